"""smla.gather_upconvert against the float64 oracle (tests/reference.py), bit for bit, and CUDA
against CPU."""
import os
import sys

import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
from torch_arrays import to_torch as to_cuda  # noqa: E402

SENTINEL = 0x5A5A


def packed_cache(nb, bs, cd, rng, layers=1):
    """A cache written by the real writer (pow2 scales), one layer of an interleaved allocation."""
    shape = (nb, layers) + ref.kv_cache_shape(1, bs, cd)[1:]
    full = np.zeros(shape, np.uint8 if cd == "fp8_ds_mla" else np.uint16)
    cache = full[:, 0]
    t = nb * bs
    smla.pack_kv(ref.rand_bf16((t, 512), rng, 2.0), ref.rand_bf16((t, 64), rng), cache,
                 np.arange(t, dtype=np.int64), kv_cache_dtype=cd)
    return cache


def run_both(cache, cd, w, bt, lens, starts, seq_starts=None):
    ws = np.full((w, 576), SENTINEL, np.uint16)
    expected = ws.copy()
    ref.gather_upconvert(cache, expected, bt, lens, starts, seq_starts, kv_cache_dtype=cd)
    res = smla.gather_upconvert(cache, ws, bt, lens, starts, seq_starts=seq_starts, kv_cache_dtype=cd)
    assert res is ws
    ref.assert_bf16_equal(ws, expected)
    return ws


@pytest.mark.parametrize("cd", ["fp8_ds_mla", "bf16"])
def test_vllm_seq_starts_cases(cd):
    """vLLM's test_cp_gather_fp8 cases: block 4, full lengths [12, 11, 9]; gather lengths [6, 5, 3]
    from starts [3, 4, 5], and [0, 5, 3] from [12, 4, 5]."""
    rng = np.random.default_rng(21)
    bs, nb = 4, 12
    cache = packed_cache(nb, bs, cd, rng)
    bt = rng.permutation(nb)[:9].reshape(3, 3).astype(np.int32)
    for lens, starts in [([6, 5, 3], [3, 4, 5]), ([0, 5, 3], [12, 4, 5])]:
        lens = np.array(lens, np.int32)
        ws_starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
        ws = run_both(cache, cd, int(lens.sum()), bt, lens, ws_starts, np.array(starts, np.int32))
        # row by row: request r's token seq_starts[r] + i
        flat = ref.unpack_kv(cache, np.arange(nb * bs), cd)
        for r in range(3):
            for i in range(lens[r]):
                p = starts[r] + i
                assert np.array_equal(ws[ws_starts[r] + i], flat[bt[r, p // bs] * bs + p % bs])


@pytest.mark.parametrize("cd", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("with_seq_starts", [False, True])
def test_random_requests_and_invalid_entries(cd, with_seq_starts):
    """Irregular lengths (0 and the whole block table included), rows no request writes, a workspace
    exactly big enough, and block ids outside the cache in columns no request reads (padding, allowed;
    invalid requests raise: tests/test_data_checks.py)."""
    rng = np.random.default_rng(22)
    nb, bs, r, mb = 40, 16, 9, 6
    i32 = np.iinfo(np.int32)
    cache = packed_cache(nb, bs, cd, rng, layers=3)
    bt = rng.integers(0, nb, (r, mb)).astype(np.int32)
    seq_starts = rng.integers(0, bs, r).astype(np.int32) if with_seq_starts else np.zeros(r, np.int32)
    lens = rng.integers(1, mb * bs - bs, r).astype(np.int32)
    lens[5] = mb * bs - seq_starts[5]  # up to the end of the block table
    lens[6] = 0
    for q in range(r):
        used = -(-(int(seq_starts[q]) + int(lens[q])) // bs)  # columns the request reads
        bt[q, used:] = rng.choice([-1, nb, i32.max, i32.min], mb - used)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
    starts[1:] += 3  # a gap of 3 rows after request 0 that no request writes
    w = int(starts[-1] + lens[-1])
    ws = run_both(cache, cd, w, bt, lens, starts, seq_starts if with_seq_starts else None)
    assert (ws[lens[0]:lens[0] + 3] == SENTINEL).all()  # rows of no request keep their value


def test_int32_extremes_never_fault():
    """Extreme lengths / starts / positions: the CPU's checks do not overflow, they raise before any
    row is written."""
    rng = np.random.default_rng(23)
    cache = packed_cache(4, 4, "fp8_ds_mla", rng)
    i32 = np.iinfo(np.int32)
    bt = np.array([[0, 1], [2, 3], [3, 2], [1, 0], [0, 1]], np.int32)
    lens = np.array([i32.max, 5, 3, i32.max, 2], np.int32)
    starts = np.array([i32.max - 2, i32.min, 0, 4, i32.min], np.int32)
    seq_starts = np.array([0, 0, i32.max - 1, i32.min, i32.max], np.int32)
    ws = np.full((10, 576), SENTINEL, np.uint16)
    for r, match in [(0, "workspace: request 0 writes rows 2147483645..4294967291"),
                     (1, "workspace_starts: request 0 starts at row -2147483648"),
                     (2, "seq_lens: request 0 reads positions 2147483646..2147483648"),
                     (3, "seq_starts: request 0 starts at position -2147483648"),
                     (4, "workspace_starts: request 0 starts at row -2147483648")]:
        with pytest.raises(ValueError, match=match):
            smla.gather_upconvert(cache, ws, bt[r:r + 1], lens[r:r + 1], starts[r:r + 1],
                                  seq_starts=seq_starts[r:r + 1])
        assert (ws == SENTINEL).all()


def test_strided_workspace_and_block_table():
    rng = np.random.default_rng(24)
    nb, bs = 10, 8
    cache = packed_cache(nb, bs, "fp8_ds_mla", rng)
    bt_big = rng.integers(0, nb, (3, 8)).astype(np.int32)
    bt = bt_big[:, :5]
    lens = np.array([9, 0, 17], np.int32)
    starts = np.array([0, 9, 9], np.int32)
    big = np.full((60, 600), SENTINEL, np.uint16)
    ws = big[::2, 4:580]
    expected = ws.copy()
    ref.gather_upconvert(cache, expected, bt, lens, starts, kv_cache_dtype="fp8_ds_mla")
    smla.gather_upconvert(cache, ws, bt, lens, starts)
    ref.assert_bf16_equal(ws, expected)
    assert (big[1::2] == SENTINEL).all() and (big[:, :4] == SENTINEL).all() and (big[:, 580:] == SENTINEL).all()


# ---------------------------------------------------------------- CUDA twin, bit for bit

@pytest.mark.cuda
@pytest.mark.parametrize("cd", ["fp8_ds_mla", "bf16"])
@pytest.mark.parametrize("with_seq_starts", [False, True])
def test_cuda_matches_cpu(cd, with_seq_starts):
    """Invalid block ids, positions past the block table, rows outside the workspace: the CPU
    rejects these, so the GPU's documented behaviour (skipped / zero rows) is checked against the
    oracle, which is bit for bit the CPU's dequant (run_both above)."""
    import torch

    rng = np.random.default_rng(25)
    nb, bs, r, mb = 300, 64, 17, 12
    cache = packed_cache(nb, bs, cd, rng, layers=2)
    gpu_cache = to_cuda(cache.base)[:, 0]
    bt = rng.integers(-2, nb + 2, (r, mb)).astype(np.int32)
    lens = rng.integers(0, mb * bs + 50, r).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
    w = int(lens.sum()) - 100
    starts[0] = -40  # rows below 0 are skipped; ranges never overlap (write order across requests is unspecified)
    seq_starts = rng.integers(-3, 2 * bs, r).astype(np.int32) if with_seq_starts else None
    cpu = np.full((w, 576), SENTINEL, np.uint16)
    ref.gather_upconvert(cache, cpu, bt, lens, starts, seq_starts, kv_cache_dtype=cd)
    gpu = to_cuda(np.full((w, 576), SENTINEL, np.uint16))
    smla.gather_upconvert(gpu_cache, gpu, to_cuda(bt), to_cuda(lens), to_cuda(starts),
                          seq_starts=None if seq_starts is None else to_cuda(seq_starts), kv_cache_dtype=cd)
    torch.cuda.synchronize()
    ref.assert_bf16_equal(gpu.view(torch.int16).cpu().numpy().view(np.uint16), cpu)
