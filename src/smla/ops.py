"""Public ops (docs/design.md section 4): validate nothing here beyond what needs Python, allocate missing
outputs with the caller's framework, pick the launch stream, and call the C extension."""
from . import _C
from ._arrays import device, empty, is_cuda, launch_stream

_ENTRY = {"bf16": 576, "fp8_ds_mla": 656}
_ALIASES = {"bfloat16": "bf16", "auto": "bf16", "fp8": "fp8_ds_mla", "fp8_e4m3": "fp8_ds_mla"}


def _cache_dtype(name):
    name = _ALIASES.get(name, name)
    if name not in _ENTRY:
        raise ValueError(f'kv_cache_dtype: expected "bf16" or "fp8_ds_mla", got {name!r}')
    return name


def kv_cache_shape(num_blocks, block_size, kv_cache_dtype):
    """Shape of a cache of this layout: (num_blocks, block_size, 656) uint8 for fp8_ds_mla,
    (num_blocks, block_size, 576) bfloat16 for bf16."""
    if num_blocks < 0 or block_size < 1:
        raise ValueError(f"kv_cache_shape: invalid num_blocks={num_blocks}, block_size={block_size}")
    return (int(num_blocks), int(block_size), _ENTRY[_cache_dtype(kv_cache_dtype)])


def pack_kv(kv_c, k_pe, kv_cache, slot_mapping, *, kv_cache_dtype, scale_rule="pow2", stream=None):
    """Write kv_c[T, 512] and k_pe[T, 64] (bf16) into kv_cache at slot_mapping[T] (negative: skipped).
    Returns kv_cache."""
    _C.pack_kv(kv_c, k_pe, kv_cache, slot_mapping, _cache_dtype(kv_cache_dtype), scale_rule,
               launch_stream(kv_cache, stream))
    return kv_cache


def unpack_kv(kv_cache, slots, *, kv_cache_dtype, out=None, stream=None):
    """Dequantised rows [n, 576] bf16 of the given slots (invalid slots give zeros)."""
    if out is None:
        out = empty(kv_cache, (slots.shape[0], 576), "bfloat16")
    _C.unpack_kv(kv_cache, slots, out, _cache_dtype(kv_cache_dtype), launch_stream(kv_cache, stream))
    return out


def gather_upconvert(kv_cache, workspace, block_table, seq_lens, workspace_starts, *, seq_starts=None,
                     kv_cache_dtype="fp8_ds_mla", stream=None):
    """workspace[workspace_starts[r] + i] = dequantised token seq_starts[r] + i of request r, for
    i < seq_lens[r]. Returns workspace."""
    _C.gather_upconvert(kv_cache, workspace, block_table, seq_lens, workspace_starts, seq_starts,
                        _cache_dtype(kv_cache_dtype), launch_stream(kv_cache, stream))
    return workspace


def convert_topk_indices(req_id, block_table, topk_indices, *, block_size, num_blocks=None,
                         prefill_request_ids=None, prefill_workspace_starts=None, return_valid_counts=False,
                         out=None, valid_counts=None, stream=None):
    """Request-local top-k positions -> global cache slots (or prefill workspace rows); -1 = none.
    num_blocks: the cache's block count; a selected token whose block id is >= it raises ValueError on
    the CPU and gives -1 on the GPU (None: no such check)."""
    if out is None:
        out = empty(topk_indices, topk_indices.shape, "int32")
    if return_valid_counts and valid_counts is None:
        valid_counts = empty(topk_indices, (topk_indices.shape[0],), "int32")
    _C.convert_topk_indices(req_id, block_table, topk_indices, int(block_size), num_blocks, prefill_request_ids,
                            prefill_workspace_starts, out, valid_counts, launch_stream(topk_indices, stream))
    return (out, valid_counts) if return_valid_counts else out


def filter_convert_dcp_indices(req_id, block_table, topk_indices, *, block_size, dcp_size, dcp_rank,
                               interleave=1, compact=True, num_blocks=None, prefill_request_ids=None,
                               prefill_workspace_starts=None, out=None, valid_counts=None, stream=None):
    """Decode context parallelism: keep this rank's tokens (owner (g // interleave) % dcp_size), map
    them to local positions and convert; compact moves the valid ones to the front. num_blocks: this
    rank's cache block count, as in convert_topk_indices. Returns (out, valid_counts)."""
    if out is None:
        out = empty(topk_indices, topk_indices.shape, "int32")
    if valid_counts is None:
        valid_counts = empty(topk_indices, (topk_indices.shape[0],), "int32")
    _C.filter_convert_dcp_indices(req_id, block_table, topk_indices, int(block_size), num_blocks,
                                  prefill_request_ids, prefill_workspace_starts, out, valid_counts, int(dcp_size),
                                  int(dcp_rank), int(interleave), bool(compact), launch_stream(topk_indices, stream))
    return out, valid_counts


def merge_attn_states(out_a, lse_a, out_b, lse_b, *, out=None, out_lse=None, stream=None):
    """lse-weighted merge of two partial attention results [n, h, d] (natural-log lse [n, h]).
    Returns (out, lse); out has the inputs' dtype."""
    if out is None:
        out = empty(out_a, out_a.shape, _dtype_name(out_a))
    if out_lse is None:
        out_lse = empty(out_a, lse_a.shape, "float32")
    _C.merge_attn_states(out_a, lse_a, out_b, lse_b, out, out_lse, launch_stream(out_a, stream))
    return out, out_lse


def _dtype_name(x):
    name = str(x.dtype).replace("torch.", "")
    return "bfloat16" if name in ("bfloat16", "uint16") else name


def sparse_mla_decode_workspace_size(b, s_q, h, topk, kv_cache_dtype="fp8_ds_mla", *, device_id=0):
    """Bytes of scratch sparse_mla_decode uses on CUDA for this shape (split top-k partials)."""
    return _C.sparse_mla_decode_workspace_size(int(b), int(s_q), int(h), int(topk),
                                               _cache_dtype(kv_cache_dtype), int(device_id))


def sparse_mla_decode(q, kv_cache, indices, *, softmax_scale, kv_cache_dtype, topk_length=None,
                      attn_sink=None, out=None, lse=None, workspace=None, stream=None):
    """Sparse MLA over a paged cache. q [b, s_q, h, 576] bf16, indices [b, s_q, topk] int32 global slots
    (invalid ones ignored). Returns (out [b, s_q, h, 512] bf16, lse [b, s_q, h] f32, natural log)."""
    cdt = _cache_dtype(kv_cache_dtype)
    if len(q.shape) != 4:
        raise ValueError(f"q: expected 4 dimensions [b, s_q, h, 576], got {len(q.shape)}")
    b, s_q, h = (int(v) for v in q.shape[:3])
    if out is None:
        out = empty(q, (b, s_q, h, 512), "bfloat16")
    if lse is None:
        lse = empty(q, (b, s_q, h), "float32")
    if workspace is None and is_cuda(q) and len(indices.shape) == 3:
        size = _C.sparse_mla_decode_workspace_size(b, s_q, max(1, min(h, 128)), max(1, int(indices.shape[2])),
                                                   cdt, device(q)[1])
        if size > 0:
            workspace = empty(q, (size,), "uint8")
    _C.sparse_mla_decode(q, kv_cache, indices, topk_length, attn_sink, out, lse, workspace, float(softmax_scale),
                         cdt, launch_stream(q, stream))
    return out, lse


def sparse_mla_prefill(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, out=None, lse=None,
                       max_logits=None, stream=None):
    """Sparse MLA over bf16 rows. q [s_q, h, 576], kv [s_kv, 576] (or [s_kv, 1, 576]), indices [s_q, topk]
    int32 rows of kv. Returns (out [s_q, h, 512] bf16, lse [s_q, h] f32, max_logits [s_q, h] f32)."""
    if len(q.shape) != 3:
        raise ValueError(f"q: expected 3 dimensions [s_q, h, 576], got {len(q.shape)}")
    s_q, h = int(q.shape[0]), int(q.shape[1])
    if out is None:
        out = empty(q, (s_q, h, 512), "bfloat16")
    if lse is None:
        lse = empty(q, (s_q, h), "float32")
    if max_logits is None:
        max_logits = empty(q, (s_q, h), "float32")
    _C.sparse_mla_prefill(q, kv, indices, topk_length, attn_sink, out, lse, max_logits, float(softmax_scale),
                          launch_stream(q, stream))
    return out, lse, max_logits
