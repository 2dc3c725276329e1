"""smla.vllm driven through the real vLLM classes (docs/vllm.md), the way vLLM's
tests/v1/attention/test_sparse_mla_backends.py drives a sparse backend: a real VllmConfig, the
builder from a CommonAttentionMetadata of a mixed decode/prefill batch, do_kv_cache_update, then
forward_mqa (smla's SparseMLAAttention.attend) on the decode subset with q as a pair and on the whole
batch with q whole, compared with the float64 oracle: the bf16 cache's plan and the fp8 cache's
"mixed" and "split" plans (forced by SMLA_VLLM_MODE), with and without vLLM's workspace manager.

Skips where vLLM is not installed (install: the vllm-test extra, then
pip install --no-deps vllm==0.34.0). No stand-in vLLM classes are used."""
import json

import numpy as np
import pytest

import reference as rp

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="vLLM is not installed (docs/vllm.md: the vllm-test extra, then "
                                   "pip install --no-deps vllm==0.34.0)")
try:
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                             VllmConfig, set_current_vllm_config)
    from vllm.v1.attention.backend import (AttentionBackend, AttentionMetadataBuilder, CommonAttentionMetadata,
                                           MLAAttentionImpl)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm.v1.worker import workspace as vllm_workspace

    import smla.vllm as sv
except ImportError as e:  # vLLM present but one of its import-time dependencies is not
    pytest.skip(f"vLLM is installed but its attention backends do not import: {e}", allow_module_level=True)

BS = 64
TOPK = 64
MAX_MODEL_LEN = 1024
NUM_BLOCKS = 24


def _vllm_config(tmp_path, h, cache_dtype):
    """A real VllmConfig of a small DeepSeek-V3.2-shaped model, offline (a config.json only)."""
    cfg = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "hidden_size": 1024,
           "intermediate_size": 2048, "moe_intermediate_size": 256, "num_hidden_layers": 1,
           "num_attention_heads": h, "num_key_value_heads": h, "q_lora_rank": 256, "kv_lora_rank": 512,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "index_topk": TOPK,
           "index_n_heads": 4, "index_head_dim": 128, "vocab_size": 1024,
           "max_position_embeddings": 4096, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "n_shared_experts": 1, "first_k_dense_replace": 1, "torch_dtype": "bfloat16",
           "rope_theta": 10000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = ModelConfig(model=str(tmp_path), tokenizer=str(tmp_path), skip_tokenizer_init=True, dtype="bfloat16",
                     max_model_len=MAX_MODEL_LEN)
    # The PyPI wheel is a CUDA build: without a GPU vLLM's platform is "unspecified", so the device
    # is given; VLLM_TARGET_DEVICE=cpu would need triton-cpu (docs/vllm.md section 1).
    return VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS, cache_dtype=cache_dtype),
                      scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                                       max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False),
                      parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"))


def _bits(t):
    """bf16 torch tensor -> uint16 NumPy bits (what tests/reference.py reads)."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def _bf16(rng, shape, scale=0.5):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).to(torch.bfloat16)


def test_backend_is_a_real_vllm_backend():
    be = sv.SmlaSparseMLABackend
    assert issubclass(be, AttentionBackend)
    assert issubclass(be.get_builder_cls(), AttentionMetadataBuilder)
    assert issubclass(be.get_impl_cls(), MLAAttentionImpl)
    assert not be.__abstractmethods__ and not be.get_builder_cls().__abstractmethods__
    assert not be.get_impl_cls().__abstractmethods__
    assert be.is_mla() and be.is_sparse() and be.get_name() == "SMLA_SPARSE"
    for d in ("auto", "bfloat16", "fp8_ds_mla", "fp8"):
        assert be.supports_kv_cache_dtype(d)
    assert be.get_supported_kernel_block_sizes() == [BS]
    # what vLLM's CUDA platform asks of a selected backend (no reasons = accepted)
    from vllm.platforms.interface import DeviceCapability
    for d in ("auto", "fp8_ds_mla"):
        assert be.validate_configuration(
            head_size=576, dtype=torch.bfloat16, kv_cache_dtype=d, block_size=BS, use_mla=True, has_sink=False,
            use_sparse=True, use_mm_prefix=False, use_per_head_quant_scales=False,
            device_capability=DeviceCapability(9, 0), attn_type="decoder") == []
    assert be.validate_configuration(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=BS, use_mla=True, has_sink=False,
        use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 0), attn_type="decoder")  # a dense model is refused
    sv.register()
    sv.register()  # plugins may be loaded more than once
    assert AttentionBackendEnum["SMLA_SPARSE"].get_class() is be


def test_smla_config_mode(tmp_path, monkeypatch):
    """One SparseMLAConfig from vLLM's config for the builder and the impl; mode "auto" unless
    SMLA_VLLM_MODE forces one."""
    from smla.config import resolve_mode
    monkeypatch.delenv("SMLA_VLLM_MODE", raising=False)
    vc = _vllm_config(tmp_path, 16, "fp8_ds_mla")
    cfg = sv.smla_config(vc, BS)
    assert (cfg.num_heads, cfg.kv_cache_dtype, cfg.block_size, cfg.topk, cfg.max_num_batched_tokens) == \
        (16, "fp8_ds_mla", BS, TOPK, 256)
    assert cfg.mode == resolve_mode(16, "fp8_ds_mla", "auto")
    monkeypatch.setenv("SMLA_VLLM_MODE", "mixed")
    assert sv.smla_config(vc, BS).mode == "mixed"
    monkeypatch.setenv("SMLA_VLLM_MODE", "fast")
    with pytest.raises(ValueError, match="mode"):
        sv.smla_config(vc, BS)


def test_smla_config_precision(tmp_path, monkeypatch):
    """precision "high" unless SMLA_VLLM_PRECISION says "fast"; the impl's layer passes it on."""
    monkeypatch.delenv("SMLA_VLLM_MODE", raising=False)
    monkeypatch.delenv("SMLA_VLLM_PRECISION", raising=False)
    vc = _vllm_config(tmp_path, 16, "fp8_ds_mla")
    assert sv.smla_config(vc, BS).precision == "high"
    monkeypatch.setenv("SMLA_VLLM_PRECISION", "fast")
    cfg = sv.smla_config(vc, BS)
    assert cfg.precision == "fast" and cfg == sv.smla_config(vc, BS)
    monkeypatch.setenv("SMLA_VLLM_PRECISION", "medium")
    with pytest.raises(ValueError, match='^precision: expected "high" or "fast", got "medium"$'):
        sv.smla_config(vc, BS)


@pytest.mark.parametrize("use_workspace_manager", [False, True], ids=["own-alloc", "vllm-workspace"])
@pytest.mark.parametrize("h", [16, 20])
@pytest.mark.parametrize("cache_dtype,mode", [("auto", "auto"), ("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split")],
                         ids=["bf16", "fp8-mixed", "fp8-split"])
def test_mixed_batch_against_oracle(tmp_path, monkeypatch, cache_dtype, mode, h, use_workspace_manager):
    rng = np.random.default_rng(1000 + h + 7 * (cache_dtype == "auto") + 3 * use_workspace_manager)
    smla_dtype = "bf16" if cache_dtype == "auto" else "fp8_ds_mla"
    monkeypatch.setenv("SMLA_VLLM_MODE", mode)  # the plan forward_mqa runs (the bf16 cache has its own)
    vc = _vllm_config(tmp_path, h, cache_dtype)
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                            cache_dtype_str=cache_dtype)

    # the batch, decodes first (vLLM's reorder): 2 decodes, 2 prefills (one with context, one without)
    ctx = np.array([70, 130, 65, 0])
    qlen = np.array([1, 1, 5, 40])
    seq = ctx + qlen
    R, T, nd = len(qlen), int(qlen.sum()), 2
    qsl = np.concatenate([[0], np.cumsum(qlen)]).astype(np.int32)
    M = MAX_MODEL_LEN // BS
    perm = rng.permutation(NUM_BLOCKS).astype(np.int32)
    bt = np.zeros((R, M), np.int32)
    used = 0
    for r in range(R):
        nb = -(-int(seq[r]) // BS)
        bt[r, :nb] = perm[used:used + nb]
        used += nb
    assert used <= NUM_BLOCKS

    def slot(r, pos):
        pos = np.asarray(pos)
        return np.where(pos >= 0, bt[r, np.maximum(pos, 0) // BS] * BS + np.maximum(pos, 0) % BS, -1)

    if smla_dtype == "bf16":
        kv_cache = torch.zeros((NUM_BLOCKS, BS, 576), dtype=torch.bfloat16)
    else:
        kv_cache = torch.zeros((NUM_BLOCKS, BS, 656), dtype=torch.uint8)

    topk_buf = torch.full((vc.scheduler_config.max_num_batched_tokens, TOPK), -1, dtype=torch.int32)
    step_pos = np.concatenate([np.arange(ctx[r], seq[r]) for r in range(R)])
    req_of = np.repeat(np.arange(R), qlen)
    for t in range(T):  # each token selects up to TOPK causal positions, some rows partly empty
        p = int(step_pos[t])
        k = min(TOPK, p + 1) - (t % 3)
        topk_buf[t, :max(k, 1)] = torch.from_numpy(rng.permutation(p + 1)[:max(k, 1)].astype(np.int32))

    if use_workspace_manager:
        vllm_workspace.init_workspace_manager(torch.device("cpu"))
    try:
        with set_current_vllm_config(vc):
            builder = sv.SmlaSparseMLABackend.get_builder_cls()(spec, ["layer.0"], vc, torch.device("cpu"))
            impl = sv.SmlaSparseMLABackend.get_impl_cls()(
                num_heads=h, head_size=576, scale=576 ** -0.5, num_kv_heads=1, alibi_slopes=None,
                sliding_window=None, kv_cache_dtype=cache_dtype, logits_soft_cap=None, attn_type="decoder",
                kv_sharing_target_layer_name=None, q_lora_rank=256, kv_lora_rank=512, qk_nope_head_dim=128,
                qk_rope_head_dim=64, qk_head_dim=192, v_head_dim=128, kv_b_proj=None,
                topk_indices_buffer=topk_buf)
        assert bool(impl.workspace_specs) == use_workspace_manager
        # with vLLM's manager lending the scratch, smla's builder holds none of it (not held twice)
        assert builder.smla_builder._per_call == (frozenset(impl._workspace_names) if use_workspace_manager
                                                  else frozenset())
        assert impl.attn.config == builder.config
        assert impl.attn.mode == ("bf16" if smla_dtype == "bf16" else mode)

        # the context, written by earlier steps
        ctx_slots = np.concatenate([slot(r, np.arange(ctx[r])) for r in range(R)]).astype(np.int64)
        n_ctx = len(ctx_slots)
        impl.do_kv_cache_update(_bf16(rng, (n_ctx, 512)), _bf16(rng, (n_ctx, 64)), kv_cache,
                                torch.from_numpy(ctx_slots), cache_dtype, torch.ones(()))

        # this step: the builder, then the cache write of the step's tokens
        step_slots = np.concatenate([slot(r, np.arange(ctx[r], seq[r])) for r in range(R)]).astype(np.int64)
        cm = CommonAttentionMetadata(
            query_start_loc=torch.from_numpy(qsl), query_start_loc_cpu=torch.from_numpy(qsl.copy()),
            seq_lens=torch.from_numpy(seq.astype(np.int32)), num_reqs=R, num_actual_tokens=T,
            max_query_len=int(qlen.max()), max_seq_len=int(seq.max()), block_table_tensor=torch.from_numpy(bt),
            slot_mapping=torch.from_numpy(step_slots))
        md = builder.build(0, cm)
        assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (nd, nd, R - nd)

        kv_c, k_pe = _bf16(rng, (T, 512)), _bf16(rng, (T, 64))
        before = kv_cache.clone()
        impl.do_kv_cache_update(kv_c, k_pe, kv_cache, cm.slot_mapping, cache_dtype, torch.ones(()))
        expect = before.numpy().copy() if smla_dtype == "fp8_ds_mla" else _bits(before).copy()
        rp.pack_kv(_bits(kv_c), _bits(k_pe), expect, step_slots, smla_dtype)
        got = kv_cache.numpy() if smla_dtype == "fp8_ds_mla" else _bits(kv_cache)
        assert np.array_equal(got, expect), "do_kv_cache_update: cache bytes differ from the oracle's pack"

        # the oracle over the whole step
        q = _bf16(rng, (T, h, 576))
        gslots = np.stack([slot(req_of[t], topk_buf[t].numpy()) for t in range(T)]).astype(np.int32)
        ref_out, ref_lse = rp.sparse_mla_decode_ref(_bits(q)[None], got, gslots[None], 576 ** -0.5, smla_dtype)
        ref_out, ref_lse = ref_out[0], ref_lse[0]

        def check(out, lse, n):
            assert tuple(out.shape) == (n, h, 512) and out.dtype == torch.bfloat16
            assert tuple(lse.shape) == (n, h) and lse.dtype == torch.float32
            rp.check_close(out.float().numpy(), ref_out[:n], abs_tol=rp.OUT_ABS, rel_tol=rp.OUT_REL,
                           cos_tol=rp.OUT_COS, name="out")
            rp.check_close(lse.numpy(), ref_lse[:n], abs_tol=rp.LSE_ABS, rel_tol=rp.LSE_REL, name="lse")

        # the decode subset, q as vLLM's (ql_nope, q_pe) pair
        out, lse = impl.forward_mqa((q[:nd, :, :512], q[:nd, :, 512:]), kv_cache, md, None)
        check(out, lse, nd)
        # the whole batch, q as one tensor
        out, lse = impl.forward_mqa(q, kv_cache, md, None)
        check(out, lse, T)
        if use_workspace_manager:  # attend ran on vLLM's buffers (the same views at each use)
            ws = impl._workspaces()
            assert (ws["indices"][:T] >= 0).any(), "the converted indices went elsewhere"
            assert not np.shares_memory(ws["indices"].numpy(), np.asarray(md.smla.indices))
            if mode == "split":
                assert ws["prefill_workspace"].view(torch.int16).any()
    finally:
        if use_workspace_manager:
            vllm_workspace.reset_workspace_manager()
