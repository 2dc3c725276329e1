"""Scores beyond the fp32 range from finite inputs (docs/design.md section 4, "Overflow"; issue 13).

The kernels keep scores in fp32 (log2 domain); a valid score beyond the fp32 range saturates at
+-FLT_MAX. Semantics, checked here against the float64 oracle (tests/reference.py) where it is exact:
- the row's maximum overflows upwards: out = the saturating token's value (the oracle's argmax), lse
  = max_logits = +inf (the oracle's, cast to float32); several saturating tokens: their mean (the
  oracle picks the true argmax among them, so those cases check the mean and the convex hull);
- scores overflowing downwards next to a finite maximum weigh 0, as in the oracle;
- every valid score overflows downwards: out = the mean of those tokens' values (the oracle's for one
  token), lse = max_logits = -inf.
Never NaN. Before the fix, an upward overflow made out and lse NaN (inf - inf in the softmax), and a row
whose every valid score was -inf gave NaN on the CPU.

The CUDA tests (marker `cuda`) run the same cases through torch CUDA arrays: the kernel families
(SMLA_ATTN_KERNEL=portable / sm90 / sm90n, the narrow one for these 20 heads, with its lazy maximum),
decode with and without the split top-k (combine kernel), against the oracle and against the CPU ops."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402

BF16 = ml_dtypes.bfloat16
H = 20  # heads: a partial head block on every vector width
ISAS = ["portable", "avx2", "avx2-emulated-bf16", "avx512", "avx512bf16"]  # a missing level falls back
KINDS = ["pos_one_scale", "pos_one_dot", "pos_many", "neg_one", "neg_many", "huge_finite"]


def make_case(kind, *, topk=96, seed=0, sink=None):
    """q [1, H, 576], kv [topk, 576] (bf16), indices [1, topk] and the scale of one overflow case;
    `mean` maps the heads whose expected out is a plain mean of values to (token ids, sign of lse)."""
    rng = np.random.default_rng(seed)
    n = topk
    qa = np.abs(rng.standard_normal((H, 576))) + 0.5
    sign = np.where(np.arange(H) % 2 == 0, 1.0, -1.0)[:, None]  # even heads +, odd heads -
    kv = rng.standard_normal((n, 576)) * 0.3
    idx = np.arange(n)
    sat = np.linspace(n // 9, n - 1 - n // 11, 5).astype(int)  # spread over the top-k (and over splits)
    big = np.abs(rng.standard_normal((5, 576))) + 2.0
    scale, mean = 1e36, {}
    if kind == "pos_one_scale":  # q.K ~ +-10 for most tokens: scores ~1e37, finite; one ~1e39
        q = sign * qa
        kv[sat[0]] = big[0]
    elif kind == "pos_one_dot":  # the fp32 dot product itself overflows (every product > 0)
        q, scale = sign * qa * 1e19, 0.04
        kv[sat[0]] = big[0] * 1e19
    elif kind == "pos_many":
        q = sign * qa
        kv[sat] = big
        mean = {hh: (sat, np.inf) for hh in range(0, H, 2)}
    elif kind in ("neg_one", "neg_many"):  # every valid score < -FLT_MAX; the rest invalid
        q, kv, scale = qa, np.abs(kv) + 0.1, -1e37  # q.K ~ 250: scores ~ -2.5e39
        keep = sat[:1] if kind == "neg_one" else sat
        idx = np.where(np.isin(idx, keep), idx, np.where(idx % 2 == 0, -1, n + idx))
        if kind == "neg_many":
            mean = {hh: (sat, -np.inf) for hh in range(H)}
    elif kind == "huge_finite":  # scores ~1e31: nothing saturates
        q, scale = sign * qa, 1e30
    else:
        raise ValueError(kind)
    return dict(q=q[None].astype(BF16), kv=kv.astype(BF16), idx=idx[None].astype(np.int32), scale=scale,
                mean=mean, sink=sink, kind=kind)


def sink_array(mode):
    if mode is None:
        return None
    s = np.full(H, {"finite": 0.75, "+inf": np.inf, "-inf": -np.inf}[mode], np.float32)
    s[1::3] = 0.25  # a few finite ones in every case
    return s


def expected(c, values):
    """(out, lse, max_logits) float64 [1, H, ...]: the oracle (lse and max_logits cast to float32, as the
    kernels return them), with the heads of c["mean"] replaced by the mean of `values` (float64
    [n, 576], the K rows as the kernels see them) over their tokens."""
    sink = sink_array(c["sink"])
    out, lse, ml = ref.sparse_mla_attention(c["q"][None], values, c["idx"][None], values.shape[0], c["scale"],
                                            attn_sink=sink)
    with np.errstate(over="ignore"):  # the kernels' lse and max_logits are float32: beyond its range, inf
        out, lse, ml = out[0], lse[0].astype(np.float32).astype(np.float64), ml[0].astype(np.float32).astype(np.float64)
    for hh, (toks, inf) in c["mean"].items():
        f = 1.0
        if sink is not None:  # docs/design.md: out *= 1 / (1 + exp(sink - lse)), sink +-inf -> 0 / 1
            s = float(sink[hh])
            f = 0.0 if s == np.inf else 1.0 if s == -np.inf else (1.0 if inf > 0 else 0.0)
        out[0, hh] = values[toks, :512].mean(axis=0) * f
        lse[0, hh] = ml[0, hh] = inf
    return out, lse, ml


def check_oracle_facts(c, values):
    """What the float64 oracle gives for these inputs (the tests rely on it)."""
    out, lse, ml = ref.sparse_mla_attention(c["q"][None], values, c["idx"][None], values.shape[0], c["scale"])
    with np.errstate(over="ignore"):
        lse32, ml32 = lse.astype(np.float32), ml.astype(np.float32)
    assert np.isfinite(out).all()
    k = c["kind"]
    if k in ("pos_one_scale", "pos_one_dot"):
        tok = int(c["idx"][0][np.argmax(values[c["idx"][0], 0])])  # the saturating token
        assert (lse32[..., ::2] == np.inf).all() and (ml32[..., ::2] == np.inf).all()
        np.testing.assert_array_equal(out[0, 0, ::2], np.broadcast_to(values[tok, :512], out[0, 0, ::2].shape))
        assert np.isfinite(lse32[..., 1::2]).all()
    if k in ("neg_one", "neg_many"):
        assert (lse32 == -np.inf).all() and (ml32 == -np.inf).all()
    if k == "huge_finite":
        assert np.isfinite(lse32).all() and (np.abs(lse32) > 1e30).all()


def check_all(out, lse, ml, c, values, name):
    e_out, e_lse, e_ml = expected(c, values)
    a_out = ref.as_f64(out).reshape(e_out.shape)
    assert not np.isnan(a_out).any() and not np.isnan(np.asarray(lse, np.float64)).any(), f"{name}: NaN"
    ref.check_close(a_out, e_out, abs_tol=ref.OUT_ABS, rel_tol=ref.OUT_REL, cos_tol=ref.OUT_COS, name=f"{name} out")
    ref.check_close(np.asarray(lse, np.float64).reshape(e_lse.shape), e_lse, abs_tol=ref.LSE_ABS,
                    rel_tol=ref.LSE_REL, name=f"{name} lse")
    if ml is not None:
        ref.check_close(np.asarray(ml, np.float64).reshape(e_ml.shape), e_ml, abs_tol=ref.LSE_ABS,
                        rel_tol=ref.LSE_REL, name=f"{name} max_logits")
    for hh, (toks, _) in c["mean"].items() if c["sink"] is None else ():  # inside the saturated tokens' hull
        v = values[toks, :512]
        o = a_out[0, hh]
        tol = 1e-3 + 2.01 / 128 * np.abs(v).max(axis=0)
        assert ((o >= v.min(axis=0) - tol) & (o <= v.max(axis=0) + tol)).all(), f"{name}: head {hh} off the hull"


# ---------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------

def bf16_values(kv):
    return ref.bf16_to_f64(ref.as_bf16_bits(kv))


def run_prefill_cpu(c):
    return smla.sparse_mla_prefill(c["q"], c["kv"], c["idx"], softmax_scale=c["scale"],
                                   attn_sink=sink_array(c["sink"]))


def decode_cache(c, cd, bs=16):
    """The case's rows as a paged cache (slot = row) and the rows as the kernels read them."""
    n = c["kv"].shape[0]
    nb = -(-n // bs)
    if cd == "bf16":
        cache = np.zeros((nb * bs, 576), BF16)
        cache[:n] = c["kv"]
        cache = cache.reshape(nb, bs, 576)
    else:
        cache = np.zeros(smla.kv_cache_shape(nb, bs, cd), np.uint8)
        smla.pack_kv(c["kv"][:, :512], c["kv"][:, 512:], cache, np.arange(n, dtype=np.int64), kv_cache_dtype=cd)
    values = ref.dequant_rows(cache, np.arange(n), cd)
    return cache, values


def run_decode_cpu(c, cache, cd):
    return smla.sparse_mla_decode(c["q"][None], cache, c["idx"][None], softmax_scale=c["scale"], kv_cache_dtype=cd,
                                  attn_sink=sink_array(c["sink"]))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_cpu(kind, isa, monkeypatch):
    monkeypatch.setenv("SMLA_CPU_ISA", isa)
    monkeypatch.setenv("SMLA_NUM_THREADS", "1")
    c = make_case(kind, seed=KINDS.index(kind))
    values = bf16_values(c["kv"])
    check_oracle_facts(c, values)
    out, lse, ml = run_prefill_cpu(c)
    check_all(out, lse, ml, c, values, f"{kind} {isa}")


@pytest.mark.parametrize("cd", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("kind", KINDS)
def test_decode_cpu(kind, cd, monkeypatch):
    monkeypatch.setenv("SMLA_NUM_THREADS", "1")
    c = make_case(kind, seed=10 + KINDS.index(kind))
    cache, values = decode_cache(c, cd)
    out, lse = run_decode_cpu(c, cache, cd)
    check_all(out, lse, None, c, values, f"{kind} {cd}")


@pytest.mark.parametrize("sink", ["finite", "+inf", "-inf"])
@pytest.mark.parametrize("kind", ["pos_one_scale", "pos_many", "neg_one", "neg_many"])
def test_sink_cpu(kind, sink, monkeypatch):
    """The sink factor on an infinite lse: sink +inf -> 0 and -inf -> 1 whatever lse (never inf - inf);
    a finite sink keeps a +inf row and zeroes a -inf row (the oracle's float64 lse is huge there)."""
    monkeypatch.setenv("SMLA_NUM_THREADS", "1")
    c = make_case(kind, seed=20, sink=sink)
    values = bf16_values(c["kv"])
    out, lse, ml = run_prefill_cpu(c)
    check_all(out, lse, ml, c, values, f"{kind} sink {sink}")


@pytest.mark.parametrize("kind", ["pos_one_scale", "pos_many", "neg_many", "huge_finite"])
def test_rows_split_over_threads_cpu(kind, monkeypatch):
    """One row of 2048 positions split over 4 threads: the saturating tokens fall in different parts,
    and the merge of the parts weighs each of them equally."""
    monkeypatch.setenv("SMLA_NUM_THREADS", "4")
    c = make_case(kind, topk=2048, seed=30)
    values = bf16_values(c["kv"])
    out, lse, ml = run_prefill_cpu(c)
    check_all(out, lse, ml, c, values, f"{kind} split")


def test_merge_of_saturated_halves_cpu(monkeypatch):
    """Attention over two halves of the top-k merged with merge_attn_states equals attention over the
    whole when one half holds the saturating token: the +inf lse outweighs the other half."""
    monkeypatch.setenv("SMLA_NUM_THREADS", "1")
    c = make_case("pos_one_scale", seed=60)
    n = c["idx"].shape[1]
    whole = run_prefill_cpu(c)
    halves = [smla.sparse_mla_prefill(c["q"], c["kv"], c["idx"][:, i * n // 2:(i + 1) * n // 2],
                                      softmax_scale=c["scale"]) for i in range(2)]
    assert (halves[0][1][:, ::2] == np.inf).all() != (halves[1][1][:, ::2] == np.inf).all()
    out, lse = smla.merge_attn_states(halves[0][0], halves[0][1], halves[1][0], halves[1][1])
    assert not np.isnan(ref.as_f64(out)).any()
    ref.check_close(out, whole[0], abs_tol=ref.OUT_ABS, rel_tol=ref.OUT_REL, cos_tol=ref.OUT_COS, name="merged out")
    ref.check_close(lse, whole[1], abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name="merged lse")


# ---------------------------------------------------------------------------------------------
# CUDA (run by the GPU suite): the same cases on torch CUDA arrays, against the oracle and the CPU
# ---------------------------------------------------------------------------------------------

def _cuda_env(family, monkeypatch):
    torch = pytest.importorskip("torch")
    if family.startswith("sm90") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernel families need a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)
    monkeypatch.setenv("SMLA_NUM_THREADS", "1")
    return torch


def _np(t):
    import torch

    t = t.detach().cpu()
    return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def _close_to_cpu(got, cpu, name):
    for g, w, what in zip(got, cpu, ["out", "lse", "max_logits"]):
        tol = (ref.OUT_ABS, ref.OUT_REL) if what == "out" else (ref.LSE_ABS, ref.LSE_REL)
        ref.check_close(ref.as_f64(g) if what == "out" else np.asarray(g, np.float64),
                        ref.as_f64(w) if what == "out" else np.asarray(w, np.float64),
                        abs_tol=tol[0], rel_tol=tol[1], name=f"{name} {what} vs CPU")


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["portable", "sm90", "sm90n"])
@pytest.mark.parametrize("sink", [None, "finite", "+inf", "-inf"])
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_cuda(kind, sink, family, monkeypatch):
    _cuda_env(family, monkeypatch)
    from torch_arrays import to_torch

    c = make_case(kind, topk=300, seed=40 + KINDS.index(kind), sink=sink)
    values = bf16_values(c["kv"])
    s = sink_array(sink)
    got = smla.sparse_mla_prefill(to_torch(c["q"]), to_torch(c["kv"]), to_torch(c["idx"]), softmax_scale=c["scale"],
                                  attn_sink=None if s is None else to_torch(s))
    got = [_np(t) for t in got]
    check_all(*got, c, values, f"cuda {family} prefill {kind} sink {sink}")
    _close_to_cpu(got, run_prefill_cpu(c), f"cuda {family} prefill {kind}")


@pytest.mark.cuda
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("family", ["portable", "sm90", "sm90n"])
@pytest.mark.parametrize("cd", ["bf16", "fp8_ds_mla"])
@pytest.mark.parametrize("kind", KINDS)
def test_decode_cuda(kind, cd, family, split, monkeypatch):
    """One query row of 2048 positions: with the workspace the top-k is split across CTAs (the
    saturating tokens fall in different splits, and the combine must weigh each of them equally);
    with an empty workspace one CTA does it all."""
    torch = _cuda_env(family, monkeypatch)
    from torch_arrays import to_torch

    c = make_case(kind, topk=2048, seed=50 + KINDS.index(kind), sink="finite" if kind == "pos_many" else None)
    cache, values = decode_cache(c, cd)
    s = sink_array(c["sink"])
    ws = None if split else torch.empty(0, dtype=torch.uint8, device="cuda")
    got = smla.sparse_mla_decode(to_torch(c["q"][None]), to_torch(cache), to_torch(c["idx"][None]),
                                 softmax_scale=c["scale"], kv_cache_dtype=cd,
                                 attn_sink=None if s is None else to_torch(s), workspace=ws)
    got = [_np(t)[0] for t in got]
    check_all(*got, None, c, values, f"cuda {family} decode {cd} {kind} split={split}")
    cpu = [a[0] for a in run_decode_cpu(c, cache, cd)]
    _close_to_cpu(got, cpu, f"cuda {family} decode {cd} {kind}")
