# Type stub for smla's C extension (csrc/). The functions are the raw bindings behind smla.ops and take
# keyword arguments only (csrc/python/kwargs.c: a positional, unknown, repeated or missing argument is a
# TypeError naming the function and the argument). Optional arrays may be left out or given as None;
# kv_cache_dtype is a canonical name ("bf16" or "fp8_ds_mla": smla.ops.canonical_cache_dtype maps vLLM's
# aliases); precision (the attention ops) is "high" or "fast", required here (smla.ops gives the default);
# stream is an integer handle, and left out it means 0xFFFFFFFFFFFFFFFF, the current stream of the
# framework that owns the first CUDA array (the legacy default stream when none says). The extension
# checks every array and the rules of each op (csrc/core/checks.c). An output argument given as ALLOCATE is
# allocated by the op itself (C-contiguous, with the framework of the op's reference array on its device:
# NumPy, or a type whose DLPack exchange API has an allocator, see can_allocate); the ops that write
# outputs return them as a tuple (the given or allocated arrays, None for an absent optional one). Use the
# functions of smla instead.
from typing import Any

# A NumPy array or any object with __dlpack__ (CPU or CUDA).
_Array = Any

class CudaError(RuntimeError): ...

# Limits and model sizes, defined once in csrc/core/smla.h.
MAX_HEADS: int  # query heads per attention call: 1..MAX_HEADS (128)
MAX_TOPK: int  # indices per query token: 1..MAX_TOPK (2**30 - 1)
D_NOPE: int  # 512, the latent part (kv_lora_rank)
D_ROPE: int  # 64
D_QK: int  # 576
D_V: int  # 512
FP8_ENTRY_BYTES: int  # 656, one fp8_ds_mla cache entry
PRECISIONS: tuple[str, ...]  # ("high", "fast"): the precision= names of the attention ops
ALLOCATE: object  # an output argument the op allocates itself

def can_allocate(array: Any, /) -> bool: ...  # whether an op can allocate outputs like this array

def pack_kv(*, kv_c: _Array, k_pe: _Array, kv_cache: _Array, slot_mapping: _Array, kv_cache_dtype: str,
            scale_rule: str, stream: int = ...) -> None: ...
def unpack_kv(*, kv_cache: _Array, slots: _Array, out: _Array, kv_cache_dtype: str,
              stream: int = ...) -> tuple[_Array]: ...
def gather_upconvert(*, kv_cache: _Array, workspace: _Array, block_table: _Array, seq_lens: _Array,
                     workspace_starts: _Array, seq_starts: _Array | None = None, kv_cache_dtype: str,
                     stream: int = ...) -> None: ...
def convert_topk_indices(*, req_id: _Array, block_table: _Array, topk_indices: _Array, block_size: int,
                         num_blocks: int | None = None, prefill_request_ids: _Array | None = None,
                         prefill_workspace_starts: _Array | None = None, out: _Array,
                         valid_counts: _Array | None = None, stream: int = ...) -> tuple[_Array, _Array | None]: ...
def filter_convert_dcp_indices(*, req_id: _Array, block_table: _Array, topk_indices: _Array, block_size: int,
                               num_blocks: int | None = None, prefill_request_ids: _Array | None = None,
                               prefill_workspace_starts: _Array | None = None, out: _Array,
                               valid_counts: _Array | None = None, stream: int = ..., dcp_size: int, dcp_rank: int,
                               interleave: int, compact: bool) -> tuple[_Array, _Array | None]: ...
def merge_attn_states(*, out_a: _Array, lse_a: _Array, out_b: _Array, lse_b: _Array, out: _Array,
                      out_lse: _Array | None = None, stream: int = ...) -> tuple[_Array, _Array | None]: ...
def sparse_mla_decode(*, q: _Array, kv_cache: _Array, indices: _Array, topk_length: _Array | None = None,
                      attn_sink: _Array | None = None, out: _Array, lse: _Array, workspace: _Array | None = None,
                      softmax_scale: float, kv_cache_dtype: str, precision: str, stream: int = ...,
                      q_pe: _Array | None = None) -> tuple[_Array, _Array]: ...
def sparse_mla_decode_workspace_size(*, b: int, s_q: int, h: int, topk: int, kv_cache_dtype: str,
                                     device: int) -> int: ...
def sparse_mla_prefill(*, q: _Array, kv: _Array, indices: _Array, topk_length: _Array | None = None,
                       attn_sink: _Array | None = None, out: _Array, lse: _Array, max_logits: _Array | None = None,
                       softmax_scale: float, precision: str, stream: int = ...,
                       q_pe: _Array | None = None) -> tuple[_Array, _Array, _Array | None]: ...
def cuda_device_count() -> int: ...
def build_info() -> dict[str, Any]: ...
