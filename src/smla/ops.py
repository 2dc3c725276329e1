"""Public ops (docs/design.md section 4): check here only what Python must read itself (an argument's
type before its .shape, the scalars), have missing outputs allocated with the caller's framework (by the
extension itself, passed as _C.ALLOCATE, for NumPy and for frameworks whose DLPack exchange API has an
allocator; here otherwise), pick the launch stream, and call the C extension by keyword (src/smla/_C.pyi),
which validates every array and the rules of each op and returns the op's outputs. Every error names the
argument. The limits and sizes come from the extension (_C.MAX_HEADS, _C.D_QK, ...), which defines them
once (csrc/core/smla.h)."""
from __future__ import annotations

import operator
from typing import Any, Literal, overload

import numpy as np

from . import _C
from ._arrays import Array, c_allocates, check_array, device, empty, is_cuda, launch_stream

__all__ = ["CACHE_DTYPE_ALIASES", "canonical_cache_dtype", "convert_topk_indices", "filter_convert_dcp_indices",
           "gather_upconvert", "kv_cache_shape", "merge_attn_states", "pack_kv", "sparse_mla_decode",
           "sparse_mla_decode_workspace_size", "sparse_mla_prefill", "unpack_kv"]

_ENTRY = {"bf16": _C.D_QK, "fp8_ds_mla": _C.FP8_ENTRY_BYTES}
_ALLOC = _C.ALLOCATE  # an output argument the extension allocates (c_allocates)
# vLLM's names for the two layouts. The package's one alias table: metadata.py and layer.py use
# canonical_cache_dtype, and the extension is only ever given the canonical names.
CACHE_DTYPE_ALIASES = {"bfloat16": "bf16", "auto": "bf16", "fp8": "fp8_ds_mla", "fp8_e4m3": "fp8_ds_mla"}
_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1


# every accepted spelling -> its canonical name: the hot path's one dict lookup
_CANONICAL = {**{n: n for n in _ENTRY}, **CACHE_DTYPE_ALIASES}


def canonical_cache_dtype(kv_cache_dtype: str) -> str:
    """"bf16" or "fp8_ds_mla" for a layout name or one of vLLM's aliases ("auto", "bfloat16", "fp8",
    "fp8_e4m3")."""
    if type(kv_cache_dtype) is str:
        name = _CANONICAL.get(kv_cache_dtype)
        if name is not None:
            return name
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {type(kv_cache_dtype).__name__}")
    name = CACHE_DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if name not in _ENTRY:
        raise ValueError(f'kv_cache_dtype: expected "bf16" or "fp8_ds_mla", got {kv_cache_dtype!r}')
    return name


def _int(x: Any, name: str, lo: int, hi: int = _I64_MAX) -> int:
    """x as a Python int in [lo, hi] (anything with __index__: int, NumPy integers, 0-d integer arrays)."""
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(x).__name__}") from None
    if v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v}")
    if v > hi:
        raise ValueError(f"{name}: expected an integer <= {hi}, got {v}")
    return v


def _bool(x: Any, name: str) -> bool:
    """A flag: bool, NumPy bool, or the integers 0 and 1."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name}: expected a bool, got {type(x).__name__}") from None
    if v not in (0, 1):
        raise ValueError(f"{name}: expected a bool (or 0 / 1), got {v}")
    return bool(v)


def _real(x: Any, name: str) -> float:
    """x as a Python float (the extension rejects NaN and infinities with its own message)."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{name}: expected a finite number, got {x!r}") from None
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}") from None


def _shape(x: Any, name: str, ndim: int, layout: str = "") -> tuple[int, ...]:
    """x's shape, after checking that x is an array of ndim dimensions (the extension checks the rest)."""
    check_array(x, name)
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: a {type(x).__name__} has no .shape to size the outputs by; pass them (out=, ...)")
    if len(shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions{(' ' + layout) if layout else ''}, got {len(shape)}")
    return tuple(int(s) for s in shape)


def _dtype_name(x: Any, name: str) -> str:
    dt = getattr(x, "dtype", None)
    if dt is None:
        raise TypeError(f"{name}: a {type(x).__name__} has no .dtype to allocate the outputs with; "
                        "pass them (out=, ...)")
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        s = str(dt).replace("torch.", "")  # str of a NumPy dtype costs ~1.5 us: once per dtype
        name = _DTYPE_NAMES[dt] = "bfloat16" if s in ("bfloat16", "uint16") else s
    return name


_DTYPE_NAMES: dict[Any, str] = {}


def kv_cache_shape(num_blocks: int, block_size: int, kv_cache_dtype: str) -> tuple[int, int, int]:
    """Shape of a cache of this layout: (num_blocks, block_size, 656) uint8 for fp8_ds_mla,
    (num_blocks, block_size, 576) bfloat16 for bf16."""
    nb = _int(num_blocks, "num_blocks", 0)
    bs = _int(block_size, "block_size", 1)
    return (nb, bs, _ENTRY[canonical_cache_dtype(kv_cache_dtype)])


def pack_kv(kv_c: Array, k_pe: Array, kv_cache: Array, slot_mapping: Array, *, kv_cache_dtype: str,
            scale_rule: str = "pow2", stream: int | None = None) -> Array:
    """Write kv_c[T, 512] and k_pe[T, 64] (bf16) into kv_cache at slot_mapping[T] (negative: skipped).
    scale_rule: "pow2" or "fp32" (docs/design.md section 3; the extension checks it). Returns kv_cache."""
    cdt = canonical_cache_dtype(kv_cache_dtype)
    _C.pack_kv(kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, kv_cache_dtype=cdt,
               scale_rule=scale_rule, stream=launch_stream(kv_cache, stream, "kv_cache"))
    return kv_cache


def unpack_kv(kv_cache: Array, slots: Array, *, kv_cache_dtype: str, out: Array | None = None,
              stream: int | None = None) -> Array:
    """Dequantised rows [n, 576] bf16 of the given slots (invalid slots give zeros)."""
    cdt = canonical_cache_dtype(kv_cache_dtype)
    s = launch_stream(kv_cache, stream, "kv_cache")
    if out is None:
        out = _ALLOC if c_allocates(kv_cache, "kv_cache") else empty(kv_cache, (_shape(slots, "slots", 1)[0], _C.D_QK),
                                                                     "bfloat16")
    return _C.unpack_kv(kv_cache=kv_cache, slots=slots, out=out, kv_cache_dtype=cdt, stream=s)[0]


def gather_upconvert(kv_cache: Array, workspace: Array, block_table: Array, seq_lens: Array,
                     workspace_starts: Array, *, seq_starts: Array | None = None,
                     kv_cache_dtype: str = "fp8_ds_mla", stream: int | None = None) -> Array:
    """workspace[workspace_starts[r] + i] = dequantised token seq_starts[r] + i of request r, for
    i < seq_lens[r]. Returns workspace."""
    cdt = canonical_cache_dtype(kv_cache_dtype)
    _C.gather_upconvert(kv_cache=kv_cache, workspace=workspace, block_table=block_table, seq_lens=seq_lens,
                        workspace_starts=workspace_starts, seq_starts=seq_starts, kv_cache_dtype=cdt,
                        stream=launch_stream(kv_cache, stream, "kv_cache"))
    return workspace


@overload
def convert_topk_indices(req_id: Array, block_table: Array, topk_indices: Array, *, block_size: int,
                         num_blocks: int | None = ..., prefill_request_ids: Array | None = ...,
                         prefill_workspace_starts: Array | None = ...,
                         return_valid_counts: Literal[False] = ..., out: Array | None = ...,
                         valid_counts: Array | None = ..., stream: int | None = ...) -> Array: ...
@overload
def convert_topk_indices(req_id: Array, block_table: Array, topk_indices: Array, *, block_size: int,
                         num_blocks: int | None = ..., prefill_request_ids: Array | None = ...,
                         prefill_workspace_starts: Array | None = ...,
                         return_valid_counts: Literal[True], out: Array | None = ...,
                         valid_counts: Array | None = ..., stream: int | None = ...) -> tuple[Array, Array]: ...
@overload
def convert_topk_indices(req_id: Array, block_table: Array, topk_indices: Array, *, block_size: int,
                         num_blocks: int | None = ..., prefill_request_ids: Array | None = ...,
                         prefill_workspace_starts: Array | None = ...,
                         return_valid_counts: bool = ..., out: Array | None = ...,
                         valid_counts: Array | None = ..., stream: int | None = ...) -> Array | tuple[Array, Array]: ...


def convert_topk_indices(req_id, block_table, topk_indices, *, block_size, num_blocks=None,
                         prefill_request_ids=None, prefill_workspace_starts=None, return_valid_counts=False,
                         out=None, valid_counts=None, stream=None):
    """Request-local top-k positions -> global cache slots (or prefill workspace rows); -1 = none.
    num_blocks: the cache's block count; a selected token whose block id is >= it raises ValueError on
    the CPU and gives -1 on the GPU (None: no such check).
    out may be topk_indices itself (in place); any other overlap between the arrays raises."""
    bs = block_size if type(block_size) is int and 1 <= block_size <= _I64_MAX else _int(block_size, "block_size", 1)
    if return_valid_counts is not True and return_valid_counts is not False:
        return_valid_counts = _bool(return_valid_counts, "return_valid_counts")
    s = launch_stream(topk_indices, stream, "topk_indices")
    if out is None or (return_valid_counts and valid_counts is None):
        out, valid_counts = _index_outputs(topk_indices, out, valid_counts if not return_valid_counts else
                                           (_ALLOC if valid_counts is None else valid_counts))
    out, valid_counts = _C.convert_topk_indices(
        req_id=req_id, block_table=block_table, topk_indices=topk_indices, block_size=bs, num_blocks=num_blocks,
        prefill_request_ids=prefill_request_ids, prefill_workspace_starts=prefill_workspace_starts, out=out,
        valid_counts=valid_counts, stream=s)
    return (out, valid_counts) if return_valid_counts else out


def _index_outputs(topk_indices, out, valid_counts):
    """out (None: wanted) and valid_counts (_ALLOC: wanted) of the index conversions: left to the extension
    where it can allocate like topk_indices, else made here with its framework."""
    if c_allocates(topk_indices, "topk_indices"):
        return (_ALLOC if out is None else out), valid_counts
    if out is None:
        out = empty(topk_indices, _shape(topk_indices, "topk_indices", 2), "int32")
    if valid_counts is _ALLOC:
        valid_counts = empty(topk_indices, (_shape(topk_indices, "topk_indices", 2)[0],), "int32")
    return out, valid_counts


def filter_convert_dcp_indices(req_id: Array, block_table: Array, topk_indices: Array, *, block_size: int,
                               dcp_size: int, dcp_rank: int, interleave: int = 1, compact: bool = True,
                               num_blocks: int | None = None, prefill_request_ids: Array | None = None,
                               prefill_workspace_starts: Array | None = None, out: Array | None = None,
                               valid_counts: Array | None = None, stream: int | None = None) -> tuple[Array, Array]:
    """Decode context parallelism: keep this rank's tokens (owner (g // interleave) % dcp_size), map
    them to local positions and convert; compact moves the valid ones to the front. num_blocks: this
    rank's cache block count, as in convert_topk_indices. Returns (out, valid_counts). out may be
    topk_indices itself (in place)."""
    bs = _int(block_size, "block_size", 1)
    size = _int(dcp_size, "dcp_size", 1, _I32_MAX)
    rank = _int(dcp_rank, "dcp_rank", 0, _I32_MAX)
    if rank >= size:
        raise ValueError(f"dcp_rank: expected 0 <= dcp_rank < dcp_size = {size}, got {rank}")
    il = _int(interleave, "interleave", 1, _I32_MAX)
    compact = _bool(compact, "compact")
    s = launch_stream(topk_indices, stream, "topk_indices")
    if out is None or valid_counts is None:
        out, valid_counts = _index_outputs(topk_indices, out, _ALLOC if valid_counts is None else valid_counts)
    return _C.filter_convert_dcp_indices(req_id=req_id, block_table=block_table, topk_indices=topk_indices, block_size=bs,
                                  num_blocks=num_blocks, prefill_request_ids=prefill_request_ids,
                                  prefill_workspace_starts=prefill_workspace_starts, out=out,
                                  valid_counts=valid_counts, stream=s, dcp_size=size, dcp_rank=rank, interleave=il,
                                  compact=compact)


def merge_attn_states(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array, *, out: Array | None = None,
                      out_lse: Array | None = None, stream: int | None = None) -> tuple[Array, Array]:
    """lse-weighted merge of two partial attention results [n, h, d] (natural-log lse [n, h]).
    Returns (out, lse); out has the inputs' dtype. out may be out_a or out_b itself, and out_lse lse_a
    or lse_b (in place); any other overlap between the arrays raises."""
    s = launch_stream(out_a, stream, "out_a")
    if (out is None or out_lse is None) and c_allocates(out_a, "out_a"):
        out = _ALLOC if out is None else out
        out_lse = _ALLOC if out_lse is None else out_lse
    if out is None:
        dt = _dtype_name(out_a, "out_a")
        if dt not in ("bfloat16", "float16", "float32"):
            raise TypeError(f"out_a: expected bfloat16, float16 or float32, got {dt}")
        out = empty(out_a, _shape(out_a, "out_a", 3), dt)
    if out_lse is None:
        out_lse = empty(out_a, _shape(lse_a, "lse_a", 2), "float32")
    return _C.merge_attn_states(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b, out=out, out_lse=out_lse,
                                stream=s)


def sparse_mla_decode_workspace_size(b: int, s_q: int, h: int, topk: int, kv_cache_dtype: str = "fp8_ds_mla", *,
                                     device_id: int = 0) -> int:
    """Bytes of scratch sparse_mla_decode uses on CUDA for this shape (split top-k partials); 0 where no
    CUDA decode can run (smla built without CUDA, or no usable GPU)."""
    return _C.sparse_mla_decode_workspace_size(b=_int(b, "b", 0), s_q=_int(s_q, "s_q", 0),
                                               h=_int(h, "h", 1, _C.MAX_HEADS), topk=_int(topk, "topk", 1, _C.MAX_TOPK),
                                               kv_cache_dtype=canonical_cache_dtype(kv_cache_dtype),
                                               device=_int(device_id, "device_id", 0, _I32_MAX))


def _q_pair(q: tuple[Array, Array] | list) -> tuple[Array, Array]:
    """(q_nope, q_pe) of a pair ([.., h, 512], [.., h, 64]), which the kernels read in place (no
    concatenation). The attention wrappers test for a pair inline (they run on every call) and call
    this only for one."""
    if len(q) != 2:
        raise ValueError(f"q: expected one array or a (q_nope, q_pe) pair, got a {type(q).__name__} of {len(q)}")
    return q[0], q[1]


def sparse_mla_decode(q: Array | tuple[Array, Array], kv_cache: Array, indices: Array, *, softmax_scale: float,
                      kv_cache_dtype: str,
                      topk_length: Array | None = None, attn_sink: Array | None = None, out: Array | None = None,
                      lse: Array | None = None, workspace: Array | None = None, stream: int | None = None,
                      precision: str = "high") -> tuple[Array, Array]:
    """Sparse MLA over a paged cache. q [b, s_q, h, 576] bf16, or the pair (q_nope [b, s_q, h, 512],
    q_pe [b, s_q, h, 64]) of any row strides, read in place; indices [b, s_q, topk] int32 global slots
    (invalid ones ignored). Returns (out [b, s_q, h, 512] bf16, lse [b, s_q, h] f32, natural log).

    precision: "high" (default) keeps the probabilities at full precision in P.V and meets
    docs/design.md's tolerances on every input; "fast" lets a kernel that has a fast variant (the
    Hopper sm90 kernel) round them to bf16 before P.V, FlashMLA's recipe, within the looser bound of
    docs/design.md section 4 ("Precision"). The CPU and the portable CUDA kernel run high either way.
    The extension checks the value."""
    cdt = canonical_cache_dtype(kv_cache_dtype)
    q_pe = None
    if isinstance(q, (tuple, list)):
        q, q_pe = _q_pair(q)
    s = launch_stream(q, stream, "q")
    if out is None or lse is None or workspace is None:
        if c_allocates(q, "q"):  # the extension sizes and makes them (the workspace only on CUDA, when split)
            out = _ALLOC if out is None else out
            lse = _ALLOC if lse is None else lse
            workspace = _ALLOC if workspace is None else workspace
        elif out is None or lse is None or is_cuda(q, "q"):
            out, lse, workspace = _decode_outputs(q, indices, cdt, out, lse, workspace)
    # softmax_scale and the arrays are checked by the extension, each message naming its argument
    return _C.sparse_mla_decode(q=q, kv_cache=kv_cache, indices=indices, topk_length=topk_length,
                                attn_sink=attn_sink, out=out, lse=lse, workspace=workspace,
                                softmax_scale=softmax_scale, kv_cache_dtype=cdt, precision=precision, stream=s,
                                q_pe=q_pe)  # in the binding's order: fastest lookup


def _decode_outputs(q, indices, cdt, out, lse, workspace):
    """The outputs sparse_mla_decode was not given, made with q's framework (workspace: CUDA only).
    The workspace size comes from the extension, whose launcher plans the split."""
    b, s_q, h, _ = _shape(q, "q", 4, "[b, s_q, h, 576]")
    if out is None:
        out = empty(q, (b, s_q, h, _C.D_V), "bfloat16")
    if lse is None:
        lse = empty(q, (b, s_q, h), "float32")
    if workspace is None and is_cuda(q):
        # a shape out of range gets the extension's message naming q / indices below, not one naming h / topk
        topk = min(max(1, _shape(indices, "indices", 3)[2]), _C.MAX_TOPK)
        size = _C.sparse_mla_decode_workspace_size(b=b, s_q=s_q, h=min(max(1, h), _C.MAX_HEADS), topk=topk,
                                                   kv_cache_dtype=cdt, device=device(q)[1])
        if size > 0:
            workspace = empty(q, (size,), "uint8")
    return out, lse, workspace


def sparse_mla_prefill(q: Array | tuple[Array, Array], kv: Array, indices: Array, *, softmax_scale: float,
                       topk_length: Array | None = None, attn_sink: Array | None = None, out: Array | None = None,
                       lse: Array | None = None, max_logits: Array | None = None, stream: int | None = None,
                       precision: str = "high") -> tuple[Array, Array, Array]:
    """Sparse MLA over bf16 rows. q [s_q, h, 576] (or the pair q_nope [s_q, h, 512], q_pe [s_q, h, 64], read
    in place), kv [s_kv, 576] (or [s_kv, 1, 576]), indices [s_q, topk] int32 rows of kv. Returns
    (out [s_q, h, 512] bf16, lse [s_q, h] f32, max_logits [s_q, h] f32).
    precision: "high" (default) or "fast", as for sparse_mla_decode."""
    q_pe = None
    if isinstance(q, (tuple, list)):
        q, q_pe = _q_pair(q)
    s = launch_stream(q, stream, "q")
    if (out is None or lse is None or max_logits is None) and c_allocates(q, "q"):
        out = _ALLOC if out is None else out
        lse = _ALLOC if lse is None else lse
        max_logits = _ALLOC if max_logits is None else max_logits
    if out is None or lse is None or max_logits is None:
        s_q, h, _ = _shape(q, "q", 3, "[s_q, h, 576]")
        if out is None:
            out = empty(q, (s_q, h, _C.D_V), "bfloat16")
        if lse is None:
            lse = empty(q, (s_q, h), "float32")
        if max_logits is None:
            max_logits = empty(q, (s_q, h), "float32")
    return _C.sparse_mla_prefill(q=q, kv=kv, indices=indices, topk_length=topk_length, attn_sink=attn_sink, out=out,
                                 lse=lse, max_logits=max_logits, softmax_scale=softmax_scale, precision=precision,
                                 stream=s, q_pe=q_pe)
