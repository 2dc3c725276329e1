"""smla.merge_attn_states against the float64 oracle (tests/reference.py) and CUDA against CPU.

Tolerances are derived from the kernel's arithmetic (csrc/core/merge_math.h): exp and log within 2 ulp,
so the float32 value before the final rounding is within 8 * 2^-24 * S of the exact one, where
S = (wa|oa| + wb|ob|) / (wa + wb); the output then adds half an ulp of its dtype. lse = M + log(wa + wb)
with log(wa + wb) in [0, ln 2]: within 4e-7 plus one float32 ulp of lse."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
MANT = {"bfloat16": (7, -126), "float16": (10, -14), "float32": (23, -126)}


def ulp(x, dtype):
    frac, emin = MANT[dtype]
    _, e = np.frexp(np.abs(x))
    return np.ldexp(1.0, np.maximum(e - 1, emin) - frac)


def make(n, h, d, dtype, rng, lse_spread=5.0):
    oa = (rng.standard_normal((n, h, d)) * 3).astype(DTYPES[dtype])
    ob = (rng.standard_normal((n, h, d)) * 3).astype(DTYPES[dtype])
    la = (rng.standard_normal((n, h)) * lse_spread).astype(np.float32)
    lb = (rng.standard_normal((n, h)) * lse_spread).astype(np.float32)
    return oa, la, ob, lb


def check(out, lse, oa, la, ob, lb, dtype):
    e_out, e_lse = ref.merge_attn_states(oa, la, ob, lb)
    a_out, a_lse = ref.as_f64(out), lse.astype(np.float64)
    fin = np.isfinite(e_out)
    np.testing.assert_array_equal(np.isnan(a_out), np.isnan(e_out))
    np.testing.assert_array_equal(a_out[~fin & ~np.isnan(e_out)], e_out[~fin & ~np.isnan(e_out)])
    la64, lb64 = la.astype(np.float64), lb.astype(np.float64)
    with np.errstate(all="ignore"):
        m = np.maximum(la64, lb64)
        wa, wb = np.exp(la64 - m), np.exp(lb64 - m)
        sat = ((la64 == np.inf) | (lb64 == np.inf)) & ~np.isnan(la64) & ~np.isnan(lb64)  # +inf outweighs
        wa, wb = np.where(sat, la64 == np.inf, wa), np.where(sat, lb64 == np.inf, wb)
        s = (wa[..., None] * np.abs(ref.as_f64(oa)) + wb[..., None] * np.abs(ref.as_f64(ob))) / (wa + wb)[..., None]
    bound = 8 * 2.0**-24 * s + 0.5 * ulp(np.maximum(np.abs(a_out), np.abs(e_out)), dtype)
    err = np.abs(a_out - e_out)
    bad = fin & ~(err <= bound)
    assert not bad.any(), f"{bad.sum()} outputs off; worst ratio {np.nanmax(np.where(fin, err / bound, 0)):.3g}"
    np.testing.assert_array_equal(np.isnan(a_lse), np.isnan(e_lse))
    lfin = np.isfinite(e_lse)
    np.testing.assert_array_equal(a_lse[~lfin & ~np.isnan(e_lse)], e_lse[~lfin & ~np.isnan(e_lse)])
    lbound = 4e-7 + ulp(e_lse, "float32")
    assert (np.abs(a_lse[lfin] - e_lse[lfin]) <= lbound[lfin]).all()
    ref.check_close(lse, e_lse, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name="lse")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,h,d", [(1, 1, 1), (7, 3, 48), (64, 16, 128), (33, 128, 512)])
def test_matches_reference(dtype, n, h, d):
    rng = np.random.default_rng(41)
    oa, la, ob, lb = make(n, h, d, dtype, rng)
    out = np.empty_like(oa)
    out_lse = np.empty_like(la)
    res = smla.merge_attn_states(oa, la, ob, lb, out=out, out_lse=out_lse)
    assert res[0] is out and res[1] is out_lse
    check(out, out_lse, oa, la, ob, lb, dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_allocates_outputs(dtype):
    rng = np.random.default_rng(42)
    oa, la, ob, lb = make(5, 4, 64, dtype, rng)
    out, lse = smla.merge_attn_states(oa, la, ob, lb)
    assert out.dtype == oa.dtype and out.shape == oa.shape and lse.dtype == np.float32
    check(out, lse, oa, la, ob, lb, dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_strided_views_and_vllm_lse_layout(dtype):
    """Outputs padded along h and d; lse stored [h, n] as vLLM does (a transposed view)."""
    rng = np.random.default_rng(43)
    n, h, d = 9, 6, 40
    big_a = (rng.standard_normal((n, h + 2, d + 8)) * 2).astype(DTYPES[dtype])
    big_b = (rng.standard_normal((n, h + 2, d + 8)) * 2).astype(DTYPES[dtype])
    oa, ob = big_a[:, 1:h + 1, 4:d + 4], big_b[:, :h, 8:]
    la = np.ascontiguousarray((rng.standard_normal((n, h)) * 4).astype(np.float32).T).T
    lb = np.ascontiguousarray((rng.standard_normal((n, h)) * 4).astype(np.float32).T).T
    big_o = np.zeros((n, h + 1, d + 3), DTYPES[dtype])
    out = big_o[:, 1:, 3:]
    lse = np.zeros((h, n), np.float32).T
    smla.merge_attn_states(oa, la, ob, lb, out=out, out_lse=lse)
    check(out, lse, oa, la, ob, lb, dtype)
    assert not big_o[:, 0].astype(np.float32).any() and not big_o[:, :, :3].astype(np.float32).any()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_identities(dtype):
    """Both empty -> out_a bit for bit and -inf; one empty side -> the other side exactly."""
    rng = np.random.default_rng(44)
    n, h, d = 6, 2, 32
    oa, la, ob, lb = make(n, h, d, dtype, rng)
    ninf = np.float32(-np.inf)
    la[0], lb[0] = ninf, ninf  # both empty
    oa_bits = oa.view(np.uint16 if dtype != "float32" else np.uint32)
    oa_bits[0, 0, :3] = [0x8000, 0x7FC1, 0x7E01] if dtype != "float32" else [0x80000000, 0x7FC00001, 0x7F800001]
    lb[1] = ninf  # only a
    la[2] = ninf  # only b
    la[3] = lb[3]  # equal weights
    lb[4] = la[4] - 95.0  # wb subnormal
    lb[5] = la[5] + 200.0  # wa underflows to 0
    out, lse = np.empty_like(oa), np.empty_like(la)
    smla.merge_attn_states(oa, la, ob, lb, out=out, out_lse=lse)
    bits = (lambda x: x.view(np.uint16 if dtype != "float32" else np.uint32))
    assert np.array_equal(bits(out[0]), bits(oa[0])) and (lse[0] == -np.inf).all()
    assert np.array_equal(bits(out[1]), bits(oa[1])) and np.array_equal(lse[1], la[1])
    assert np.array_equal(bits(out[2]), bits(ob[2])) and np.array_equal(lse[2], lb[2])
    assert np.array_equal(bits(out[5]), bits(ob[5])) and np.array_equal(lse[5], lb[5])
    rows = [3, 4]
    check(out[rows], lse[rows], oa[rows], la[rows], ob[rows], lb[rows], dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_nan_and_inf_lse(dtype):
    """A +inf lse (a state whose maximum score overflowed) outweighs the other side: out = its out bit
    for bit, lse +inf; two +inf sides weigh 1 each. A NaN lse -> NaN out and lse (no remapping), also
    next to -inf (not "both empty") or +inf; a side of weight 0 still poisons (0 * NaN, 0 * Inf)."""
    rng = np.random.default_rng(45)
    oa, la, ob, lb = make(7, 1, 16, dtype, rng)
    la[0] = np.inf
    la[1], la[2], lb[2] = np.nan, np.nan, -np.inf
    la[3], lb[3] = np.inf, np.inf
    lb[4] = -np.inf
    ob[4, 0, 0] = np.nan
    ob[4, 0, 1] = np.inf
    la[5], lb[5] = np.inf, np.nan
    lb[6] = np.inf
    out, lse = np.empty_like(oa), np.empty_like(la)
    smla.merge_attn_states(oa, la, ob, lb, out=out, out_lse=lse)
    bits = (lambda x: x.view(np.uint16 if dtype != "float32" else np.uint32))
    assert np.array_equal(bits(out[0]), bits(oa[0])) and np.array_equal(bits(out[6]), bits(ob[6]))
    assert (lse[[0, 3, 6]] == np.inf).all() and np.isfinite(out[[0, 3, 6]].astype(np.float32)).all()
    assert np.isnan(lse[[1, 2, 5]]).all() and np.isnan(out[[1, 2, 5]].astype(np.float32)).all()
    assert np.isnan(out[4, 0, :2].astype(np.float32)).all() and np.isfinite(out[4, 0, 2:].astype(np.float32)).all()
    check(out, lse, oa, la, ob, lb, dtype)


def test_in_place_and_no_lse_out():
    rng = np.random.default_rng(46)
    oa, la, ob, lb = make(8, 4, 64, "float32", rng)
    out, lse = smla.merge_attn_states(oa, la, ob, lb)
    a = oa.copy()
    smla.merge_attn_states(a, la, ob, lb, out=a)  # out aliases out_a
    assert np.array_equal(a, out)
    b = np.empty_like(oa)
    smla._C.merge_attn_states(out_a=oa, lse_a=la, out_b=ob, lse_b=lb, out=b)  # the kernel without an lse output
    assert np.array_equal(b, out)
    check(out, lse, oa, la, ob, lb, "float32")


def test_bad_arguments():
    rng = np.random.default_rng(47)
    oa, la, ob, lb = make(2, 2, 8, "float32", rng)
    with pytest.raises(TypeError, match=r"^out_b: "):
        smla.merge_attn_states(oa, la, ob.astype(np.float16), lb)
    o64 = oa.astype(np.float64)
    with pytest.raises(TypeError, match=r"^out_a: "):
        smla.merge_attn_states(o64, la, o64, lb, out=np.empty_like(o64))
    with pytest.raises(ValueError, match=r"^lse_a: "):
        smla.merge_attn_states(oa, la[:1], ob, lb)


# ---------------------------------------------------------------- CUDA twin, bit for bit

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cuda_matches_cpu(dtype):
    import torch

    rng = np.random.default_rng(48)
    n, h, d = 613, 16, 512
    oa, la, ob, lb = make(n, h, d, dtype, rng, lse_spread=30.0)
    specials = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 88.0, -95.0, 1e-30], np.float32)
    la.reshape(-1)[:64] = np.repeat(specials, 8)
    lb.reshape(-1)[:64] = np.tile(specials, 8)
    lb.reshape(-1)[64:80] = la.reshape(-1)[64:80]
    cpu_out, cpu_lse = smla.merge_attn_states(oa, la, ob, lb, out=np.empty_like(oa))
    tdt = getattr(torch, dtype)
    if dtype == "bfloat16":
        t = lambda a: torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)  # noqa: E731
    else:
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    g_out, g_lse = smla.merge_attn_states(t(oa), torch.from_numpy(la).cuda(), t(ob), torch.from_numpy(lb).cuda())
    torch.cuda.synchronize()
    assert g_out.dtype == tdt
    g = g_out.float().cpu().numpy()
    c = cpu_out.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
    gb = g_out.view(torch.int16 if dtype != "float32" else torch.int32).cpu().numpy()
    cb = cpu_out.view(np.int16 if dtype != "float32" else np.int32)
    ok = np.isnan(c) | (gb == cb)
    assert ok.all(), f"{(~ok).sum()} outputs differ from the CPU bits"
    gl = g_lse.cpu().numpy()
    np.testing.assert_array_equal(np.isnan(gl), np.isnan(cpu_lse))
    np.testing.assert_array_equal(gl[~np.isnan(gl)].view(np.int32), cpu_lse[~np.isnan(cpu_lse)].view(np.int32))
