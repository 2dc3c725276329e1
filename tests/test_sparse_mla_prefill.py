"""smla.sparse_mla_prefill against the float64 oracle (tests/reference.py), and CUDA against CPU.

FlashMLA's prefill recipe: kv rows no valid index reads are NaN, indices mix valid rows (with
duplicates when topk > s_kv) and every invalid class, all-invalid rows, topk_length and attn_sink
corner values, strided q / kv / outputs. Tolerances are the oracle's PREFILL_* constants."""
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
    SINK_MODES, TL_MODES, assert_fast_runs_bf16_p, from_torch, make_sink, rand_q, run_decode, strided, to_torch)
from test_sparse_mla_decode import check_against_ref as check_decode_against_ref  # noqa: E402

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


@pytest.mark.parametrize("scale", [1e-3, SCALE, 0.5, 4.0])
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
