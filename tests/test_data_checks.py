"""Data the CPU can check (issue 13, item 5): slots past the cache (pack_kv), requests that do not fit the
workspace, the block table or the cache (gather_upconvert), selected tokens whose block is past the cache
(convert_topk_indices / filter_convert_dcp_indices with num_blocks) and a layer whose cache is smaller than
its block table raise a ValueError naming the argument, on the CPU, before anything is written where
docs/design.md says so; the valid edge cases still work. The GPU cannot check without a sync: its
documented behaviour (skipped writes, zero rows, -1 indices) is tested at the end."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
from test_layer import World, build, make  # noqa: E402
from torch_arrays import to_torch  # noqa: E402

BF16 = ml_dtypes.bfloat16
I32 = np.iinfo(np.int32)
SENTINEL = 0x5A5A
ISAS = ["default", "portable"]  # the vector (AVX2 and up) and the scalar code


def tokens(t, rng):
    return ref.rand_bf16((t, 512), rng, 2.0), ref.rand_bf16((t, 64), rng)


def fp8_cache(nb, bs, fill=0xAB):
    return np.full(smla.kv_cache_shape(nb, bs, "fp8_ds_mla"), fill, np.uint8)


# ---------------------------------------------------------------------------------------- pack_kv

@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bad", ["capacity", "far"])
@pytest.mark.parametrize("cd", ["fp8_ds_mla", "bf16"])
def test_pack_kv_slot_past_cache_raises_before_writing(slot_dtype, bad, cd):
    rng = np.random.default_rng(1)
    nb, bs, t = 32, 64, 600  # 600 tokens: several threads on a multi-core machine
    cache = np.full(smla.kv_cache_shape(nb, bs, cd), 0xAB, np.uint8 if cd == "fp8_ds_mla" else np.uint16)
    before = cache.copy()
    kv_c, k_pe = tokens(t, rng)
    slots = rng.permutation(nb * bs)[:t].astype(slot_dtype)
    value = nb * bs if bad == "capacity" else int(np.iinfo(slot_dtype).max)
    slots[[7, 400]] = value  # the first one is reported
    with pytest.raises(ValueError, match=rf"^slot_mapping: slot {value} \(token 7\) is outside the cache of "
                                         rf"{nb * bs} slots$"):
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
    np.testing.assert_array_equal(cache, before)  # not even the tokens before token 7


def test_pack_kv_last_slot_and_negative_slots():
    """Slot num_blocks * block_size - 1 is written; negative slots are skipped (padding)."""
    rng = np.random.default_rng(2)
    nb, bs = 4, 16
    cache = fp8_cache(nb, bs)
    kv_c, k_pe = tokens(4, rng)
    slots = np.array([nb * bs - 1, -1, I32.min, 0], np.int32)
    expected = cache.copy()
    ref.pack_kv(kv_c, k_pe, expected, slots, "fp8_ds_mla")
    smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla")
    np.testing.assert_array_equal(cache, expected)
    assert (cache[nb - 1, bs - 1] != 0xAB).any()
    untouched = np.ones((nb, bs), bool)
    untouched[nb - 1, bs - 1] = untouched[0, 0] = False
    assert (cache[untouched] == 0xAB).all()


# ------------------------------------------------------------------------------ gather_upconvert

def gather_case(rng, cd="fp8_ds_mla"):
    """3 requests on a 10-block cache (block 8), all valid: lens 20, 9, 14 from seq_starts 3, 0, 10,
    back to back in a workspace of exactly 43 rows."""
    nb, bs = 10, 8
    shape = smla.kv_cache_shape(nb, bs, cd)
    cache = np.zeros(shape, np.uint8 if cd == "fp8_ds_mla" else np.uint16)
    smla.pack_kv(*tokens(nb * bs, rng), cache, np.arange(nb * bs, dtype=np.int32), kv_cache_dtype=cd)
    bt = np.array([[4, 9, 0, 7], [1, 2, -1, -1], [3, 6, 5, 8]], np.int32)  # -1: columns no request reads
    lens = np.array([20, 9, 14], np.int32)
    seq_starts = np.array([3, 0, 10], np.int32)
    starts = np.array([0, 20, 29], np.int32)
    return cache, bt, lens, starts, seq_starts


@pytest.mark.parametrize("cd", ["fp8_ds_mla", "bf16"])
def test_gather_valid_edges(cd):
    """A workspace exactly big enough, a request reading up to the block table's last position, padding
    block ids in columns no request reads, and a zero-length request that needs nothing."""
    rng = np.random.default_rng(3)
    cache, bt, lens, starts, seq_starts = gather_case(rng, cd)
    lens[2] = 4 * 8 - seq_starts[2]  # positions 10..31: the whole block table row
    w = int(starts[2] + lens[2])
    bt = np.concatenate([bt, [[-1, I32.max, 99, I32.min]]]).astype(np.int32)
    lens, starts, seq_starts = (np.append(a, v).astype(np.int32)
                                for a, v in ((lens, 0), (starts, w), (seq_starts, 32)))
    ws = np.full((w, 576), SENTINEL, np.uint16)
    expected = ws.copy()
    ref.gather_upconvert(cache, expected, bt, lens, starts, seq_starts, kv_cache_dtype=cd)
    smla.gather_upconvert(cache, ws, bt, lens, starts, seq_starts=seq_starts, kv_cache_dtype=cd)
    ref.assert_bf16_equal(ws, expected)
    assert not (ws == SENTINEL).all(axis=1).any()  # every row written


def _gather_raises(match, cache, bt, lens, starts, seq_starts, w=43):
    ws = np.full((w, 576), SENTINEL, np.uint16)
    with pytest.raises(ValueError, match=match):
        smla.gather_upconvert(cache, ws, bt, lens, starts, seq_starts=seq_starts)
    assert (ws == SENTINEL).all()  # the valid requests before the bad one are not written either


def test_gather_workspace_too_small():
    cache, bt, lens, starts, seq_starts = gather_case(np.random.default_rng(4))
    _gather_raises(r"^workspace: request 2 writes rows 29\.\.42 \(workspace_starts 29 \+ seq_lens 14\) but the "
                   r"workspace has 42 rows$", cache, bt, lens, starts, seq_starts, w=42)
    starts[1] = 40  # overlaps nothing it should not, but runs past the end
    _gather_raises(r"^workspace: request 1 writes rows 40\.\.48", cache, bt, lens, starts, seq_starts)
    # a workspace of no rows: the binding used to skip the call
    _gather_raises(r"^workspace: request 0 writes rows 0\.\.19 .* has 0 rows$", cache, bt, lens, starts,
                   seq_starts, w=0)


@pytest.mark.parametrize("name", ["seq_lens", "workspace_starts", "seq_starts"])
def test_gather_negative_values(name):
    cache, bt, lens, starts, seq_starts = gather_case(np.random.default_rng(5))
    arrays = dict(seq_lens=lens, workspace_starts=starts, seq_starts=seq_starts)
    arrays[name][1] = -3
    what = {"seq_lens": "has -3 tokens", "workspace_starts": "starts at row -3",
            "seq_starts": "starts at position -3"}[name]
    _gather_raises(rf"^{name}: request 1 {what}, expected >= 0$", cache, bt, lens, starts, seq_starts)


def test_gather_positions_past_block_table():
    cache, bt, lens, starts, seq_starts = gather_case(np.random.default_rng(6))
    lens[2] = 23  # positions 10..32, the table holds 32
    _gather_raises(r"^seq_lens: request 2 reads positions 10\.\.32 \(seq_starts 10 \+ seq_lens 23\) but the block "
                   r"table holds 32 \(4 blocks of 8\)$", cache, bt, lens, starts, seq_starts, w=60)
    lens[2] = 14
    seq_starts[0] = I32.max  # int32 extremes: no overflow in the check
    _gather_raises(r"^seq_lens: request 0 reads positions 2147483647\.\.2147483666", cache, bt, lens, starts,
                   seq_starts)


@pytest.mark.parametrize("block", [10, -1, I32.max, I32.min])
def test_gather_block_outside_cache(block):
    cache, bt, lens, starts, seq_starts = gather_case(np.random.default_rng(7))
    bt[2, 3] = block  # position 24..31 of request 2 (it reads 10..23: column 3 is unused) ...
    ws = np.full((43, 576), SENTINEL, np.uint16)
    smla.gather_upconvert(cache, ws, bt, lens, starts, seq_starts=seq_starts)  # ... so this is fine
    bt[2, 2] = block  # positions 16..23: read
    _gather_raises(rf"^block_table: block {block} \(request 2, column 2\) is outside the cache of 10 blocks$",
                   cache, bt, lens, starts, seq_starts)


# ------------------------------------------------------------------------------ convert_topk_indices

def convert_case(rng, n=40, k=2048, bs=64, nb=34, mb=40):
    """n rows over 3 requests whose block tables name blocks 0..nb-1 only (so num_blocks=nb is valid)."""
    bt = rng.integers(0, nb, (3, mb)).astype(np.int32)
    req = rng.integers(0, 3, n).astype(np.int32)
    tok = rng.integers(-1, mb * bs, (n, k)).astype(np.int32)
    return req, bt, tok


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    if request.param != "default":
        monkeypatch.setenv("SMLA_CPU_ISA", request.param)
    return request.param


@pytest.mark.parametrize("k", [2048, 13])  # 13: five entries on the vector path's scalar tail
def test_convert_num_blocks_absent_or_valid_changes_nothing(isa, k):
    rng = np.random.default_rng(8)
    req, bt, tok = convert_case(rng, k=k)
    bt[1, 5] = 33  # the last block of a 34-block cache
    tok[:, 0] = 5 * 64 + 3
    expected, counts = ref.convert_topk_indices(req, bt, tok, 64)
    for nb in (None, 34, 10**12):
        out, c = smla.convert_topk_indices(req, bt, tok, block_size=64, num_blocks=nb, return_valid_counts=True)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(c, counts)
    # without num_blocks, blocks past any cache still convert as before (the old behaviour)
    bt[1, 5] = 1000
    out = smla.convert_topk_indices(req, bt, tok, block_size=64)
    np.testing.assert_array_equal(out, ref.convert_topk_indices(req, bt, tok, 64)[0])
    assert (out[req == 1, 0] == 1000 * 64 + 3).all()


@pytest.mark.parametrize("col", [0, 100, 2047, 2045])  # the first 8 entries, mid-row, the last 8
@pytest.mark.parametrize("in_place", [False, True])
def test_convert_block_past_cache_raises(isa, col, in_place):
    rng = np.random.default_rng(9)
    req, bt, tok = convert_case(rng, n=64)  # 64 x 2048 entries: more than one thread's share
    req[:] = req % 2
    req[[10, 50]] = 2  # request 2: rows 10 and 50 only, selecting from columns 0..2
    tok[[10, 50]] = rng.integers(-1, 3 * 64, (2, tok.shape[1]))
    bt[2, 3], bt[2, 5] = 40, 41
    tok[10, col] = 3 * 64 + 9  # the first bad entry in row order ...
    tok[50, 0] = 5 * 64  # ... and a later one, on the other thread
    out = tok if in_place else None
    with pytest.raises(ValueError, match=r"^block_table: block 40 \(request 2, column 3\) is outside the cache of 34 "
                                         r"blocks$"):
        smla.convert_topk_indices(req, bt, tok, block_size=64, num_blocks=34, out=out)


def test_convert_unselected_or_prefill_entries_do_not_raise(isa):
    """A block past the cache is an error only where a paged row selects it: not for -1 entries, positions
    past max_blocks, rows of unknown requests, or prefill rows (those map to workspace rows)."""
    rng = np.random.default_rng(10)
    req, bt, tok = convert_case(rng, n=8, k=64, mb=4)
    bt[:, 2] = 99
    tok[tok // 64 == 2] = -1  # nobody selects column 2 ...
    tok[0, :3] = [-1, 4 * 64, I32.max]
    req[1] = 7  # ... except a row of no request
    tok[1, 0] = 2 * 64
    pids = np.full(8, -1, np.int32)
    pids[2] = 0  # ... and a prefill row
    tok[2, 0] = 2 * 64
    out, counts = smla.convert_topk_indices(req, bt, tok, block_size=64, num_blocks=34, prefill_request_ids=pids,
                                            prefill_workspace_starts=np.array([100], np.int32),
                                            return_valid_counts=True)
    e_out, e_counts = ref.convert_topk_indices(req, bt, tok, 64, pids, np.array([100], np.int32))
    np.testing.assert_array_equal(out, e_out)
    np.testing.assert_array_equal(counts, e_counts)


@pytest.mark.parametrize("dcp", [None, (1, 0, 1, True), (2, 1, 2, False)])
def test_convert_prefill_rows_any_value(isa, dcp):
    """Prefill rows may map to any int32 value, negative ones included (workspace_starts + tok): none
    of them may be taken for the "block past the cache" mark (a prefill row with value -2 crashed)."""
    rng = np.random.default_rng(11)
    req, bt, tok = convert_case(rng, n=6, k=100, mb=4)
    pids = np.array([-1, 0, 1, -1, 1, 0], np.int32)
    starts = np.array([-5, -200], np.int32)
    tok[1, :8] = np.arange(8)  # -5 .. 2: -2 among them
    tok[4, :8] = np.arange(196, 204)
    kw = dict(block_size=64, num_blocks=34, prefill_request_ids=pids, prefill_workspace_starts=starts)
    if dcp is None:
        out, counts = smla.convert_topk_indices(req, bt, tok, return_valid_counts=True, **kw)
        e_out, e_counts = ref.convert_topk_indices(req, bt, tok, 64, pids, starts)
    else:
        size, rank, il, compact = dcp
        out, counts = smla.filter_convert_dcp_indices(req, bt, tok, dcp_size=size, dcp_rank=rank, interleave=il,
                                                      compact=compact, **kw)
        e_out, e_counts = ref.filter_convert_dcp_indices(req, bt, tok, 64, size, rank, il, compact, pids, starts)
    np.testing.assert_array_equal(out, e_out)
    np.testing.assert_array_equal(counts, e_counts)


@pytest.mark.parametrize("compact", [True, False])
def test_filter_convert_dcp_block_past_cache_raises(compact):
    rng = np.random.default_rng(11)
    req, bt, tok = convert_case(rng, n=6, k=100)
    e_out, e_counts = ref.filter_convert_dcp_indices(req, bt, tok, 64, 2, 1, 2, compact)
    out, counts = smla.filter_convert_dcp_indices(req, bt, tok, block_size=64, dcp_size=2, dcp_rank=1,
                                                  interleave=2, compact=compact, num_blocks=34)
    np.testing.assert_array_equal(out, e_out)
    np.testing.assert_array_equal(counts, e_counts)
    bt = np.concatenate([bt, np.arange(40, dtype=np.int32)[None] % 34]).astype(np.int32)
    bt[3, 7] = 34  # request 3, which only row 4 uses
    req[4] = 3
    tok[4] = np.arange(100) - 1  # positions -1..98: local columns 0 and 1
    # global position g: owner (g // 2) % 2 = 1, local (g // 4) * 2 + g % 2 = 7 * 64 + 5 -> column 7
    g = (7 * 64 + 4) // 2 * 4 + 2 + 1
    assert (g // 2) % 2 == 1 and (g // 4) * 2 + g % 2 == 7 * 64 + 5
    tok[4, 60] = g
    with pytest.raises(ValueError, match=r"^block_table: block 34 \(request 3, column 7\) is outside the cache of 34 "
                                         r"blocks$"):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=64, dcp_size=2, dcp_rank=1, interleave=2,
                                        compact=compact, num_blocks=34)
    tok[4, 60] = g - 2  # owned by rank 0: not this rank's token, so not an error here
    smla.filter_convert_dcp_indices(req, bt, tok, block_size=64, dcp_size=2, dcp_rank=1, interleave=2,
                                    compact=compact, num_blocks=34)


def test_convert_num_blocks_argument():
    req, bt, tok = convert_case(np.random.default_rng(12), n=2, k=8)
    for bad in (0, -1, 2**63):
        with pytest.raises(ValueError, match=r"^num_blocks: expected the cache's block count"):
            smla.convert_topk_indices(req, bt, tok, block_size=64, num_blocks=bad)
    with pytest.raises(TypeError, match=r"^num_blocks: expected None or an integer, got str"):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=64, dcp_size=1, dcp_rank=0, num_blocks="34")
    smla.convert_topk_indices(req, bt, tok, block_size=64, num_blocks=np.int64(34))  # any integer type


# ------------------------------------------------------------------------------------------- layer

def small_cache_world(kv_dtype):
    """One request whose 40 context tokens sit in blocks 6 and 5 (and 1), with a cache cut to 4 blocks
    afterwards: the step's own slots (block 1) fit, the context the indexer selects does not."""
    rng = np.random.default_rng(13)
    world = World(rng, kv_dtype, block_size=16, max_model_len=64, max_reqs=1)
    world.block_table[0] = [6, 5, 1, 0]
    world.write_context(0, 40)
    return world


@pytest.mark.parametrize("cache_mode", [("fp8_ds_mla", "mixed"), ("fp8_ds_mla", "split"), ("bf16", "auto")],
                         ids=["fp8-mixed", "fp8-split", "bf16"])
@pytest.mark.parametrize("q_len", [1, 5])
def test_layer_cache_smaller_than_block_table(cache_mode, q_len):
    """The issue's case: wrong rows without an error before. Decodes and mixed mode fail in the index
    conversion; split-mode prefills (workspace rows, no block check there) in gather_upconvert."""
    kv_dtype, mode = cache_mode
    world = small_cache_world(kv_dtype)
    builder, attn = make(world, 16, 32, mode, max_tokens=16)
    st = world.step([(0, q_len)], 16, 32)
    st["topk"][:, 0] = 3  # position 3: block 6
    md = build(builder, st)
    small = world.cache[:4]
    where = "block_table: block 6 \\(request 0, column 0\\) is outside the cache of 4 blocks"
    with pytest.raises(ValueError, match=where):
        attn.forward(st["q"], st["kv_c"], st["k_pe"], small, st["topk"], md)


def test_layer_slots_past_small_cache():
    world = small_cache_world("fp8_ds_mla")
    world.block_table[0, 2] = 4  # the step's token (position 40) now lands in block 4
    builder, attn = make(world, 16, 32, "mixed", max_tokens=16)
    st = world.step([(0, 1)], 16, 32)
    md = build(builder, st)
    small = world.cache[:4].copy()
    before = small.copy()
    with pytest.raises(ValueError, match=r"^slot_mapping: slot 72 \(token 0\) is outside the cache of 64 slots$"):
        attn.forward(st["q"], st["kv_c"], st["k_pe"], small, st["topk"], md)
    np.testing.assert_array_equal(small, before)


def test_layer_output_and_cache_shapes():
    world = small_cache_world("fp8_ds_mla")
    builder, attn = make(world, 16, 32, "mixed", max_tokens=16)
    st = world.step([(0, 2)], 16, 32)
    md = build(builder, st)
    args = (st["q"], st["kv_c"], st["k_pe"], world.cache, st["topk"], md)
    before = world.cache.copy()
    for out in (np.zeros((2, 16 * 512), np.float32), np.zeros((2, 8, 512), BF16), np.zeros((1, 16, 512), BF16),
                np.zeros((2, 16, 256), BF16)):  # shapes are checked whatever the dtype
        with pytest.raises(ValueError, match=r"^out: expected \[2, 16, 512\] \(at least T = "
                                             r"len\(md.slot_mapping\) = 2 rows\), got \["):
            attn.forward(*args, out=out)
    for lse in (np.zeros((2, 8), np.float32), np.zeros(2, np.float32), np.zeros((1, 16), np.float32)):
        with pytest.raises(ValueError, match=r"^lse: expected \[2, 16\] "):
            attn.forward(*args, return_lse=True, lse=lse)
    with pytest.raises(TypeError, match=r"^out: expected a NumPy array or an object with __dlpack__, got list"):
        attn.forward(*args, out=[[0.0]])
    for cache in (world.cache[:, :8], world.cache[..., :576], world.cache[0], world.cache[:0],
                  np.zeros((7, 16, 576), BF16)):  # another block size, a bf16 entry, 2-d, no blocks
        with pytest.raises(ValueError, match=r"^kv_cache: expected \[num_blocks >= 1, 16, 656\] \(the layer's "
                                             r"block_size and the fp8_ds_mla entry\), got \["):
            attn.forward(*args[:3], cache, *args[4:])
    np.testing.assert_array_equal(world.cache, before)  # checked before the cache write
    out, lse = attn.forward(*args, out=np.zeros((3, 16, 512), BF16), return_lse=True,
                            lse=np.zeros((2, 16), np.float32))  # longer out, exact lse: fine
    assert out.shape == (3, 16, 512) and lse.shape == (2, 16)


# ------------------------------------------------------------------- the GPU's documented behaviour

def host(x):
    import torch

    torch.cuda.synchronize()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).cpu().numpy().view(np.uint16)
    return x.cpu().numpy()


@pytest.mark.cuda
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_cuda_pack_kv_skips_slots_past_cache(slot_dtype):
    rng = np.random.default_rng(20)
    nb, bs, t = 32, 64, 600
    kv_c, k_pe = tokens(t, rng)
    slots = rng.permutation(nb * bs)[:t].astype(slot_dtype)
    slots[[7, 400]] = [nb * bs, np.iinfo(slot_dtype).max]
    slots[9] = -1
    gpu = to_torch(fp8_cache(nb, bs))
    smla.pack_kv(to_torch(kv_c), to_torch(k_pe), gpu, to_torch(slots), kv_cache_dtype="fp8_ds_mla")
    expected = fp8_cache(nb, bs)
    smla.pack_kv(kv_c, k_pe, expected, np.where(slots >= nb * bs, -1, slots), kv_cache_dtype="fp8_ds_mla")
    np.testing.assert_array_equal(host(gpu), expected)


@pytest.mark.cuda
@pytest.mark.parametrize("k", [2048, 13])
def test_cuda_convert_num_blocks_gives_minus_one(k):
    """On the GPU a selected block past the cache becomes -1: the CPU's result with those blocks marked
    -1 in the block table (which the CPU skips), and unchanged without num_blocks."""
    rng = np.random.default_rng(21)
    req, bt, tok = convert_case(rng, n=64, k=k)
    bt[2, 3], bt[0, 0], bt[1, 7] = 40, 34, I32.max
    tok[:, :4] = [3 * 64 + 9, 5, 7 * 64, 33]
    cut = np.where(bt >= 34, -1, bt).astype(np.int32)
    e_out, e_counts = smla.convert_topk_indices(req, cut, tok, block_size=64, return_valid_counts=True)
    g = [to_torch(a) for a in (req, bt, tok)]
    out, counts = smla.convert_topk_indices(*g, block_size=64, num_blocks=34, return_valid_counts=True)
    np.testing.assert_array_equal(host(out), e_out)
    np.testing.assert_array_equal(host(counts), e_counts)
    out = smla.convert_topk_indices(*g, block_size=64)  # absent: the old slots
    np.testing.assert_array_equal(host(out), smla.convert_topk_indices(req, bt, tok, block_size=64))
    e_out, e_counts = smla.filter_convert_dcp_indices(req, cut, tok, block_size=64, dcp_size=2, dcp_rank=1)
    out, counts = smla.filter_convert_dcp_indices(*g, block_size=64, dcp_size=2, dcp_rank=1, num_blocks=34)
    np.testing.assert_array_equal(host(out), e_out)
    np.testing.assert_array_equal(host(counts), e_counts)


@pytest.mark.cuda
def test_cuda_gather_skips_and_zero_rows():
    """Rows past the workspace are skipped; a block outside the cache or a position past the block
    table gives zero rows (the oracle's rule)."""
    cache, bt, lens, starts, seq_starts = gather_case(np.random.default_rng(22))
    bt[0, 1] = 10  # request 0's positions 8..15: zero rows 5..12
    seq_starts[1], lens[1] = 28, 9  # request 1: positions 28..36, column 3 is -1, column 4 past the table:
    starts[2] = 35  # rows 20..28 zero; request 2: rows 35..48 of 43, the tail skipped; 29..34 untouched
    expected = np.full((43, 576), SENTINEL, np.uint16)
    ref.gather_upconvert(cache, expected, bt, lens, starts, seq_starts, kv_cache_dtype="fp8_ds_mla")
    ws = to_torch(np.full((43, 576), SENTINEL, np.uint16))
    smla.gather_upconvert(to_torch(cache), ws, *(to_torch(a) for a in (bt, lens, starts)),
                          seq_starts=to_torch(seq_starts))
    ref.assert_bf16_equal(host(ws), expected)
    assert not expected[5:13].any() and not expected[20:29].any() and (expected[29:35] == SENTINEL).all()
