"""SparseMLAAttention's two halves on their own, as vLLM calls them: write_kv_cache, then attend over
a token range of the step (the decodes, a prefill range, the whole step, any range) with q whole or
as its (q_nope, q_pe) pair, against the float64 oracle of tests/test_layer.py; caller-supplied
workspaces (SparseMLAMetadataBuilder.workspace_specs / workspaces=, and per call: attend(...,
workspaces=)); bad ranges and buffers. The
same on CUDA with torch, under torch's sync debug mode."""
import os
import sys
import zlib

import numpy as np
import pytest

import smla
from smla.metadata import SparseMLAConfig, SparseMLAMetadataBuilder

sys.path.insert(0, os.path.dirname(__file__))
import reference as rp  # noqa: E402
from test_layer import (BF16, SCALE, World, _host_bits, _torch_bf16, build, check, forbid_host_work,  # noqa: E402
                        make, prefill_kernel_mask)

CACHE_MODES = [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")]
CACHE_IDS = ["fp8-mixed", "fp8-split", "bf16"]


def q_form(q, form, rng):
    """q [n, h, 576] as the layer takes it: "one" array, a "pair" of contiguous halves, or a
    "strided" pair (q_nope rows inside wider rows, q_pe with heads outermost in memory)."""
    if form == "one":
        return q
    if form == "pair":
        return np.ascontiguousarray(q[..., :512]), np.ascontiguousarray(q[..., 512:])
    wide = np.zeros(q.shape[:2] + (640,), BF16)
    wide[..., 3:515] = q[..., :512]
    q_pe = np.ascontiguousarray(q[..., 512:].transpose(1, 0, 2)).transpose(1, 0, 2)
    assert len(q) < 2 or not (wide[..., 3:515].flags.c_contiguous or q_pe.flags.c_contiguous)
    return wide[..., 3:515], q_pe


def mixed_step(rng, kv_dtype, h, topk, *, spec=1):
    """A world and a step of decodes (query length `spec`) then three prefills of 7, 311 and 156
    tokens of sequence (a split workspace of 320 rows holds the first two, then the third)."""
    reqs = [(int(rng.integers(1, 600)), spec) for _ in range(5)] + [(0, 7), (300, 11), (150, 6)]
    world = World(rng, kv_dtype, max_model_len=1024, max_reqs=len(reqs))
    for r, (ctx, _) in enumerate(reqs):
        world.write_context(r, ctx)
    st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk, empty_rows=1)
    return world, st


def check_range(attn, md, world, st, res, ref, start, end, name):
    out, lse = res
    mask = prefill_kernel_mask(attn, md, st["T"], world.cache)[start:end]
    check(out, lse, ref[0][start:end], ref[1][start:end], mask, name)


@pytest.mark.parametrize("form", ["one", "pair", "strided"])
@pytest.mark.parametrize("cache_mode", CACHE_MODES, ids=CACHE_IDS)
def test_attend_ranges_match_reference(cache_mode, form):
    """One write_kv_cache, then attend over the decodes, the prefills, the whole step, a range that
    cuts requests (and in split mode a workspace chunk) and an empty one; the whole step equals
    forward bit for bit."""
    kv_dtype, mode = cache_mode
    rng = np.random.default_rng(zlib.crc32(f"{kv_dtype}/{mode}/{form}".encode()))
    h, topk = 16, 64
    world, st = mixed_step(rng, kv_dtype, h, topk)
    builder, attn = make(world, h, topk, mode, ws_rows=320)
    md = build(builder, st)
    T, nd = st["T"], md.num_decode_tokens
    assert nd == 5 and len(md.chunks) == (2 if attn.mode == "split" else 0)
    assert attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md) is world.cache
    ref = world.expected(st)
    for start, end in ((0, nd), (nd, T), (0, T), (2, T - 4), (nd + 3, nd + 9), (4, 4)):
        q = q_form(st["q"][start:end], form, rng)
        res = attn.attend(q, world.cache, st["topk"][start:end], md, tokens=(start, end))
        assert res[0].shape == (end - start, h, 512) and res[1].shape == (end - start, h)
        check_range(attn, md, world, st, res, ref, start, end, f"{attn.mode}/{form} tokens {start}..{end}")
    whole = attn.attend(q_form(st["q"][:T], form, rng), world.cache, st["topk"], md)
    out, lse = attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md, return_lse=True)
    np.testing.assert_array_equal(rp.as_bf16_bits(whole[0]), rp.as_bf16_bits(out))
    np.testing.assert_array_equal(whole[1], lse)


@pytest.mark.parametrize("form", ["one", "strided"])
def test_attend_speculative_decodes_split(form):
    """Split mode with decodes of 2 tokens: a range of whole decode requests runs them as [b, 2],
    one that cuts a request as single-token rows; both match the oracle, given out= and lse=."""
    rng = np.random.default_rng(21)
    h, topk = 32, 64
    world, st = mixed_step(rng, "fp8_ds_mla", h, topk, spec=2)
    builder, attn = make(world, h, topk, "split", threshold=2)
    md = build(builder, st)
    assert md.decode_shape == (5, 2)
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)
    ref = world.expected(st)
    for start, end in ((0, 10), (2, 8), (1, 4), (3, 14)):
        out = np.full((end - start + 2, h, 512), 7, BF16)  # longer than n: only n rows are written
        lse = np.full((end - start + 2, h), 7, np.float32)
        res = attn.attend(q_form(st["q"][start:end], form, rng), world.cache, st["topk"][start:end], md,
                          tokens=slice(start, end), out=out, lse=lse)
        assert res[0] is out and res[1] is lse and (rp.as_f64(out[end - start:]) == 7).all()
        check_range(attn, md, world, st, (out[:end - start], lse[:end - start]), ref, start, end,
                    f"spec {form} {start}..{end}")


def test_write_kv_cache_alone():
    """The cache write of forward on its own: the step's tokens at md.slot_mapping, padding skipped."""
    rng = np.random.default_rng(22)
    world = World(rng, "fp8_ds_mla", max_reqs=3)
    builder, attn = make(world, 16, 32, "mixed")
    before = world.cache.copy()
    st = world.step([(0, 1), (1, 1), (2, 3)], 16, 32, pad=2)
    md = build(builder, st)
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)
    want = before.copy()
    rp.pack_kv(rp.as_bf16_bits(st["kv_c"][:5]), rp.as_bf16_bits(st["k_pe"][:5]), want, st["slot_mapping"][:5],
               "fp8_ds_mla")
    rp.assert_cache_equal(world.cache, want, "fp8_ds_mla")
    with pytest.raises(ValueError, match=r"^kv_c: expected \[7, 512\] \(at least T = len\(md.slot_mapping\) = 7 "
                                         r"rows\), got \[6, 512\]"):
        attn.write_kv_cache(st["kv_c"][:6], st["k_pe"], world.cache, md)
    with pytest.raises(ValueError, match=r"^k_pe: expected \[7, 64\]"):
        attn.write_kv_cache(st["kv_c"], st["kv_c"], world.cache, md)
    with pytest.raises(ValueError, match=r"^kv_cache: expected \[num_blocks >= 1, 16, 656\]"):
        attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache[:, :8], md)


def test_attend_rejects_bad_arguments():
    rng = np.random.default_rng(23)
    world, st = mixed_step(rng, "fp8_ds_mla", 16, 32)
    builder, attn = make(world, 16, 32, "split")
    md = build(builder, st)
    T = st["T"]
    q, topk, cache = st["q"], st["topk"], world.cache
    for tokens, exc, msg in (((0, T + 1), ValueError, rf"^tokens: expected 0 <= start <= end <= T = "
                                                      rf"len\(md.slot_mapping\) = {T}, got \(0, {T + 1}\)"),
                             ((3, 2), ValueError, r"^tokens: expected 0 <= start <= end"),
                             ((-1, 2), ValueError, r"^tokens\[0\]: expected an integer >= 0, got -1"),
                             ((0, 2.0), TypeError, r"^tokens\[1\]: expected an integer, got float"),
                             (slice(0, 4, 2), ValueError, r"^tokens: expected a contiguous range"),
                             ([0, 2], TypeError, r"^tokens: expected None, a \(start, end\) pair or a slice")):
        with pytest.raises(exc, match=msg):
            attn.attend(q, cache, topk, md, tokens=tokens)
    with pytest.raises(ValueError, match=r"^q: expected \[4, 16, 576\] \(at least n = 4 rows: tokens \[2, 6\) of "
                                         r"the step\), got \[3, 16, 576\]"):
        attn.attend(q[:3], cache, topk, md, tokens=(2, 6))
    with pytest.raises(ValueError, match=r"^q: expected one array or a \(q_nope, q_pe\) pair, got a tuple of 3"):
        attn.attend((q[..., :512], q[..., 512:], q), cache, topk, md)
    with pytest.raises(ValueError, match=r"^q\[1\] \(q_pe\): expected \[4, 16, 64\]"):
        attn.attend((q[:4, :, :512], q[:4, :, 448:]), cache, topk, md, tokens=(0, 4))
    with pytest.raises(TypeError, match=r"^q\[0\] \(q_nope\): expected bfloat16, got float32"):
        attn.attend((q[:4, :, :512].astype(np.float32), q[:4, :, 512:]), cache, topk, md, tokens=(0, 4))
    with pytest.raises(ValueError, match=r"^topk_indices: expected \[5, 32\]"):
        attn.attend(q, cache, topk[:4], md, tokens=(0, 5))
    with pytest.raises(ValueError, match=r"^out: expected \[5, 16, 512\]"):
        attn.attend(q, cache, topk, md, tokens=(0, 5), out=np.empty((5, 16, 576), BF16))
    with pytest.raises(ValueError, match=r"^lse: expected \[5, 16\]"):
        attn.attend(q, cache, topk, md, tokens=(0, 5), lse=np.empty((4, 16), np.float32))
    with pytest.raises(ValueError, match=r"^kv_cache: expected \[num_blocks >= 1, 16, 656\]"):
        attn.attend(q, cache[:, :8], topk, md)
    with pytest.raises(TypeError, match=r"^md: expected a SparseMLAMetadata"):
        attn.attend(q, cache, topk, None)
    build(builder, st)
    with pytest.raises(RuntimeError, match="^md: stale"):
        attn.attend(q, cache, topk, md)


def test_attend_does_no_host_work(monkeypatch):
    """As forward: with every host-copy and planning function made to raise, write_kv_cache and
    attend over a pair and over ranges of a split step (two workspace chunks) still match the oracle."""
    rng = np.random.default_rng(24)
    world, st = mixed_step(rng, "fp8_ds_mla", 16, 32)
    builder, attn = make(world, 16, 32, "split", ws_rows=320)
    md = build(builder, st)
    assert len(md.chunks) == 2
    forbid_host_work(monkeypatch)
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)
    ref = world.expected(st)
    for start, end in ((0, 5), (5, st["T"]), (3, 20)):
        res = attn.attend(q_form(st["q"][start:end], "strided", rng), world.cache, st["topk"][start:end], md,
                          tokens=(start, end))
        check_range(attn, md, world, st, res, ref, start, end, f"no host work {start}..{end}")


@pytest.mark.parametrize("mode", ["split", "mixed", "bf16"])
def test_workspace_specs_and_caller_buffers(mode):
    """workspace_specs names every scratch buffer; the builder uses the caller's (longer ones are
    viewed to the spec's rows) and allocates only the others; the step matches the oracle."""
    rng = np.random.default_rng(25)
    kv_dtype = "bf16" if mode == "bf16" else "fp8_ds_mla"
    h, topk = 16, 32
    world, st = mixed_step(rng, kv_dtype, h, topk)
    cfg = SparseMLAConfig(num_heads=h, kv_cache_dtype=kv_dtype, block_size=world.bs, topk=topk,
                          max_model_len=world.max_model_len, max_num_seqs=world.max_reqs,
                          max_num_batched_tokens=128, mode="auto" if mode == "bf16" else mode)
    specs = SparseMLAMetadataBuilder.workspace_specs(cfg, prefill_workspace_rows=700)
    names = {"indices", "lse", "max_logits"} | ({"prefill_workspace"} if mode == "split" else set())
    assert set(specs) == names  # the CPU has no decode workspace; a q pair needs no staging (read in place)
    assert specs["indices"] == ((128, topk), "int32", 128 * topk * 4)
    if mode == "split":
        assert specs["prefill_workspace"] == ((700, 576), "bfloat16", 700 * 576 * 2)
    dtypes = {"int32": np.int32, "float32": np.float32, "bfloat16": BF16}
    given = {name: np.zeros((s.shape[0] + 3,) + s.shape[1:], dtypes[s.dtype]) for name, s in specs.items()
             if name != "max_logits"}
    builder = SparseMLAMetadataBuilder.from_config(cfg, prefill_workspace_rows=700, device="cpu", workspaces=given)
    attn = smla.SparseMLAAttention.from_config(cfg, SCALE)
    md = build(builder, st)
    assert np.shares_memory(md.indices, given["indices"]) and np.shares_memory(md.lse_scratch, given["lse"])
    assert md.max_logits_scratch.shape == (st["T"], h)
    if mode == "split":
        assert np.shares_memory(md.prefill_workspace, given["prefill_workspace"])
        assert md.prefill_workspace.shape == (700, 576)
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)
    res = attn.attend(q_form(st["q"][:st["T"]], "pair", rng), world.cache, st["topk"], md)
    check_range(attn, md, world, st, res, world.expected(st), 0, st["T"], f"caller buffers {mode}")


def test_workspaces_rejected_with_the_buffer_named():
    cfg = SparseMLAConfig(num_heads=16, kv_cache_dtype="fp8_ds_mla", block_size=16, topk=32, max_model_len=64,
                          max_num_seqs=2, max_num_batched_tokens=8, mode="split")

    def builder(**ws):
        return SparseMLAMetadataBuilder.from_config(cfg, device="cpu", workspaces=ws)
    with pytest.raises(ValueError, match=r"^workspaces\['indices'\]: expected \[8, 32\] \(at least 8 rows, "
                                         r"1024 bytes\), got \[7, 32\]"):
        builder(indices=np.zeros((7, 32), np.int32))
    with pytest.raises(ValueError, match=r"^workspaces\['prefill_workspace'\]: expected \[320, 576\]"):
        builder(prefill_workspace=np.zeros((320, 512), BF16))
    with pytest.raises(TypeError, match=r"^workspaces\['lse'\]: expected float32, got float64"):
        builder(lse=np.zeros((8, 16)))
    with pytest.raises(ValueError, match=r"^workspaces\['lse'\]: expected a C-contiguous array"):
        builder(lse=np.zeros((8, 20), np.float32)[..., :16])
    with pytest.raises(ValueError, match=r"^workspaces: no buffer 'q_staging' in this configuration"):
        builder(q_staging=np.zeros((8, 16, 576), BF16))  # pairs are read in place: no staging buffer
    with pytest.raises(TypeError, match=r"^workspaces\['max_logits'\]: expected a NumPy array"):
        builder(max_logits=[0.0] * 128)
    with pytest.raises(ValueError, match=r"^workspaces: no buffer 'decode_workspace' in this configuration"):
        builder(decode_workspace=np.zeros(64, np.uint8))  # the CPU has none
    with pytest.raises(TypeError, match=r"^workspaces: expected a dict of arrays, got list"):
        SparseMLAMetadataBuilder.from_config(cfg, workspaces=[])
    with pytest.raises(TypeError, match=r"^config: expected a SparseMLAConfig"):
        SparseMLAMetadataBuilder.workspace_specs(dict(num_heads=16))


@pytest.mark.parametrize("mode", ["split", "mixed", "bf16"])
def test_attend_per_call_workspaces(mode):
    """attend(..., workspaces=): the caller's buffers for that call only (as vLLM's workspace manager
    hands them out at each use); the builder's own are untouched, and the result matches the oracle."""
    rng = np.random.default_rng(26)
    kv_dtype = "bf16" if mode == "bf16" else "fp8_ds_mla"
    h, topk = 16, 32
    world, st = mixed_step(rng, kv_dtype, h, topk)
    builder, attn = make(world, h, topk, "auto" if mode == "bf16" else mode, ws_rows=320)
    md = build(builder, st)
    dtypes = {"int32": np.int32, "float32": np.float32, "bfloat16": BF16}
    given = {name: np.zeros((s.shape[0] + 2,) + s.shape[1:], dtypes[s.dtype])
             for name, s in md.workspace_specs.items()}
    own = {name: np.array(getattr(md, f), copy=True) for name, f in md._WORKSPACE_FIELDS.items()
           if getattr(md, f) is not None}
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)
    ref = world.expected(st)
    for form, (start, end) in (("pair", (0, 5)), ("one", (0, st["T"]))):
        res = attn.attend(q_form(st["q"][start:end], form, rng), world.cache, st["topk"][start:end], md,
                          tokens=(start, end), workspaces=given)
        check_range(attn, md, world, st, res, ref, start, end, f"per-call workspaces {mode} {form}")
    assert given["indices"].any()  # the converted indices went to the caller's buffer
    if mode == "split":
        assert given["prefill_workspace"].any()
    for name, f in md._WORKSPACE_FIELDS.items():  # the builder's buffers were not written
        if name in own:
            assert np.array_equal(np.asarray(getattr(md, f)).view(np.uint8), own[name].view(np.uint8)), name


def test_attend_per_call_workspaces_rejected_with_the_buffer_named():
    rng = np.random.default_rng(27)
    world, st = mixed_step(rng, "fp8_ds_mla", 16, 32)
    builder, attn = make(world, 16, 32, "split", ws_rows=320)
    md = build(builder, st)
    T = st["T"]
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)

    def attend(**ws):
        return attn.attend(st["q"][:T], world.cache, st["topk"][:T], md, workspaces=ws)
    rows = md.workspace_specs["indices"].shape[0]
    with pytest.raises(ValueError, match=rf"^workspaces\['indices'\]: expected \[{rows}, 32\] \(at least "
                                         rf"{rows} rows, {rows * 32 * 4} bytes\), got \[{rows - 1}, 32\]"):
        attend(indices=np.zeros((rows - 1, 32), np.int32))
    with pytest.raises(TypeError, match=r"^workspaces\['prefill_workspace'\]: expected bfloat16, got float32"):
        attend(prefill_workspace=np.zeros(md.workspace_specs["prefill_workspace"].shape, np.float32))
    with pytest.raises(ValueError, match=r"^workspaces: no buffer 'decode_workspace' in this configuration"):
        attend(decode_workspace=np.zeros(64, np.uint8))
    with pytest.raises(TypeError, match=r"^workspaces: expected a dict of arrays, got list"):
        attn.attend(st["q"][:T], world.cache, st["topk"][:T], md, workspaces=[])


@pytest.mark.parametrize("mode", ["split", "mixed"])
def test_builder_holds_no_per_call_buffers(mode):
    """workspaces={name: None}: the builder neither allocates nor holds those buffers (a framework lends
    them at each use); attend takes them per call and matches the oracle; a call without them, and
    forward, raise naming what is missing."""
    rng = np.random.default_rng(28)
    h, topk = 16, 32
    world, st = mixed_step(rng, "fp8_ds_mla", h, topk)
    cfg = SparseMLAConfig(num_heads=h, kv_cache_dtype="fp8_ds_mla", block_size=world.bs, topk=topk,
                          max_model_len=world.max_model_len, max_num_seqs=world.max_reqs,
                          max_num_batched_tokens=256, mode=mode)
    specs = SparseMLAMetadataBuilder.workspace_specs(cfg, prefill_workspace_rows=320)
    builder = SparseMLAMetadataBuilder.from_config(cfg, prefill_workspace_rows=320,
                                                   workspaces={name: None for name in specs})
    attn = smla.SparseMLAAttention.from_config(cfg, SCALE)
    md = build(builder, st)
    assert md.per_call == frozenset(specs)
    assert md.indices is None and md.lse_scratch is None and md.prefill_workspace is None
    attn.write_kv_cache(st["kv_c"], st["k_pe"], world.cache, md)
    T = st["T"]
    with pytest.raises(ValueError, match=r"^workspaces: the builder was made to take \['indices', "):
        attn.attend(st["q"][:T], world.cache, st["topk"][:T], md)
    with pytest.raises(ValueError, match=r"^workspaces: the builder was made to take .*forward takes none"):
        attn.forward(st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md)
    partial = {"indices": np.zeros(specs["indices"].shape, np.int32)}
    with pytest.raises(ValueError, match=r"^workspaces: the builder was made to take \['lse', "):
        attn.attend(st["q"][:T], world.cache, st["topk"][:T], md, workspaces=partial)
    dtypes = {"int32": np.int32, "float32": np.float32, "bfloat16": BF16}
    given = {name: np.zeros(s.shape, dtypes[s.dtype]) for name, s in specs.items()}
    ref = world.expected(st)
    for form, (start, end) in (("pair", (0, 5)), ("one", (0, T))):
        res = attn.attend(q_form(st["q"][start:end], form, rng), world.cache, st["topk"][start:end], md,
                          tokens=(start, end), workspaces=given)
        check_range(attn, md, world, st, res, ref, start, end, f"builder without buffers {mode} {form}")
    assert given["indices"].any()


def test_torch_cpu_pair():
    """torch CPU tensors: a non-contiguous (q_nope, q_pe) pair, read in place."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(26)
    world, st = mixed_step(rng, "fp8_ds_mla", 16, 32)
    dev = torch.device("cpu")
    builder, attn = make(world, 16, 32, "split", device=torch.empty(0), ws_rows=700)
    md = builder.build(*(_torch_bf16(torch, st[k], dev) for k in ("qsl", "seq_lens", "block_table", "slot_mapping")))
    cache = _torch_bf16(torch, world.cache, dev)
    attn.write_kv_cache(_torch_bf16(torch, st["kv_c"], dev), _torch_bf16(torch, st["k_pe"], dev), cache, md)
    q = _torch_bf16(torch, st["q"], dev)
    start, end = 3, st["T"]
    out, lse = attn.attend((q[start:end, :, :512], q[start:end, :, 512:]), cache,
                           _torch_bf16(torch, st["topk"][start:end], dev), md, tokens=(start, end))
    assert isinstance(out, torch.Tensor)
    check_range(attn, md, world, st, (_host_bits(out), lse.numpy()), world.expected(st), start, end, "torch pair")


@pytest.mark.cuda
class TestCuda:
    @pytest.mark.parametrize("form", ["one", "pair"])
    @pytest.mark.parametrize("cache_mode", CACHE_MODES, ids=CACHE_IDS)
    def test_attend_never_synchronises(self, cache_mode, form):
        """write_kv_cache and attend over the decodes, then the prefills (split: two workspace
        chunks), under torch.cuda.set_sync_debug_mode("error"), with caller-supplied workspaces
        (the decode workspace included); both ranges match the oracle."""
        import torch

        kv_dtype, mode = cache_mode
        rng = np.random.default_rng(27)
        reqs = [(int(rng.integers(1, 2000)), 1) for _ in range(8)] + [(0, 100), (900, 60)]
        world = World(rng, kv_dtype, block_size=64, max_model_len=4096, max_reqs=len(reqs))
        for r, (ctx, _) in enumerate(reqs):
            world.write_context(r, ctx)
        h, topk = 64, 256
        st = world.step([(r, ql) for r, (_, ql) in enumerate(reqs)], h, topk)
        dev = torch.device("cuda")
        cache = _torch_bf16(torch, world.cache, dev)
        cfg = SparseMLAConfig(num_heads=h, kv_cache_dtype=kv_dtype, block_size=64, topk=topk, max_model_len=4096,
                              max_num_seqs=len(reqs), max_num_batched_tokens=512, mode=mode)
        specs = SparseMLAMetadataBuilder.workspace_specs(cfg, device="cuda", prefill_workspace_rows=1000)
        given = {name: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=dev) for name, s in specs.items()}
        builder = SparseMLAMetadataBuilder.from_config(cfg, prefill_workspace_rows=1000, device="cuda",
                                                       workspaces=given)
        attn = smla.SparseMLAAttention.from_config(cfg, SCALE)
        md = builder.build(*(_torch_bf16(torch, st[k], dev) for k in ("qsl", "seq_lens", "block_table",
                                                                      "slot_mapping")),
                           query_start_loc_cpu=st["qsl"], seq_lens_cpu=st["seq_lens"])
        assert len(md.chunks) == (2 if attn.mode == "split" else 0)
        q, kv_c, k_pe, topk_idx = (_torch_bf16(torch, st[k], dev) for k in ("q", "kv_c", "k_pe", "topk"))
        nd, T = md.num_decode_tokens, st["T"]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            attn.write_kv_cache(kv_c, k_pe, cache, md)
            res = [attn.attend(q[a:e] if form == "one" else (q[a:e, :, :512], q[a:e, :, 512:]), cache,
                               topk_idx[a:e], md, tokens=(a, e)) for a, e in ((0, nd), (nd, T))]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        ref = world.expected(st)
        for (a, e), (out, lse) in zip(((0, nd), (nd, T)), res):
            check_range(attn, md, world, st, (_host_bits(out), lse.cpu().numpy()), ref, a, e,
                        f"cuda {attn.mode}/{form} {a}..{e}")


def test_workspace_contiguity_rule():
    """The workspace check's C-contiguity test (from the framework's own flag, for speed: attend(...,
    workspaces=) runs it for every layer) agrees with the rule on element strides (extents of 1 take any
    stride) on NumPy and torch arrays of every layout the kernels must accept or refuse."""
    from numpy.lib.stride_tricks import as_strided

    from smla import _arrays

    def rule(x):
        shape, strides = tuple(map(int, x.shape)), _arrays.strides_elems(x)
        want = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
        return all(st == w for st, w, n in zip(strides, want, shape) if n > 1)

    base = np.zeros((6, 4, 8), np.float32)
    cases = [base, base[:3], base[::2], base.transpose(1, 0, 2), base[:, :2], base[:, :, :1], base[:, :1],
             as_strided(base, (6, 1, 8), (128, 4096, 4)), np.zeros((1, 5), np.int32)[:, ::2],
             np.zeros((5, 1), np.int32)]
    seen = set()
    for x in cases:
        assert _arrays.is_c_contiguous(x) == rule(x), (x.shape, x.strides)
        seen.add(rule(x))
    assert seen == {True, False}
    torch = pytest.importorskip("torch")
    flat = torch.zeros(8192)
    for x in cases:  # the same shapes and element strides as torch views
        t = flat.as_strided(tuple(x.shape), _arrays.strides_elems(x))
        assert _arrays.is_c_contiguous(t) == rule(t) == rule(x), (tuple(t.shape), t.stride())
