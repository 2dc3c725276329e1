"""SparseMLAAttention: the layer backend a serving stack calls in place of vLLM's sparse-MLA
backends (docs/design.md section 6).

A step has two halves, which a caller may run together (forward) or apart, as vLLM does
(do_kv_cache_update, then forward_mqa over the tokens that take the sparse path):

- write_kv_cache: the step's tokens into the cache by md.slot_mapping (so a token can select itself);
- attend: over a contiguous token range of the step (the whole step, the decodes [0, n), a range of
  prefill tokens, any range: every token's metadata is its own), convert the indexer's
  request-local top-k positions to cache slots (or prefill-workspace rows), then run the kernels:

- bf16 cache: the prefill kernel over the paged rows, the cache seen as kv[num_blocks*block_size,
  576] (when blocks are contiguous; caches that interleave layers use the decode kernel instead).
- fp8_ds_mla cache, "mixed": the decode kernel for the whole batch on the fp8 pages, every token a
  [T, s_q=1] row.
- fp8_ds_mla cache, "split": the decode kernel for the (uniform) decodes as [b, s_q]; prefill
  requests chunk by chunk: gather_upconvert of their whole sequences into the bf16 workspace, then
  the prefill kernel over the workspace with indices converted to workspace rows.
- "auto": "split" when num_heads >= smla.config.MIN_HEADS_FOR_SPLIT, else "mixed"; measured on
  the H200 by benchmarks/bench_layer.py, split won at every head count (so the threshold is 1).

All reusable buffers (converted indices, lse scratch, prefill and decode workspaces) belong to the metadata
builder, made once per model and shared by every layer, or are handed to it by the caller
(SparseMLAMetadataBuilder.workspace_specs / workspaces=, or per call: attend(..., workspaces=)); forward and
attend allocate only the outputs they are not given. All host work of a step (the split mode's prefill chunks
included) is done by the builder's build(), so forward and attend never copy from the device or wait for it. A
decode step with out= (and for attend lse=) given also allocates nothing, so it can be captured in a CUDA
graph (capture after one eager step, replay after each build()).
"""
from typing import Any

from . import _arrays
from .config import D_NOPE, D_QK, D_ROPE, D_V, SparseMLAConfig, expect_config
from .metadata import SparseMLAMetadata
from .ops import (_int, _real, convert_topk_indices, gather_upconvert, kv_cache_shape, pack_kv,
                  sparse_mla_decode, sparse_mla_prefill)

__all__ = ["SparseMLAAttention", "SparseMLAConfig"]

Array = Any  # a NumPy, torch or CuPy array (smla accepts any DLPack producer)
_NOPE_TAIL, _ROPE_TAIL = (D_NOPE,), (D_ROPE,)


def _shape(x, name):
    """x's shape, after the package's check that x is an array (messages give the whole expected shape)."""
    _arrays.check_array(x, name)
    return tuple(int(s) for s in x.shape)


def _first(x, n):
    """x's first n rows: x itself when it has exactly n (a torch slice costs ~0.8-0.9 us of host time on the
    development machine, tools/layer_host_time.py)."""
    return x if x.shape[0] == n else x[:n]


def _q_map(q, f):
    """f applied to q: one array, or each half of the (q_nope, q_pe) pair (a tuple)."""
    return (f(q[0]), f(q[1])) if isinstance(q, tuple) else f(q)


def _flat_rows(kv_cache):
    """kv[num_blocks*block_size, 576] view of a bf16 cache whose blocks are back to back, else None."""
    if _arrays.framework(kv_cache) not in ("numpy", "torch", "cupy"):
        return None
    nb, bs, e = (int(s) for s in kv_cache.shape)
    s0, s1, s2 = _arrays.strides_elems(kv_cache)
    if s2 != 1 or (nb > 1 and s0 != bs * s1):
        return None
    return kv_cache.reshape(nb * bs, e)  # merging dims 0 and 1 is a view under this condition


class SparseMLAAttention:
    """Sparse MLA attention over a paged latent cache (module docstring).

    num_heads: query heads of this rank (1..MAX_HEADS); softmax_scale: the model's scale (for
    DeepSeek-V3.2, 192**-0.5 * mscale**2, not 576**-0.5). The other arguments are the model's
    SparseMLAConfig, which must be the configuration of the builder the step's metadata comes
    from: make one config and pass it to both (from_config), or the same values to both
    constructors. `config` holds it. precision ("high" or "fast", the config's) is passed to every
    attention op the layer runs (smla.ops.sparse_mla_decode); the builder need not share it."""

    def __init__(self, num_heads: int, softmax_scale: float, *, kv_cache_dtype: str, block_size: int, topk: int,
                 max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, mode: str = "auto",
                 precision: str = "high") -> None:
        self._setup(SparseMLAConfig(num_heads=num_heads, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
                                    topk=topk, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens, mode=mode,
                                    precision=precision), softmax_scale)

    @classmethod
    def from_config(cls, config: SparseMLAConfig, softmax_scale: float) -> "SparseMLAAttention":
        """A layer of the model whose builder is SparseMLAMetadataBuilder.from_config(config, ...)."""
        layer = cls.__new__(cls)
        layer._setup(expect_config(config), softmax_scale)
        return layer

    def _setup(self, config, softmax_scale):
        self.config = config
        self.softmax_scale = _real(softmax_scale, "softmax_scale")
        # the trailing dims each array must have (the checks of every call compare shapes with these)
        h = config.num_heads
        self._cache_tail = kv_cache_shape(0, config.block_size, config.kv_cache_dtype)[1:]  # (block_size, entry)
        self._q_tail, self._out_tail, self._lse_tail = (h, D_QK), (h, D_V), (h,)
        self._topk_tail = (config.topk,)
        self._rows_want = (-1, {})  # _check_rows' full shapes for the last row count

    @property
    def mode(self) -> str:
        """The attention plan: "bf16", "mixed" or "split" (config.mode)."""
        return self.config.mode

    def __repr__(self):
        return f"SparseMLAAttention({self.config}, softmax_scale={self.softmax_scale!r})"

    def _check_md(self, md):
        """md is this configuration's, fresh metadata; returns T, the step's token count."""
        cfg = self.config
        if not isinstance(md, SparseMLAMetadata):
            raise TypeError(f"md: expected a SparseMLAMetadata (SparseMLAMetadataBuilder.build), "
                            f"got {type(md).__name__}")
        if md.config is not cfg and md.config != cfg:
            raise ValueError(f"md: built for another configuration ({md.config.differences(cfg)}; "
                             "metadata vs layer): give the builder and the layer one SparseMLAConfig")
        if md.stale:
            raise RuntimeError("md: stale metadata: its builder has built another step since")
        return md.num_padded_tokens

    def _check_rows(self, n, what, arrays):
        """Each (name, x, tail) with x [>= n, *tail] (only the first n rows are read or written);
        out / lse None are skipped (outputs to allocate). what() says where n comes from, for messages.
        The usual case, x of exactly [n, *tail], is one shape comparison (torch.Size compares equal to
        a tuple) with the full shapes of this n kept from the last call (a step's layers share n); any
        other shape takes the general rule, and a bad one the checked path, which names the argument."""
        rows_n, want = self._rows_want  # one attribute: the dict always belongs to its n
        if rows_n != n:
            want = {}
            self._rows_want = (n, want)
        for name, x, tail in arrays:
            if x is None and name in ("out", "lse"):
                continue
            w = want.get(tail)
            if w is None:
                w = want[tail] = (n,) + tail
            try:
                s = x.shape
                if s == w or (s[1:] == tail and s[0] >= n):
                    continue
            except (AttributeError, TypeError, IndexError):
                pass
            shape = _shape(x, name)
            if shape[1:] != tail or shape[0] < n:
                raise ValueError(f"{name}: expected [{n}, {', '.join(map(str, tail))}] (at least {what()}), "
                                 f"got {list(shape)}")

    @staticmethod
    def _check_scratch(md, op):
        """The buffers the builder takes per call (workspaces={name: None}) must come with this call."""
        if md.per_call:
            raise ValueError(f"workspaces: the builder was made to take {sorted(md.per_call)} with each call "
                             f"(workspaces={{name: None}}); pass them to attend(..., workspaces=)"
                             + (" (forward takes none: use write_kv_cache and attend)" if op == "forward" else ""))

    def _check_cache(self, kv_cache):
        # the converted indices are slots of this block size, checked against its block count
        try:
            s = kv_cache.shape
            if s[1:] == self._cache_tail and s[0] >= 1:  # so 3 dims
                return
        except (AttributeError, TypeError, IndexError):
            pass
        cfg = self.config
        shape = _shape(kv_cache, "kv_cache")
        want = kv_cache_shape(shape[0] if shape else 0, cfg.block_size, cfg.kv_cache_dtype)
        if shape != want or want[0] < 1:
            raise ValueError(f"kv_cache: expected [num_blocks >= 1, {want[1]}, {want[2]}] (the layer's "
                             f"block_size and the {cfg.kv_cache_dtype} entry), got {list(shape)}")

    def _token_range(self, tokens, T):
        """(start, end) of attend's `tokens`: None (the whole step), a (start, end) pair or a slice
        with step 1, inside [0, T]."""
        if tokens is None:
            return 0, T
        if isinstance(tokens, slice):
            if tokens.step not in (None, 1):
                raise ValueError(f"tokens: expected a contiguous range (slice step 1), got step {tokens.step}")
            pair = (0 if tokens.start is None else tokens.start, T if tokens.stop is None else tokens.stop)
        elif isinstance(tokens, tuple) and len(tokens) == 2:
            pair = tokens
        else:
            raise TypeError(f"tokens: expected None, a (start, end) pair or a slice, got {type(tokens).__name__}")
        start, end = (_int(v, f"tokens[{i}]", 0) for i, v in enumerate(pair))
        if not 0 <= start <= end <= T:
            raise ValueError(f"tokens: expected 0 <= start <= end <= T = len(md.slot_mapping) = {T}, "
                             f"got ({start}, {end})")
        return start, end

    def write_kv_cache(self, kv_c: Array, k_pe: Array, kv_cache: Array, md: SparseMLAMetadata) -> Array:
        """The first half of a step: kv_c [T, 512] and k_pe [T, 64] bf16 (this step's latent and
        rope keys; longer inputs are CUDA-graph padding, only the first T = len(md.slot_mapping)
        rows are used) written into kv_cache in place at md.slot_mapping (slot -1: padding,
        skipped). Returns kv_cache. On the CPU, slots past the cache raise ValueError before
        anything is written; the GPU skips them."""
        T = self._check_md(md)
        self._check_rows(T, lambda: f"T = len(md.slot_mapping) = {T} rows",
                         (("kv_c", kv_c, _NOPE_TAIL), ("k_pe", k_pe, _ROPE_TAIL)))
        self._check_cache(kv_cache)
        self._write(kv_c, k_pe, kv_cache, md, T)
        return kv_cache

    def _write(self, kv_c, k_pe, kv_cache, md, T):
        if T:
            # the slot mapping sets the token count: longer (padded) inputs need no slice
            pack_kv(kv_c, k_pe, kv_cache, md.slot_mapping, kv_cache_dtype=self.config.kv_cache_dtype)

    def attend(self, q: Array | tuple[Array, Array], kv_cache: Array, topk_indices: Array, md: SparseMLAMetadata,
               *, tokens: tuple[int, int] | slice | None = None, out: Array | None = None,
               lse: Array | None = None, workspaces: dict | None = None) -> tuple[Array, Array]:
        """The second half of a step: attention of the step's tokens [start, end) over kv_cache,
        which must already hold them (write_kv_cache). tokens: None for the whole step [0, T), else
        a (start, end) pair or a slice of the step's tokens, T = len(md.slot_mapping); vLLM's sparse
        tokens are (0, num_decode_tokens) for the decodes, or a range of prefill tokens. Any range
        works, as every token's request, prefill id and workspace chunk come from md.

        With n = end - start: q is [n, h, 576] bf16, or the pair (q_nope [n, h, 512], q_pe [n, h,
        64]) of any row strides, which the kernels read in place (no concatenation; on CUDA each half's
        rows 16-byte aligned, as q's). topk_indices [n, topk] int32:
        request-local positions of those n tokens (-1: none). out [n, h, 512] bf16 and lse [n, h]
        f32 are written (their first n rows; allocated when not given). Returns (out, lse), lse in
        natural log.

        workspaces: {name: array} in place of the builder's scratch for this call only (any subset
        of SparseMLAMetadataBuilder.workspace_specs, checked as the builder's workspaces= are), for a
        host framework that hands its buffers out at each use (vLLM's workspace manager).

        A range that cuts a split-mode workspace chunk still upconverts the whole chunk. As forward,
        attend never copies from the device or waits for it."""
        T = self._check_md(md)
        if workspaces is not None:
            md = md.with_workspaces(workspaces)
        self._check_scratch(md, "attend")
        start, end = self._token_range(tokens, T)
        n, h, topk = end - start, self.config.num_heads, self.config.topk
        what = lambda: f"n = {n} rows: tokens [{start}, {end}) of the step"  # noqa: E731 (only for messages)
        pair = isinstance(q, (tuple, list))
        if pair and len(q) != 2:
            raise ValueError(f"q: expected one array or a (q_nope, q_pe) pair, got a {type(q).__name__} "
                             f"of {len(q)}")
        qs = (("q[0] (q_nope)", q[0], (h, D_NOPE)), ("q[1] (q_pe)", q[1], (h, D_ROPE))) if pair else \
            (("q", q, (h, D_QK)),)
        self._check_rows(n, what, qs + (("topk_indices", topk_indices, (topk,)), ("out", out, (h, D_V)),
                                        ("lse", lse, (h,))))
        self._check_cache(kv_cache)
        ref = q[0] if pair else q
        if out is None:
            out = _arrays.empty(ref, (n, h, D_V), "bfloat16")
        if lse is None:
            lse = _arrays.empty(ref, (n, h), "float32")
        if pair:  # the extension would name them q and q_pe
            for name, x, _ in qs:
                if _arrays.dtype_name(x) != "bfloat16":
                    raise TypeError(f"{name}: expected bfloat16, got {_arrays.dtype_name(x)}")
        if n:
            q = _q_map(tuple(q) if pair else q, lambda x: _first(x, n))
            self._attend(q, kv_cache, _first(topk_indices, n), md, start, end, _first(out, n), _first(lse, n))
        return out, lse

    def forward(self, q: Array, kv_c: Array, k_pe: Array, kv_cache: Array, topk_indices: Array,
                md: SparseMLAMetadata, out: Array | None = None, return_lse: bool = False,
                lse: Array | None = None) -> Array | tuple[Array, Array]:
        """write_kv_cache, then attend over the whole step, with every argument checked before the
        cache is written. q [T, h, 576] bf16, kv_c [T, 512], k_pe [T, 64] (this step's latent and
        rope keys), kv_cache (written in place), topk_indices [T, topk] int32 request-local
        positions (-1: none), md from build() of a builder with this layer's configuration. Inputs
        may be longer than T = len(md.slot_mapping) (CUDA-graph padding); only their first T rows
        are used. Returns out [T, h, 512] bf16 (the given out, whose first T rows are written), and
        lse [T, h] f32 (natural log) with return_lse=True. kv_cache must be [num_blocks,
        block_size, entry] of the layer's layout; on the CPU, slots or block-table entries past it
        raise ValueError (the GPU cannot check without a sync: it skips such writes and never reads
        past the cache)."""
        T = self._check_md(md)
        self._check_scratch(md, "forward")
        self._check_rows(T, lambda: f"T = len(md.slot_mapping) = {T} rows", (
            ("q", q, self._q_tail), ("kv_c", kv_c, _NOPE_TAIL), ("k_pe", k_pe, _ROPE_TAIL),
            ("topk_indices", topk_indices, self._topk_tail), ("out", out, self._out_tail),
            ("lse", lse if return_lse else None, self._lse_tail)))
        self._check_cache(kv_cache)
        if out is None:
            out = _arrays.empty(q, (T,) + self._out_tail, "bfloat16")
        if return_lse and lse is None:
            lse = _arrays.empty(q, (T,) + self._lse_tail, "float32")
        if T:
            self._write(kv_c, k_pe, kv_cache, md, T)
            self._attend(_first(q, T), kv_cache, _first(topk_indices, T), md, 0, T, _first(out, T),
                         _first(lse, T) if return_lse else md.lse_scratch)
        return (out, lse) if return_lse else out

    def _attend(self, q, kv_cache, topk_indices, md, start, end, o, l):
        """Attention of the step's tokens [start, end) (checked): q, topk_indices, o, l hold exactly
        those n = end - start rows; md's per-token arrays are indexed by step token. A torch view costs ~0.8
        us of host time (tools/layer_host_time.py), so the whole step (forward's case) and a range that is all
        decodes take md's arrays and the caller's as they are."""
        cfg = self.config
        n = end - start
        whole = start == 0 and end == md.num_padded_tokens  # md's per-token arrays are [T, ...] views
        tok = slice(start, end)
        # prefill_request_ids / prefill_workspace_starts: None unless build() planned a split prefill
        ids = md.prefill_request_ids
        idx = convert_topk_indices(
            md.req_id_per_token if whole else md.req_id_per_token[tok], md.block_table, topk_indices,
            block_size=cfg.block_size, num_blocks=int(kv_cache.shape[0]),
            prefill_request_ids=None if ids is None else (ids if whole else ids[tok]),
            prefill_workspace_starts=md.prefill_workspace_starts, out=md.indices if whole else md.indices[tok])
        if cfg.mode == "bf16":
            kv = _flat_rows(kv_cache)
            if kv is not None:
                sparse_mla_prefill(q, kv, idx, softmax_scale=self.softmax_scale, out=o, lse=l,
                                   max_logits=md.max_logits_scratch if whole else md.max_logits_scratch[tok],
                                   precision=cfg.precision)
            else:
                self._decode(q, kv_cache, idx, o, l, md, n, 1)
            return
        if cfg.mode == "mixed":
            self._decode(q, kv_cache, idx, o, l, md, n, 1)
            return
        # split: the decodes [0, b*s) of the step through the decode kernel, as [b, s] when the range
        # holds whole decode requests, else one token per row (same results, the kernel's batching)
        b, s = md.decode_shape
        d = min(end, b * s) - start
        if d > 0:
            whole_reqs = start % s == 0 and d % s == 0
            if d < n:
                q_d, idx_d, o_d, l_d = _q_map(q, lambda x: x[:d]), idx[:d], o[:d], l[:d]
            else:
                q_d, idx_d, o_d, l_d = q, idx, o, l
            self._decode(q_d, kv_cache, idx_d, o_d, l_d, md, d // s if whole_reqs else d, s if whole_reqs else 1)
        if not md.chunks:
            return
        ws = md.prefill_workspace
        max_logits = md.max_logits_scratch[tok]
        for c in md.chunks:
            lo, hi = max(c.token_start, start), min(c.token_end, end)
            if lo >= hi:
                continue  # no query tokens of this chunk in the range: nothing to attend
            rows = ws[:c.num_rows]
            gather_upconvert(kv_cache, rows, c.block_table, c.seq_lens, c.workspace_starts,
                             kv_cache_dtype=cfg.kv_cache_dtype)
            t = slice(lo - start, hi - start)
            sparse_mla_prefill(_q_map(q, lambda x: x[t]), rows, idx[t], softmax_scale=self.softmax_scale, out=o[t],
                               lse=l[t], max_logits=max_logits[t], precision=cfg.precision)

    __call__ = forward

    def _decode(self, q, kv_cache, idx, o, l, md, b, s):
        cfg = self.config
        h = cfg.num_heads
        # md's own indices and lse scratch come viewed as [b, s, ...] by build() for the step's decode shape
        dv = md.decode_views
        if dv is not None and dv[0] == b and dv[1] == s:
            idx = dv[2] if idx is md.indices else idx.reshape(b, s, cfg.topk)
            l = dv[3] if l is md.lse_scratch else l.reshape(b, s, h)
        else:
            idx, l = idx.reshape(b, s, cfg.topk), l.reshape(b, s, h)
        q = (q[0].reshape(b, s, h, D_NOPE), q[1].reshape(b, s, h, D_ROPE)) if isinstance(q, tuple) else \
            q.reshape(b, s, h, D_QK)
        sparse_mla_decode(q, kv_cache, idx,
                          softmax_scale=self.softmax_scale, kv_cache_dtype=cfg.kv_cache_dtype,
                          out=o.reshape(b, s, h, D_V), lse=l, workspace=md.decode_workspace, precision=cfg.precision)
