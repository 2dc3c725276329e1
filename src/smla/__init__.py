"""smla: sparse MLA attention (DeepSeek-V3.2 DSA) for CPU and CUDA, from NumPy or any DLPack array."""
from __future__ import annotations

# The one version source: pyproject.toml reads this line without importing the package.
__version__ = "0.1.0"

import importlib.util as _importlib_util
import struct as _struct
import sys as _sys
from typing import Any

import ml_dtypes as _ml_dtypes  # noqa: F401  (registers bfloat16 / float8 before the extension loads)

_ASAN_PRELOAD = "LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 python ..."


def _links_asan(path: str) -> bool:
    """True when the ELF shared library at path lists libasan among its needed libraries (DT_NEEDED)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:6] != b"\x7fELF\x02\x01":  # 64-bit little-endian ELF only (what setup.py builds here)
            return False
        shoff, = _struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = _struct.unpack_from("<HH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        # (name, type, flags, addr, offset, size, link, info, addralign, entsize) per section
        sections = [_struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        for sec in sections:
            if sec[1] != 6:  # SHT_DYNAMIC; its sh_link is the string table of the names
                continue
            f.seek(sec[4])
            dynamic = f.read(sec[5])
            names = sections[sec[6]]
            f.seek(names[4])
            strings = f.read(names[5])
            for tag, value in _struct.iter_unpack("<qQ", dynamic):
                if tag == 1 and strings[value:strings.index(b"\0", value)].startswith(b"libasan"):  # DT_NEEDED
                    return True
    return False


def _check_sanitizer_runtime() -> None:
    """An SMLA_DEBUG=1 build links AddressSanitizer, whose runtime must be loaded before anything else:
    loading the extension without it preloaded ends the process at once (no exception to catch), so we
    look at the library first and raise an ImportError that says how to start Python instead."""
    if not _sys.platform.startswith("linux"):
        return
    spec = _importlib_util.find_spec(__name__ + "._C")
    if spec is None or not spec.origin:
        return  # the import below reports the missing extension
    with open("/proc/self/maps") as maps:
        if "libasan" in maps.read():
            return
    if _links_asan(spec.origin):
        raise ImportError(
            f"smla._C at {spec.origin} is an SMLA_DEBUG=1 build (AddressSanitizer), which loads only when "
            f"libasan is preloaded: start Python as `{_ASAN_PRELOAD}`, or rebuild without SMLA_DEBUG")


_check_sanitizer_runtime()

from . import _C  # noqa: E402
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
from .config import D_NOPE, D_QK, D_ROPE, D_V, MAX_HEADS, SparseMLAConfig  # noqa: F401  (public constants)
from .layer import SparseMLAAttention
from .metadata import (
    SparseMLAMetadata,
    SparseMLAMetadataBuilder,
    req_id_per_token,
    split_decodes_and_prefills,
    split_prefill_chunks,
)

FP8_ENTRY_BYTES = kv_cache_shape(0, 1, "fp8_ds_mla")[2]  # kv_cache_shape owns the cache layouts


def cuda_available() -> bool:
    """True when smla was built with CUDA and a GPU is usable now."""
    return _C.cuda_device_count() > 0


def build_info() -> dict[str, Any]:
    """How the extension was built: CUDA or not, CUDA runtime/driver, target archs, debug, ablation (a
    profiling build, SMLA_PROFILE_BUILD=1: stages can be switched off for timing), compiler, and
    the CPU level the next op runs (cpu_isa: SMLA_CPU_ISA if set, within what the CPU has) and the
    default level of this machine (cpu_isa_default)."""
    info = dict(_C.build_info())
    info["version"] = __version__
    info["cuda_devices"] = _C.cuda_device_count()
    return info


__all__ = [
    "CudaError", "SparseMLAAttention", "SparseMLAConfig", "SparseMLAMetadata", "SparseMLAMetadataBuilder", "build_info",
    "metadata", "req_id_per_token", "split_decodes_and_prefills", "split_prefill_chunks", "convert_topk_indices", "cuda_available", "filter_convert_dcp_indices",
    "gather_upconvert", "kv_cache_shape", "merge_attn_states", "pack_kv", "sparse_mla_decode",
    "sparse_mla_decode_workspace_size", "sparse_mla_prefill", "unpack_kv",
]
