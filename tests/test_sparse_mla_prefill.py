"""smla.sparse_mla_prefill against the float64 oracle (tests/reference.py), and CUDA against CPU.

FlashMLA's prefill recipe: kv rows no valid index reads are NaN, indices mix valid rows (with
duplicates when topk > s_kv) and every invalid class, all-invalid rows, topk_length and attn_sink
corner values, strided q / kv / outputs. Tolerances are the oracle's PREFILL_* constants."""
import functools
import itertools
import os
import random
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
from test_sparse_mla_decode import (  # noqa: E402
    SINK_MODES, TL_MODES, assert_fast_runs_bf16_p, from_torch, make_decode_case, make_sink, rand_q, run_decode, strided,
    to_torch)
from test_sparse_mla_decode import check_against_ref as check_decode_against_ref  # noqa: E402
from test_pack_kv import isa  # noqa: E402,F401 (the SMLA_CPU_ISA levels fixture)

BF16 = ml_dtypes.bfloat16
SCALE = 576 ** -0.5


def make_prefill_case(s_q, h, s_kv, topk, *, seed, tl_mode="rand", sink_mode="mixed", all_invalid_frac=0.1,
                      scale=SCALE, kv_layout="plain"):
    rng = np.random.default_rng(seed)
    kv = rng.standard_normal((s_kv, 576), dtype=np.float32).astype(BF16)
    zoo = ref.invalid_index_zoo(s_kv)
    idx = np.empty((s_q, topk), np.int64)
    for i in range(s_q):
        if rng.random() < all_invalid_frac:
            idx[i] = rng.choice(zoo, topk)
            continue
        # topk > s_kv: rows repeat (duplicates count twice), up to 4 times each on average to bound
        # the run time; else distinct rows, sometimes one repeat
        n_valid = int(rng.integers(1, min(topk, 4 * s_kv) + 1))
        rows = rng.choice(s_kv, n_valid, replace=False) if n_valid <= s_kv else rng.integers(0, s_kv, n_valid)
        if n_valid >= 2 and rng.random() < 0.3:
            rows[-1] = rows[0]
        row = np.concatenate([rows, rng.choice(zoo, topk - n_valid)])
        if rng.random() < 0.5:
            rng.shuffle(row)
        else:
            row[n_valid:] = -1
        idx[i] = row
    if s_q >= 2 and all_invalid_frac > 0:
        idx[-1] = rng.choice(zoo, topk)
    idx = idx.astype(np.int32)

    if tl_mode == "none":
        tl = None
    elif tl_mode == "zero":
        tl = np.zeros(s_q, np.int32)
    elif tl_mode == "full":
        tl = np.full(s_q, topk, np.int32)
    else:
        tl = rng.integers(0, topk + 1, s_q).astype(np.int32)
        tl[0] = topk
        if s_q > 1:
            tl[-1] = 0

    valid = (idx >= 0) & (idx < s_kv)
    if tl is not None:
        valid &= np.arange(topk) < tl[:, None]
    kv.view(np.uint16)[np.setdiff1d(np.arange(s_kv), idx[valid])] = 0x7FC0  # a stray read gives NaN

    if kv_layout == "strided":  # row stride 640 elements, offset inside the row
        big = np.full((s_kv, 640), np.nan, BF16)
        big[:, 32:608] = kv
        kv = big[:, 32:608]
    elif kv_layout == "3d":  # [s_kv, 1, 576], FlashMLA's h_kv = 1 form
        kv = kv[:, None, :]

    q = rand_q((s_q, h, 576), rng)
    return dict(q=q, kv=kv, indices=idx, topk_length=tl, attn_sink=make_sink(sink_mode, h, rng),
                softmax_scale=scale)


def run_prefill(c, **kw):
    return smla.sparse_mla_prefill(c["q"], c["kv"], c["indices"], softmax_scale=c["softmax_scale"],
                                   topk_length=c["topk_length"], attn_sink=c["attn_sink"], **kw)


def ref_prefill(c, return_abs=False):
    kv = np.ascontiguousarray(c["kv"]).reshape(-1, 576)
    return ref.sparse_mla_prefill_ref(np.ascontiguousarray(c["q"]), kv, c["indices"], c["softmax_scale"],
                                      c["topk_length"], c["attn_sink"], return_abs)


def check_against_ref(c, out, lse, ml, precision="high"):
    out_ref, lse_ref, ml_ref, *out_abs = ref_prefill(c, return_abs=precision == "fast")  # out_abs: fast's rule
    ref.check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, precision=precision,
                      out_abs=out_abs[0] if out_abs else None)
    assert out.dtype == BF16 and out.shape == out_ref.shape
    assert lse.dtype == np.float32 and ml.dtype == np.float32 and lse.shape == ml.shape == lse_ref.shape


# ---------------------------------------------------------------------------------------------
# grid 1: the FlashMLA shape grid in full; features rotate with a fixed seed
# ---------------------------------------------------------------------------------------------

SKV_TOPK = [(128, 128), (592, 128), (1840, 256), (32, 2048)]


def _shape_cases():
    rnd = random.Random(20251203)
    cases = []
    for i, (h, s_q, (s_kv, topk)) in enumerate(itertools.product([16, 64, 128], [1, 62, 213], SKV_TOPK)):
        tl_mode = rnd.choices(TL_MODES, weights=[3, 4, 1, 1])[0]
        sink_mode = rnd.choices(SINK_MODES, weights=[3, 3, 1, 1, 2])[0]
        layout = rnd.choice(["plain", "plain", "strided", "3d"])
        strided_q = rnd.random() < 0.4
        cases.append(pytest.param(h, s_q, s_kv, topk, tl_mode, sink_mode, layout, strided_q, i,
                                  id=f"h{h}-sq{s_q}-skv{s_kv}-topk{topk}-tl_{tl_mode}-sink_{sink_mode}-kv_{layout}"
                                     f"{'-strided_q' if strided_q else ''}"))
    return cases


@pytest.mark.parametrize("h,s_q,s_kv,topk,tl_mode,sink_mode,layout,strided_q,seed", _shape_cases())
def test_prefill_shapes(h, s_q, s_kv, topk, tl_mode, sink_mode, layout, strided_q, seed):
    c = make_prefill_case(s_q, h, s_kv, topk, seed=seed, tl_mode=tl_mode, sink_mode=sink_mode, kv_layout=layout)
    if strided_q:
        c["q"] = strided(c["q"], np.random.default_rng(seed))
    out, lse, ml = run_prefill(c)
    check_against_ref(c, out, lse, ml)


# ---------------------------------------------------------------------------------------------
# grid 2: features on a small shape, odd head counts, softmax scales
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sink_mode", SINK_MODES)
@pytest.mark.parametrize("tl_mode", TL_MODES)
def test_prefill_features(tl_mode, sink_mode):
    c = make_prefill_case(20, 16, 300, 128, seed=5, tl_mode=tl_mode, sink_mode=sink_mode)
    out, lse, ml = run_prefill(c)
    check_against_ref(c, out, lse, ml)


@pytest.mark.parametrize("h", [1, 3, 33, 127])
def test_prefill_odd_heads(h):
    c = make_prefill_case(9, h, 200, 192, seed=h)
    out, lse, ml = run_prefill(c)
    check_against_ref(c, out, lse, ml)


@pytest.mark.parametrize("scale", [1e-3, SCALE, 0.5, 4.0, -SCALE, 0.0, -2.0])
def test_prefill_softmax_scale(scale):
    c = make_prefill_case(8, 16, 400, 384, seed=2, tl_mode="none", sink_mode="none", scale=scale)
    out, lse, ml = run_prefill(c)
    check_against_ref(c, out, lse, ml)


def test_prefill_flashmla_data():
    """FlashMLA's own prefill inputs: q and kv = randn/10 + offset, sm_scale 0.5 (large positive
    logits, so max_logits and lse are far from 0)."""
    rng = np.random.default_rng(8)
    c = make_prefill_case(62, 64, 592, 128, seed=8, tl_mode="none", sink_mode="finite", scale=0.5)
    kv_bits = c["kv"].view(np.uint16)
    keep = kv_bits != 0x7FC0
    fresh = (rng.standard_normal(kv_bits.shape) / 10 + 0.3).astype(BF16).view(np.uint16)
    kv_bits[keep] = fresh[keep]
    c["q"] = (rng.standard_normal(c["q"].shape) / 10 + 0.3).astype(BF16)
    out, lse, ml = run_prefill(c)
    check_against_ref(c, out, lse, ml)


def test_prefill_out_views():
    """out= / lse= / max_logits= as strided views: the results land there, the gaps stay untouched."""
    c = make_prefill_case(17, 16, 256, 128, seed=4)
    s_q, h = 17, 16
    out_big = np.full((s_q, 2 * h, 512 + 32), 7.0, BF16)
    lse_big = np.full((2, s_q, h), 7.0, np.float32)
    ml_big = np.full((s_q, h + 5), 7.0, np.float32)
    out_v, lse_v, ml_v = out_big[:, ::2, 8:520], lse_big[1], ml_big[:, 2:2 + h]
    out, lse, ml = run_prefill(c, out=out_v, lse=lse_v, max_logits=ml_v)
    assert out is out_v and lse is lse_v and ml is ml_v
    check_against_ref(c, out_v, lse_v, ml_v)
    gaps = np.ones(out_big.shape, bool)
    gaps[:, ::2, 8:520] = False
    assert (out_big[gaps].astype(np.float32) == 7.0).all()
    assert (lse_big[0] == 7.0).all() and (ml_big[:, :2] == 7.0).all() and (ml_big[:, 2 + h:] == 7.0).all()


# ---------------------------------------------------------------------------------------------
# corner cases
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sink_mode", ["none", "finite", "+inf", "-inf"])
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (40, 432, 1024), (8, 2048, 2048)])
def test_prefill_all_invalid(s_q, s_kv, topk, sink_mode):
    """FlashMLA's all-invalid corner: out 0, lse -inf, max_logits -inf whatever the sink, and the kv
    (all NaN) is never read."""
    rng = np.random.default_rng(s_kv)
    kv = np.full((s_kv, 576), np.nan, BF16)
    idx = rng.choice(ref.invalid_index_zoo(s_kv), (s_q, topk)).astype(np.int32)
    idx[0, 3:] = 1  # valid rows beyond topk_length
    tl = np.full(s_q, topk, np.int32)
    tl[0] = 3
    h = 64
    q = rand_q((s_q, h, 576), rng)
    out, lse, ml = smla.sparse_mla_prefill(q, kv, idx, softmax_scale=SCALE, topk_length=tl,
                                           attn_sink=make_sink(sink_mode, h, rng))
    assert (out.view(np.uint16) == 0).all()
    assert (lse == -np.inf).all() and (ml == -np.inf).all()


def test_prefill_single_row_is_exact():
    """One valid row per query: out is that kv row's latent part bit for bit, max_logits = lse."""
    rng = np.random.default_rng(12)
    s_q, h, s_kv = 10, 16, 50
    kv = rng.standard_normal((s_kv, 576), dtype=np.float32).astype(BF16)
    idx = np.full((s_q, 64), -1, np.int32)
    rows = rng.integers(0, s_kv, s_q)
    idx[np.arange(s_q), rng.integers(0, 64, s_q)] = rows
    q = rand_q((s_q, h, 576), rng)
    out, lse, ml = smla.sparse_mla_prefill(q, kv, idx, softmax_scale=SCALE)
    ref.assert_bf16_equal(out, np.broadcast_to(kv[rows][:, None, :512], out.shape))
    np.testing.assert_array_equal(lse, ml)
    c = dict(q=q, kv=kv, indices=idx, topk_length=None, attn_sink=None, softmax_scale=SCALE)
    check_against_ref(c, out, lse, ml)


def test_prefill_matches_decode():
    """Prefill is decode with b = 1 over one block of s_kv bf16 rows: the same bits from both ops, and
    both within the oracle's tolerance (a bug the two share fails there)."""
    c = make_prefill_case(30, 64, 700, 256, seed=17)
    out, lse, ml = run_prefill(c)
    check_against_ref(c, out, lse, ml)
    kv = c["kv"].reshape(1, -1, 576)
    dc = dict(q=c["q"][None], kv_cache=kv, indices=c["indices"][None], topk_length=c["topk_length"][None],
              attn_sink=c["attn_sink"], softmax_scale=c["softmax_scale"], kv_cache_dtype="bf16")
    out_d, lse_d = run_decode(dc)
    check_decode_against_ref(dc, out_d, lse_d)
    ref.assert_bf16_equal(out_d[0], out)
    np.testing.assert_array_equal(lse_d[0], lse)


@pytest.mark.parametrize("v_scale", [1.0, 10.0])
def test_prefill_precision(v_scale):
    """precision="high" and "fast" within both rules, latent values of magnitude ~10 included (q's
    latent part scaled down as much); fast's out differs from high's only on CPU levels with bf16 dot
    products, its lse and max_logits never (test_decode_precision)."""
    c = make_prefill_case(40, 16, 300, 128, seed=43, kv_layout="strided")
    if v_scale != 1:
        c["kv"][:, :512] = (c["kv"][:, :512].astype(np.float32) * v_scale).astype(BF16)  # NaN rows stay NaN
        c["q"][..., :512] = (c["q"][..., :512].astype(np.float32) / v_scale).astype(BF16)
    res = {p: run_prefill(c, precision=p) for p in ("high", "fast")}
    for p, (out, lse, ml) in res.items():
        check_against_ref(c, out, lse, ml, precision=p)
    assert_fast_runs_bf16_p(res["fast"][0], res["high"][0])
    for i in (1, 2):
        np.testing.assert_array_equal(res["fast"][i], res["high"][i])


# ---------------------------------------------------------------------------------------------
# issue 16: the causal prefill of a fresh prompt, and whole 64-token tiles with no valid index in the
# middle of a row (a kernel may skip such tiles; the result must not change). The index patterns are
# shared with tests/test_cuda_attention.py.
# ---------------------------------------------------------------------------------------------

CAUSAL_LAYOUTS = ("pad", "topk_length", "scattered")
TILE = 64  # the tile of indices the GPU kernels load together
# one letter per 64-index tile of a 512-index row: V all valid (distinct rows), H half valid and half -1
# mixed, 1 one valid index, N all -1, O all out of range (>= s_kv), Z the invalid zoo (negative, >= s_kv)
EMPTY_TILE_PATTERNS = ("VVNOVNVV", "NVNOVNVN", "NNNOVNNN", "NNNOZNNN", "NNNNNN1N", "HHNOHNHH")
EMPTY_TILE_TL = (512, 266, 128, 0, 385)  # topk_length cuts: none, inside a tile, before an empty tile, all


def causal_indices(s, topk, layout, rng):
    """Row p of the causal prefill of a fresh s-token prompt (s <= topk) selects tokens 0..p, p + 1 valid
    indices. "pad": in order at the front, -1 after (as a top-k indexer returns them); "topk_length":
    the same front, topk_length[p] = p + 1 and any int32 after it (later tokens' rows, out-of-range and
    negative values); "scattered": the p + 1 valid ones at random places among -1.
    Returns (indices [s, topk] int32, topk_length [s] int32 or None)."""
    assert s <= topk and layout in CAUSAL_LAYOUTS
    cols = np.arange(topk)
    front = cols[None, :] <= np.arange(s)[:, None]
    if layout != "topk_length":
        idx = np.where(front, cols[None, :], -1)
        if layout == "scattered":
            idx = rng.permuted(idx, axis=1)
        return idx.astype(np.int32), None
    kind = rng.integers(0, 3, (s, topk))
    junk = np.where(kind == 0, rng.integers(0, s, (s, topk)),  # rows of later tokens: in range
                    np.where(kind == 1, rng.choice(ref.invalid_index_zoo(s), (s, topk)),
                             rng.integers(ref.INT32_MIN, ref.INT32_MAX, (s, topk), endpoint=True)))
    idx = np.where(front, cols[None, :], junk)
    return idx.astype(np.int32), np.arange(1, s + 1, dtype=np.int32)


def empty_tile_indices(s_q, s_kv, rng, with_tl):
    """[s_q, 512] indices, row r tiled as EMPTY_TILE_PATTERNS[r % 6] (pattern 3 has no valid index);
    with_tl: topk_length[r] = EMPTY_TILE_TL[r % 5], else None. Valid indices of a row are distinct."""
    topk = TILE * len(EMPTY_TILE_PATTERNS[0])
    assert s_kv >= topk
    code = np.array([list(EMPTY_TILE_PATTERNS[r % len(EMPTY_TILE_PATTERNS)]) for r in range(s_q)])
    code = np.repeat(code, TILE, axis=1)  # [s_q, topk], one letter per index
    cand = np.argsort(rng.random((s_q, s_kv)), axis=1)[:, :topk]  # distinct valid rows
    one = (np.arange(topk) % TILE)[None, :] == rng.integers(0, TILE, (s_q, 1))
    valid = (code == "V") | ((code == "H") & (rng.random((s_q, topk)) < 0.5)) | ((code == "1") & one)
    far = s_kv + rng.integers(0, 1 << 30, (s_q, topk))
    far[:, ::17] = s_kv
    far[:, 5::17] = ref.INT32_MAX
    idx = np.where(valid, cand, -1)
    idx = np.where(code == "O", far, idx)
    idx = np.where(code == "Z", rng.choice(ref.invalid_index_zoo(s_kv), (s_q, topk)), idx)
    tl = np.array([EMPTY_TILE_TL[r % len(EMPTY_TILE_TL)] for r in range(s_q)], np.int32) if with_tl else None
    return idx.astype(np.int32), tl


def _valid(idx, limit, tl):
    v = (idx >= 0) & (idx < limit)
    if tl is not None:
        v &= np.arange(idx.shape[1]) < tl[:, None]
    return v


@functools.lru_cache(maxsize=1)
def _case_and_ref(kind, *args):
    """(case, oracle with out_abs) of causal_case / empty_tiles_case, built once for both precisions
    (the parameter that varies fastest)."""
    c = {"causal": causal_case, "empty_tiles": empty_tiles_case}[kind](*args)
    return c, ref_prefill(c, return_abs=True)


def causal_case(s, topk, h, layout):
    rng = np.random.default_rng(s * 7 + h)
    idx, tl = causal_indices(s, topk, layout, rng)
    return dict(q=rand_q((s, h, 576), rng), kv=rng.standard_normal((s, 576), dtype=np.float32).astype(BF16),
                indices=idx, topk_length=tl,
                attn_sink=make_sink("finite" if layout == "scattered" else "none", h, rng), softmax_scale=SCALE)


def empty_tiles_case(s_q, s_kv, h, with_tl):
    rng = np.random.default_rng(h + 2 * with_tl)
    idx, tl = empty_tile_indices(s_q, s_kv, rng, with_tl)
    kv = rng.standard_normal((s_kv, 576), dtype=np.float32).astype(BF16)
    kv.view(np.uint16)[np.setdiff1d(np.arange(s_kv), idx[_valid(idx, s_kv, tl)])] = 0x7FC0  # stray reads: NaN
    return dict(q=rand_q((s_q, h, 576), rng), kv=kv, indices=idx, topk_length=tl,
                attn_sink=make_sink("mixed", h, rng), softmax_scale=SCALE)


def _check_cached(c, refs, out, lse, ml, precision):
    out_ref, lse_ref, ml_ref, out_abs = refs
    ref.check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, precision=precision, out_abs=out_abs)
    assert out.dtype == BF16 and lse.dtype == np.float32 and ml.dtype == np.float32


CAUSAL_CASES = [(s, topk, h, layout) for s, topk, h in ((300, 2048, 16), (300, 2048, 128), (130, 130, 64),
                                                        (700, 700, 16)) for layout in CAUSAL_LAYOUTS]
CAUSAL_CASES.append((2048, 2048, 16, "pad"))  # the benchmark's prompt (bench_sparse_mla_prefill.py --causal)


@pytest.mark.parametrize("precision", ref.PRECISIONS)  # varies fastest: one case and oracle for both
@pytest.mark.parametrize("s,topk,h,layout", CAUSAL_CASES)
def test_prefill_causal_fresh_prompt(s, topk, h, layout, precision):
    """Row p of an s-token prompt attends to tokens 0..p (s_q = s_kv = s), in each index layout of
    causal_indices, at both precisions (the CPU's "fast" runs bf16 P where its level has bf16 dot
    products, "high" elsewhere)."""
    c, refs = _case_and_ref("causal", s, topk, h, layout)
    out, lse, ml = run_prefill(c, precision=precision)
    _check_cached(c, refs, out, lse, ml, precision)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("with_tl", [False, True], ids=["no_tl", "tl"])
@pytest.mark.parametrize("h", [16, 64, 128])
def test_prefill_empty_tiles_mid_row(h, with_tl, precision):
    """topk 512 with whole tiles of -1 / out-of-range values between valid ones, rows that start or end
    with empty tiles, a single valid index among empty tiles, rows with no valid index (out 0, lse and
    max_logits -inf), topk_length cuts; kv rows no valid index reads are NaN."""
    c, refs = _case_and_ref("empty_tiles", 61, 1000, h, with_tl)
    out, lse, ml = run_prefill(c, precision=precision)
    _check_cached(c, refs, out, lse, ml, precision)
    none = ~_valid(c["indices"], 1000, c["topk_length"]).any(1)
    assert none[3] and (out[none].view(np.uint16) == 0).all()
    assert (lse[none] == -np.inf).all() and (ml[none] == -np.inf).all()


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------

def _good_args():
    s_q, h, s_kv, topk = 4, 16, 64, 8
    return dict(q=np.zeros((s_q, h, 576), BF16), kv=np.zeros((s_kv, 576), BF16),
                indices=np.zeros((s_q, topk), np.int32), softmax_scale=SCALE,
                topk_length=np.full(s_q, topk, np.int32), attn_sink=np.zeros(h, np.float32),
                out=np.empty((s_q, h, 512), BF16), lse=np.empty((s_q, h), np.float32),
                max_logits=np.empty((s_q, h), np.float32))


BAD_PREFILL = [
    ("q", dict(q=np.zeros((4, 16, 576), np.float32)), TypeError),
    ("q", dict(q=np.zeros((1, 4, 16, 576), BF16)), ValueError),
    ("q", dict(q=np.zeros((4, 16, 512), BF16)), ValueError),
    ("q", dict(q=np.zeros((4, 129, 576), BF16)), ValueError),
    ("q", dict(q=np.zeros((4, 16, 1152), BF16)[..., ::2]), ValueError),
    ("kv", dict(kv=np.zeros((64, 576), np.float32)), TypeError),
    ("kv", dict(kv=np.zeros((64, 656), np.uint8)), TypeError),
    ("kv", dict(kv=np.zeros((64, 512), BF16)), ValueError),
    ("kv", dict(kv=np.zeros(576, BF16)), ValueError),
    ("kv", dict(kv=np.zeros((64, 1152), BF16)[:, ::2]), ValueError),
    ("indices", dict(indices=np.zeros((4, 8), np.int64)), TypeError),
    ("indices", dict(indices=np.zeros(8, np.int32)), ValueError),
    ("indices", dict(indices=np.zeros((5, 8), np.int32)), ValueError),
    ("out", dict(out=np.empty((4, 16, 512), np.float32)), TypeError),
    ("out", dict(out=np.empty((4, 16, 576), BF16)), ValueError),
    ("out", dict(out=np.empty((4, 8, 512), BF16)), ValueError),
    ("lse", dict(lse=np.empty((4, 16), BF16)), TypeError),
    ("lse", dict(lse=np.empty((4, 17), np.float32)), ValueError),
    ("max_logits", dict(max_logits=np.empty((4, 16), np.float64)), TypeError),
    ("max_logits", dict(max_logits=np.empty((3, 16), np.float32)), ValueError),
    ("attn_sink", dict(attn_sink=np.zeros(8, np.float32)), ValueError),
    ("attn_sink", dict(attn_sink=np.zeros((1, 16), np.float32)), ValueError),
    ("topk_length", dict(topk_length=np.zeros(5, np.int32)), ValueError),
    ("topk_length", dict(topk_length=np.zeros(4, np.int64)), TypeError),
    ("precision", dict(precision="medium"), ValueError),
    ("precision", dict(precision=1), TypeError),
    ("precision", dict(precision=None), TypeError),
]


@pytest.mark.parametrize("name,bad,exc", BAD_PREFILL,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_PREFILL)])
def test_prefill_bad_inputs(name, bad, exc):
    a = _good_args()
    a.update(bad)
    q, kv, idx = a.pop("q"), a.pop("kv"), a.pop("indices")
    with pytest.raises(exc, match=rf"\b{name}\b"):
        smla.sparse_mla_prefill(q, kv, idx, **a)


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------

def _check_cuda(c, torch):
    out_c, lse_c, ml_c = run_prefill(c)
    g = {k: (to_torch(v, torch) if isinstance(v, np.ndarray) else v) for k, v in c.items()}
    out_g, lse_g, ml_g = run_prefill(g)
    assert out_g.is_cuda and out_g.dtype == torch.bfloat16
    torch.cuda.synchronize()
    out_g, lse_g, ml_g = (from_torch(t, torch) for t in (out_g, lse_g, ml_g))
    check_against_ref(c, out_g, lse_g, ml_g)
    ref.check_close(out_g, out_c, abs_tol=ref.PREFILL_OUT_ABS, rel_tol=ref.PREFILL_OUT_REL,
                    cos_tol=ref.PREFILL_OUT_COS, name="cuda vs cpu out")
    ref.check_close(lse_g, lse_c, abs_tol=ref.PREFILL_LSE_ABS, rel_tol=ref.PREFILL_LSE_REL, name="cuda vs cpu lse")
    ref.check_close(ml_g, ml_c, abs_tol=ref.PREFILL_LSE_ABS, rel_tol=ref.PREFILL_LSE_REL,
                    name="cuda vs cpu max_logits")


@pytest.mark.cuda
@pytest.mark.parametrize("h,s_q,s_kv,topk,tl_mode,sink_mode,layout,strided_q,seed", _shape_cases())
def test_prefill_cuda_shapes(h, s_q, s_kv, topk, tl_mode, sink_mode, layout, strided_q, seed):
    torch = pytest.importorskip("torch")
    c = make_prefill_case(s_q, h, s_kv, topk, seed=seed, tl_mode=tl_mode, sink_mode=sink_mode, kv_layout=layout)
    if strided_q:
        c["q"] = strided(c["q"], np.random.default_rng(seed))
    _check_cuda(c, torch)


@pytest.mark.cuda
@pytest.mark.parametrize("h", [1, 8, 16, 33, 64, 100, 128])
@pytest.mark.parametrize("s_kv,topk", [(4096, 2048), (95, 128), (1521, 512), (64, 8192)])
def test_prefill_cuda_heads_and_topk(h, s_kv, topk):
    torch = pytest.importorskip("torch")
    c = make_prefill_case(64, h, s_kv, topk, seed=h + topk)
    _check_cuda(c, torch)


def q_pair(q, rng):
    """q [.., h, 576] as a (q_nope, q_pe) pair in other memory: q_nope inside wider rows with NaN around
    it, q_pe with the heads outermost (so a stride bug or a read of the wrong half shows)."""
    wide = np.full(q.shape[:-1] + (600,), np.nan, BF16)
    wide[..., 8:520] = q[..., :512]
    pe = np.ascontiguousarray(np.moveaxis(q[..., 512:], -2, 0))
    return wide[..., 8:520], np.moveaxis(pe, 0, -2)


def test_q_pair_read_in_place(isa):
    """q as the (q_nope, q_pe) pair (the extension's q_pe=): the same bits as q in one array, prefill and
    decode (both cache dtypes), on each CPU level; a pair that does not fit raises naming the half."""
    rng = np.random.default_rng(77)
    for i, (s_q, h, s_kv, topk) in enumerate([(5, 16, 300, 128), (3, 33, 1000, 512), (1, 128, 64, 64)]):
        c = make_prefill_case(s_q, h, s_kv, topk, seed=300 + i)
        one = run_prefill(c)
        two = run_prefill(dict(c, q=q_pair(c["q"], rng)))
        for a, b in zip(one, two):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), (isa, s_q, h)
    for i, cd in enumerate(["fp8_ds_mla", "bf16"]):
        c = make_decode_case(cd, 3, 2, 20, 96, 16, seed=310 + i)
        one = run_decode(c)
        two = run_decode(dict(c, q=q_pair(c["q"], rng)))
        for a, b in zip(one, two):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), (isa, cd)
    c = make_prefill_case(4, 16, 128, 64, seed=320)
    q = c["q"]
    for bad, exc, msg in (((q[..., :512], q[..., 512:570]), ValueError, r"^q_pe: expected shape\[2\] == 64"),
                          ((q, q[..., 512:]), ValueError, r"^q: expected shape\[2\] == 512 \(d_nope\), got 576"),
                          ((q[..., :512], q[:2, :, 512:]), ValueError, r"^q_pe: expected shape\[0\] == 4"),
                          ((q[..., :512], q[:, :8, 512:]), ValueError, r"^q_pe: expected shape\[1\] == 16"),
                          ((q[..., :512], q[..., 512:].astype(np.float32)), TypeError, r"^q_pe: expected bfloat16"),
                          ((q[..., :512],), ValueError, r"^q: expected one array or a \(q_nope, q_pe\) pair"),
                          ((q[..., :512], q[..., 512:], q), ValueError, r"^q: expected one array or a")):
        with pytest.raises(exc, match=msg):
            run_prefill(dict(c, q=bad))
