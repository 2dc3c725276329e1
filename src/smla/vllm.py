"""smla as a vLLM attention backend for DeepSeek-V3.2 sparse MLA (docs/vllm.md is the contract).

vLLM is optional: `import smla` never imports this module, and importing it without vLLM raises an
ImportError that says what to install. Written against vLLM 0.34.0's classes:

- `SmlaSparseMLABackend` (an `AttentionBackend`), registered by `register()` under the name
  `SMLA_SPARSE` (and, with `SMLA_VLLM_OVERRIDE=1` in the environment, also in place of
  `FLASHMLA_SPARSE`); `register` is the `vllm.general_plugins` entry point in pyproject.toml.
- `SmlaSparseMLAMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)` with
  `build(common_prefix_len, common_attn_metadata, fast_build=False)`, on smla's
  `SparseMLAMetadataBuilder`.
- `SmlaSparseMLAImpl` with vLLM's `do_kv_cache_update` (smla.ops.pack_kv) and `forward_mqa` over the
  first n tokens of the step (the decode subset or the whole batch), q whole [n, h, 576] or as the
  pair (ql_nope [n, h, 512], q_pe [n, h, 64]); it returns (out [n, h, 512], lse [n, h]) with lse in
  natural log. Any head count 1..128 runs unpadded; caches "bf16" (vLLM "auto" / "bfloat16") and
  "fp8_ds_mla" (also "fp8", "fp8_e4m3"), 64-token blocks.
- `smla_config(vllm_config, block_size)`: the one SparseMLAConfig of the builder and every impl.

forward_mqa is smla's SparseMLAAttention.attend over tokens (0, n) (the step's tokens are already in
the cache: do_kv_cache_update comes first), so the adapter runs smla's plan for the config: with an
fp8 cache "split" (decodes through the decode kernel, prefills by the bf16 prefill kernel over a
dequantised workspace) or "mixed" (every token through the decode kernel on the fp8 pages), chosen
by mode "auto" from the head count; SMLA_VLLM_MODE=mixed|split forces one (tests, benchmarks).
SMLA_VLLM_PRECISION=high|fast (default high) is the attention ops' precision= (docs/design.md section 4;
"fast" is FlashMLA's recipe, bf16 probabilities in P.V, on the kernels that have it). A q given as the
(ql_nope, q_pe) pair is read in place by the kernels (no concatenation). smla's scratch
(SparseMLAMetadataBuilder.workspace_specs) is reserved through vLLM's workspace manager where one runs and
handed to attend per call (workspaces=), as vLLM hands its workspaces out at each use; without a manager the
builder's own buffers are used. With a manager the builder holds none of that scratch
(workspaces={name: None}), so the memory is reserved once.

CUDA graphs: declared NEVER until the decode path has been captured under vLLM on a GPU (not done:
the development machine has no GPU); smla's own layer preallocates everything a decode step needs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

try:
    import torch
    from vllm.v1.attention.backend import (
        AttentionBackend,
        AttentionCGSupport,
        AttentionMetadata,
        AttentionMetadataBuilder,
        CommonAttentionMetadata,
        MLAAttentionImpl,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
except ImportError as e:  # pragma: no cover - exercised where vLLM is absent
    raise ImportError(
        "smla.vllm needs vLLM (tested with 0.34.0): pip install --no-deps vllm==0.34.0 plus the "
        f"packages of smla's vllm-test extra (docs/vllm.md section 2); the import failed with: {e}") from e

from . import ops
from .config import D_NOPE, D_QK, D_ROPE, SparseMLAConfig
from .layer import SparseMLAAttention
from .metadata import SparseMLAMetadata, SparseMLAMetadataBuilder

__all__ = ["BACKEND_NAME", "SmlaSparseMLABackend", "SmlaSparseMLAImpl", "SmlaSparseMLAMetadata",
           "SmlaSparseMLAMetadataBuilder", "register", "smla_config"]

BACKEND_NAME = "SMLA_SPARSE"
BLOCK_SIZE = 64


def _cache_dtype(kv_cache_dtype: str) -> str:
    """vLLM's cache dtype name -> smla's canonical one ("bf16" or "fp8_ds_mla")."""
    name = ops.CACHE_DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if name not in ("bf16", "fp8_ds_mla"):
        raise ValueError(f"smla's vLLM backend supports the bf16 and fp8_ds_mla caches, got {kv_cache_dtype!r}")
    return name


def smla_config(vllm_config, block_size: int) -> SparseMLAConfig:
    """The model's SparseMLAConfig from vLLM's config, shared by the builder and every impl (the
    layer's attend checks that they agree). mode: $SMLA_VLLM_MODE ("auto" when unset: smla picks
    "split" or "mixed" by head count; "mixed" or "split" force one, for tests and benchmarks).
    precision: $SMLA_VLLM_PRECISION ("high" when unset, or "fast"), passed to every attention op."""
    mc = vllm_config.model_config
    sc = vllm_config.scheduler_config
    topk = getattr(mc.hf_text_config, "index_topk", None)
    if topk is None:
        raise ValueError("smla's sparse backend needs the model's index_topk (a DeepSeek-V3.2-style model)")
    return SparseMLAConfig(
        num_heads=mc.get_num_attention_heads(vllm_config.parallel_config),
        kv_cache_dtype=_cache_dtype(vllm_config.cache_config.cache_dtype), block_size=block_size,
        topk=int(topk), max_model_len=mc.max_model_len, max_num_seqs=sc.max_num_seqs,
        max_num_batched_tokens=sc.max_num_batched_tokens, mode=os.environ.get("SMLA_VLLM_MODE", "auto"),
        precision=os.environ.get("SMLA_VLLM_PRECISION", "high"))


def _scratch_specs(config: SparseMLAConfig, device) -> dict:
    """SparseMLAMetadataBuilder.workspace_specs of a builder on `device` (a torch.device or its name):
    the one list the impl reserves through vLLM's manager and the builder leaves to it."""
    dev = torch.device(device)
    return SparseMLAMetadataBuilder.workspace_specs(
        config, device="cpu" if dev.type != "cuda" else
        (dev.index if dev.index is not None else torch.cuda.current_device()))


# =============================================================================================
# metadata
# =============================================================================================

@dataclass
class SmlaSparseMLAMetadata(AttentionMetadata):
    """One step, as vLLM's layer and smla's impl read it. `smla` is smla's record of the step (its
    arrays are views of the builder's buffers, valid until the next build)."""
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    block_size: int
    topk_tokens: int
    query_start_loc: Any
    seq_lens: Any
    slot_mapping: Any
    block_table: Any
    req_id_per_token: Any
    smla: SparseMLAMetadata
    topk_start: int = 0
    causal: bool = True
    prefill: Any = None  # no dense-MHA prefill metadata: every token takes the sparse path
    decode: Any = None


class SmlaSparseMLAMetadataBuilder(AttentionMetadataBuilder[SmlaSparseMLAMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: ClassVar[Optional[int]] = 1  # decodes first, as smla's builder expects

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.config = smla_config(vllm_config, kv_cache_spec.block_size)
        from vllm.v1.worker.workspace import is_workspace_manager_initialized
        # Where vLLM's workspace manager lends smla's scratch to each forward_mqa (the impl reserves it),
        # the builder holds none of it (None: handed to attend per call), so it is not held twice.
        lent = ({name: None for name in _scratch_specs(self.config, device)}
                if is_workspace_manager_initialized() else None)
        self.smla_builder = SparseMLAMetadataBuilder.from_config(self.config, device=device, workspaces=lent)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> SmlaSparseMLAMetadata:
        cm = common_attn_metadata
        n = cm.num_actual_tokens
        md = self.smla_builder.build(cm.query_start_loc, cm.seq_lens, cm.block_table_tensor,
                                     cm.slot_mapping[:n], query_start_loc_cpu=cm.query_start_loc_cpu)
        return SmlaSparseMLAMetadata(
            num_reqs=cm.num_reqs, num_actual_tokens=n, max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len, num_decodes=md.num_decodes, num_decode_tokens=md.num_decode_tokens,
            num_prefills=md.num_prefills, num_prefill_tokens=md.num_prefill_tokens,
            block_size=self.config.block_size, topk_tokens=self.config.topk,
            query_start_loc=md.query_start_loc, seq_lens=md.seq_lens, slot_mapping=md.slot_mapping,
            block_table=md.block_table, req_id_per_token=md.req_id_per_token, smla=md,
            causal=bool(cm.causal) if isinstance(cm.causal, bool) else True)


# =============================================================================================
# impl
# =============================================================================================

class SmlaSparseMLAImpl(MLAAttentionImpl[SmlaSparseMLAMetadata]):
    is_sparse: ClassVar[bool] = True

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: Optional[list[float]], sliding_window: Optional[int], kv_cache_dtype: str,
                 logits_soft_cap: Optional[float], attn_type: str, kv_sharing_target_layer_name: Optional[str],
                 q_lora_rank: Optional[int], kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 qk_head_dim: int, v_head_dim: int, kv_b_proj: Any, indexer: Optional[object] = None,
                 topk_indices_buffer: Optional[torch.Tensor] = None, index_group_builder: Any = None,
                 q_pad_num_heads: Optional[int] = None) -> None:
        unsupported = [name for name, v in (("alibi_slopes", alibi_slopes), ("sliding_window", sliding_window),
                                            ("logits_soft_cap", logits_soft_cap),
                                            ("index_group_builder", index_group_builder)) if v is not None]
        if unsupported:
            raise NotImplementedError(f"smla's sparse MLA backend does not support {', '.join(unsupported)}")
        if kv_lora_rank != D_NOPE or qk_rope_head_dim != D_ROPE:
            raise NotImplementedError(f"smla needs kv_lora_rank {D_NOPE} and qk_rope_head_dim {D_ROPE}, got "
                                      f"{kv_lora_rank} and {qk_rope_head_dim}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.smla_cache_dtype = _cache_dtype(kv_cache_dtype)
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_head_dim
        self.v_head_dim = v_head_dim
        self.kv_b_proj = kv_b_proj
        self.indexer = indexer
        if topk_indices_buffer is None and indexer is not None:
            topk_indices_buffer = getattr(indexer, "topk_indices_buffer", None)
        self.topk_indices_buffer = topk_indices_buffer
        self.dcp_world_size = 1
        self.need_to_return_lse_for_decode = False
        from vllm.config import get_current_vllm_config
        vc = get_current_vllm_config()
        # the builder's config: vLLM builds both from the same VllmConfig (block size: the cache's)
        cfg = smla_config(vc, vc.cache_config.block_size)
        if cfg.num_heads != num_heads or cfg.kv_cache_dtype != self.smla_cache_dtype:
            raise ValueError(f"num_heads / kv_cache_dtype: the impl has {num_heads} / {kv_cache_dtype!r}, vLLM's "
                             f"config {cfg.num_heads} / {cfg.kv_cache_dtype!r}")
        self.attn = SparseMLAAttention.from_config(cfg, self.scale)
        self.workspace_specs, self._workspace_names = self._workspace_specs(vc)
        if self.workspace_specs:
            from vllm.v1.worker.workspace import current_workspace_manager
            current_workspace_manager().get_simultaneous(*self.workspace_specs)  # counted by profiling

    def _workspace_specs(self, vc) -> tuple[list, list]:
        """smla's scratch (SparseMLAMetadataBuilder.workspace_specs: converted indices, lse and
        max_logits scratch, the split plan's bf16 prefill workspace, the decode kernel's workspace on
        CUDA) as vLLM's [(shape, torch dtype)], reserved through vLLM's
        workspace manager where one is running (vLLM's worker makes it before the model); without
        one, attend uses the builder's own buffers."""
        from vllm.v1.worker.workspace import is_workspace_manager_initialized
        if not is_workspace_manager_initialized():
            return [], []
        specs = _scratch_specs(self.attn.config, vc.device_config.device)
        return [(s.shape, getattr(torch, s.dtype)) for s in specs.values()], list(specs)

    def _workspaces(self) -> Optional[dict]:
        """This use's buffers from vLLM's manager (handed out at each use), by smla's names."""
        if not self.workspace_specs:
            return None
        from vllm.v1.worker.workspace import current_workspace_manager
        return dict(zip(self._workspace_names, current_workspace_manager().get_simultaneous(*self.workspace_specs)))

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor,
                           skip_scale: bool = False) -> None:
        """Writes the step's tokens into the cache (slot -1: not written); k_scale is ignored, as vLLM
        does for fp8_ds_mla (docs/design.md section 3)."""
        if kv_cache.numel() == 0:
            return
        n = slot_mapping.shape[0]
        ops.pack_kv(kv_c_normed[:n], k_pe.reshape(k_pe.shape[0], -1)[:n], kv_cache, slot_mapping,
                    kv_cache_dtype=_cache_dtype(kv_cache_dtype))

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: SmlaSparseMLAMetadata,
                    layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's attend over vLLM's first n tokens of the step (its sparse tokens: the decode
        subset or the whole batch), q [n, h, 576] or the pair; the step's tokens are already in the
        cache (do_kv_cache_update comes first)."""
        if self.topk_indices_buffer is None:
            raise RuntimeError("forward_mqa: no topk_indices_buffer (the indexer's output) was given")
        n = (q[0] if isinstance(q, tuple) else q).shape[0]
        start = attn_metadata.topk_start
        return self.attn.attend(q, kv_c_and_k_pe_cache, self.topk_indices_buffer[start:start + n],
                                attn_metadata.smla, tokens=(0, n), workspaces=self._workspaces())


# =============================================================================================
# backend and registration
# =============================================================================================

class SmlaSparseMLABackend(AttentionBackend):
    supported_dtypes: ClassVar[list] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "bfloat16", "fp8_ds_mla", "fp8", "fp8_e4m3"]
    forward_includes_kv_cache_update: ClassVar[bool] = False

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_builder_cls() -> type[SmlaSparseMLAMetadataBuilder]:
        return SmlaSparseMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type[SmlaSparseMLAImpl]:
        return SmlaSparseMLAImpl

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return [BLOCK_SIZE]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [D_QK]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability.major >= 8  # smla's CUDA kernels: sm_80 and up (sm_90a for the wgmma family)


def register() -> None:
    """The vllm.general_plugins entry point: registers SmlaSparseMLABackend as SMLA_SPARSE, and in
    place of FLASHMLA_SPARSE when SMLA_VLLM_OVERRIDE=1. Safe to call more than once."""
    path = f"{SmlaSparseMLABackend.__module__}.{SmlaSparseMLABackend.__qualname__}"
    if BACKEND_NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum[BACKEND_NAME], path)
    else:
        register_backend(BACKEND_NAME, path)
    if os.environ.get("SMLA_VLLM_OVERRIDE", "0") == "1":
        register_backend(AttentionBackendEnum.FLASHMLA_SPARSE, path)
