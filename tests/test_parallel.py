"""smla.parallel (decode context parallelism), simulated in one process: split a cache by owner, run
every rank's share, combine with dcp_combine, and compare with the unsplit decode and the float64
oracle. The torch.distributed path runs over gloo on CPU processes when torch is installed."""
import functools
import os
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import smla
from smla.parallel import (dcp_combine, dcp_decode, dcp_global_position, dcp_local_decode,
                           dcp_local_position, dcp_local_seq_lens, dcp_owner, split_cache_by_owner)

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
from torch_arrays import to_torch  # noqa: E402

BF16 = ml_dtypes.bfloat16
CACHE_DTYPES = ["fp8_ds_mla", "bf16"]
BS = 64
SEQ_LENS = [1000, 100, 613]  # request 1 is shorter than 2 * 64: with interleave 64 some ranks own none of it
B, S_Q = 4, 2
REQ_ID = [0, 0, 1, 1, 2, 2, 0, 2]  # row k of the [B*S_Q, topk] indices is (k // S_Q, k % S_Q)
ROW_ONE_TOKEN, ROW_EMPTY = 5, 6  # only position 0 (rank 0 owns it); nothing valid
SCALE = 0.08


def bf16(bits):
    return np.asarray(bits).view(BF16)


def build_inputs(cd, h, topk):
    """One decode step over three requests of a paged cache (shuffled blocks), rows of every kind."""
    rng = np.random.default_rng([h, topk, CACHE_DTYPES.index(cd)])
    nblk = [-(-n // BS) for n in SEQ_LENS]
    num_blocks = sum(nblk) + 4
    perm = rng.permutation(num_blocks)
    bt = np.full((len(SEQ_LENS), max(nblk) + 2), -1, np.int32)
    slots, start = [], 0
    for r, n in enumerate(SEQ_LENS):
        bt[r, :nblk[r]] = perm[start:start + nblk[r]]
        start += nblk[r]
        p = np.arange(n)
        slots.append(bt[r, p // BS] * BS + p % BS)
    slots = np.concatenate(slots).astype(np.int32)
    cache = np.zeros(smla.kv_cache_shape(num_blocks, BS, cd), np.uint8 if cd == "fp8_ds_mla" else BF16)
    t = slots.shape[0]
    smla.pack_kv(bf16(ref.rand_bf16((t, 512), rng)), bf16(ref.rand_bf16((t, 64), rng)), cache, slots,
                 kv_cache_dtype=cd)

    def distinct(n_ctx, k):
        row = np.full(topk, -1, np.int64)
        sel = rng.permutation(n_ctx)[:k]
        row[:sel.shape[0]] = sel
        return row

    idx = np.stack([
        distinct(SEQ_LENS[0], topk),
        distinct(SEQ_LENS[0], topk),
        distinct(SEQ_LENS[1], topk),                           # topk > 100: -1 padded
        rng.permutation(distinct(SEQ_LENS[1], topk // 2)),     # -1 scattered through the row
        distinct(SEQ_LENS[2], topk),
        np.r_[0, np.full(topk - 1, -1)],                       # one token, owned by rank 0
        rng.choice([-1, -2, -7, ref.INT32_MIN], topk),         # nothing valid
        np.where(rng.random(topk) < 0.1, -1, rng.integers(0, SEQ_LENS[2], topk)),  # duplicates
    ]).astype(np.int32)
    sink = (rng.standard_normal(h) * 2 + 3).astype(np.float32)
    sink[0], sink[1] = np.inf, -np.inf
    return types.SimpleNamespace(
        cd=cd, h=h, topk=topk, cache=cache, bt=bt, seq_lens=np.array(SEQ_LENS, np.int32),
        q=bf16(ref.rand_bf16((B, S_Q, h, 576), rng)), idx=idx, req_id=np.array(REQ_ID, np.int32), sink=sink)


@functools.lru_cache(maxsize=None)
def dataset(cd, h, topk):
    """Inputs plus what every split must reproduce: the unsplit decode and the oracle (both computed
    once, with and without sink)."""
    d = build_inputs(cd, h, topk)
    slots = smla.convert_topk_indices(d.req_id, d.bt, d.idx, block_size=BS).reshape(B, S_Q, topk)
    ref_slots, _ = ref.convert_topk_indices(d.req_id, d.bt, d.idx, BS)
    ref_slots = ref_slots.reshape(B, S_Q, topk)
    for sfx, sink in (("", None), ("_sink", d.sink)):
        o, l = smla.sparse_mla_decode(d.q, d.cache, slots, softmax_scale=SCALE, kv_cache_dtype=cd, attn_sink=sink)
        ro, rl = ref.sparse_mla_decode_ref(d.q, d.cache, ref_slots, SCALE, cd, attn_sink=sink)
        setattr(d, "out_full" + sfx, o)
        setattr(d, "lse_full" + sfx, l)
        setattr(d, "out_ref" + sfx, ro)
        setattr(d, "lse_ref" + sfx, rl)
    return d


def row(a, k):
    return a[k // S_Q, k % S_Q]


def combine_f64(parts, sink=None):
    """The same-precision reference of a combine: the float64 merge of the ranks' actual bf16 / f32
    partial results, then the sink. Returns (out, lse, rounding) where rounding [..., 512] bounds what
    rounding the partial outputs to bf16 can move the combined output: sum_r w_r |o_r| 2**-8."""
    out, lse = ref.as_f64(parts[0][0]), ref.as_f64(parts[0][1])
    for o, l in parts[1:]:
        out, lse = ref.merge_attn_states(out, lse, o, l)
    rounding = np.zeros(out.shape)
    with np.errstate(all="ignore"):
        for o, l in parts:
            w = np.where(lse == -np.inf, 0.0, np.exp(ref.as_f64(l) - lse))
            rounding += w[..., None] * np.abs(ref.as_f64(o)) * 2.0**-8
        if sink is not None:
            f = np.where(lse == -np.inf, 0.0, 1 / (1 + np.exp(np.asarray(sink, np.float64) - lse)))
            out, rounding = out * f[..., None], rounding * f[..., None]
    return out, lse, rounding


def check_dcp(out, lse, d, parts, sink, name, against=("ref", "full")):
    """A combined DCP result is checked three ways.

    1. Against the float64 combine of its own partial results, with docs/design.md's tolerances: the combine
       itself is as accurate as a kernel.
    2. Against the oracle of the unsplit step and 3. the unsplit kernel: docs/design.md's tolerances widened
       by the bf16 rounding of the partial outputs. Partials are bf16 (the kernel's output type, as in
       vLLM), and where the ranks' contributions cancel, their rounding (2**-8 of each partial) is
       large next to the result: no implementation with bf16 partials meets the plain elementwise
       bound there. The cosine bound widens the same way: the angle between result and expectation
       may be that of docs/design.md's cosine tolerance (twice against the unsplit kernel, which rounds too)
       plus |rounding| / |expected|. lse keeps docs/design.md's tolerances."""
    sfx = "_sink" if sink is not None else ""
    c_out, c_lse, rounding = combine_f64(parts, sink)
    ref.check_decode(out, lse, c_out, c_lse, name=f"{name} vs float64 combine")
    a = ref.as_f64(out)
    assert not np.isnan(a).any() and not np.isnan(lse).any()
    assert (row(a, ROW_EMPTY) == 0).all() and (row(lse, ROW_EMPTY) == -np.inf).all()
    for what in against:
        e_out, e_lse = getattr(d, f"out_{what}{sfx}"), getattr(d, f"lse_{what}{sfx}")
        e = ref.as_f64(e_out)
        err = np.abs(a - e)
        bound = np.maximum(ref.OUT_ABS, ref.OUT_REL * np.abs(e)) + rounding
        if what == "full":  # the unsplit kernel's own rounding
            bound += 2.0**-8 * np.abs(e)
        bad = err > bound
        if bad.any():
            i = np.unravel_index(int(np.argmax(err / bound)), err.shape)
            raise AssertionError(f"{name} vs {what}: {int(bad.sum())} of {a.size} outside the bound; worst at "
                                 f"{i}: actual {a[i]!r}, expected {e[i]!r}, bound {bound[i]:.3g}")
        av, ev = a.reshape(-1), e.reshape(-1)  # all finite (checked above)
        cos_diff = 1 - np.dot(av, ev) / (np.linalg.norm(av) * np.linalg.norm(ev))
        angle = (2 if what == "full" else 1) * np.sqrt(2 * ref.OUT_COS) + np.linalg.norm(rounding) / np.linalg.norm(ev)
        assert cos_diff <= angle**2 / 2, f"{name} vs {what}: cosine difference {cos_diff:.3g} > {angle**2 / 2:.3g}"
        ref.check_close(lse, e_lse, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name=f"{name} vs {what} lse")


# ---- framework plumbing for the torch variants ----

def to_numpy(t):
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).view(BF16)
    return t.numpy()


def simulate(d, n, interleave, device=None):
    """Every rank's partial result, in rank order: [(out, lse)] as NumPy (device None) or torch."""
    cache, bt, q, idx, req_id = d.cache, d.bt, d.q, d.idx, d.req_id
    if device is not None:
        cache, bt, q, idx, req_id = (to_torch(a, device) for a in (cache, bt, q, idx, req_id))
    parts = []
    for r, (lc, lbt, _) in enumerate(split_cache_by_owner(cache, bt, d.seq_lens, dcp_size=n,
                                                            interleave=interleave, seed=n)):
        parts.append(dcp_local_decode(q, lc, idx, req_id, lbt, block_size=BS, softmax_scale=SCALE,
                                      kv_cache_dtype=d.cd, dcp_size=n, dcp_rank=r, interleave=interleave))
    return parts


def check_simulation(d, n, interleave, parts):
    lses = [np.asarray(l) for _, l in parts]
    for r, (o, l) in enumerate(zip([np.asarray(o).astype(np.float32) for o, _ in parts], lses)):
        assert not np.isnan(o).any() and not np.isnan(l).any(), f"rank {r}: NaN in a partial result"
        assert (row(o, ROW_EMPTY) == 0).all() and (row(l, ROW_EMPTY) == -np.inf).all()
        # Only rank 0 owns position 0: every other rank has a row with nothing selected.
        assert np.isfinite(row(l, ROW_ONE_TOKEN)).all() == (r == 0)
        if r > 0:
            assert (row(o, ROW_ONE_TOKEN) == 0).all()
    if interleave * n > SEQ_LENS[1]:  # request 1 is wholly on the first ranks
        assert all((row(lses[r], k) == -np.inf).all() for r in range(-(-SEQ_LENS[1] // interleave), n)
                   for k in (2, 3))


# =============================================================================================
# the simulation grid
# =============================================================================================

@pytest.mark.parametrize("topk", [64, 256])
@pytest.mark.parametrize("h", [16, 128])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("interleave", [1, 2, 64])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_dcp_simulation(n, interleave, cd, h, topk):
    d = dataset(cd, h, topk)
    parts = simulate(d, n, interleave)
    check_simulation(d, n, interleave, parts)
    outs, lses = [p[0] for p in parts], [p[1] for p in parts]
    out, lse = dcp_combine(outs, lses)
    assert out.dtype == np.dtype(BF16) and lse.dtype == np.float32
    check_dcp(out, lse, d, parts, None, f"dcp n={n}")
    out, lse = dcp_combine(outs, lses, attn_sink=d.sink)
    check_dcp(out, lse, d, parts, d.sink, f"dcp n={n} sink", against=("ref",))
    assert (out[..., 0, :] == 0).all()  # sink +inf


@pytest.mark.cuda
@pytest.mark.parametrize("topk", [64, 256])
@pytest.mark.parametrize("h", [16, 128])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("interleave", [1, 2, 64])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_dcp_simulation_cuda(n, interleave, cd, h, topk):
    d = dataset(cd, h, topk)
    parts = simulate(d, n, interleave, device="cuda")
    np_parts = [(to_numpy(o), to_numpy(l)) for o, l in parts]
    check_simulation(d, n, interleave, np_parts)
    out, lse = dcp_combine([p[0] for p in parts], [p[1] for p in parts], attn_sink=to_torch(d.sink, "cuda"))
    assert out.is_cuda and lse.is_cuda
    check_dcp(to_numpy(out), to_numpy(lse), d, np_parts, d.sink, f"cuda dcp n={n} sink")


@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_dcp_simulation_torch_cpu(cd):
    pytest.importorskip("torch")
    d = dataset(cd, 16, 64)
    parts = simulate(d, 3, 2, device="cpu")
    np_parts = [(to_numpy(o), to_numpy(l)) for o, l in parts]
    check_simulation(d, 3, 2, np_parts)
    out, lse = dcp_combine([p[0] for p in parts], [p[1] for p in parts], attn_sink=d.sink)
    check_dcp(to_numpy(out), to_numpy(lse), d, np_parts, d.sink, "torch dcp")
    np_out, np_lse = dcp_combine([to_numpy(p[0]) for p in parts], [to_numpy(p[1]) for p in parts],
                                 attn_sink=d.sink)
    # torch's and NumPy's float32 exp may differ in the last bit, so not always the same bf16.
    ref.check_decode(to_numpy(out), to_numpy(lse), np_out, np_lse, name="torch vs numpy")


def test_sink_applied_once():
    """Applying the sink on each shard instead of after the combine is measurably wrong: the test
    data can tell the two apart."""
    d = dataset("bf16", 16, 64)
    n = 2
    wrong = []
    for r, (lc, lbt, _) in enumerate(split_cache_by_owner(d.cache, d.bt, d.seq_lens, dcp_size=n)):
        li, _ = smla.filter_convert_dcp_indices(d.req_id, lbt, d.idx, block_size=BS, dcp_size=n, dcp_rank=r)
        wrong.append(smla.sparse_mla_decode(d.q, lc, li.reshape(B, S_Q, -1), softmax_scale=SCALE,
                                            kv_cache_dtype="bf16", attn_sink=d.sink))
    out_wrong, lse_wrong = dcp_combine([w[0] for w in wrong], [w[1] for w in wrong])
    parts = simulate(d, n, 1)
    with pytest.raises(AssertionError, match="vs float64 combine out"):
        check_dcp(out_wrong, lse_wrong, d, parts, d.sink, "per-shard sink")
    out, lse = dcp_combine([p[0] for p in parts], [p[1] for p in parts], attn_sink=d.sink)
    check_dcp(out, lse, d, parts, d.sink, "sink after combine")


def test_dcp_decode_single_rank_numpy():
    """dcp_size 1 needs no process group: the plain decode of the (whole) local cache, sink included."""
    d = dataset("fp8_ds_mla", 16, 64)
    out, lse = dcp_decode(d.q, d.cache, d.idx.reshape(B, S_Q, -1), d.req_id, d.bt, block_size=BS,
                          softmax_scale=SCALE, kv_cache_dtype="fp8_ds_mla", dcp_size=1, dcp_rank=0,
                          attn_sink=d.sink)
    ref.check_decode(out, lse, d.out_ref_sink, d.lse_ref_sink, name="dcp_decode n=1")
    ref.assert_bf16_equal(out, d.out_full_sink)


# =============================================================================================
# dcp_combine on its own
# =============================================================================================

def random_parts(rng, n_ranks, shape=(37, 8), d=512):
    """Partial results with rows empty on some ranks (lse -inf, out 0) and rows empty on all."""
    outs, lses = [], []
    for _ in range(n_ranks):
        lse = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)
        lse[rng.random(shape) < 0.2] = -np.inf
        lse[0] = -np.inf  # row 0: empty everywhere
        out = bf16(ref.rand_bf16(shape + (d,), rng))
        out[lse == -np.inf] = 0
        outs.append(out)
        lses.append(lse)
    return outs, lses


def test_combine_single_rank_is_identity():
    outs, lses = random_parts(np.random.default_rng(1), 1)
    out, lse = dcp_combine(outs, lses)
    ref.assert_bf16_equal(out, outs[0])
    np.testing.assert_array_equal(lse, lses[0])


@pytest.mark.parametrize("n", [2, 3, 4])
def test_combine_matches_merge_attn_states(n):
    outs, lses = random_parts(np.random.default_rng(n), n)
    out, lse = dcp_combine(outs, lses)
    # smla.merge_attn_states folded pairwise, in float32 (bf16 intermediates would each round) ...
    m_out, m_lse = outs[0].astype(np.float32), lses[0]
    for o, l in zip(outs[1:], lses[1:]):
        m_out, m_lse = smla.merge_attn_states(m_out, m_lse, o.astype(np.float32), l)
    assert m_out.dtype == np.float32
    if n == 2:  # one merge: both round the same float32 formula to bf16 once
        ref.check_close(out, smla.merge_attn_states(outs[0], lses[0], outs[1], lses[1])[0],
                        abs_tol=ref.OUT_ABS, rel_tol=ref.OUT_REL, cos_tol=ref.OUT_COS, name="out bf16")
    ref.check_close(out, m_out, abs_tol=ref.OUT_ABS, rel_tol=ref.OUT_REL, cos_tol=ref.OUT_COS, name="out")
    ref.check_close(lse, m_lse, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name="lse")
    # ... and the float64 oracle's fold.
    r_out, r_lse = ref.as_f64(outs[0]), ref.as_f64(lses[0])
    for o, l in zip(outs[1:], lses[1:]):
        r_out, r_lse = ref.merge_attn_states(r_out, r_lse, o, l)
    ref.check_decode(out, lse, r_out, r_lse, name="combine vs oracle")
    assert (out[0] == 0).all() and (lse[0] == -np.inf).all()
    if n == 2:
        ref.assert_bf16_equal(dcp_combine(outs[::-1], lses[::-1])[0], out)  # symmetric


def test_combine_empty_shards_contribute_nothing():
    """A shard whose lse is -inf (or NaN / +inf, which vLLM's combine treats as empty) adds exactly 0,
    even when its output holds NaN or Inf garbage; rows empty everywhere give 0 and -inf."""
    rng = np.random.default_rng(7)
    outs, lses = random_parts(rng, 2)
    junk = bf16(np.full((37, 8, 512), 0x7FC0, np.uint16))  # NaN
    junk[::2] = np.inf
    for bad in (-np.inf, np.nan, np.inf):
        out, lse = dcp_combine(outs + [junk], lses + [np.full((37, 8), bad, np.float32)])
        ref.assert_bf16_equal(out, dcp_combine(outs, lses)[0])
        np.testing.assert_array_equal(lse, dcp_combine(outs, lses)[1])
    out, lse = dcp_combine([junk, junk], [np.full((37, 8), -np.inf, np.float32)] * 2, attn_sink=np.zeros(8))
    assert (out.astype(np.float32) == 0).all() and (lse == -np.inf).all()


def test_combine_bf16_bits_and_f32_outputs():
    outs, lses = random_parts(np.random.default_rng(3), 3)
    out, lse = dcp_combine(outs, lses)
    bits, lse_b = dcp_combine([o.view(np.uint16) for o in outs], lses)
    assert bits.dtype == np.uint16
    ref.assert_bf16_equal(bits, out)
    f32, _ = dcp_combine([o.astype(np.float32) for o in outs], lses)
    assert f32.dtype == np.float32
    ref.check_decode(f32, lse_b, out, lse)


def test_combine_rejects_mismatched_lists():
    outs, lses = random_parts(np.random.default_rng(0), 2)
    with pytest.raises(ValueError, match=r"^dcp_combine: expected one lse per output, got 2 outputs, 1 lses"):
        dcp_combine(outs, lses[:1])
    with pytest.raises(ValueError, match=r"^dcp_combine: expected one lse per output, got 0 outputs"):
        dcp_combine([], [])


# =============================================================================================
# ownership helpers and split_cache_by_owner
# =============================================================================================

@pytest.mark.parametrize("interleave", [1, 2, 4, 64])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ownership_round_trip(n, interleave):
    g = np.arange(5000)
    owner, local = dcp_owner(g, n, interleave), dcp_local_position(g, n, interleave)
    for r in range(n):
        mine = g[owner == r]
        # Each rank's tokens are numbered 0, 1, 2, ... in global order, and the inverse maps back.
        np.testing.assert_array_equal(local[owner == r], np.arange(mine.shape[0]))
        np.testing.assert_array_equal(dcp_global_position(local[owner == r], r, n, interleave), mine)
        for length in (0, 1, interleave, n * interleave - 1, 999, 4321):
            assert dcp_local_seq_lens(length, n, r, interleave) == int((mine < length).sum())
        lens = np.array([0, 1, 999, 4321])
        np.testing.assert_array_equal(dcp_local_seq_lens(lens, n, r, interleave), [(mine < x).sum() for x in lens])
    # Python ints work too (the C op's rule, on scalars).
    assert dcp_owner(130, 4, 64) == 2 and dcp_local_position(130, 4, 64) == 2


def test_local_seq_lens_vllm_case():
    """vLLM tests/v1/attention/test_dcp_sparse_indexer.py: world 2, interleave 2, lengths 1..4."""
    lens = np.arange(1, 5)
    np.testing.assert_array_equal(dcp_local_seq_lens(lens, 2, 0, 2), [1, 2, 2, 2])
    np.testing.assert_array_equal(dcp_local_seq_lens(lens, 2, 1, 2), [0, 0, 1, 2])


@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("n,interleave", [(1, 1), (2, 64), (3, 2), (4, 1)])
def test_split_cache_by_owner(n, interleave, cd):
    d = build_inputs(cd, 16, 64)
    shards = split_cache_by_owner(d.cache, d.bt, d.seq_lens, dcp_size=n, interleave=interleave, seed=5)
    assert sum(s[2] for s in shards).tolist() == SEQ_LENS
    for r, (lc, lbt, llens) in enumerate(shards):
        assert lc.dtype == d.cache.dtype and lc.shape[1:] == d.cache.shape[1:] and lbt.dtype == np.int32
        for q in range(len(SEQ_LENS)):
            lp = np.arange(llens[q])
            g = dcp_global_position(lp, r, n, interleave)
            assert (dcp_owner(g, n, interleave) == r).all()
            np.testing.assert_array_equal(lc[lbt[q, lp // BS], lp % BS], d.cache[d.bt[q, g // BS], g % BS])
            assert (lbt[q, -(-llens[q] // BS):] == -1).all()
        used = lbt[lbt >= 0]
        assert np.unique(used).shape == used.shape  # no block shared between requests
    only = split_cache_by_owner(d.cache, d.bt, d.seq_lens, dcp_size=n, interleave=interleave, seed=5,
                                ranks=[n - 1], num_blocks=64)
    assert len(only) == 1 and only[0][0].shape[0] == 64
    with pytest.raises(ValueError, match=r"^num_blocks: rank 0 needs \d+ blocks, got 1"):
        split_cache_by_owner(d.cache, d.bt, d.seq_lens, dcp_size=1, num_blocks=1)


SPLIT_REJECTS = [  # (keyword arguments over the dataset's, exception, message)
    (dict(dcp_size=0), ValueError, r"^dcp_size: expected an integer >= 1, got 0"),
    (dict(dcp_size=2.0), TypeError, r"^dcp_size: expected an integer, got float"),
    (dict(interleave=0), ValueError, r"^interleave: expected an integer >= 1, got 0"),
    (dict(ranks=[2]), ValueError, r"^ranks\[i\]: expected an integer <= 1, got 2"),
    (dict(num_blocks="64"), TypeError, r"^num_blocks: expected an integer, got str"),
    (dict(seq_lens=np.array(SEQ_LENS[:2])), ValueError, r"^block_table: \[3, \d+\] and seq_lens \[2\] disagree"),
    (dict(seq_lens=np.array(SEQ_LENS, np.float32)), TypeError, r"^seq_lens: expected an integer array"),
    (dict(block_table=None), TypeError, r"^block_table: expected an array, got NoneType"),
    (dict(narrow=True), ValueError, r"^block_table: too narrow for seq_lens"),
]


@pytest.mark.parametrize("kw,exc,msg", SPLIT_REJECTS, ids=[str(i) for i in range(len(SPLIT_REJECTS))])
def test_split_cache_by_owner_rejects(kw, exc, msg):
    d = build_inputs("bf16", 16, 64)
    args, kw = dict(block_table=d.bt, seq_lens=d.seq_lens, dcp_size=2), dict(kw)
    if kw.pop("narrow", False):
        args["block_table"] = d.bt[:, :2]  # request 0 has 1000 tokens in 16 blocks of 64
    args.update(kw)
    with pytest.raises(exc, match=msg):
        split_cache_by_owner(d.cache, **args)


# =============================================================================================
# dcp_decode through torch.distributed (gloo, CPU processes)
# =============================================================================================

def _gloo_worker(rank, world, interleave, store, outdir):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        d = build_inputs("fp8_ds_mla", 16, 64)
        (lc, lbt, _), = split_cache_by_owner(to_torch(d.cache, "cpu"), to_torch(d.bt, "cpu"), d.seq_lens,
                                             dcp_size=world, interleave=interleave, ranks=[rank], seed=rank)
        args = (to_torch(d.q, "cpu"), lc, to_torch(d.idx, "cpu"), to_torch(d.req_id, "cpu"), lbt)
        kw = dict(block_size=BS, softmax_scale=SCALE, kv_cache_dtype=d.cd, dcp_size=world, dcp_rank=rank,
                  interleave=interleave, attn_sink=to_torch(d.sink, "cpu"))
        out, lse = dcp_decode(*args, **kw)
        p_out, p_lse = dcp_local_decode(*args, **{k: v for k, v in kw.items() if k != "attn_sink"})
        np.save(os.path.join(outdir, f"part_out{rank}.npy"), to_numpy(p_out).view(np.uint16))
        np.save(os.path.join(outdir, f"part_lse{rank}.npy"), to_numpy(p_lse))
        np.save(os.path.join(outdir, f"out{rank}.npy"), to_numpy(out).view(np.uint16))
        np.save(os.path.join(outdir, f"lse{rank}.npy"), to_numpy(lse))
        buf = torch.empty_like(out)
        out_bf, _ = dcp_decode(*args, **kw, comm_dtype=torch.bfloat16, out=buf)
        assert out_bf is buf
        np.save(os.path.join(outdir, f"outbf{rank}.npy"), to_numpy(out_bf).view(np.uint16))
        with pytest.raises(ValueError, match=r"^dcp_decode: dcp_size="):
            dcp_decode(*args, **{**kw, "dcp_rank": (rank + 1) % world})
    finally:
        dist.destroy_process_group()


def test_dcp_decode_gloo(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    world = 2
    mp.spawn(_gloo_worker, args=(world, 2, str(tmp_path / "store"), str(tmp_path)), nprocs=world, join=True)
    d = dataset("fp8_ds_mla", 16, 64)
    parts = [(np.load(tmp_path / f"part_out{r}.npy"), np.load(tmp_path / f"part_lse{r}.npy")) for r in range(world)]
    check_simulation(d, world, 2, parts)
    for r in range(world):
        out, lse = np.load(tmp_path / f"out{r}.npy"), np.load(tmp_path / f"lse{r}.npy")
        check_dcp(out, lse, d, parts, d.sink, f"gloo rank {r}")
        ref.assert_bf16_equal(out, np.load(tmp_path / "out0.npy"), name="ranks agree")
        # bf16 communication rounds each scaled partial and each partial sum to bf16: up to `world`
        # more roundings of the partials' size on top of the float64 combine of the partials.
        c_out, _, rounding = combine_f64(parts, d.sink)
        err = np.abs(ref.as_f64(np.load(tmp_path / f"outbf{r}.npy")) - c_out)
        assert (err <= np.maximum(ref.OUT_ABS, ref.OUT_REL * np.abs(c_out)) + world * rounding).all()
