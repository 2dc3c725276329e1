"""smla.convert_topk_indices / filter_convert_dcp_indices against the oracle (tests/reference.py),
exactly, and CUDA against CPU."""
import os
import sys

import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
from test_pack_kv import isa  # noqa: E402,F401 (the SMLA_CPU_ISA levels fixture)
from torch_arrays import to_torch as to_cuda  # noqa: E402

I32 = np.iinfo(np.int32)


def paged_case(rng, n=24, r=5, mb=10, bs=64, k=256, nb=None):
    nb = nb or r * mb * 2
    bt = rng.integers(0, nb, (r, mb)).astype(np.int32)
    req = rng.integers(0, r, n).astype(np.int32)
    tok = rng.integers(-2, mb * bs + 3, (n, k)).astype(np.int32)
    return req, bt, tok


def convert(req, bt, tok, bs, **kw):
    out, counts = smla.convert_topk_indices(req, bt, tok, block_size=bs, return_valid_counts=True, **kw)
    exp, exp_counts = ref.convert_topk_indices(req, bt, tok, bs, kw.get("prefill_request_ids"),
                                               kw.get("prefill_workspace_starts"))
    assert out.dtype == np.int32 and counts.dtype == np.int32
    np.testing.assert_array_equal(out, exp)
    np.testing.assert_array_equal(counts, exp_counts)
    return out, counts


@pytest.mark.parametrize("bs", [1, 16, 64, 128])
@pytest.mark.parametrize("k", [1, 128, 384, 2048])
def test_paged_matches_reference(bs, k):
    rng = np.random.default_rng(31)
    req, bt, tok = paged_case(rng, bs=bs, k=k)
    out = smla.convert_topk_indices(req, bt, tok, block_size=bs)
    np.testing.assert_array_equal(out, ref.convert_topk_indices(req, bt, tok, bs)[0])
    convert(req, bt, tok, bs)


def test_every_int32_value_class():
    """Entries: INT_MIN, -123456, -1, 0, a valid middle value, the last valid position, just past
    the block table, INT_MAX; request ids out of range; negative and huge block ids (slot overflows
    int32 -> -1)."""
    bs, mb = 16, 4
    bt = np.array([[3, 7, 1, 2], [-1, 5, I32.max // 8, I32.max], [0, I32.min, 9, 4]], np.int32)
    vals = np.array([I32.min, -123456, -1, 0, 17, mb * bs - 1, mb * bs, mb * bs + 1, I32.max, 40, 33, 50],
                    np.int32)
    req = np.array([0, 1, 2, -1, 3, I32.max, I32.min], np.int32)
    tok = np.tile(vals, (len(req), 1))
    out, counts = convert(req, bt, tok, bs)
    # hand-checked row 0: 0 -> 3*16, 17 -> 7*16+1, 63 -> 2*16+15, 40 -> 1*16+8
    assert list(out[0]) == [-1, -1, -1, 48, 113, 47, -1, -1, -1, 24, 17, 34]
    assert (out[3:] == -1).all() and (counts[3:] == 0).all()  # request id out of range
    # row 1: block 0 is -1; block 2 = INT32_MAX // 8 -> slot fits? (2^31-1)//8*16 > INT32_MAX -> -1
    assert out[1, 3] == -1 and out[1, 4] == 5 * 16 + 1 and out[1, 11] == -1


def test_prefill_workspace_rows():
    rng = np.random.default_rng(32)
    bs = 64
    req, bt, tok = paged_case(rng, n=16, bs=bs, k=128)
    pids = np.full(16, -1, np.int32)
    pids[4:8] = 0
    pids[8:12] = 1
    pids[12] = 2  # past num_prefills -> -1 row
    pids[13] = I32.max
    pids[14] = I32.min  # negative: a paged row
    starts = np.array([100, I32.max - 50], np.int32)  # request 1 overflows int32 for tok > 50
    mb_past = 10 * bs + 5  # past the block table: fine for a workspace row
    tok[4:12, :4] = [I32.max, mb_past, 0, 49]
    out, counts = convert(req, bt, tok, bs, prefill_request_ids=pids, prefill_workspace_starts=starts)
    # prefill rows skip the block-table bounds check
    assert out[4, 1] == 100 + mb_past and out[4, 0] == -1
    assert out[8, 3] == I32.max - 1 and out[8, 1] == -1
    assert (out[12] == -1).all() and (out[13] == -1).all()
    assert counts[12] == 0


def test_valid_prefix_counts():
    """vLLM's valid-prefix case: rows hold K/2, K/4, K, 1 valid entries then -1."""
    rng = np.random.default_rng(33)
    for k in (128, 384, 2048):
        req, bt, tok = paged_case(rng, n=8, k=k, mb=40)
        tok = rng.integers(0, 40 * 64, (8, k)).astype(np.int32)
        lens = np.array([k // 2, k // 4, k, 1] * 2)
        tok[np.arange(k)[None, :] >= lens[:, None]] = -1
        out, counts = convert(req, bt, tok, 64)
        np.testing.assert_array_equal(counts, lens)


def test_out_buffers_and_in_place():
    rng = np.random.default_rng(34)
    req, bt, tok = paged_case(rng, n=10, k=200)
    exp, exp_counts = ref.convert_topk_indices(req, bt, tok, 64)
    big = np.full((20, 256), 7, np.int32)
    out = big[::2, 10:210]
    counts = np.full(10, 99, np.int32)
    res = smla.convert_topk_indices(req, bt, tok, block_size=64, out=out, valid_counts=counts,
                                    return_valid_counts=True)
    assert res[0] is out and res[1] is counts
    np.testing.assert_array_equal(out, exp)
    np.testing.assert_array_equal(counts, exp_counts)
    assert (big[1::2] == 7).all() and (big[:, :10] == 7).all() and (big[:, 210:] == 7).all()
    t2 = tok.copy()
    smla.convert_topk_indices(req, bt, t2, block_size=64, out=t2)  # in place
    np.testing.assert_array_equal(t2, exp)


def test_bad_arguments():
    rng = np.random.default_rng(35)
    req, bt, tok = paged_case(rng, n=4, k=8)
    with pytest.raises(ValueError, match=r"^req_id: "):
        smla.convert_topk_indices(req[:3], bt, tok, block_size=64)
    with pytest.raises(ValueError, match=r"^block_size: "):
        smla.convert_topk_indices(req, bt, tok, block_size=0)
    with pytest.raises(TypeError, match=r"^topk_indices: "):
        smla.convert_topk_indices(req, bt, tok.astype(np.int64), block_size=64)
    with pytest.raises(ValueError, match=r"^dcp_rank: "):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=64, dcp_size=2, dcp_rank=2)
    with pytest.raises(ValueError, match=r"^interleave: "):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=64, dcp_size=2, dcp_rank=0, interleave=0)


# ---------------------------------------------------------------- every CPU path

def zoo_case(rng, n, r, mb, bs, k, nb):
    """Paged rows whose entries hit every branch of the rule: negative positions (INT32_MIN included),
    positions past the block table and at its last entry, block ids -1, INT32_MIN, past the cache
    (when nb is given), and ones whose slot overflows int32; rows of no request; k not a multiple of 8."""
    bt = rng.integers(0, nb, (r, mb)).astype(np.int32)
    bt[rng.random(bt.shape) < 0.1] = -1
    bt[0, -1] = I32.min
    big = I32.max // bs
    bt[1, : min(mb, 4)] = [big, min(big + 1, I32.max), max(big - 1, 0), I32.max][: min(mb, 4)]
    req = rng.integers(0, r, n).astype(np.int32)
    req[::7] = rng.choice([-1, r, I32.max, I32.min], req[::7].shape)
    hi = min(mb * bs + 3, I32.max)
    tok = rng.integers(-3, hi, (n, k), dtype=np.int64).astype(np.int32)
    zoo = np.array([I32.min, -(2**30), -bs, -1, 0, bs - 1, bs, min(mb * bs - 1, I32.max), min(mb * bs, I32.max),
                    I32.max], np.int64).astype(np.int32)
    tok[:, : zoo.size] = zoo[: min(k, zoo.size)]
    return req, bt, tok


@pytest.mark.parametrize("bs", [1, 2, 3, 16, 61, 64, 1000, 2**20, 2**30, 2**31 - 1])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_every_path_matches_reference(isa, bs, threads, monkeypatch):
    """Each SMLA_CPU_ISA level (the vector code: shifts for power-of-two block sizes, a corrected
    reciprocal otherwise, unsigned range tests, a masked gather) against the oracle on every branch of
    the rule, with and without prefill rows, in place, on one and two threads."""
    monkeypatch.setenv("SMLA_NUM_THREADS", threads)
    rng = np.random.default_rng(bs % 9973)
    n, r, k = 40, 5, 2051
    mb = max(1, min(300, (I32.max // bs) + 3))  # past INT32_MAX // bs columns: no position reaches them
    req, bt, tok = zoo_case(rng, n, r, mb, bs, k, nb=5000)
    convert(req, bt, tok, bs)
    pids = np.full(n, -1, np.int32)
    pids[3::4] = rng.integers(0, 3, pids[3::4].size)
    pids[5] = 3  # past num_prefills
    starts = np.array([0, 7777, I32.max - 1000], np.int32)
    convert(req, bt, tok, bs, prefill_request_ids=pids, prefill_workspace_starts=starts)
    exp = ref.convert_topk_indices(req, bt, tok, bs)[0]
    t2 = tok.copy()
    smla.convert_topk_indices(req, bt, t2, block_size=bs, out=t2)
    np.testing.assert_array_equal(t2, exp)


@pytest.mark.parametrize("bs,mb", [(2**20, 4096), (2**30, 8), (2**16, 2**15 + 7)])
def test_negative_positions_with_a_wide_block_table(isa, bs, mb):
    """A power-of-two block size with more block-table columns than any position can reach
    (INT32_MAX // bs + 1): a negative position shifted right lands on such a column, and must still be -1."""
    rng = np.random.default_rng(mb)
    bt = rng.integers(0, 100, (2, mb)).astype(np.int32)
    tok = np.array([[I32.min, -1, -bs, -(2**30), I32.min + bs, 0, bs, I32.max, I32.max - bs, -2, 5, 6, 7, 8, 9,
                     -bs - 1, min(3 * bs, I32.max)]] * 3, np.int32)
    convert(np.array([0, 1, 0], np.int32), bt, tok, bs)


def test_empty_block_table_and_rows(isa):
    """max_blocks = 0 (every paged entry -1, prefill rows still mapped), topk = 0 and no rows."""
    rng = np.random.default_rng(41)
    tok = rng.integers(-1, 100, (6, 37)).astype(np.int32)
    pids = np.array([-1, 0, -1, 1, -1, 0], np.int32)
    convert(np.zeros(6, np.int32), np.zeros((2, 0), np.int32), tok, 16, prefill_request_ids=pids,
            prefill_workspace_starts=np.array([10, 20], np.int32))
    convert(np.zeros(3, np.int32), np.zeros((2, 4), np.int32), np.zeros((3, 0), np.int32), 16)
    convert(np.zeros(0, np.int32), np.zeros((2, 4), np.int32), np.zeros((0, 8), np.int32), 16)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_num_blocks_check_on_every_path(isa, threads, monkeypatch):
    """With num_blocks the vector code tests every selected block against it; without an offending
    entry the result is the oracle's (blocks past INT32_MAX // bs but inside the cache are -1, not
    errors), and the first offending entry in row order is the one reported, whichever thread meets it."""
    monkeypatch.setenv("SMLA_NUM_THREADS", threads)
    rng = np.random.default_rng(42)
    for bs in (64, 61):
        req, bt, tok = zoo_case(rng, 300, 4, 40, bs, 100, nb=50)
        bt[bt >= 50] = 7  # the zoo's huge ids are past a 50-block cache: keep one overflow case only
        nb = I32.max // bs + 10
        bt[2, 3] = nb - 1  # inside the cache, but its slots overflow int32: -1
        out, counts = smla.convert_topk_indices(req, bt, tok, block_size=bs, num_blocks=nb, return_valid_counts=True)
        exp, exp_counts = ref.convert_topk_indices(req, bt, tok, bs)
        np.testing.assert_array_equal(out, exp)
        np.testing.assert_array_equal(counts, exp_counts)
        bt[2, 3], bt[3, 5] = 0, 60
        rows = np.nonzero(req == 3)[0]
        tok[rows[1], 50] = 5 * bs + 1  # the first in row order; later rows select it too
        tok[rows[2:], 9] = 5 * bs
        with pytest.raises(ValueError, match=r"^block_table: block 60 \(request 3, column 5\) is outside the "
                                             r"cache of 50 blocks$"):
            smla.convert_topk_indices(req, bt, tok, block_size=bs, num_blocks=50)


# ---------------------------------------------------------------- decode context parallel

def dcp_local_len(seq_len, world, il, rank):
    base = (seq_len // il // world) * il
    return base + min(max(seq_len - base * world - rank * il, 0), il)


@pytest.mark.parametrize("il", [1, 2, 4])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("compact", [True, False])
def test_dcp_union_over_ranks_is_the_whole_set(il, world, compact):
    """Every rank keeps exactly the tokens it owns, at its local position; mapped back to global
    positions, the union over ranks is the whole set of valid inputs, each owned exactly once."""
    rng = np.random.default_rng(36 + il * 10 + world)
    bs, n, k, seq_len = 16, 6, 300, 1000
    mb = -(-seq_len // bs)
    req = rng.integers(0, 3, n).astype(np.int32)
    tok = rng.integers(-1, seq_len, (n, k)).astype(np.int32)
    tok[0, :5] = [I32.min, -123456, -1, seq_len - 1, 0]
    seen = np.zeros((n, k), np.int64)
    for rank in range(world):
        # identity block table per rank (block b -> b), so a slot is the local position itself
        bt = np.tile(np.arange(mb, dtype=np.int32), (3, 1))
        out, counts = smla.filter_convert_dcp_indices(req, bt, tok, block_size=bs, dcp_size=world,
                                                      dcp_rank=rank, interleave=il, compact=compact)
        exp, exp_counts = ref.filter_convert_dcp_indices(req, bt, tok, bs, world, rank, il, compact)
        np.testing.assert_array_equal(out, exp)
        np.testing.assert_array_equal(counts, exp_counts)
        assert (out[out != -1] < dcp_local_len(seq_len, world, il, rank)).all()
        owned = (tok >= 0) & ((tok // il) % world == rank)
        np.testing.assert_array_equal(counts, owned.sum(1))
        loc = out.astype(np.int64)
        g = (loc // il) * (world * il) + rank * il + loc % il  # back to global positions
        for i in range(n):
            vals = g[i][out[i] != -1]
            if compact:
                assert (out[i, counts[i]:] == -1).all()
                np.testing.assert_array_equal(vals, tok[i][owned[i]])  # stable: same order
            else:
                np.testing.assert_array_equal(out[i] != -1, owned[i])
                np.testing.assert_array_equal(vals, tok[i][owned[i]])
        seen += owned
    assert (seen == (tok >= 0)).all()


def test_dcp_block_table_and_prefill_rows():
    """DCP with a real block table (random blocks, short tables) and prefill rows, which bypass
    the ownership filter (they index a gathered workspace)."""
    rng = np.random.default_rng(37)
    req, bt, tok = paged_case(rng, n=12, k=160, mb=6, bs=16)
    pids = np.full(12, -1, np.int32)
    pids[6:9] = [0, 1, 5]
    starts = np.array([0, 1000], np.int32)
    for world, rank, il in [(2, 1, 1), (3, 0, 2), (4, 3, 4), (1, 0, 1)]:
        for compact in (True, False):
            out, counts = smla.filter_convert_dcp_indices(
                req, bt, tok, block_size=16, dcp_size=world, dcp_rank=rank, interleave=il, compact=compact,
                prefill_request_ids=pids, prefill_workspace_starts=starts)
            exp, exp_counts = ref.filter_convert_dcp_indices(req, bt, tok, 16, world, rank, il, compact, pids,
                                                             starts)
            np.testing.assert_array_equal(out, exp)
            np.testing.assert_array_equal(counts, exp_counts)


@pytest.mark.parametrize("world,il", [(1, 1), (2, 1), (3, 1), (4, 2), (3, 5), (8, 64), (5, 1000), (7, 2**20)])
@pytest.mark.parametrize("bs", [16, 61])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_dcp_every_path(isa, world, il, bs, threads, monkeypatch):
    """filter_convert_dcp_indices on each SMLA_CPU_ISA level (the vector code divides by the interleave and
    the world size with shifts or a corrected reciprocal, and compacts 8 entries at a time through a
    lane table): every rank, compact or not, the zoo of entries, prefill rows (compacted, not filtered),
    in place, and a block past the cache reported."""
    monkeypatch.setenv("SMLA_NUM_THREADS", threads)
    rng = np.random.default_rng(world * 1000 + il)
    n, r, k = 24, 4, 1003
    req, bt, tok = zoo_case(rng, n, r, 60, bs, k, nb=5000)
    tok[:, 20:] = np.where(rng.random((n, k - 20)) < 0.9, rng.integers(0, world * 60 * bs, (n, k - 20)), tok[:, 20:])
    pids = np.full(n, -1, np.int32)
    pids[2::6] = rng.integers(0, 3, pids[2::6].size)
    starts = np.array([5, 9000, I32.max - 77], np.int32)
    for rank in {0, world - 1, world // 2}:
        for compact in (True, False):
            kw = dict(block_size=bs, dcp_size=world, dcp_rank=rank, interleave=il, compact=compact)
            for extra in ({}, dict(prefill_request_ids=pids, prefill_workspace_starts=starts)):
                out, counts = smla.filter_convert_dcp_indices(req, bt, tok, **kw, **extra)
                exp, exp_counts = ref.filter_convert_dcp_indices(req, bt, tok, bs, world, rank, il, compact,
                                                                 extra.get("prefill_request_ids"),
                                                                 extra.get("prefill_workspace_starts"))
                np.testing.assert_array_equal(out, exp)
                np.testing.assert_array_equal(counts, exp_counts)
            t2 = tok.copy()
            smla.filter_convert_dcp_indices(req, bt, t2, out=t2, **kw)
            np.testing.assert_array_equal(t2, ref.filter_convert_dcp_indices(req, bt, tok, bs, world, rank, il,
                                                                             compact)[0])
    # a block past the cache where rank 0 selects it (local position 3 * bs + 1 -> column 3 of request 1)
    bt[1] = rng.integers(0, 5000, bt.shape[1])  # the zoo's huge ids in this row are past the cache too
    bt[1, 3] = 6000
    loc = 3 * bs + 1
    g = (loc // il) * world * il + loc % il  # rank 0's position loc, as a global one
    row = int(np.nonzero(req == 1)[0][0])
    tok[row, 500] = g
    with pytest.raises(ValueError, match=r"^block_table: block 6000 \(request 1, column 3\) is outside the cache "
                                         r"of 5000 blocks$"):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=bs, dcp_size=world, dcp_rank=0, interleave=il,
                                        num_blocks=5000)


# ---------------------------------------------------------------- CUDA twin, bit for bit

@pytest.mark.cuda
@pytest.mark.parametrize("k", [1, 384, 2048])
@pytest.mark.parametrize("bs", [64, 61, 1])
def test_cuda_matches_cpu(k, bs):
    """The GPU divides by multiply-shift constants (smla_udiv), the CPU's vector path through a double
    reciprocal: a non-power-of-two block size compares the two."""
    rng = np.random.default_rng(38)
    req, bt, tok = paged_case(rng, n=300, r=7, mb=12, bs=bs, k=k)
    tok[::7, ::3] = rng.choice([I32.min, -123456, -1, 12 * bs, I32.max], tok[::7, ::3].shape)
    bt[2, 3], bt[4, 5] = -1, I32.max
    req[::11] = 7
    pids = np.full(300, -1, np.int32)
    pids[200:260] = rng.integers(0, 4, 60)
    starts = np.array([0, 5000, I32.max - 100, 77], np.int32)
    g = [to_cuda(a) for a in (req, bt, tok, pids, starts)]
    for kw, gkw in [({}, {}), (dict(prefill_request_ids=pids, prefill_workspace_starts=starts),
                               dict(prefill_request_ids=g[3], prefill_workspace_starts=g[4]))]:
        cpu = smla.convert_topk_indices(req, bt, tok, block_size=bs, return_valid_counts=True, **kw)
        gpu = smla.convert_topk_indices(g[0], g[1], g[2], block_size=bs, return_valid_counts=True, **gkw)
        np.testing.assert_array_equal(gpu[0].cpu().numpy(), cpu[0])
        np.testing.assert_array_equal(gpu[1].cpu().numpy(), cpu[1])
    for world, rank, il in [(1, 0, 1), (2, 1, 1), (3, 2, 2), (4, 0, 4)]:
        for compact in (True, False):
            kw = dict(block_size=bs, dcp_size=world, dcp_rank=rank, interleave=il, compact=compact)
            cpu = smla.filter_convert_dcp_indices(req, bt, tok, **kw)
            gpu = smla.filter_convert_dcp_indices(g[0], g[1], g[2], **kw)
            np.testing.assert_array_equal(gpu[0].cpu().numpy(), cpu[0])  # compaction is stable on both
            np.testing.assert_array_equal(gpu[1].cpu().numpy(), cpu[1])


@pytest.mark.cuda
@pytest.mark.parametrize("world,il", [(3, 1), (5, 3), (7, 64), (2, 1000), (6, 7), (1, 1 << 30), (3, 1 << 30),
                                      (2, (1 << 30) + 1)])
@pytest.mark.parametrize("k", [300, 4096 + 40])
def test_cuda_dcp_positions_up_to_2_pow_31(world, il, k):
    """GPU DCP conversion against the CPU over the whole int32 position range, odd world sizes and
    interleaves up to 2^30 (a kernel that divides differently, e.g. by multiply-shift magic numbers,
    must agree everywhere). Block size 2^24 keeps the local positions inside the block table (128
    blocks of 2^24 tokens), so ownership and local position decide each entry; rows longer than 4096
    entries take the multi-chunk path."""
    rng = np.random.default_rng(180 + world)
    bs, mb, n = 1 << 24, 128, 64
    bt = rng.integers(0, 128, (4, mb)).astype(np.int32)
    req = rng.integers(0, 4, n).astype(np.int32)
    tok = rng.integers(0, I32.max, (n, k), dtype=np.int64).astype(np.int32)
    tok[:, :8] = [min(x, I32.max) for x in (0, 1, il - 1, il, world * il - 1, world * il, I32.max, I32.max - 1)]
    g = [to_cuda(a) for a in (req, bt, tok)]
    for rank in sorted({0, world - 1, world // 2}):
        for compact in (True, False):
            kw = dict(block_size=bs, dcp_size=world, dcp_rank=rank, interleave=il, compact=compact)
            cpu = smla.filter_convert_dcp_indices(req, bt, tok, **kw)
            if rank * il < 2**31:  # else the rank owns no int32 position (world 3, interleave 2^30: rank 2)
                assert (cpu[1] > 0).all(), "every row keeps some entries: the case tests the mapping"
            gpu = smla.filter_convert_dcp_indices(g[0], g[1], g[2], **kw)
            np.testing.assert_array_equal(gpu[0].cpu().numpy(), cpu[0])
            np.testing.assert_array_equal(gpu[1].cpu().numpy(), cpu[1])
