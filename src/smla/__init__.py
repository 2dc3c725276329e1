"""smla: sparse MLA attention (DeepSeek-V3.2 DSA) for CPU and CUDA, from NumPy or any DLPack array."""
import ml_dtypes as _ml_dtypes  # noqa: F401  (registers bfloat16 / float8 before the extension loads)

from . import _C
from ._C import CudaError
from .ops import (
    convert_topk_indices,
    filter_convert_dcp_indices,
    gather_upconvert,
    kv_cache_shape,
    merge_attn_states,
    pack_kv,
    sparse_mla_decode,
    sparse_mla_decode_workspace_size,
    sparse_mla_prefill,
    unpack_kv,
)

from . import metadata
from .layer import SparseMLAAttention
from .metadata import (
    SparseMLAMetadata,
    SparseMLAMetadataBuilder,
    req_id_per_token,
    split_decodes_and_prefills,
    split_prefill_chunks,
)

__version__ = "0.1.0"

D_NOPE, D_ROPE, D_QK, D_V = 512, 64, 576, 512
FP8_ENTRY_BYTES = 656


def cuda_available():
    """True when smla was built with CUDA and a GPU is usable now."""
    return _C.cuda_device_count() > 0


def build_info():
    """How the extension was built: CUDA or not, CUDA runtime/driver, target archs, debug, compiler, and
    the CPU level the next op runs (cpu_isa: SMLA_CPU_ISA if set, within what the CPU has) and the
    default level of this machine (cpu_isa_default)."""
    info = dict(_C.build_info())
    info["version"] = __version__
    info["cuda_devices"] = _C.cuda_device_count()
    return info


__all__ = [
    "CudaError", "SparseMLAAttention", "SparseMLAMetadata", "SparseMLAMetadataBuilder", "build_info",
    "metadata", "req_id_per_token", "split_decodes_and_prefills", "split_prefill_chunks", "convert_topk_indices", "cuda_available", "filter_convert_dcp_indices",
    "gather_upconvert", "kv_cache_shape", "merge_attn_states", "pack_kv", "sparse_mla_decode",
    "sparse_mla_decode_workspace_size", "sparse_mla_prefill", "unpack_kv",
]
