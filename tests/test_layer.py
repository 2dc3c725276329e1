"""SparseMLAAttention end to end: random serving steps (decode only, prefill only, mixed) through
SparseMLAMetadataBuilder + forward, against a float64 oracle that gathers each token's top-k rows
from the tokens written so far (tests/reference.py), on NumPy; the same on CUDA with torch and CuPy,
and a decode step captured in a CUDA graph."""
import dataclasses
import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import reference as rp
import smla
from smla import layer as layer_mod
from test_sparse_mla_decode import assert_fast_runs_bf16_p
from smla.layer import SparseMLAAttention
from smla.metadata import SparseMLAConfig, SparseMLAMetadataBuilder

BF16 = ml_dtypes.bfloat16
SCALE = 192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2  # DeepSeek-V3.2's model scale (YaRN mscale)


class World:
    """A paged cache plus, per request, every token written so far (kv_c / k_pe as bf16), so the
    oracle can rebuild any token's K row independently of the kernels."""

    def __init__(self, rng, kv_cache_dtype, *, block_size=16, max_model_len=512, max_reqs=8,
                 interleave=1):
        self.rng, self.kv_cache_dtype, self.bs = rng, kv_cache_dtype, block_size
        self.max_model_len, self.max_reqs = max_model_len, max_reqs
        bpr = -(-max_model_len // block_size)
        num_blocks = max_reqs * bpr + 3
        self.block_table = rng.permutation(num_blocks)[:max_reqs * bpr].reshape(max_reqs, bpr).astype(np.int32)
        shape = smla.kv_cache_shape(num_blocks, block_size, kv_cache_dtype)
        dt = np.uint8 if kv_cache_dtype == "fp8_ds_mla" else BF16
        if interleave > 1:  # another layer's pages sit between this layer's blocks
            self.cache = np.zeros((num_blocks, interleave) + shape[1:], dt)[:, 0]
        else:
            self.cache = np.zeros(shape, dt)
        self.kv_c = [np.zeros((0, 512), BF16) for _ in range(max_reqs)]
        self.k_pe = [np.zeros((0, 64), BF16) for _ in range(max_reqs)]

    def rand(self, shape, scale=0.5):
        return (self.rng.standard_normal(shape) * scale).astype(BF16)

    def slots(self, r, pos):
        pos = np.asarray(pos, np.int64)
        return self.block_table[r, pos // self.bs].astype(np.int64) * self.bs + pos % self.bs

    def write_context(self, r, n):
        """n earlier tokens of request r, written by an earlier step (with smla.pack_kv)."""
        kv_c, k_pe = self.rand((n, 512)), self.rand((n, 64))
        start = self.kv_c[r].shape[0]
        smla.pack_kv(kv_c, k_pe, self.cache, self.slots(r, np.arange(start, start + n)),
                     kv_cache_dtype=self.kv_cache_dtype)
        self.kv_c[r] = np.concatenate([self.kv_c[r], kv_c])
        self.k_pe[r] = np.concatenate([self.k_pe[r], k_pe])

    def step(self, reqs, h, topk, *, pad=0, empty_rows=0):
        """A step of (request, query length) pairs, decodes first. The step's tokens are recorded
        as written (the layer writes them); returns the layer inputs and the oracle's inputs."""
        rng = self.rng
        q_lens = [q for _, q in reqs]
        T = sum(q_lens)
        kv_c, k_pe = self.rand((T + pad, 512)), self.rand((T + pad, 64))
        q = self.rand((T + pad, h, 576))
        topk_idx = np.full((T + pad, topk), -1, np.int32)
        slot_mapping = np.full(T + pad, -1, np.int64)
        seq_lens, req_of, pos_of = [], [], []
        t = 0
        for (r, ql) in reqs:
            start = self.kv_c[r].shape[0]
            seq_lens.append(start + ql)
            slot_mapping[t:t + ql] = self.slots(r, np.arange(start, start + ql))
            self.kv_c[r] = np.concatenate([self.kv_c[r], kv_c[t:t + ql]])
            self.k_pe[r] = np.concatenate([self.k_pe[r], k_pe[t:t + ql]])
            for j in range(ql):
                p = start + j  # the token's own position: the indexer picks from [0, p]
                n = min(topk, p + 1) if rng.random() < 0.8 else int(rng.integers(1, min(topk, p + 1) + 1))
                sel = rng.choice(p + 1, n, replace=False).astype(np.int32)
                topk_idx[t, :n] = sel
                if rng.random() < 0.3:
                    rng.shuffle(topk_idx[t])  # -1 entries anywhere in the row
                req_of.append(r)
                pos_of.append(p)
                t += 1
        for t in rng.choice(T, min(empty_rows, T), replace=False):
            topk_idx[t] = -1
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        bt = self.block_table[[r for r, _ in reqs]]
        width = -(-max(seq_lens) // self.bs)
        bt = np.ascontiguousarray(bt[:, :int(rng.integers(width, bt.shape[1] + 1))])
        return dict(q=q, kv_c=kv_c, k_pe=k_pe, topk=topk_idx, qsl=qsl,
                    seq_lens=np.array(seq_lens, np.int32), block_table=bt, slot_mapping=slot_mapping,
                    req_of=np.array(req_of), T=T)

    def expected(self, st, return_abs=False):
        """Oracle out [T, h, 512], lse [T, h] (float64) of the step's real tokens; with return_abs also
        the output with V replaced by |V| (precision "fast"'s rule)."""
        T = st["T"]
        idx = st["topk"][:T].astype(np.int64)
        reqs = np.unique(st["req_of"])
        base = {}
        off = 0
        for r in reqs:
            base[r] = off
            off += self.kv_c[r].shape[0]
        all_c = np.concatenate([self.kv_c[r] for r in reqs])
        all_pe = np.concatenate([self.k_pe[r] for r in reqs])
        gid = np.where(idx >= 0, idx + np.array([base[r] for r in st["req_of"]])[:, None], -1)
        uniq, inv = np.unique(gid[gid >= 0], return_inverse=True)
        c, pe = rp.as_bf16_bits(all_c[uniq]), rp.as_bf16_bits(all_pe[uniq])
        if self.kv_cache_dtype == "fp8_ds_mla":
            rows = rp.unpack_fp8_ds_mla(rp.pack_fp8_ds_mla(c, pe))
        else:
            rows = np.concatenate([c, pe], axis=1)
        local = np.full(gid.shape, -1, np.int64)
        local[gid >= 0] = inv.reshape(-1)
        res = rp.sparse_mla_attention(st["q"][:T, None], rows, local[:, None], len(uniq), SCALE,
                                      return_abs=return_abs)
        return (res[0][:, 0], res[1][:, 0]) + ((res[3][:, 0],) if return_abs else ())


def check(out, lse, ref_out, ref_lse, prefill_kernel, name, precision="high", out_abs=None):
    """docs/design.md's tolerances for the kernel that produced each token (bool mask prefill_kernel) and
    the precision ("fast" needs out_abs, World.expected(return_abs=True)'s third array)."""
    out, lse = rp.as_f64(out), np.asarray(lse, np.float64)
    for mask, kind in ((~prefill_kernel, "decode"), (prefill_kernel, "prefill")):
        if not mask.any():
            continue
        o_abs = None if out_abs is None else out_abs[mask]
        if kind == "decode":
            rp.check_decode(out[mask], lse[mask], ref_out[mask], ref_lse[mask], name=f"{name} ({kind})",
                            precision=precision, out_abs=o_abs)
        else:
            rp.check_close(out[mask], ref_out[mask], **rp.out_rule(precision, o_abs, prefill=True),
                           name=f"{name} out ({kind})")
            rp.check_close(lse[mask], ref_lse[mask], abs_tol=rp.PREFILL_LSE_ABS, rel_tol=rp.PREFILL_LSE_REL,
                           name=f"{name} lse ({kind})")


def prefill_kernel_mask(attn, md, T, cache):
    """Which tokens the layer sends to the prefill kernel."""
    if attn.mode == "bf16":
        return np.full(T, smla.layer._flat_rows(cache) is not None)
    if attn.mode == "mixed":
        return np.zeros(T, bool)
    mask = np.zeros(T, bool)
    b, s = md.decode_shape
    mask[b * s:] = True
    return mask


def make(world, h, topk, mode, *, max_num_seqs=None, max_tokens=256, threshold=1, ws_rows=None,
         device=None, framework=None):
    common = dict(kv_cache_dtype=world.kv_cache_dtype, block_size=world.bs, topk=topk,
                  max_model_len=world.max_model_len, max_num_seqs=max_num_seqs or world.max_reqs,
                  max_num_batched_tokens=max_tokens)
    builder = SparseMLAMetadataBuilder(num_heads=h, mode=mode, decode_threshold=threshold,
                                       prefill_workspace_rows=ws_rows, device=device, framework=framework,
                                       **common)
    return builder, SparseMLAAttention(h, SCALE, mode=mode, **common)


def build(builder, st):
    return builder.build(st["qsl"], st["seq_lens"], st["block_table"], st["slot_mapping"])


def run_step(world, attn, builder, st, name, out=None):
    md = build(builder, st)
    res = attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, out=out,
                       return_lse=True)
    ref_out, ref_lse = world.expected(st)
    T = st["T"]
    check(res[0][:T], res[1][:T], ref_out, ref_lse, prefill_kernel_mask(attn, md, T, world.cache), name)
    return res, md


# (h, topk, batch): sizes keep the CPU kernels' work (T * h * topk) small
SIZES = {16: 64, 64: 64, 128: 32}
BATCHES = {
    # name: list of (context before the step, query length); decodes first
    "decode": lambda rng, h: [(int(rng.integers(0, 400)), 1) for _ in range(64 if h == 16 else 12)],
    "prefill": lambda rng, h: [(0, 24), (int(rng.integers(500, 2900)), 9)] if h < 128 else [(2000, 12)],
    "mixed": lambda rng, h: ([(int(rng.integers(1, 3000)), 1) for _ in range(5)]
                             + [(0, 7), (int(rng.integers(100, 900)), 11)]),
}


@pytest.mark.parametrize("kind", list(BATCHES))
@pytest.mark.parametrize("h", [16, 64, 128])
@pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                         ids=["fp8-mixed", "fp8-split", "bf16"])
def test_layer_matches_reference(cache_mode, h, kind):
    kv_dtype, mode = cache_mode
    rng = np.random.default_rng(zlib.crc32(f"{kv_dtype}/{mode}/{h}/{kind}".encode()))
    reqs = BATCHES[kind](rng, h)
    world = World(rng, kv_dtype, max_model_len=512 if kind == "decode" else 3072, max_reqs=len(reqs))
    for r, (ctx, _) in enumerate(reqs):
        world.write_context(r, ctx)
    topk = SIZES[h]
    builder, attn = make(world, h, topk, mode)
    st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk, empty_rows=1)
    (out, lse), md = run_step(world, attn, builder, st, f"{kv_dtype}/{attn.mode}/h{h}/{kind}")
    assert out.shape == (st["T"], h, 512) and out.dtype == BF16 and lse.dtype == np.float32
    assert md.num_prefills == sum(ql > 1 for _, ql in reqs)


def test_split_and_mixed_agree_and_chunking():
    """The same step through split (several workspace chunks), split (one chunk) and mixed mode."""
    rng = np.random.default_rng(7)
    h, topk = 32, 64
    reqs = [(300, 1), (40, 1), (900, 1), (0, 20), (250, 6), (600, 9), (30, 5)]
    world = World(rng, "fp8_ds_mla", max_model_len=1024, max_reqs=len(reqs))
    for r, (ctx, _) in enumerate(reqs):
        world.write_context(r, ctx)
    st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk)
    ref_out, ref_lse = world.expected(st)
    results = {}
    for name, mode, ws_rows in (("chunked", "split", 620), ("one-chunk", "split", None), ("mixed", "mixed", None)):
        builder, attn = make(world, h, topk, mode, ws_rows=ws_rows)
        md = build(builder, st)
        if name == "chunked":
            assert [(c.req_start, c.req_end) for c in md.chunks] == [(0, 2), (2, 3), (3, 4)]
        out, lse = attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, return_lse=True)
        check(out, lse, ref_out, ref_lse, prefill_kernel_mask(attn, md, st["T"], world.cache), name)
        results[name] = (rp.as_f64(out), lse)
    # chunking only moves rows within the workspace: the prefill kernel sees the same values
    np.testing.assert_array_equal(results["chunked"][0], results["one-chunk"][0])
    np.testing.assert_array_equal(results["chunked"][1], results["one-chunk"][1])
    rp.check_close(results["mixed"][0], results["one-chunk"][0], abs_tol=rp.PREFILL_OUT_ABS,
                   rel_tol=rp.PREFILL_OUT_REL, cos_tol=rp.PREFILL_OUT_COS, name="mixed vs split")


def test_one_config_for_builder_and_layer():
    """A stack makes one SparseMLAConfig and hands it to the builder and every layer."""
    rng = np.random.default_rng(3)
    world = World(rng, "fp8_ds_mla", max_reqs=3)
    world.write_context(0, 100)
    world.write_context(2, 50)
    cfg = SparseMLAConfig(num_heads=16, kv_cache_dtype="fp8", block_size=16, topk=32, max_model_len=512,
                          max_num_seqs=3, max_num_batched_tokens=256)
    builder = SparseMLAMetadataBuilder.from_config(cfg, prefill_workspace_rows=60)
    layers = [SparseMLAAttention.from_config(builder.config, SCALE), SparseMLAAttention.from_config(cfg, SCALE)]
    assert all(layer.config is cfg and layer.mode == "split" for layer in layers) and builder.config is cfg
    st = world.step([(0, 1), (1, 13), (2, 4)], 16, 32)
    md = build(builder, st)
    assert md.config is cfg and [(c.req_start, c.req_end) for c in md.chunks] == [(0, 1), (1, 2)]
    for layer in layers:  # the second layer rewrites the same tokens and recomputes the same step
        out, lse = layer.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, return_lse=True)
        check(out, lse, *world.expected(st), prefill_kernel_mask(layer, md, st["T"], world.cache), "from_config")
    with pytest.raises(TypeError, match=r"^config: expected a SparseMLAConfig, got dict"):
        SparseMLAAttention.from_config(dict(num_heads=16), SCALE)
    with pytest.raises(TypeError, match=r"^softmax_scale: expected a real number, got str"):
        SparseMLAAttention.from_config(cfg, "0.1")


def forbid_host_work(monkeypatch):
    """Every host-copy and planning function of smla made to raise (the layer's calls must not use them)."""
    def no_host_work(*a, **k):
        raise AssertionError("host work (a device->host copy or planning) inside the layer")
    for mod, name in ((smla.metadata, "_host"), (smla._arrays, "host_ints"), (smla.metadata, "split_prefill_chunks"),
                      (smla.metadata, "split_decodes_and_prefills"), (SparseMLAMetadataBuilder, "build"),
                      (SparseMLAMetadataBuilder, "_plan_prefill")):
        monkeypatch.setattr(mod, name, no_host_work)


def test_forward_does_no_host_work(monkeypatch):
    """build() plans everything (the split mode's prefill chunks too), so forward never reads an
    array back to the host: with every host-copy and planning function made to raise, forward of a
    split step with two workspace chunks still matches the oracle. The metadata holds no builder."""
    rng = np.random.default_rng(12)
    world = World(rng, "fp8_ds_mla", max_reqs=4)
    for r in range(4):
        world.write_context(r, 40 * r)
    builder, attn = make(world, 16, 32, "split", ws_rows=150)
    st = world.step([(0, 1), (1, 1), (2, 9), (3, 5)], 16, 32)
    md = build(builder, st)
    assert len(md.chunks) == 2
    assert not any(isinstance(v, SparseMLAMetadataBuilder) for v in vars(md).values())
    forbid_host_work(monkeypatch)
    out, lse = attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, return_lse=True)
    check(out, lse, *world.expected(st), prefill_kernel_mask(attn, md, st["T"], world.cache), "no host work")


@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "bf16"])
def test_steps_accumulate(kv_dtype):
    """Prefill, then decode steps (speculative: 2 tokens each), then a mixed step: every step sees
    the tokens written by the earlier ones, through one builder and one set of buffers."""
    rng = np.random.default_rng(11)
    h, topk = 32, 64  # fp8: split mode
    world = World(rng, kv_dtype, max_reqs=4)
    builder, attn = make(world, h, topk, "auto", threshold=2)
    run_step(world, attn, builder, world.step([(0, 30), (1, 17)], h, topk), "prefill")
    for i in range(3):
        run_step(world, attn, builder, world.step([(0, 2), (1, 2)], h, topk), f"decode {i}")
    run_step(world, attn, builder, world.step([(0, 1), (1, 1), (2, 40), (3, 3)], h, topk), "mixed")


@pytest.mark.parametrize("mode", ["mixed", "split", "bf16"])
def test_padded_decode_step_with_out(mode):
    """CUDA-graph style step: inputs longer than the real tokens (slot -1 padding), out= given."""
    rng = np.random.default_rng(5)
    kv_dtype = "bf16" if mode == "bf16" else "fp8_ds_mla"
    world = World(rng, kv_dtype, max_reqs=6)
    for r in range(6):
        world.write_context(r, int(rng.integers(0, 200)))
    h, topk = 16, 32
    builder, attn = make(world, h, topk, "auto" if mode == "bf16" else mode)
    st = world.step([(r, 1) for r in range(6)], h, topk, pad=2)
    md = build(builder, st)
    assert md.num_padded_tokens == 8 and md.num_tokens == 6
    out = np.full((10, h, 512), 7, BF16)  # longer than T: only the first T rows are written
    res = attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, out=out)
    assert res is out and (rp.as_f64(out[8:]) == 7).all()
    lse = md.lse_scratch[:6]
    check(out[:6], lse, *world.expected(st), prefill_kernel_mask(attn, md, 6, world.cache), mode)


def test_bf16_interleaved_cache_uses_decode_kernel():
    rng = np.random.default_rng(9)
    world = World(rng, "bf16", max_reqs=3, interleave=2)
    assert smla.layer._flat_rows(world.cache) is None
    for r in range(3):
        world.write_context(r, 60 * r)
    builder, attn = make(world, 16, 32, "auto")
    run_step(world, attn, builder, world.step([(0, 1), (1, 1), (2, 9)], 16, 32), "bf16 interleaved")


def test_all_invalid_rows_give_zero_and_neg_inf():
    rng = np.random.default_rng(2)
    world = World(rng, "fp8_ds_mla", max_reqs=2)
    world.write_context(0, 10)
    builder, attn = make(world, 16, 32, "split")
    st = world.step([(0, 1), (1, 5)], 16, 32)
    st["topk"][:] = -1
    md = build(builder, st)
    out, lse = attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, return_lse=True)
    assert (rp.as_f64(out) == 0).all() and np.isneginf(lse).all()


def test_layer_rejects_mismatched_metadata():
    rng = np.random.default_rng(1)
    world = World(rng, "fp8_ds_mla", max_reqs=2)
    builder, attn = make(world, 16, 32, "mixed")
    st = world.step([(0, 1), (1, 1)], 16, 32)
    md = build(builder, st)
    args = (st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"])
    kw = dict(kv_cache_dtype="fp8_ds_mla", block_size=16, topk=32, max_model_len=512, max_num_seqs=2,
              max_num_batched_tokens=256)
    # a layer of another configuration: the message names every field that differs
    for other, diff in ((SparseMLAAttention(32, SCALE, mode="mixed", **kw), r"num_heads: 16 vs 32;"),
                        (SparseMLAAttention(16, SCALE, **kw), r"mode: 'mixed' vs 'split';"),
                        (SparseMLAAttention(16, SCALE, **dict(kw, max_num_seqs=3, mode="mixed")),
                         r"max_num_seqs: 2 vs 3;")):
        with pytest.raises(ValueError, match=r"^md: built for another configuration \(" + diff):
            other.forward(*args, md)
    # an equal configuration made separately is the same configuration
    SparseMLAAttention(16, SCALE, mode="mixed", **dict(kw, kv_cache_dtype="fp8")).forward(*args, md)
    with pytest.raises(TypeError, match=r"^md: expected a SparseMLAMetadata"):
        attn.forward(*args, None)
    with pytest.raises(ValueError, match=r"^topk_indices: expected \[2, 32\]"):
        attn.forward(*args[:4], st["topk"][:, :16], md)
    with pytest.raises(ValueError, match=r"^q: expected \[2, 16, 576\] \(at least T = len\(md.slot_mapping\) = 2 "
                                         r"rows\), got \[16, 576\]"):
        attn.forward(st["q"][0], *args[1:], md)
    with pytest.raises(ValueError, match=r"^kv_cache: expected \[num_blocks >= 1, 16, 656\].*got \[\]"):
        attn.forward(*args[:3], world.cache[0, 0, 0, ...], st["topk"], md)  # 0-d
    with pytest.raises(TypeError, match=r"^kv_c: expected a NumPy array"):
        attn.forward(st["q"], None, *args[2:], md)
    with pytest.raises(ValueError, match=r"^kv_cache: expected \[num_blocks >= 1, 16, 656\]"):
        attn.forward(*args[:3], world.cache[:, :8], st["topk"], md)
    build(builder, st)
    with pytest.raises(RuntimeError, match="^md: stale"):
        attn.forward(*args, md)
    with pytest.raises(ValueError, match="^mode: "):
        SparseMLAAttention(16, SCALE, **dict(kw, mode="fast"))
    with pytest.raises(ValueError, match=r"^num_heads: expected an integer <= 128"):
        SparseMLAAttention(smla.MAX_HEADS + 1, SCALE, **kw)


@pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                         ids=["fp8-mixed", "fp8-split", "bf16"])
def test_layer_passes_precision(cache_mode, monkeypatch):
    """The config's precision reaches every attention op the layer runs; the metadata does not depend
    on it (a builder made for "high" serves a "fast" layer); on the CPU fast's out differs from high's
    only where the level has bf16 dot products, its lse never."""
    kv_dtype, mode = cache_mode
    world = World(np.random.default_rng(17), kv_dtype, max_reqs=3)
    world.write_context(0, 100)
    world.write_context(2, 300)
    builder, high = make(world, 16, 32, mode)
    fast = SparseMLAAttention.from_config(dataclasses.replace(high.config, precision="fast"), SCALE)
    assert (high.config.precision, fast.config.precision) == ("high", "fast") and fast.config == high.config
    seen = []
    for name in ("sparse_mla_decode", "sparse_mla_prefill"):
        def spy(*a, _real=getattr(layer_mod, name), _name=name, **kw):
            seen.append((_name, kw["precision"]))
            return _real(*a, **kw)
        monkeypatch.setattr(layer_mod, name, spy)
    st = world.step([(0, 1), (1, 13), (2, 4)], 16, 32)
    md = build(builder, st)
    res = {}
    for layer in (high, fast):  # the second layer rewrites the same tokens and recomputes the same step
        seen.clear()
        res[layer.config.precision] = layer.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md,
                                                    return_lse=True)
        assert seen and {p for _, p in seen} == {layer.config.precision}, seen
    ref_out, ref_lse, ref_abs = world.expected(st, return_abs=True)
    check(*res["fast"], ref_out, ref_lse, prefill_kernel_mask(fast, md, st["T"], world.cache), "fast",
          precision="fast", out_abs=ref_abs)
    assert_fast_runs_bf16_p(res["fast"][0], res["high"][0])
    np.testing.assert_array_equal(res["fast"][1], res["high"][1])
    kw = dict(kv_cache_dtype=kv_dtype, block_size=16, topk=32, max_model_len=512, max_num_seqs=3,
              max_num_batched_tokens=256)
    assert SparseMLAAttention(16, SCALE, precision="fast", **kw).config.precision == "fast"
    with pytest.raises(ValueError, match='^precision: expected "high" or "fast", got "medium"$'):
        SparseMLAAttention(16, SCALE, precision="medium", **kw)
    with pytest.raises(TypeError, match="^precision: expected a str, got NoneType$"):
        SparseMLAAttention(16, SCALE, precision=None, **kw)


def test_auto_mode_rule():
    kw = dict(kv_cache_dtype="fp8_ds_mla", block_size=64, topk=2048, max_model_len=4096, max_num_seqs=4,
              max_num_batched_tokens=64)
    assert SparseMLAAttention(16, SCALE, **kw).mode == "split"  # measured on the H200: split wins at h = 16 too
    assert SparseMLAAttention(16, SCALE, **dict(kw, mode="mixed")).mode == "mixed"
    assert SparseMLAAttention(128, SCALE, **kw).mode == "split"
    assert SparseMLAAttention(128, SCALE, **dict(kw, kv_cache_dtype="bf16")).mode == "bf16"


@pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                         ids=["fp8-mixed", "fp8-split", "bf16"])
def test_torch_cpu_tensors(cache_mode):
    """torch CPU tensors in, torch buffers in the builder (device=a torch tensor), torch out."""
    torch = pytest.importorskip("torch")
    kv_dtype, mode = cache_mode
    rng = np.random.default_rng(6)
    world = World(rng, kv_dtype, max_reqs=4)
    for r in range(4):
        world.write_context(r, 50 * r)
    st = world.step([(0, 1), (1, 1), (2, 9), (3, 5)], 16, 32)
    dev = torch.device("cpu")
    builder, attn = make(world, 16, 32, mode, device=torch.empty(0), ws_rows=160)
    assert builder.framework == "torch"
    md = builder.build(*(_torch_bf16(torch, st[k], dev) for k in ("qsl", "seq_lens", "block_table", "slot_mapping")))
    if attn.mode == "split":
        assert len(md.chunks) == 2
    cache = _torch_bf16(torch, world.cache, dev)
    out, lse = attn.forward(*(_torch_bf16(torch, st[k], dev) for k in ("q", "kv_c", "k_pe")), cache,
                            _torch_bf16(torch, st["topk"], dev), md, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and isinstance(md.block_table, torch.Tensor)
    check(_host_bits(out), lse.numpy(), *world.expected(st), prefill_kernel_mask(attn, md, st["T"], cache), "torch cpu")


# =============================================================================================
# CUDA: torch and CuPy, and a CUDA-graph-captured decode step
# =============================================================================================

def _torch_bf16(torch, x, dev):
    """NumPy (bf16 via int16 bits) -> torch on dev."""
    t = torch.from_numpy(np.ascontiguousarray(x).view(np.int16) if x.dtype == BF16 else np.ascontiguousarray(x))
    return (t.view(torch.bfloat16) if x.dtype == BF16 else t).to(dev)


def _host_bits(t):
    """torch bf16 -> NumPy uint16 bits."""
    import torch

    return t.view(torch.int16).cpu().numpy().view(np.uint16)


@pytest.mark.cuda
class TestCuda:
    def _world(self, rng, kv_dtype, reqs):
        world = World(rng, kv_dtype, block_size=64, max_model_len=4096, max_reqs=len(reqs))
        for r, (ctx, _) in enumerate(reqs):
            world.write_context(r, ctx)
        return world

    @pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                             ids=["fp8-mixed", "fp8-split", "bf16"])
    @pytest.mark.parametrize("h", [16, 64, 128])
    def test_torch(self, cache_mode, h):
        import torch

        kv_dtype, mode = cache_mode
        rng = np.random.default_rng(h)
        reqs = [(int(rng.integers(1, 2000)), 1) for _ in range(16)] + [(0, 200), (1500, 100), (700, 64)]
        world = self._world(rng, kv_dtype, reqs)
        topk = 256
        st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk, empty_rows=2)
        dev = torch.device("cuda")
        cache = _torch_bf16(torch, world.cache, dev)
        builder, attn = make(world, h, topk, mode, max_tokens=1024, ws_rows=2000, device="cuda")
        md = builder.build(*(_torch_bf16(torch, st[k], dev) for k in ("qsl", "seq_lens", "block_table", "slot_mapping")),
                           query_start_loc_cpu=st["qsl"])
        args = [_torch_bf16(torch, st[k], dev) for k in ("q", "kv_c", "k_pe")]
        out, lse = attn.forward(*args, cache, _torch_bf16(torch, st["topk"], dev), md, return_lse=True)
        assert out.dtype == torch.bfloat16 and out.device.type == "cuda"
        if attn.mode == "split":
            assert len(md.chunks) == 2  # the workspace of 2000 rows holds 2 of the 3 prefills at a time
        T = st["T"]
        mask = prefill_kernel_mask(attn, md, T, cache)
        check(_host_bits(out), lse.cpu().numpy(), *world.expected(st), mask, f"torch h{h}")
        # the device cache holds the step's tokens as the CPU writer packs them
        smla.pack_kv(st["kv_c"][:T], st["k_pe"][:T], world.cache, st["slot_mapping"][:T], kv_cache_dtype=kv_dtype)
        got = _host_bits(cache) if kv_dtype == "bf16" else cache.cpu().numpy()
        rp.assert_cache_equal(got, world.cache, kv_dtype)

    @pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                             ids=["fp8-mixed", "fp8-split", "bf16"])
    def test_forward_never_synchronises(self, cache_mode):
        """forward of a step with decodes and prefills (split: two workspace chunks) under
        torch.cuda.set_sync_debug_mode("error"), where a device->host copy or any other synchronising
        torch call raises: build() did all the host work."""
        import torch

        kv_dtype, mode = cache_mode
        rng = np.random.default_rng(14)
        reqs = [(int(rng.integers(1, 2000)), 1) for _ in range(8)] + [(0, 100), (900, 60)]
        world = self._world(rng, kv_dtype, reqs)
        h, topk = 64, 256
        st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk)
        dev = torch.device("cuda")
        cache = _torch_bf16(torch, world.cache, dev)
        builder, attn = make(world, h, topk, mode, max_tokens=512, ws_rows=1000, device="cuda")
        md = builder.build(*(_torch_bf16(torch, st[k], dev) for k in ("qsl", "seq_lens", "block_table", "slot_mapping")),
                           query_start_loc_cpu=st["qsl"], seq_lens_cpu=st["seq_lens"])
        assert len(md.chunks) == (2 if attn.mode == "split" else 0)  # prefill rows 100 + 960 > 1000
        args = [_torch_bf16(torch, st[k], dev) for k in ("q", "kv_c", "k_pe", "topk")]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out, lse = attn.forward(*args[:3], cache, args[3], md, return_lse=True)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        check(_host_bits(out), lse.cpu().numpy(), *world.expected(st),
              prefill_kernel_mask(attn, md, st["T"], cache), f"no sync {attn.mode}")

    @pytest.mark.parametrize("mode", ["mixed", "split"])
    def test_cupy(self, mode):
        cupy = pytest.importorskip("cupy")
        rng = np.random.default_rng(4)
        reqs = [(int(rng.integers(1, 3000)), 1) for _ in range(16)] + [(100, 150)]
        world = self._world(rng, "fp8_ds_mla", reqs)
        h, topk = 64, 256
        st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk)

        def cp(x):
            return cupy.asarray(np.ascontiguousarray(x).view(np.uint16) if x.dtype == BF16 else x)
        builder, attn = make(world, h, topk, mode, max_tokens=512, device="cuda:0", framework="cupy")
        assert builder.framework == "cupy"
        md = builder.build(*(cp(st[k]) for k in ("qsl", "seq_lens", "block_table", "slot_mapping")))
        out, lse = attn.forward(cp(st["q"]), cp(st["kv_c"]), cp(st["k_pe"]), cp(world.cache), cp(st["topk"]), md,
                                return_lse=True)
        assert isinstance(out, cupy.ndarray)
        check(cupy.asnumpy(out).view(np.uint16), cupy.asnumpy(lse), *world.expected(st),
              prefill_kernel_mask(attn, md, st["T"], world.cache), f"cupy {mode}")

    @pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                             ids=["fp8-mixed", "fp8-split", "bf16"])
    def test_cuda_graph_decode_step(self, cache_mode):
        """Capture one decode step, then replay it over new steps (new tokens, new metadata from
        build()); each replay equals an eager forward of the same step and the oracle."""
        import torch

        kv_dtype, mode = cache_mode
        rng = np.random.default_rng(8)
        R, h, topk, s_q = 16, 128, 2048, 2
        world = self._world(rng, kv_dtype, [(int(rng.integers(100, 2500)), 0) for _ in range(R)])
        dev = torch.device("cuda")
        cache = _torch_bf16(torch, world.cache, dev)
        builder, attn = make(world, h, topk, mode, max_tokens=R * s_q, device="cuda", threshold=s_q)
        T = R * s_q
        static = {k: None for k in ("q", "kv_c", "k_pe", "topk")}
        out = torch.empty((T, h, 512), dtype=torch.bfloat16, device=dev)

        def load(st):
            md = builder.build(*(_torch_bf16(torch, st[k], dev) for k in ("qsl", "seq_lens", "block_table",
                                                                          "slot_mapping")),
                               query_start_loc_cpu=st["qsl"])
            for k in static:
                v = _torch_bf16(torch, st[k], dev)
                if static[k] is None:
                    static[k] = v
                else:
                    static[k].copy_(v)
            return md

        st = world.step([(r, s_q) for r in range(R)], h, topk)
        md = load(st)
        assert md.num_decodes == R and md.decode_shape == (R, s_q)
        fwd = lambda m: attn.forward(static["q"], static["kv_c"], static["k_pe"], cache, static["topk"], m, out=out)  # noqa: E731
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fwd(md)  # eager warm-up on the side stream, as torch recommends before capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fwd(md)
        for i in range(3):
            st = world.step([(r, s_q) for r in range(R)], h, topk)
            md = load(st)
            g.replay()
            torch.cuda.synchronize()
            replayed = out.clone()
            lse_replayed = md.lse_scratch.clone()
            fwd(md)  # eager: rewrites the same cache bytes, recomputes
            torch.cuda.synchronize()
            assert torch.equal(replayed.view(torch.int16), out.view(torch.int16)), f"replay {i}"
            assert torch.equal(lse_replayed, md.lse_scratch), f"replay {i} lse"
        mask = prefill_kernel_mask(attn, md, T, cache)  # the last replay against the oracle
        check(_host_bits(replayed), lse_replayed.cpu().numpy(), *world.expected(st), mask,
              "graph replay")
