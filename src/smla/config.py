"""SparseMLAConfig: the one configuration that a model's SparseMLAAttention layers and its
SparseMLAMetadataBuilder share (docs/design.md section 6), validated once, when it is made.

The layer's widths and head limit are defined here too, once for the Python layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from . import _C
from .ops import _I32_MAX, _int, canonical_cache_dtype

__all__ = ["D_NOPE", "D_QK", "D_ROPE", "D_V", "MAX_HEADS", "MIN_HEADS_FOR_SPLIT", "MODES", "PRECISIONS",
           "SparseMLAConfig", "expect_config", "resolve_mode"]

# Defined once in csrc/core/smla.h and exported by the extension: the head limit (SMLA_MAX_HEADS) and
# DeepSeek-V3.2's latent head (q and k are nope + rope wide, values are the nope part).
MAX_HEADS: int = _C.MAX_HEADS
D_NOPE, D_ROPE, D_QK, D_V = _C.D_NOPE, _C.D_ROPE, _C.D_QK, _C.D_V

# mode="auto" for fp8 caches: "split" (decode kernel for decodes, bf16 prefill kernel over an
# upconverted workspace for prefills) from this many heads up, "mixed" (decode kernel on the fp8
# pages for every token) below. vLLM uses 32 (MIN_HEADS_FOR_BF16_PREFILL); on the H200
# benchmarks/bench_layer.py measured split as fast or faster at every head count it tried
# (h = 16, 64, 128; 1K-16K-token chunks; context 0 and 32K: mixed / split = 1.00-1.30), so split
# is the default for every head count.
MIN_HEADS_FOR_SPLIT = 1

MODES = ("auto", "mixed", "split")
# precision= of the attention ops (docs/design.md section 4): the names the extension accepts, from its
# one table (csrc/python/binding.c), so that a config is checked when it is made, not at its first step.
PRECISIONS: tuple = _C.PRECISIONS


def _precision(precision: Any) -> str:
    if not isinstance(precision, str):
        raise TypeError(f"precision: expected a str, got {type(precision).__name__}")
    if precision not in PRECISIONS:
        names = " or ".join(f'"{p}"' for p in PRECISIONS)
        raise ValueError(f'precision: expected {names}, got "{precision}"')
    return precision


def _plan(num_heads: int, kv_cache_dtype: str, mode: str) -> str:
    """resolve_mode for a canonical cache dtype. "bf16" is accepted back as a mode (a config's
    resolved mode), so that dataclasses.replace of a bf16 config works."""
    if not isinstance(mode, str):
        raise TypeError(f"mode: expected a str, got {type(mode).__name__}")
    if mode not in MODES and not (mode == "bf16" and kv_cache_dtype == "bf16"):
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if kv_cache_dtype == "bf16":
        return "bf16"
    if mode == "auto":
        return "split" if num_heads >= MIN_HEADS_FOR_SPLIT else "mixed"
    return mode


def resolve_mode(num_heads: int, kv_cache_dtype: str, mode: str = "auto") -> str:
    """The attention plan of a layer: "bf16" (bf16 cache: prefill kernel over the paged rows; the
    fp8 mode is ignored), else "mixed" or "split"; "auto" is "split" when num_heads >=
    MIN_HEADS_FOR_SPLIT, else "mixed"."""
    return _plan(num_heads, canonical_cache_dtype(kv_cache_dtype), mode)


@dataclass(frozen=True, kw_only=True)
class SparseMLAConfig:
    """What a model's sparse MLA layers and their metadata builder must agree on. Made once per
    model and handed to both (SparseMLAMetadataBuilder.from_config, SparseMLAAttention.from_config);
    the layer's forward rejects metadata built for another configuration.

    Stored validated: integers as int (anything with __index__; num_heads 1..MAX_HEADS, the sizes
    >= 1), kv_cache_dtype canonical ("bf16" or "fp8_ds_mla", vLLM's aliases accepted) and mode
    resolved ("bf16", "mixed" or "split"; resolve_mode).

    precision ("high" or "fast", docs/design.md section 4) is what the layers pass to the attention
    ops; the metadata does not depend on it, so it takes no part in comparisons: a builder serves
    layers of either precision."""
    num_heads: int
    kv_cache_dtype: str
    block_size: int
    topk: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    mode: str = "auto"
    precision: str = field(default="high", compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: only __post_init__ stores the validated values
        put(self, "num_heads", _int(self.num_heads, "num_heads", 1, MAX_HEADS))
        for name in ("block_size", "topk", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            put(self, name, _int(getattr(self, name), name, 1, _I32_MAX))  # they size int32 arrays
        put(self, "kv_cache_dtype", canonical_cache_dtype(self.kv_cache_dtype))
        put(self, "mode", _plan(self.num_heads, self.kv_cache_dtype, self.mode))
        put(self, "precision", _precision(self.precision))

    @property
    def max_blocks(self) -> int:
        """Block-table width that holds a request of max_model_len tokens."""
        return -(-self.max_model_len // self.block_size)

    def differences(self, other: SparseMLAConfig) -> str:
        """"name: mine vs other's, ..." over the compared fields where the two differ (for messages)."""
        return ", ".join(f"{f.name}: {getattr(self, f.name)!r} vs {getattr(other, f.name)!r}"
                         for f in fields(self) if f.compare and getattr(self, f.name) != getattr(other, f.name))


def expect_config(config: Any) -> SparseMLAConfig:
    """config, checked to be a SparseMLAConfig (the from_config constructors)."""
    if not isinstance(config, SparseMLAConfig):
        raise TypeError(f"config: expected a SparseMLAConfig, got {type(config).__name__}")
    return config
