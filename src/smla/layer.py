"""SparseMLAAttention: the layer backend a serving stack calls in place of vLLM's sparse-MLA
backends (docs/design.md section 6).

Per step: write the step's tokens into the cache (so a token can select itself), convert the
indexer's request-local top-k positions to cache slots (or prefill-workspace rows), then attend:

- bf16 cache: the prefill kernel over the paged rows, the cache seen as kv[num_blocks*block_size,
  576] (when blocks are contiguous; caches that interleave layers use the decode kernel instead).
- fp8_ds_mla cache, "mixed": the decode kernel for the whole batch on the fp8 pages, every token a
  [T, s_q=1] row.
- fp8_ds_mla cache, "split": the decode kernel for the (uniform) decodes as [b, s_q]; prefill
  requests chunk by chunk: gather_upconvert of their whole sequences into the bf16 workspace, then
  the prefill kernel over the workspace with indices converted to workspace rows.
- "auto": "split" when num_heads >= smla.config.MIN_HEADS_FOR_SPLIT, else "mixed"; measured on
  the H200 by benchmarks/bench_layer.py, split won at every head count (so the threshold is 1).

All reusable buffers (converted indices, lse scratch, prefill and decode workspaces) belong to the
metadata builder, made once per model and shared by every layer; forward allocates only the
outputs it is not given. All host work of a step (the split mode's prefill chunks included) is done
by the builder's build(), so forward never copies from the device or waits for it. A decode step with
out= given also allocates nothing, so it can be captured in a CUDA graph (capture after one eager
step, replay after each build()).
"""
from typing import Any

from . import _arrays
from .config import D_NOPE, D_QK, D_ROPE, D_V, SparseMLAConfig, expect_config
from .metadata import SparseMLAMetadata
from .ops import (_real, convert_topk_indices, gather_upconvert, kv_cache_shape, pack_kv,
                  sparse_mla_decode, sparse_mla_prefill)

__all__ = ["SparseMLAAttention", "SparseMLAConfig"]

Array = Any  # a NumPy, torch or CuPy array (smla accepts any DLPack producer)


def _shape(x, name):
    """x's shape, after the package's check that x is an array (messages give the whole expected shape)."""
    _arrays.check_array(x, name)
    return tuple(int(s) for s in x.shape)


def _strides_elems(x):
    """Element strides of a torch / NumPy / CuPy array."""
    if _arrays.framework(x) == "torch":
        return tuple(int(s) for s in x.stride())
    return tuple(int(s) // x.dtype.itemsize for s in x.strides)


def _flat_rows(kv_cache):
    """kv[num_blocks*block_size, 576] view of a bf16 cache whose blocks are back to back, else None."""
    if _arrays.framework(kv_cache) not in ("numpy", "torch", "cupy"):
        return None
    nb, bs, e = (int(s) for s in kv_cache.shape)
    s0, s1, s2 = _strides_elems(kv_cache)
    if s2 != 1 or (nb > 1 and s0 != bs * s1):
        return None
    return kv_cache.reshape(nb * bs, e)  # merging dims 0 and 1 is a view under this condition


class SparseMLAAttention:
    """Sparse MLA attention over a paged latent cache (module docstring).

    num_heads: query heads of this rank (1..MAX_HEADS); softmax_scale: the model's scale (for
    DeepSeek-V3.2, 192**-0.5 * mscale**2, not 576**-0.5). The other arguments are the model's
    SparseMLAConfig, which must be the configuration of the builder the step's metadata comes
    from: make one config and pass it to both (from_config), or the same values to both
    constructors. `config` holds it."""

    def __init__(self, num_heads: int, softmax_scale: float, *, kv_cache_dtype: str, block_size: int, topk: int,
                 max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, mode: str = "auto") -> None:
        self._setup(SparseMLAConfig(num_heads=num_heads, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
                                    topk=topk, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens, mode=mode), softmax_scale)

    @classmethod
    def from_config(cls, config: SparseMLAConfig, softmax_scale: float) -> "SparseMLAAttention":
        """A layer of the model whose builder is SparseMLAMetadataBuilder.from_config(config, ...)."""
        layer = cls.__new__(cls)
        layer._setup(expect_config(config), softmax_scale)
        return layer

    def _setup(self, config, softmax_scale):
        self.config = config
        self.softmax_scale = _real(softmax_scale, "softmax_scale")

    @property
    def mode(self) -> str:
        """The attention plan: "bf16", "mixed" or "split" (config.mode)."""
        return self.config.mode

    def __repr__(self):
        return f"SparseMLAAttention({self.config}, softmax_scale={self.softmax_scale!r})"

    def _check(self, md, q, kv_c, k_pe, kv_cache, topk_indices, out, lse):
        """Everything forward can check before it writes anything (the cache is written first).
        Returns T, the step's token count."""
        cfg = self.config
        if not isinstance(md, SparseMLAMetadata):
            raise TypeError(f"md: expected a SparseMLAMetadata (SparseMLAMetadataBuilder.build), "
                            f"got {type(md).__name__}")
        if md.config is not cfg and md.config != cfg:
            raise ValueError(f"md: built for another configuration ({md.config.differences(cfg)}; "
                             "metadata vs layer): give the builder and the layer one SparseMLAConfig")
        if md.stale:
            raise RuntimeError("md: stale metadata: its builder has built another step since")
        T, h = md.num_padded_tokens, cfg.num_heads
        for name, x, tail in (("q", q, (h, D_QK)), ("kv_c", kv_c, (D_NOPE,)), ("k_pe", k_pe, (D_ROPE,)),
                              ("topk_indices", topk_indices, (cfg.topk,)), ("out", out, (h, D_V)),
                              ("lse", lse, (h,))):
            if x is None and name in ("out", "lse"):
                continue  # allocated by forward
            shape = _shape(x, name)
            # inputs and outputs: at least T rows, only the first T are read or written
            if shape[1:] != tail or shape[0] < T:
                raise ValueError(f"{name}: expected [{T}, {', '.join(map(str, tail))}] (at least T = "
                                 f"len(md.slot_mapping) = {T} rows), got {list(shape)}")
        # the cache: the converted indices are slots of this block size, checked against its block count
        shape = _shape(kv_cache, "kv_cache")
        want = kv_cache_shape(shape[0] if shape else 0, cfg.block_size, cfg.kv_cache_dtype)
        if shape != want or want[0] < 1:
            raise ValueError(f"kv_cache: expected [num_blocks >= 1, {want[1]}, {want[2]}] (the layer's "
                             f"block_size and the {cfg.kv_cache_dtype} entry), got {list(shape)}")
        return T

    def forward(self, q: Array, kv_c: Array, k_pe: Array, kv_cache: Array, topk_indices: Array,
                md: SparseMLAMetadata, out: Array | None = None, return_lse: bool = False,
                lse: Array | None = None) -> Array | tuple[Array, Array]:
        """q [T, h, 576] bf16, kv_c [T, 512], k_pe [T, 64] (this step's latent and rope keys),
        kv_cache (written in place), topk_indices [T, topk] int32 request-local positions (-1: none),
        md from build() of a builder with this layer's configuration. Inputs may be longer than T = len(md.slot_mapping)
        (CUDA-graph padding); only their first T rows are used. Returns out [T, h, 512] bf16 (the
        given out, whose first T rows are written), and lse [T, h] f32 (natural log) with
        return_lse=True. kv_cache must be [num_blocks, block_size, entry] of the layer's layout; on
        the CPU, slots or block-table entries past it raise ValueError (the GPU cannot check without a
        sync: it skips such writes and never reads past the cache)."""
        T = self._check(md, q, kv_c, k_pe, kv_cache, topk_indices, out, lse if return_lse else None)
        cfg = self.config
        h = cfg.num_heads
        if out is None:
            out = _arrays.empty(q, (T, h, D_V), "bfloat16")
        if return_lse and lse is None:
            lse = _arrays.empty(q, (T, h), "float32")
        if T == 0:
            return (out, lse) if return_lse else out
        o = out[:T]
        l = lse[:T] if return_lse else md.lse_scratch
        q = q[:T]

        pack_kv(kv_c[:T], k_pe[:T], kv_cache, md.slot_mapping, kv_cache_dtype=cfg.kv_cache_dtype)

        # prefill_request_ids / prefill_workspace_starts: None unless build() planned a split prefill
        idx = convert_topk_indices(
            md.req_id_per_token, md.block_table, topk_indices[:T], block_size=cfg.block_size,
            num_blocks=int(kv_cache.shape[0]), prefill_request_ids=md.prefill_request_ids,
            prefill_workspace_starts=md.prefill_workspace_starts, out=md.indices)

        if cfg.mode == "bf16":
            kv = _flat_rows(kv_cache)
            if kv is not None:
                sparse_mla_prefill(q, kv, idx, softmax_scale=self.softmax_scale, out=o, lse=l,
                                   max_logits=md.max_logits_scratch)
            else:
                self._decode(q, kv_cache, idx, o, l, md, T, 1)
        elif cfg.mode == "mixed":
            self._decode(q, kv_cache, idx, o, l, md, T, 1)
        else:
            b, s = md.decode_shape
            if b * s:
                n = b * s
                self._decode(q[:n], kv_cache, idx[:n], o[:n], l[:n], md, b, s)
            ws = md.prefill_workspace
            for c in md.chunks:
                t = c.tokens
                if c.token_end == c.token_start:
                    continue  # requests without query tokens: nothing to attend
                rows = ws[:c.num_rows]
                gather_upconvert(kv_cache, rows, c.block_table, c.seq_lens, c.workspace_starts,
                                 kv_cache_dtype=cfg.kv_cache_dtype)
                sparse_mla_prefill(q[t], rows, idx[t], softmax_scale=self.softmax_scale, out=o[t],
                                   lse=l[t], max_logits=md.max_logits_scratch[t])
        return (out, lse) if return_lse else out

    __call__ = forward

    def _decode(self, q, kv_cache, idx, o, l, md, b, s):
        cfg = self.config
        h = cfg.num_heads
        sparse_mla_decode(q.reshape(b, s, h, D_QK), kv_cache, idx.reshape(b, s, cfg.topk),
                          softmax_scale=self.softmax_scale, kv_cache_dtype=cfg.kv_cache_dtype,
                          out=o.reshape(b, s, h, D_V), lse=l.reshape(b, s, h),
                          workspace=md.decode_workspace)
