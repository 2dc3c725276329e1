"""CUDA sparse MLA decode and prefill on the issue grids, against the float64 oracle and the CPU ops.

Cases follow FlashMLA's recipe (tests/reference.py, docs/design.md section 4): indices mix valid slots with
every class of invalid value, cache rows that no valid index reads hold NaN (a stray read shows),
duplicates, all-invalid rows, topk_length and attn_sink corner values, strided q / caches / outputs.

The large grids are built on the GPU with torch (the cache written by smla.pack_kv) and checked
against `oracle`, a float64 twin of reference.sparse_mla_attention that runs on the device (the NumPy
oracle would take minutes on the 4096-token shapes); `test_oracle_twin_matches_reference` pins the
twin to reference.py, and the small cases compare with reference.py and with the CPU ops directly.
Tolerances are reference.py's constants with its check_close (a device-side copy of the same rule is
used only for outputs too large to move to the host cheaply). precision= (docs/design.md section 4): the
grids run each case at "high" and "fast" (the case and its oracle built once for both, `shared`), each
checked with its rule (reference.out_rule: "fast" allows 2^-8 * out_abs more, out_abs = the oracle with
|V|); a latent-magnitude-10 case holds "high" to the high rule where bf16 probabilities would miss it,
and the portable kernel, which has no fast variant, gives the same bits at both."""
import itertools
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
import test_sparse_mla_prefill as tpre  # noqa: E402  (issue 16's index patterns)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.cuda

BF16 = ml_dtypes.bfloat16
DEV = os.environ.get("SMLA_TEST_DEVICE", "cuda")  # "cpu" only to debug the helpers without a GPU
DEC_SCALE = 576 ** -0.55  # FlashMLA's decode test scale
PRE_SCALE = 576 ** -0.5
CACHE_DTYPES = ["fp8_ds_mla", "bf16"]
TL_MODES = ["none", "rand", "zero", "full"]
SINK_MODES = ["none", "finite", "+inf", "-inf", "mixed"]
HOST_CHECK_MAX = 1 << 21  # elements: larger outputs are compared on the device (same rule)


# =============================================================================================
# torch <-> numpy
# =============================================================================================

def to_np(t):
    """torch -> NumPy (bf16 as ml_dtypes.bfloat16, through int16 bits)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


# =============================================================================================
# case construction (on the device)
# =============================================================================================

def new_cache(cd, num_blocks, block_size, layers=1):
    """Zeroed cache; layers > 1 makes it layer `layers-1` of an interleaved allocation, so stride(0)
    is larger than block_size * entry."""
    if cd == "fp8_ds_mla":
        full = torch.zeros((num_blocks, layers, block_size, ref.FP8_ENTRY), dtype=torch.uint8, device=DEV)
    else:
        full = torch.zeros((num_blocks, layers, block_size, ref.D_QK), dtype=torch.bfloat16, device=DEV)
    return full[:, layers - 1]


def _nan_entry(cd):
    if cd == "bf16":
        return torch.full((ref.D_QK,), 0x7FC0, dtype=torch.int16).view(torch.bfloat16).to(DEV)
    ent = np.empty(ref.FP8_ENTRY, np.uint8)
    ent[:512] = 0x7F
    ent[512:528] = np.full(4, np.nan, np.float32).view(np.uint8)
    ent[528:] = np.full(64, 0x7FC0, np.uint16).view(np.uint8)
    return torch.from_numpy(ent).to(DEV)


def nan_fill(cache, cd, slots):
    bs = cache.shape[1]
    if slots.numel():
        cache[slots // bs, slots % bs] = _nan_entry(cd)


def make_sink(mode, h, gen):
    if mode == "none":
        return None
    s = torch.randn(h, generator=gen, device=DEV) * 2.0 + 1.0
    if mode == "+inf":
        s[:] = float("inf")
    elif mode == "-inf":
        s[:] = float("-inf")
    elif mode == "mixed":
        s[torch.rand(h, generator=gen, device=DEV) < 0.25] = float("inf")
        s[torch.rand(h, generator=gen, device=DEV) < 0.25] = float("-inf")
    return s.float()


def make_tl(mode, rows, topk, gen):
    if mode == "none":
        return None
    if mode == "zero":
        return torch.zeros(rows, dtype=torch.int32, device=DEV)
    if mode == "full":
        return torch.full((rows,), topk, dtype=torch.int32, device=DEV)
    tl = torch.randint(0, topk + 1, (rows,), generator=gen, device=DEV, dtype=torch.int32)
    tl[0] = topk
    if rows > 1:
        tl[-1] = 0
    return tl


def make_q(shape, gen, strided):
    q = torch.randn(shape, generator=gen, device=DEV).to(torch.bfloat16)
    if not strided:
        return q
    # every other head, 32 values into a wider row, NaN in the gaps
    *lead, h, d = shape
    big = torch.full((*lead, 2 * h, d + 64), float("nan"), dtype=torch.bfloat16, device=DEV)
    v = big[..., ::2, 32:32 + d]
    v.copy_(q)
    return v


def make_indices(rows_valid, n_rows, topk, limit, gen, *, all_invalid_frac):
    """rows_valid(n_valid) -> [n_rows, topk] int64 candidate valid slots (the first n_valid[r] of row r
    are used); the rest of each row is drawn from the invalid zoo, half the rows are shuffled, the
    other half end in -1 padding, and some rows (always the last one) are all invalid."""
    cols = torch.arange(topk, device=DEV)
    n_valid = (torch.rand(n_rows, generator=gen, device=DEV) * topk).long().clamp_(0, topk - 1) + 1
    cand = rows_valid(n_valid)
    dup = (torch.rand(n_rows, generator=gen, device=DEV) < 0.3) & (n_valid >= 2)
    r = dup.nonzero().squeeze(1)
    cand[r, n_valid[r] - 1] = cand[r, 0]  # duplicates count twice
    zoo = torch.from_numpy(ref.invalid_index_zoo(limit).astype(np.int64)).to(DEV)
    junk = zoo[torch.randint(0, zoo.numel(), (n_rows, topk), generator=gen, device=DEV)]
    head = cols[None, :] < n_valid[:, None]
    idx = torch.where(head, cand, junk)
    shuffle = torch.rand(n_rows, generator=gen, device=DEV) < 0.5
    perm = torch.rand(n_rows, topk, generator=gen, device=DEV).argsort(1)
    idx = torch.where(shuffle[:, None], idx.gather(1, perm), torch.where(head, idx, torch.full_like(idx, -1)))
    allinv = torch.rand(n_rows, generator=gen, device=DEV) < all_invalid_frac
    if n_rows >= 2 and all_invalid_frac > 0:
        allinv[-1] = True
    return torch.where(allinv[:, None], junk, idx).to(torch.int32)


def valid_mask(idx, limit, tl):
    v = (idx >= 0) & (idx.long() < limit)
    if tl is not None:
        v &= torch.arange(idx.shape[-1], device=idx.device) < tl.long()[..., None]
    return v


def decode_case(cd, b, s_q, h, topk, bs, *, seed, tl_mode="rand", sink_mode="mixed", strided_q=False, layers=1,
                all_invalid_frac=0.15, scale=DEC_SCALE, v_scale=1.0):
    """b requests of varied lengths (1..topk+64 tokens) on shuffled blocks of one paged cache. v_scale
    multiplies the latent values (V) and divides q's latent part (the scores keep their spread)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    seq_lens = rng.integers(1, topk + 65, b)
    nblk = -(-seq_lens // bs)
    num_blocks = int(nblk.sum()) + 3  # spare blocks nobody owns (NaN)
    perm = rng.permutation(num_blocks)
    starts = np.concatenate([[0], np.cumsum(nblk)])
    bt = np.zeros((b, int(nblk.max())), np.int64)
    for r in range(b):
        bt[r, :nblk[r]] = perm[starts[r]:starts[r + 1]]
    tok_req = np.repeat(np.arange(b), seq_lens)
    tok_pos = np.arange(tok_req.size) - np.repeat(np.cumsum(seq_lens) - seq_lens, seq_lens)
    tok_slots = bt[tok_req, tok_pos // bs] * bs + tok_pos % bs
    t = tok_slots.size
    mag = 2.0 ** torch.randint(-4, 3, (t, 4, 1), generator=gen, device=DEV).float()
    kv_c = (torch.randn((t, 4, 128), generator=gen, device=DEV) * mag * v_scale).reshape(t, 512).to(torch.bfloat16)
    k_pe = torch.randn((t, 64), generator=gen, device=DEV).to(torch.bfloat16)
    cache = new_cache(cd, num_blocks, bs, layers)
    smla.pack_kv(kv_c, k_pe, cache, torch.from_numpy(tok_slots).to(DEV), kv_cache_dtype=cd)
    limit = num_blocks * bs

    rows = b * s_q
    lens = torch.from_numpy(np.repeat(seq_lens, s_q)).to(DEV)
    bt_t = torch.from_numpy(bt).to(DEV)
    req = torch.arange(rows, device=DEV) // s_q

    def rows_valid(n_valid):
        lmax = topk + 64
        j = torch.arange(lmax, device=DEV)
        keys = torch.rand(rows, lmax, generator=gen, device=DEV) + (j[None] >= lens[:, None]).float() * 2
        distinct = keys.argsort(1)[:, :topk]  # a permutation of the row's own positions first
        repl = (torch.rand(rows, topk, generator=gen, device=DEV) * lens[:, None]).long()
        pos = torch.where((n_valid <= lens)[:, None], distinct, repl)
        pos = torch.minimum(pos, lens[:, None] - 1)  # columns past n_valid are replaced later
        return bt_t[req[:, None], pos // bs] * bs + pos % bs

    idx = make_indices(rows_valid, rows, topk, limit, gen, all_invalid_frac=all_invalid_frac)
    tl = make_tl(tl_mode, rows, topk, gen)
    v = valid_mask(idx, limit, tl)
    read = torch.zeros(limit, dtype=torch.bool, device=DEV)
    read[idx.long()[v]] = True
    nan_fill(cache, cd, (~read).nonzero().squeeze(1))
    q = make_q((b, s_q, h, 576), gen, strided_q)
    q[..., :512].copy_((q[..., :512].float() / v_scale).to(torch.bfloat16))
    return dict(q=q, kv_cache=cache, indices=idx.view(b, s_q, topk),
                topk_length=None if tl is None else tl.view(b, s_q), attn_sink=make_sink(sink_mode, h, gen),
                softmax_scale=scale, kv_cache_dtype=cd, limit=limit)


def prefill_case(s_q, h, s_kv, topk, *, seed, tl_mode="rand", sink_mode="mixed", kv_layout="plain",
                 all_invalid_frac=0.1, scale=PRE_SCALE, distinct=True, v_scale=1.0):
    """kv [s_kv, 576] with NaN in every row no valid index reads; topk > s_kv repeats rows. v_scale as
    in decode_case."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    kv = torch.randn((s_kv, 576), generator=gen, device=DEV)
    kv[:, :512] *= v_scale
    kv = kv.to(torch.bfloat16)

    def rows_valid(n_valid):
        n_valid.clamp_(max=4 * s_kv)  # bounded repeats when topk > s_kv
        repl = torch.randint(0, s_kv, (s_q, topk), generator=gen, device=DEV)
        if not distinct:
            return repl
        p = torch.rand(s_q, s_kv, generator=gen, device=DEV).argsort(1)
        p = p[:, :topk] if s_kv >= topk else torch.cat([p, repl[:, s_kv:]], 1)
        return torch.where((n_valid <= s_kv)[:, None], p, repl)

    idx = make_indices(rows_valid, s_q, topk, s_kv, gen, all_invalid_frac=all_invalid_frac)
    tl = make_tl(tl_mode, s_q, topk, gen)
    v = valid_mask(idx, s_kv, tl)
    read = torch.zeros(s_kv, dtype=torch.bool, device=DEV)
    read[idx.long()[v]] = True
    kv.view(torch.int16)[~read] = 0x7FC0
    kv_arg = kv
    if kv_layout == "strided":  # row stride 640, 32 values into the row
        big = torch.full((s_kv, 640), float("nan"), dtype=torch.bfloat16, device=DEV)
        big[:, 32:608] = kv
        kv_arg = big[:, 32:608]
    elif kv_layout == "3d":  # FlashMLA's [s_kv, 1, 576]
        kv_arg = kv[:, None, :]
    q = make_q((s_q, h, 576), gen, False)
    q[..., :512] = (q[..., :512].float() / v_scale).to(torch.bfloat16)
    return dict(q=q, kv=kv_arg, kv_plain=kv, indices=idx, topk_length=tl, attn_sink=make_sink(sink_mode, h, gen),
                softmax_scale=scale)


# =============================================================================================
# the float64 oracle on the device (twin of reference.sparse_mla_attention)
# =============================================================================================

def dequant_table(cache, cd):
    """Every slot of the cache as float32 [limit + 1, 576] (exact bf16 values), plus a zero row at
    index `limit` that invalid positions point to. fp8: bf16_rne(float32(e4m3) * scale)."""
    nb, bs, e = cache.shape
    flat = cache.reshape(nb * bs, e)
    n = flat.shape[0]
    if cd == "bf16":
        t = flat.float()
    else:
        vals = flat[:, :512].contiguous().view(torch.float8_e4m3fn).float()
        sc = flat[:, 512:528].contiguous().view(torch.float32)
        nope = (vals.view(n, 4, 128) * sc[:, :, None]).view(n, 512).to(torch.bfloat16).float()
        rope = flat[:, 528:].contiguous().view(torch.bfloat16).float()
        t = torch.cat([nope, rope], 1)
    return torch.cat([t, torch.zeros((1, 576), device=t.device)])


def oracle(q, table, idx, limit, tl, sink, scale, return_abs=False):
    """q [R, h, 576] bf16, idx [R, topk], tl [R] or None, sink [h] or None -> float64 (out [R, h, 512],
    lse [R, h], max_logits [R, h]), and out_abs [R, h, 512] with return_abs, with
    reference.sparse_mla_attention's semantics."""
    n_rows, h, _ = q.shape
    topk = idx.shape[1]
    valid = valid_mask(idx, limit, tl)
    pos = torch.where(valid, idx.long(), torch.full_like(idx, limit, dtype=torch.long))
    scale = float(np.float32(scale))
    has = valid.any(1)
    out = torch.zeros((n_rows, h, 512), dtype=torch.float64, device=q.device)
    lse = torch.full((n_rows, h), float("-inf"), dtype=torch.float64, device=q.device)
    ml = lse.clone()
    out_abs = torch.zeros_like(out) if return_abs else None
    ch = max(1, (1 << 28) // (topk * 576 * 8))
    for r0 in range(0, n_rows, ch):
        r1 = min(n_rows, r0 + ch)
        k = table[pos[r0:r1]].double()
        s = scale * torch.bmm(q[r0:r1].double(), k.transpose(1, 2))
        s = s.masked_fill(~valid[r0:r1, None, :], float("-inf"))
        hv = has[r0:r1, None]
        m = s.amax(2)
        e = torch.exp(s - torch.where(hv, m, torch.zeros_like(m))[..., None])
        z = e.sum(2)
        zs = torch.where(hv, z, torch.ones_like(z))[..., None]
        o = torch.bmm(e, k[..., :512]) / zs
        out[r0:r1] = torch.where(hv[..., None], o, torch.zeros_like(o))
        if return_abs:
            oa = torch.bmm(e, k[..., :512].abs()) / zs
            out_abs[r0:r1] = torch.where(hv[..., None], oa, torch.zeros_like(oa))
        lse[r0:r1] = torch.where(hv, m + torch.log(z), torch.full_like(m, float("-inf")))
        ml[r0:r1] = torch.where(hv, m, torch.full_like(m, float("-inf")))
    if sink is not None:
        f = 1.0 / (1.0 + torch.exp(sink.double()[None, :] - lse))
        out = torch.where(has[:, None, None], out * f[..., None], torch.zeros_like(out))
        if return_abs:
            out_abs = torch.where(has[:, None, None], out_abs * f[..., None], torch.zeros_like(out_abs))
    return (out, lse, ml, out_abs) if return_abs else (out, lse, ml)


def decode_oracle(c, return_abs=False):
    """(out, lse), and out_abs after them with return_abs."""
    b, s_q, h, _ = c["q"].shape
    topk = c["indices"].shape[2]
    tl = c["topk_length"]
    res = oracle(c["q"].reshape(b * s_q, h, 576), dequant_table(c["kv_cache"], c["kv_cache_dtype"]),
                 c["indices"].reshape(b * s_q, topk), c["limit"], None if tl is None else tl.reshape(-1),
                 c["attn_sink"], c["softmax_scale"], return_abs)
    out, lse = res[0].view(b, s_q, h, 512), res[1].view(b, s_q, h)
    return (out, lse, res[3].view(b, s_q, h, 512)) if return_abs else (out, lse)


def prefill_oracle(c, rows=None, return_abs=False):
    """(out, lse, max_logits), and out_abs after them with return_abs."""
    kv = c["kv_plain"]
    table = torch.cat([kv.float(), torch.zeros((1, 576), device=kv.device)])
    q, idx, tl = c["q"], c["indices"], c["topk_length"]
    if rows is not None:
        q, idx, tl = q[rows], idx[rows], None if tl is None else tl[rows]
    return oracle(q, table, idx, kv.shape[0], tl, c["attn_sink"], c["softmax_scale"], return_abs)


_SHARED = {}


def shared(key, make):
    """make(), built by the first of consecutive tests with this key and reused by the next (a grid
    point run at each precision: one case and one oracle); one entry is kept."""
    if key not in _SHARED:
        _SHARED.clear()
        _SHARED[key] = make()
    return _SHARED[key]


# =============================================================================================
# comparison
# =============================================================================================

def check_close_dev(actual, expected, *, abs_tol, rel_tol, cos_tol=None, slack=None, name="value"):
    """reference.check_close's rule evaluated on the device (for outputs of 10^8 elements)."""
    a, e = actual.double(), expected.double()
    assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    nan_a, nan_e = a.isnan(), e.isnan()
    assert bool((nan_a == nan_e).all()), f"{name}: {int((nan_a != nan_e).sum())} mismatched NaN"
    inf_bad = (a.isinf() | e.isinf()) & ~(nan_a | nan_e) & (a != e)
    assert not bool(inf_bad.any()), f"{name}: {int(inf_bad.sum())} mismatched Inf"
    fin = a.isfinite() & e.isfinite()
    err = torch.where(fin, (a - e).abs(), torch.zeros_like(a))
    rel = rel_tol * torch.where(fin, e, torch.zeros_like(e)).abs()
    if slack is None:
        bound = torch.clamp(rel, min=abs_tol)
    else:
        bound = abs_tol + rel + torch.where(fin, slack.double().expand_as(e), torch.zeros_like(e))
    ratio = err / bound
    worst = int(ratio.argmax())
    if float(ratio.view(-1)[worst]) > 1:
        i = np.unravel_index(worst, tuple(a.shape))
        rule = f"abs {abs_tol:g} / rel {rel_tol:g}" if slack is None else f"abs {abs_tol:g} + rel {rel_tol:g} + slack"
        raise AssertionError(f"{name}: {int((ratio > 1).sum())} of {a.numel()} elements outside {rule}; "
                             f"worst at {i}: actual {float(a[i])!r}, expected {float(e[i])!r}")
    if cos_tol is not None:
        av, ev = a[fin], e[fin]
        na, ne = av.norm(), ev.norm()
        if float(na) == 0 and float(ne) == 0:
            cd = 0.0
        elif float(na) == 0 or float(ne) == 0:
            cd = 1.0
        else:
            cd = float(1.0 - (av * ev).sum() / (na * ne))
        assert cd <= cos_tol, f"{name}: cosine difference {cd:.3g} > {cos_tol:g}"


def check(actual, expected, *, abs_tol, rel_tol, cos_tol=None, slack=None, name):
    if actual.numel() <= HOST_CHECK_MAX:
        ref.check_close(to_np(actual), to_np(expected), abs_tol=abs_tol, rel_tol=rel_tol, cos_tol=cos_tol,
                        slack=None if slack is None else to_np(slack), name=name)
    else:
        check_close_dev(actual, expected, abs_tol=abs_tol, rel_tol=rel_tol, cos_tol=cos_tol, slack=slack, name=name)


def check_decode(out, lse, out_ref, lse_ref, name="decode", *, precision="high", out_abs=None):
    """reference.check_decode's rules ("fast" needs out_abs: decode_oracle(c, return_abs=True))."""
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    check(out, out_ref, **ref.out_rule(precision, out_abs), name=f"{name} out")
    check(lse, lse_ref, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name=f"{name} lse")


def check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name="prefill", *, precision="high", out_abs=None):
    check(out, out_ref, **ref.out_rule(precision, out_abs, prefill=True), name=f"{name} out")
    check(lse, lse_ref, abs_tol=ref.PREFILL_LSE_ABS, rel_tol=ref.PREFILL_LSE_REL, name=f"{name} lse")
    check(ml, ml_ref, abs_tol=ref.PREFILL_LSE_ABS, rel_tol=ref.PREFILL_LSE_REL, name=f"{name} max_logits")


def run_decode(c, **kw):
    return smla.sparse_mla_decode(c["q"], c["kv_cache"], c["indices"], softmax_scale=c["softmax_scale"],
                                  kv_cache_dtype=c["kv_cache_dtype"], topk_length=c["topk_length"],
                                  attn_sink=c["attn_sink"], **kw)


def run_prefill(c, **kw):
    return smla.sparse_mla_prefill(c["q"], c["kv"], c["indices"], softmax_scale=c["softmax_scale"],
                                   topk_length=c["topk_length"], attn_sink=c["attn_sink"], **kw)


def np_case(c, keys):
    return {k: (to_np(v) if isinstance(v, torch.Tensor) else v) for k, v in c.items() if k in keys}


# =============================================================================================
# decode: the issue grid. h x s_q x topk x cache dtype in full; block size, batch, topk_length,
# sink, strided q and interleaved caches rotate so that each value of each appears.
# =============================================================================================

def _decode_grid():
    cases = []
    prod = itertools.product(CACHE_DTYPES, [8, 16, 32, 64, 128], [1, 2, 4], [64, 2048, 2112])
    for i, (cd, h, s_q, topk) in enumerate(prod):
        bs = [64, 1, 61][(i // 3) % 3]
        hs = h * s_q
        b = 321 if hs <= 128 else (37 if hs <= 256 else 9)
        if i % 7 == 3:
            b = 1
        tl_mode = TL_MODES[(i // 2) % 4]
        sink_mode = SINK_MODES[i % 5]
        strided_q = i % 2 == 1
        layers = 2 if i % 4 == 2 else 1
        cases.append(pytest.param(cd, h, s_q, topk, bs, b, tl_mode, sink_mode, strided_q, layers, i,
                                  id=f"{cd}-h{h}-sq{s_q}-topk{topk}-bs{bs}-b{b}-tl_{tl_mode}-sink_{sink_mode}"
                                     f"{'-strided' if strided_q else ''}{'-interleaved' if layers > 1 else ''}"))
    return cases


@pytest.mark.parametrize("precision", ref.PRECISIONS)  # varies fastest: the two runs share one case and oracle
@pytest.mark.parametrize("cd,h,s_q,topk,bs,b,tl_mode,sink_mode,strided_q,layers,seed", _decode_grid())
def test_decode_grid(cd, h, s_q, topk, bs, b, tl_mode, sink_mode, strided_q, layers, seed, precision):
    def make():
        c = decode_case(cd, b, s_q, h, topk, bs, seed=seed, tl_mode=tl_mode, sink_mode=sink_mode,
                        strided_q=strided_q, layers=layers)
        return c, decode_oracle(c, return_abs=True)

    c, (out_ref, lse_ref, out_abs) = shared(("decode grid", seed), make)
    out, lse = run_decode(c, precision=precision)
    check_decode(out, lse, out_ref, lse_ref, name=precision, precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("h,topk,bs", [(8, 2112, 61), (16, 64, 1), (64, 2048, 64), (128, 2112, 61), (100, 300, 16)])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_vs_cpu_and_reference(cd, h, topk, bs, precision):
    """Small batches: CUDA against the CPU op (which runs high at either precision) and against
    reference.py's NumPy oracle itself, with the precision's rule."""
    c = decode_case(cd, 2, 2, h, topk, bs, seed=h + topk, tl_mode="rand", sink_mode="mixed", strided_q=True)
    out, lse = run_decode(c, precision=precision)
    n = np_case(c, ("q", "kv_cache", "indices", "topk_length", "attn_sink"))
    out_c, lse_c = smla.sparse_mla_decode(n["q"], n["kv_cache"], n["indices"], softmax_scale=c["softmax_scale"],
                                          kv_cache_dtype=cd, topk_length=n["topk_length"],
                                          attn_sink=n["attn_sink"], precision=precision)
    out_r, lse_r, out_abs = ref.sparse_mla_decode_ref(np.ascontiguousarray(n["q"]), n["kv_cache"], n["indices"],
                                                      c["softmax_scale"], cd, n["topk_length"], n["attn_sink"],
                                                      return_abs=True)
    out_g, lse_g = to_np(out), to_np(lse)
    ref.check_close(out_g, out_c, **ref.out_rule(precision, out_abs), name="cuda vs cpu out")
    ref.check_close(lse_g, lse_c, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name="cuda vs cpu lse")
    ref.check_decode(out_g, lse_g, out_r, lse_r, name="cuda vs reference", precision=precision, out_abs=out_abs)


def test_oracle_twin_matches_reference():
    """The device oracle used by the big grids agrees with reference.py to ~1e-12 (out_abs included)."""
    c = decode_case("fp8_ds_mla", 3, 2, 16, 200, 61, seed=5, tl_mode="rand", sink_mode="mixed", layers=2)
    twin = decode_oracle(c, return_abs=True)
    n = np_case(c, ("q", "kv_cache", "indices", "topk_length", "attn_sink"))
    want = ref.sparse_mla_decode_ref(n["q"], n["kv_cache"], n["indices"], c["softmax_scale"], "fp8_ds_mla",
                                     n["topk_length"], n["attn_sink"], return_abs=True)
    for x, y, nm in zip(twin, want, ("out", "lse", "out_abs")):
        ref.check_close(to_np(x), y, abs_tol=1e-12, rel_tol=1e-12, name=f"twin {nm}")
    p = prefill_case(40, 16, 300, 128, seed=6)
    twin = prefill_oracle(p, return_abs=True)
    np_p = np_case(p, ("q", "kv_plain", "indices", "topk_length", "attn_sink"))
    want = ref.sparse_mla_prefill_ref(np_p["q"], np_p["kv_plain"], np_p["indices"], p["softmax_scale"],
                                      np_p["topk_length"], np_p["attn_sink"], return_abs=True)
    for x, y, nm in zip(twin, want, ("out", "lse", "max_logits", "out_abs")):
        ref.check_close(to_np(x), y, abs_tol=1e-12, rel_tol=1e-12, name=f"twin prefill {nm}")


@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("sink_mode", ["none", "finite", "+inf", "-inf"])
def test_decode_all_invalid(cd, sink_mode):
    """Every index invalid (the zoo, or valid slots past topk_length), the whole cache NaN: out is
    exactly 0, lse -inf, on the split and the unsplit path, at both precisions."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    cache = new_cache(cd, 4, 16)
    nan_fill(cache, cd, torch.arange(64, device=DEV))
    zoo = torch.from_numpy(ref.invalid_index_zoo(64)).to(DEV)
    for b, s_q, h, topk in ((3, 2, 16, 40), (1, 1, 128, 2048)):
        idx = zoo[torch.randint(0, zoo.numel(), (b, s_q, topk), generator=gen, device=DEV)].to(torch.int32)
        idx[0, 0, 5:] = 3
        tl = torch.full((b, s_q), topk, dtype=torch.int32, device=DEV)
        tl[0, 0] = 5
        q = torch.randn((b, s_q, h, 576), generator=gen, device=DEV).to(torch.bfloat16)
        sink = make_sink(sink_mode, h, gen)
        for precision in ref.PRECISIONS:
            out, lse = smla.sparse_mla_decode(q, cache, idx, softmax_scale=DEC_SCALE, kv_cache_dtype=cd,
                                              topk_length=tl, attn_sink=sink, precision=precision)
            assert bool((out.view(torch.int16) == 0).all()), precision
            assert bool((lse == float("-inf")).all()), precision


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_split_paths_agree(cd, precision):
    """b = 2 splits the top-k over many CTAs (fp32 partials + combine); no workspace (or an empty one)
    runs unsplit. Both match the oracle; outputs land in strided out= / lse= views; runs repeat
    bit for bit."""
    c = decode_case(cd, 2, 2, 128, 2048, 64, seed=77, tl_mode="rand", sink_mode="mixed")
    out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
    ws_bytes = smla.sparse_mla_decode_workspace_size(2, 2, 128, 2048, cd, device_id=torch.cuda.current_device())
    assert ws_bytes >= 0
    for ws in (torch.empty(ws_bytes, dtype=torch.uint8, device=DEV), torch.empty(0, dtype=torch.uint8, device=DEV),
               torch.empty(ws_bytes // 3, dtype=torch.uint8, device=DEV)):
        out_big = torch.full((2, 2, 128, 576), 7.0, dtype=torch.bfloat16, device=DEV)
        lse_big = torch.full((2, 2, 128, 3), 7.0, dtype=torch.float32, device=DEV)
        out_v, lse_v = out_big[..., 32:544], lse_big[..., 1]
        out, lse = run_decode(c, out=out_v, lse=lse_v, workspace=ws, precision=precision)
        assert out.data_ptr() == out_v.data_ptr() and lse.data_ptr() == lse_v.data_ptr()
        check_decode(out_v, lse_v, out_ref, lse_ref, name=f"workspace {ws.numel()} B", precision=precision,
                     out_abs=out_abs)
        assert bool((out_big[..., :32] == 7).all()) and bool((out_big[..., 544:] == 7).all())
        assert bool((lse_big[..., 0] == 7).all()) and bool((lse_big[..., 2] == 7).all())
        again, lse2 = run_decode(c, workspace=ws, precision=precision)
        assert torch.equal(again.view(torch.int16), out_v.view(torch.int16)) and torch.equal(lse2, lse_v)


def _kernels_launched(fn):
    """Names of the CUDA kernels fn() launches (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("h", [3, 16, 64, 128])
def test_decode_fused_combine_matches_the_combine_kernel(monkeypatch, cd, h, precision):
    """A split decode of few rows merges its partials in its own kernel (a cooperative launch,
    SMLA_ATTN_COMBINE=auto: no combine kernel is launched) or, with SMLA_ATTN_COMBINE=kernel, in the combine
    kernel: the same merge, so the same bits, and the oracle's results; repeated calls agree. On a 132-SM GPU
    (the H200) two query rows of 128 heads fuse (128 CTAs: 8 or more splits, at most 2 (row, head) pairs a CTA,
    at least 7/8 of the SMs; launch.cu); two rows of 64 heads or fewer (64 CTAs) and three rows of 128 heads
    (more pairs than that) take the combine kernel either way."""
    _check_fused_combine(monkeypatch, cd, h, precision, ((2, 1), (1, 2), (3, 1)),
                         lambda b, s_q: b * s_q == 2 and h == 128)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_fused_combine_narrow(monkeypatch, cd, precision):
    """The narrow kernel's fused split decode: eight rows of 20 heads split 16 ways (128 CTAs) fuse on a
    132-SM GPU, over the bf16 cache in "high" with two consumer warpgroups, each merging its own share of the
    (row, head) pairs (sm90/narrow_kernel.cuh), else with one."""
    _check_fused_combine(monkeypatch, cd, 20, precision, ((8, 1),), lambda b, s_q: True)


def _check_fused_combine(monkeypatch, cd, h, precision, shapes, fuses):
    """Each shape (b, s_q) with SMLA_ATTN_COMBINE=kernel and =auto: the same bits, the oracle's results, the
    same again on a repeated call; on a 132-SM GPU auto launches the combine kernel unless fuses(b, s_q)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for b, s_q in shapes:
        c = decode_case(cd, b, s_q, h, 2048, 64, seed=100 + b * 10 + s_q + h, tl_mode="rand", sink_mode="mixed")
        ws_bytes = smla.sparse_mla_decode_workspace_size(b, s_q, h, 2048, cd)
        assert ws_bytes > 0, "this shape splits the top-k"
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=DEV)
        res = {}
        for mode in ("kernel", "auto"):
            monkeypatch.setenv("SMLA_ATTN_COMBINE", mode)
            names = _kernels_launched(lambda: res.__setitem__(mode, run_decode(c, workspace=ws, precision=precision)))
            if names:  # (no CUDA events at all: no profiler here, e.g. under compute-sanitizer)
                combines = len([n for n in names if "attn_combine_kernel" in n])
                if mode == "kernel":
                    assert combines == 1, (mode, names)
                elif sms == 132:
                    assert combines == (0 if fuses(b, s_q) else 1), (mode, names)
        (o1, l1), (o2, l2) = res["kernel"], res["auto"]
        name = f"b={b} s_q={s_q} h={h}"
        assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)), name
        assert torch.equal(l1.view(torch.int32), l2.view(torch.int32)), name
        out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
        check_decode(o2, l2, out_ref, lse_ref, name=name, precision=precision, out_abs=out_abs)
        o3, l3 = run_decode(c, workspace=ws, precision=precision)
        assert torch.equal(o3.view(torch.int16), o2.view(torch.int16)) and torch.equal(l3.view(torch.int32),
                                                                                     l2.view(torch.int32)), name


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("b", [2, 64])
def test_decode_cuda_graph(cd, b, precision):
    """One decode step captured in a CUDA graph (workspace and outputs preallocated) replays to the
    same bits as an eager call, with new q and indices copied into the captured buffers."""
    c = decode_case(cd, b, 2, 64, 2048, 64, seed=b, tl_mode="rand", sink_mode="finite")
    gen = torch.Generator(device=DEV).manual_seed(b + 1)
    # second step: new q, the rows' (indices, topk_length) pairs rotated across requests
    c2 = dict(c, q=torch.randn(c["q"].shape, generator=gen, device=DEV).to(torch.bfloat16),
              indices=c["indices"].roll(1, 0), topk_length=c["topk_length"].roll(1, 0))
    static = dict(c)
    for k in ("q", "indices", "topk_length"):
        static[k] = c[k].clone()
    ws = torch.empty(smla.sparse_mla_decode_workspace_size(b, 2, 64, 2048, cd), dtype=torch.uint8, device=DEV)
    out = torch.empty((b, 2, 64, 512), dtype=torch.bfloat16, device=DEV)
    lse = torch.empty((b, 2, 64), dtype=torch.float32, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (kernel attributes, module load)
        run_decode(static, out=out, lse=lse, workspace=ws, precision=precision)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_decode(static, out=out, lse=lse, workspace=ws, precision=precision)
    for src in (c, c2):
        static["q"].copy_(src["q"])
        static["indices"].copy_(src["indices"])
        static["topk_length"].copy_(src["topk_length"])
        graph.replay()
        sync()
        got_out, got_lse = out.clone(), lse.clone()
        eager_out, eager_lse = run_decode(static, workspace=ws, precision=precision)
        sync()
        assert torch.equal(got_out.view(torch.int16), eager_out.view(torch.int16))
        assert torch.equal(got_lse, eager_lse)
    out_ref, lse_ref, out_abs = decode_oracle(static, return_abs=True)
    check_decode(got_out, got_lse, out_ref, lse_ref, name="graph replay", precision=precision, out_abs=out_abs)


# =============================================================================================
# prefill: the issue grid (h x s_q x (s_kv, topk) in full)
# =============================================================================================

PREFILL_KV_TOPK = [(128, 128), (592, 128), (1840, 256), (1521, 512), (8192, 2048), (32, 2048)]


def _prefill_grid():
    cases = []
    prod = itertools.product([16, 32, 64, 128], [1, 62, 213, 4096], PREFILL_KV_TOPK)
    for i, (h, s_q, (s_kv, topk)) in enumerate(prod):
        tl_mode = TL_MODES[i % 4]
        sink_mode = SINK_MODES[(i // 4) % 5]
        kv_layout = ["plain", "strided", "3d"][i % 3]
        cases.append(pytest.param(h, s_q, s_kv, topk, tl_mode, sink_mode, kv_layout, i,
                                  id=f"h{h}-sq{s_q}-skv{s_kv}-topk{topk}-tl_{tl_mode}-sink_{sink_mode}-{kv_layout}"))
    return cases


@pytest.mark.parametrize("precision", ref.PRECISIONS)  # varies fastest: the two runs share one case and oracle
@pytest.mark.parametrize("h,s_q,s_kv,topk,tl_mode,sink_mode,kv_layout,seed", _prefill_grid())
def test_prefill_grid(h, s_q, s_kv, topk, tl_mode, sink_mode, kv_layout, seed, precision):
    def make():
        c = prefill_case(s_q, h, s_kv, topk, seed=seed, tl_mode=tl_mode, sink_mode=sink_mode, kv_layout=kv_layout)
        return c, prefill_oracle(c, return_abs=True)

    c, (out_ref, lse_ref, ml_ref, out_abs) = shared(("prefill grid", seed), make)
    out, lse, ml = run_prefill(c, precision=precision)
    check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=precision, precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("h,s_q,s_kv,topk", [(16, 62, 592, 128), (128, 5, 1521, 512), (64, 3, 32, 2048)])
def test_prefill_vs_cpu_and_reference(h, s_q, s_kv, topk, precision):
    c = prefill_case(s_q, h, s_kv, topk, seed=h, tl_mode="rand", sink_mode="mixed", kv_layout="strided")
    out, lse, ml = run_prefill(c, precision=precision)
    n = np_case(c, ("q", "kv_plain", "indices", "topk_length", "attn_sink"))
    oc, lc, mc = smla.sparse_mla_prefill(n["q"], n["kv_plain"], n["indices"], softmax_scale=c["softmax_scale"],
                                         topk_length=n["topk_length"], attn_sink=n["attn_sink"], precision=precision)
    o_r, l_r, m_r, out_abs = ref.sparse_mla_prefill_ref(n["q"], n["kv_plain"], n["indices"], c["softmax_scale"],
                                                        n["topk_length"], n["attn_sink"], return_abs=True)
    og, lg, mg = to_np(out), to_np(lse), to_np(ml)
    ref.check_close(og, oc, **ref.out_rule(precision, out_abs, prefill=True), name="cuda vs cpu out")
    ref.check_close(lg, lc, abs_tol=ref.PREFILL_LSE_ABS, rel_tol=ref.PREFILL_LSE_REL, name="cuda vs cpu lse")
    ref.check_close(mg, mc, abs_tol=ref.PREFILL_LSE_ABS, rel_tol=ref.PREFILL_LSE_REL, name="cuda vs cpu max_logits")
    ref.check_prefill(og, lg, mg, o_r, l_r, m_r, precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("scale", [-PRE_SCALE, 0.0, -2.0, 3.0])
@pytest.mark.parametrize("h", [128, 64, 16])
def test_prefill_softmax_scale_any_sign(h, scale, precision):
    """Negative, zero and large scales: a negative scale reverses the raw scores' order (the row max is
    the raw minimum scaled), a zero one makes every valid score 0 (and an invalid one must still weigh
    0, not inf * 0)."""
    c = prefill_case(9, h, 900, 320, seed=77 + h, tl_mode="rand", sink_mode="mixed", scale=scale)
    out_ref, lse_ref, ml_ref, out_abs = prefill_oracle(c, return_abs=True)
    out, lse, ml = run_prefill(c, precision=precision)
    check(out, out_ref, **ref.out_rule(precision, out_abs, prefill=True), name=f"scale {scale} out")
    # lse and max_logits are scale x (fp32 dot products): their absolute error grows with |scale| (the
    # shared tolerance is FlashMLA's, for scales near 1 / sqrt(576)); measured at scale -2, h = 128:
    # 1.04e-5 on max_logits 0.0575
    stat_abs = ref.PREFILL_LSE_ABS * max(1.0, abs(scale) / PRE_SCALE)
    check(lse, lse_ref, abs_tol=stat_abs, rel_tol=ref.PREFILL_LSE_REL, name=f"scale {scale} lse")
    check(ml, ml_ref, abs_tol=stat_abs, rel_tol=ref.PREFILL_LSE_REL, name=f"scale {scale} max_logits")


def test_prefill_all_invalid():
    gen = torch.Generator(device=DEV).manual_seed(2)
    kv = torch.full((50, 576), float("nan"), dtype=torch.bfloat16, device=DEV)
    zoo = torch.from_numpy(ref.invalid_index_zoo(50)).to(DEV)
    for s_q, h, topk in ((1, 128, 128), (300, 16, 2048), (70, 64, 64)):
        idx = zoo[torch.randint(0, zoo.numel(), (s_q, topk), generator=gen, device=DEV)].to(torch.int32)
        q = torch.randn((s_q, h, 576), generator=gen, device=DEV).to(torch.bfloat16)
        sink = make_sink("mixed", h, gen)
        for precision in ref.PRECISIONS:
            out, lse, ml = smla.sparse_mla_prefill(q, kv, idx, softmax_scale=PRE_SCALE, attn_sink=sink,
                                                   precision=precision)
            assert bool((out.view(torch.int16) == 0).all()), precision
            assert bool((lse == float("-inf")).all()) and bool((ml == float("-inf")).all()), precision


def test_prefill_70000_tokens():
    """s_q beyond 65535 (grid.x carries it): every output finite where a valid index exists, spot rows
    (first, last, random) against the oracle."""
    c = prefill_case(70000, 64, 4096, 256, seed=70000, tl_mode="none", sink_mode="none", distinct=False,
                     all_invalid_frac=0.0)
    out, lse, ml = run_prefill(c)
    assert bool(out.isfinite().all()) and bool(lse.isfinite().all()) and bool(ml.isfinite().all())
    gen = torch.Generator(device=DEV).manual_seed(3)
    rows = torch.cat([torch.tensor([0, 1, 65535, 65536, 69999], device=DEV),
                      torch.randint(0, 70000, (251,), generator=gen, device=DEV)])
    o, l, m = prefill_oracle(c, rows)
    check_prefill(out[rows], lse[rows], ml[rows], o, l, m, name="70000 spot rows")


def test_prefill_peaked_softmax_and_max_logits():
    """Large scales: the running max moves late in the list (online rescaling), max_logits exact-ish."""
    for scale in (4.0, 1e-3):
        c = prefill_case(64, 64, 1840, 256, seed=int(scale * 1000), scale=scale)
        out, lse, ml = run_prefill(c)
        check_prefill(out, lse, ml, *prefill_oracle(c), name=f"scale {scale}")


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("scale", [PRE_SCALE, 4.0])
@pytest.mark.parametrize("h", [128, 64])
def test_prefill_full_and_partial_tiles(h, scale, precision):
    """The wide kernel's softmax by 64-token tile (docs/design.md, "speculative softmax"): a tile whose rows
    are all valid is not masked, any other is; exponents are taken against the reference max first and again
    where a tile moves it (scale 4: often). Rows mix full tiles with tiles holding one -1, one out-of-range
    index, a single valid index, or an invalid first / last index; unread cache rows hold NaN."""
    c = prefill_case(6, h, 2048, 384, seed=h + int(scale), tl_mode="none", sink_mode="mixed", all_invalid_frac=0.0,
                     scale=scale)
    idx = c["indices"]  # row 0: six full tiles
    idx[1, 64 + 17] = -1
    idx[1, 192 + 40] = 2048 + 5
    idx[2, 128:191] = -1  # tile 2: only its last index valid
    idx[3, 0] = -1
    idx[4, 383] = -1
    idx[5, ::64] = -1  # one invalid index in every tile
    out, lse, ml = run_prefill(c, precision=precision)
    o, l, m, out_abs = prefill_oracle(c, return_abs=True)
    check_prefill(out, lse, ml, o, l, m, name=f"h {h} scale {scale}", precision=precision, out_abs=out_abs)


# =============================================================================================
# every kernel family on every shape class: SMLA_ATTN_KERNEL=portable (mma.sync, any GPU), sm90 (the
# wide wgmma kernel, Hopper; forced here also for h <= 32, which "auto" gives the narrow one) and sm90n
# (the narrow wgmma kernel where h <= 32, the wide one above)
# =============================================================================================

def _is_hopper():
    return DEV == "cuda" and torch.cuda.get_device_capability() == (9, 0)


FAMILY_DECODE = [("fp8_ds_mla", 128, 2, 2048, 64, 9), ("fp8_ds_mla", 16, 1, 2112, 61, 40),
                 ("bf16", 64, 4, 300, 1, 5), ("bf16", 100, 1, 2048, 64, 2), ("fp8_ds_mla", 33, 2, 64, 16, 70)]
FAMILY_PREFILL = [(128, 213, 1840, 256), (64, 62, 32, 2048), (16, 300, 8192, 2048), (48, 5, 128, 128)]


# the SMLA_ATTN_KERNEL values that force a family (csrc/python/settings.c; "auto" is launch.cu's rule):
# tests that cover every family take them from here, so that a family added there is added here once
KERNEL_FAMILIES = ["portable", "sm90", "sm90n", "sm90p", "sm90r", "sm90d", "sm90t"]


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_kernel_families(family, precision, monkeypatch):
    if family != "portable" and not _is_hopper():
        pytest.skip("the sm90 kernel family needs a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)
    for i, (cd, h, s_q, topk, bs, b) in enumerate(FAMILY_DECODE):
        c = decode_case(cd, b, s_q, h, topk, bs, seed=500 + i, tl_mode=TL_MODES[i % 4], sink_mode="mixed",
                        strided_q=i % 2 == 0, layers=1 + i % 2)
        out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
        rule = dict(precision=precision, out_abs=out_abs)
        out, lse = run_decode(c, precision=precision)
        check_decode(out, lse, out_ref, lse_ref, name=f"{family} {precision} decode {cd} h{h} b{b} s_q{s_q} "
                                                      f"topk{topk}", **rule)
        # also without workspace (no split) for the small batches
        out2, lse2 = run_decode(c, workspace=torch.empty(0, dtype=torch.uint8, device=DEV), precision=precision)
        check_decode(out2, lse2, out_ref, lse_ref, name=f"{family} {precision} unsplit decode {cd} h{h}", **rule)
    for i, (h, s_q, s_kv, topk) in enumerate(FAMILY_PREFILL):
        c = prefill_case(s_q, h, s_kv, topk, seed=600 + i, tl_mode=TL_MODES[(i + 1) % 4], sink_mode="mixed",
                         kv_layout=["plain", "strided", "3d"][i % 3])
        out_ref, lse_ref, ml_ref, out_abs = prefill_oracle(c, return_abs=True)
        out, lse, ml = run_prefill(c, precision=precision)
        check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"{family} {precision} prefill h{h} s_q{s_q} "
                                                                   f"s_kv{s_kv}", precision=precision, out_abs=out_abs)


def _pair_views(q):
    """q [.., h, 576] as a (q_nope, q_pe) pair in other memory: q_nope rows inside wider rows (row stride
    640, 16-byte aligned), q_pe with the heads outermost."""
    wide = torch.zeros(q.shape[:-1] + (640,), dtype=q.dtype, device=q.device)
    wide[..., 64:576] = q[..., :512]
    pe = q[..., 512:].movedim(-2, 0).contiguous().movedim(0, -2)
    return wide[..., 64:576], pe


@pytest.mark.parametrize("family", ["auto"] + KERNEL_FAMILIES)
def test_q_pair_read_in_place(family, monkeypatch):
    """q as the (q_nope, q_pe) pair, read through two pointers: the same bits as q in one array, decode
    (fp8 and bf16 caches, split and unsplit) and prefill, on every kernel family; misaligned halves are
    refused naming the array."""
    if family not in ("auto", "portable") and not _is_hopper():
        pytest.skip("the sm90 kernel families need a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)
    for i, (cd, h, s_q, topk, bs, b) in enumerate(FAMILY_DECODE):  # sm90p over fp8: the wide kernel (launch.cu)
        c = decode_case(cd, b, s_q, h, topk, bs, seed=800 + i, tl_mode=TL_MODES[i % 4], sink_mode="mixed",
                        strided_q=i % 2 == 0)
        for ws in ({}, {"workspace": torch.empty(0, dtype=torch.uint8, device=DEV)}):
            out, lse = run_decode(c, **ws)
            c2 = dict(c, q=_pair_views(c["q"]))
            out2, lse2 = run_decode(c2, **ws)
            assert torch.equal(out.view(torch.int16), out2.view(torch.int16)), (family, cd, h, ws)
            assert torch.equal(lse, lse2), (family, cd, h)
    for i, (h, s_q, s_kv, topk) in enumerate(FAMILY_PREFILL):
        c = prefill_case(s_q, h, s_kv, topk, seed=900 + i, tl_mode=TL_MODES[(i + 1) % 4], sink_mode="mixed")
        for precision in ref.PRECISIONS:
            out, lse, ml = run_prefill(c, precision=precision)
            out2, lse2, ml2 = run_prefill(dict(c, q=_pair_views(c["q"])), precision=precision)
            assert torch.equal(out.view(torch.int16), out2.view(torch.int16)), (family, h, precision)
            assert torch.equal(lse, lse2) and torch.equal(ml, ml2), (family, h, precision)
    c = prefill_case(3, 16, 128, 64, seed=950)
    q = c["q"]
    wide = torch.zeros(q.shape[:-1] + (520,), dtype=q.dtype, device=DEV)
    with pytest.raises(ValueError, match=r"^q: .*16-byte aligned"):
        run_prefill(dict(c, q=(wide[..., 1:513], q[..., 512:])))
    with pytest.raises(ValueError, match=r"^q_pe: .*16-byte aligned"):
        run_prefill(dict(c, q=(q[..., :512], wide[..., 1:65])))


def test_portable_kernel_fast_is_high(monkeypatch):
    """The portable kernel has no fast variant (docs/design.md section 4): precision="fast" runs it
    at high precision, the same bits."""
    monkeypatch.setenv("SMLA_ATTN_KERNEL", "portable")
    for i, (cd, h, s_q, topk, bs, b) in enumerate(FAMILY_DECODE):
        c = decode_case(cd, b, s_q, h, topk, bs, seed=700 + i, tl_mode=TL_MODES[i % 4], sink_mode="mixed",
                        strided_q=i % 2 == 0)
        (out_h, lse_h), (out_f, lse_f) = (run_decode(c, precision=p) for p in ("high", "fast"))
        assert torch.equal(out_f.view(torch.int16), out_h.view(torch.int16)), f"decode {cd} h{h}"
        assert torch.equal(lse_f, lse_h), f"decode {cd} h{h}"
    for i, (h, s_q, s_kv, topk) in enumerate(FAMILY_PREFILL):
        c = prefill_case(s_q, h, s_kv, topk, seed=800 + i, tl_mode=TL_MODES[(i + 1) % 4], sink_mode="mixed")
        high, fast = (run_prefill(c, precision=p) for p in ("high", "fast"))
        assert torch.equal(fast[0].view(torch.int16), high[0].view(torch.int16)), f"prefill h{h}"
        assert torch.equal(fast[1], high[1]) and torch.equal(fast[2], high[2]), f"prefill h{h}"


# =============================================================================================
# latent values of magnitude ~10 (docs/design.md section 4): where bf16 probabilities miss the high
# rule on 1-2.5% of the elements, "high" must still meet it; "fast" meets its own
# =============================================================================================

@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("h,s_q,b", [(16, 2, 37), (32, 1, 64), (64, 2, 37), (128, 1, 64), (128, 2, 2)])
def test_decode_large_values(h, s_q, b, cd, precision):
    c = decode_case(cd, b, s_q, h, 2048, 64, seed=900 + h + b, tl_mode="none", sink_mode="none", v_scale=10.0,
                    all_invalid_frac=0.0)
    out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
    assert float(out_abs.mean()) > 4  # the latent values really are ~10
    out, lse = run_decode(c, precision=precision)
    check_decode(out, lse, out_ref, lse_ref, name=f"|V|~10 {precision}", precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("h,family", [(16, "auto"), (32, "auto"), (64, "auto"), (128, "auto"), (16, "sm90r"),
                                      (3, "sm90r"), (32, "sm90r"), (16, "sm90d"), (3, "sm90d")])
def test_decode_fp8_odd_scales_and_nan(h, family, precision, monkeypatch):
    """fp8 rows that are read, with scales the "pow2" writer makes and ones it does not: not a power of
    two, 2^-125 and 2^-124, 2^7 and 2^8 (over bytes small enough that the values stay ~10), and NaN bytes
    (0x7f, 0xff): against the float64 oracle, NaN where it has NaN (also through the split combine, where
    a split that read the NaN may be the row's only non-empty one). Also on the register kernel (sm90r)
    and the dims kernel (sm90d), which dequantise in the consumers."""
    if family != "auto" and not _is_hopper():
        pytest.skip("the sm90 kernel families need a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)
    c = decode_case("fp8_ds_mla", 37, 1, h, 2048, 64, seed=1700 + h, tl_mode="none", sink_mode="none",
                    all_invalid_frac=0.0)
    flat = c["kv_cache"].view(-1, ref.FP8_ENTRY)
    idx = c["indices"].reshape(-1).long()
    slots = torch.unique(idx[(idx >= 0) & (idx < c["limit"])])
    gen = torch.Generator(device=DEV).manual_seed(h)
    rows = slots[torch.randperm(slots.numel(), generator=gen, device=DEV)]
    g = rows.numel() // 8
    sc = flat[:, ref.FP8_SCALE_OFF:ref.FP8_SCALE_OFF + 16].view(torch.float32)
    sc[rows[:g], 1] *= 1.5
    sc[rows[g:2 * g], 2] = 2.0 ** -125
    sc[rows[2 * g:3 * g], 2] = 2.0 ** -124
    for r, (tile, k) in zip((rows[3 * g:4 * g], rows[4 * g:5 * g]), ((3, 7), (0, 8))):
        small = torch.randint(0, 0x18, (r.numel(), 128), generator=gen, device=DEV, dtype=torch.uint8)
        sign = torch.randint(0, 2, (r.numel(), 128), generator=gen, device=DEV, dtype=torch.uint8) * 0x80
        flat[r, 128 * tile:128 * tile + 128] = small | sign
        sc[r, tile] = 2.0 ** k
    flat[rows[5 * g], 77] = 0x7F
    flat[rows[5 * g + 1], 300] = 0xFF
    out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
    assert 0 < int(out_ref.float().isnan().any(-1).sum()) < out_ref.shape[0] * h  # some rows read a NaN
    out, lse = run_decode(c, precision=precision)
    check_decode(out, lse, out_ref, lse_ref, name=f"odd scales {precision}", precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("h", [16, 64, 128])
def test_prefill_large_values(h, precision):
    c = prefill_case(256, h, 8192, 2048, seed=950 + h, tl_mode="none", sink_mode="none", v_scale=10.0,
                     all_invalid_frac=0.0)
    out_ref, lse_ref, ml_ref, out_abs = prefill_oracle(c, return_abs=True)
    out, lse, ml = run_prefill(c, precision=precision)
    check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"|V|~10 {precision}", precision=precision,
                  out_abs=out_abs)


# =============================================================================================
# small head counts (h <= 32): the narrow wgmma kernel on Hopper ("auto") and the portable kernel (the
# sm_80 path) on every h from 1 to 32 the issue names, both cache dtypes, both precisions
# =============================================================================================

SMALL_H = [1, 3, 8, 16, 20, 32]


def _small_head_decode_grid():
    cases = []
    for i, (h, cd) in enumerate(itertools.product(SMALL_H, CACHE_DTYPES)):
        s_q, topk, bs = [1, 2, 4][i % 3], [2048, 2112, 64, 300][i % 4], [64, 1, 61][(i // 3) % 3]
        b = [37, 5, 1, 130][i % 4]
        cases.append(pytest.param(cd, h, s_q, topk, bs, b, TL_MODES[i % 4], SINK_MODES[i % 5], i,
                                  id=f"{cd}-h{h}-sq{s_q}-topk{topk}-bs{bs}-b{b}-tl_{TL_MODES[i % 4]}-"
                                     f"sink_{SINK_MODES[i % 5]}"))
    return cases


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("family", ["auto", "portable", "sm90r", "sm90d"])
@pytest.mark.parametrize("cd,h,s_q,topk,bs,b,tl_mode,sink_mode,seed", _small_head_decode_grid())
def test_small_heads_decode(cd, h, s_q, topk, bs, b, tl_mode, sink_mode, seed, family, precision, monkeypatch):
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)

    def make():
        c = decode_case(cd, b, s_q, h, topk, bs, seed=1000 + seed, tl_mode=tl_mode, sink_mode=sink_mode,
                        strided_q=seed % 2 == 1, layers=1 + seed % 2)
        return c, decode_oracle(c, return_abs=True)

    c, (out_ref, lse_ref, out_abs) = shared(("small heads decode", seed), make)
    out, lse = run_decode(c, precision=precision)
    check_decode(out, lse, out_ref, lse_ref, name=f"{family} {precision}", precision=precision, out_abs=out_abs)
    if b <= 5:  # the same call without a workspace: no top-k split
        out2, lse2 = run_decode(c, workspace=torch.empty(0, dtype=torch.uint8, device=DEV), precision=precision)
        check_decode(out2, lse2, out_ref, lse_ref, name=f"{family} {precision} unsplit", precision=precision,
                     out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("mult", [4.0, 32.0, 1e-3])
@pytest.mark.parametrize("h", [3, 16])
def test_decode_dims_lazy_maximum(h, mult, precision, monkeypatch):
    """The dims kernel (sm90d) keeps a lazy reference maximum: a tile whose maximum is within 2^8 of it
    (log2 domain) is taken against it, with probabilities up to 2^8, and only a larger jump runs the exact
    rescaling step. Softmax scales that make the maxima move often and by much (x4, x32: peaked rows, both
    steps taken many times per row) or hardly at all (x1e-3), against the float64 oracle."""
    if not _is_hopper():
        pytest.skip("the dims kernel needs a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", "sm90d")
    c = decode_case("fp8_ds_mla", 37, 2, h, 2048, 64, seed=2100 + h + int(mult), tl_mode="rand", sink_mode="mixed",
                    scale=DEC_SCALE * mult)
    out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
    out, lse = run_decode(c, precision=precision)
    check_decode(out, lse, out_ref, lse_ref, name=f"sm90d x{mult} {precision}", precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("mult", [4.0, 32.0, 1e-3])
@pytest.mark.parametrize("h", [3, 20, 32])
@pytest.mark.parametrize("kind", ["prefill", "bf16", "fp8_ds_mla"])
def test_narrow_lazy_maximum(kind, h, mult, precision, monkeypatch):
    """The narrow kernel (sm90n) keeps a lazy maximum too (sm90/narrow_softmax.cuh): a tile within 2^8 of
    the running maxima is taken against them, and only a larger jump (or a first tile) runs the exact step
    with its exchange between the warps; max_logits must still be the true maximum. The softmax scales of
    the dims test above, in prefill and in decode over both caches, against the float64 oracle."""
    if not _is_hopper():
        pytest.skip("the narrow kernel needs a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", "sm90n")
    seed = 2300 + h + int(mult)
    name = f"sm90n {kind} h{h} x{mult} {precision}"
    if kind == "prefill":
        c = prefill_case(37, h, 4096, 2048, seed=seed, tl_mode="rand", sink_mode="mixed", scale=PRE_SCALE * mult)
        out_ref, lse_ref, ml_ref, out_abs = prefill_oracle(c, return_abs=True)
        out, lse, ml = run_prefill(c, precision=precision)
        check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=name, precision=precision, out_abs=out_abs)
    else:
        c = decode_case(kind, 37, 2, h, 2048, 64, seed=seed, tl_mode="rand", sink_mode="mixed", scale=DEC_SCALE * mult)
        out_ref, lse_ref, out_abs = decode_oracle(c, return_abs=True)
        out, lse = run_decode(c, precision=precision)
        check_decode(out, lse, out_ref, lse_ref, name=name, precision=precision, out_abs=out_abs)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("mult", [4.0, 32.0, 1e-3])
@pytest.mark.parametrize("h", [64, 100, 128])
@pytest.mark.parametrize("family", ["sm90", "sm90p"])
def test_prefill_lazy_maximum(family, h, mult, precision, monkeypatch):
    """The wide kernel (sm90) and the pair kernel (sm90p, SMLA_SM90P_LAZY_MAX) take P against a lazy maximum
    where they keep one: a tile whose maximum is within 2^8 of it (log2 domain) keeps it, a larger jump moves
    it (in the pair kernel both warpgroups agree on it once per pair of tiles), and max_logits is the true
    maximum. The scales of the dims and narrow tests (x4, x32: the maxima jump often and far; x1e-3: hardly
    at all), with top-k lengths and sinks, against the float64 oracle."""
    if not _is_hopper():
        pytest.skip("the sm90 kernels need a compute capability 9.0 GPU")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)
    c = prefill_case(37, h, 4096, 2048, seed=2500 + h + int(mult), tl_mode="rand", sink_mode="mixed",
                     scale=PRE_SCALE * mult)
    out_ref, lse_ref, ml_ref, out_abs = prefill_oracle(c, return_abs=True)
    out, lse, ml = run_prefill(c, precision=precision)
    check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"{family} h{h} x{mult} {precision}",
                  precision=precision, out_abs=out_abs)


def _small_head_prefill_grid():
    cases = []
    shapes = [(62, 592, 128), (213, 8192, 2048), (5, 32, 2048), (300, 1840, 256)]
    for i, h in enumerate(SMALL_H):
        s_q, s_kv, topk = shapes[i % 4]
        cases.append(pytest.param(h, s_q, s_kv, topk, TL_MODES[(i + 1) % 4], SINK_MODES[(i + 2) % 5],
                                  ["plain", "strided", "3d"][i % 3], i,
                                  id=f"h{h}-sq{s_q}-skv{s_kv}-topk{topk}"))
    return cases


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("family", ["auto", "portable"])
@pytest.mark.parametrize("h,s_q,s_kv,topk,tl_mode,sink_mode,kv_layout,seed", _small_head_prefill_grid())
def test_small_heads_prefill(h, s_q, s_kv, topk, tl_mode, sink_mode, kv_layout, seed, family, precision,
                             monkeypatch):
    monkeypatch.setenv("SMLA_ATTN_KERNEL", family)

    def make():
        c = prefill_case(s_q, h, s_kv, topk, seed=1100 + seed, tl_mode=tl_mode, sink_mode=sink_mode,
                         kv_layout=kv_layout)
        return c, prefill_oracle(c, return_abs=True)

    c, (out_ref, lse_ref, ml_ref, out_abs) = shared(("small heads prefill", seed), make)
    out, lse, ml = run_prefill(c, precision=precision)
    check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"{family} {precision}", precision=precision,
                  out_abs=out_abs)


# =============================================================================================
# issue 16: the causal prefill of a fresh prompt (row p selects tokens 0..p, as a top-k indexer returns
# them for a prompt shorter than topk) and whole 64-token tiles with no valid index in the middle of a
# row. A kernel may skip the work of such tiles; the result must not change. Every family that serves
# prefill ("auto" and each forced family: launch.cu's rules say which kernel a forced family gives for a
# head count, e.g. sm90n the wide kernel above 32 heads), both precisions. The index patterns are
# tests/test_sparse_mla_prefill.py's (the CPU runs them there).
# =============================================================================================

# "sm90p:off": the pair kernel's one-item form (SMLA_ATTN_PERSISTENT=off); "sm90p" runs its persistent form on these
# small caches in both precisions (pair_kernel.cuh, persistent_here)
PREFILL_FAMILIES = ["auto"] + KERNEL_FAMILIES + ["sm90p:off"]


def use_family(family, monkeypatch):
    """SMLA_ATTN_KERNEL=family; family "NAME:MODE" also sets SMLA_ATTN_PERSISTENT=MODE."""
    if family not in ("auto", "portable") and not _is_hopper():
        pytest.skip("the sm90 kernel families need a compute capability 9.0 GPU")
    name, _, persistent = family.partition(":")
    monkeypatch.setenv("SMLA_ATTN_KERNEL", name)
    if persistent:
        monkeypatch.setenv("SMLA_ATTN_PERSISTENT", persistent)


def causal_case(s, h, topk, layout, *, seed, sink_mode="none"):
    """s_q = s_kv = s: q [s, h, 576], kv [s, 576], indices of tpre.causal_indices(layout) (every kv row
    is read by the last query row; with layout "topk_length" the values past topk_length include
    later tokens' rows, which change the result if read)."""
    rng = np.random.default_rng(seed)
    idx, tl = tpre.causal_indices(s, topk, layout, rng)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    kv = torch.randn((s, 576), generator=gen, device=DEV).to(torch.bfloat16)
    q = make_q((s, h, 576), gen, False)
    return dict(q=q, kv=kv, kv_plain=kv, indices=torch.from_numpy(idx).to(DEV),
                topk_length=None if tl is None else torch.from_numpy(tl).to(DEV),
                attn_sink=make_sink(sink_mode, h, gen), softmax_scale=PRE_SCALE)


def _causal_grid():
    cases = []
    sinks = {"pad": "none", "topk_length": "finite", "scattered": "mixed"}
    for (s, topk), h, layout in itertools.product([(300, 2048), (700, 700), (2048, 2048)], [128, 64, 16],
                                                  tpre.CAUSAL_LAYOUTS):
        cases.append(pytest.param(s, topk, h, layout, sinks[layout], id=f"s{s}-topk{topk}-h{h}-{layout}"))
    return cases


@pytest.mark.parametrize("precision", ref.PRECISIONS)  # varies fastest: one case and oracle for the family x
@pytest.mark.parametrize("family", PREFILL_FAMILIES)   # precision runs that follow
@pytest.mark.parametrize("s,topk,h,layout,sink_mode", _causal_grid())
def test_prefill_causal_fresh_prompt(s, topk, h, layout, sink_mode, family, precision, monkeypatch):
    """Row p attends to tokens 0..p of an s-token prompt: valid indices at the front then -1 ("pad", the
    benchmark's pattern at s = 2048), the same front with topk_length = p + 1 and garbage after it, or
    scattered among -1. At s = 300 < topk most tiles of every row are empty."""
    use_family(family, monkeypatch)

    def make():
        c = causal_case(s, h, topk, layout, seed=1200 + s + h, sink_mode=sink_mode)
        return c, prefill_oracle(c, return_abs=True)

    c, (out_ref, lse_ref, ml_ref, out_abs) = shared(("causal", s, topk, h, layout), make)
    out, lse, ml = run_prefill(c, precision=precision)
    check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"{family} {precision} causal s{s} h{h} {layout}",
                  precision=precision, out_abs=out_abs)


def empty_tiles_case(s_q, h, s_kv, *, seed, with_tl):
    """tpre.empty_tile_indices (topk 512: tiles 2 and 5 all -1 and tile 3 out of range in the first
    pattern, rows that start or end empty, one valid index among empty tiles, rows with none);
    kv rows no valid index reads are NaN."""
    rng = np.random.default_rng(seed)
    idx, tl = tpre.empty_tile_indices(s_q, s_kv, rng, with_tl)
    idx, tl = torch.from_numpy(idx).to(DEV), None if tl is None else torch.from_numpy(tl).to(DEV)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    kv = torch.randn((s_kv, 576), generator=gen, device=DEV).to(torch.bfloat16)
    read = torch.zeros(s_kv, dtype=torch.bool, device=DEV)
    read[idx.long()[valid_mask(idx, s_kv, tl)]] = True
    kv.view(torch.int16)[~read] = 0x7FC0
    return dict(q=make_q((s_q, h, 576), gen, False), kv=kv, kv_plain=kv, indices=idx, topk_length=tl,
                attn_sink=make_sink("mixed", h, gen), softmax_scale=PRE_SCALE)


@pytest.mark.parametrize("precision", ref.PRECISIONS)
@pytest.mark.parametrize("family", PREFILL_FAMILIES)
@pytest.mark.parametrize("h,s_q,with_tl", [(128, 97, False), (128, 97, True), (64, 97, False), (64, 300, True),
                                           (16, 97, True)])
def test_prefill_empty_tiles_mid_row(h, s_q, with_tl, family, precision, monkeypatch):
    """Whole 64-index tiles of -1 and of out-of-range values between valid ones; rows with no valid
    index give out 0 (bit for bit), lse and max_logits -inf."""
    use_family(family, monkeypatch)

    def make():
        c = empty_tiles_case(s_q, h, 1000, seed=1300 + h + s_q + with_tl, with_tl=with_tl)
        return c, prefill_oracle(c, return_abs=True)

    c, (out_ref, lse_ref, ml_ref, out_abs) = shared(("empty tiles", h, s_q, with_tl), make)
    out, lse, ml = run_prefill(c, precision=precision)
    check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"{family} {precision} empty tiles h{h} s_q{s_q}",
                  precision=precision, out_abs=out_abs)
    none = ~valid_mask(c["indices"], 1000, c["topk_length"]).any(1)
    assert bool(none[3]) and bool((out[none].view(torch.int16) == 0).all())
    assert bool((lse[none] == float("-inf")).all()) and bool((ml[none] == float("-inf")).all())


@pytest.mark.parametrize("precision", ref.PRECISIONS)
def test_pair_kernel_persistent_rule(precision, monkeypatch):
    """SMLA_ATTN_PERSISTENT: "auto" runs the pair kernel's persistent form in "high" and, in "fast", where the K
    source fits in half of the device's L2 (a cache just below and one just above that); "off" / "on" force the
    one-item / persistent form; every run gives the oracle's results."""
    use_family("sm90p", monkeypatch)
    half_l2_rows = torch.cuda.get_device_properties(0).L2_cache_size // 2 // 1152
    for s_kv in (half_l2_rows - 64, half_l2_rows + 64):
        c = prefill_case(7, 128, s_kv, 2048, seed=1400 + s_kv % 97, tl_mode="rand", sink_mode="mixed")
        out_ref, lse_ref, ml_ref, out_abs = prefill_oracle(c, return_abs=True)
        for mode in ("auto", "off", "on"):
            monkeypatch.setenv("SMLA_ATTN_PERSISTENT", mode)
            got = []
            names = _kernels_launched(lambda: got.append(run_prefill(c, precision=precision)))
            ran = [n for n in names if "attn_sm90p" in n]
            expect = mode == "on" or (mode == "auto" and (precision == "high" or s_kv < half_l2_rows))
            assert len(ran) == 1 and ("persistent" in ran[0]) == expect, (mode, s_kv, names)
            out, lse, ml = got[0]
            check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=f"{mode} {precision} s_kv {s_kv}",
                          precision=precision, out_abs=out_abs)
