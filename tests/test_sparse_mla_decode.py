"""smla.sparse_mla_decode against the float64 oracle (tests/reference.py), and CUDA against CPU.

Every case follows FlashMLA's test recipe: indices mix valid slots with every class of invalid value,
cache rows that no valid index refers to are filled with NaN (a stray read turns the output NaN),
topk_length and attn_sink take their corner values, and q may be a strided view."""
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

BF16 = ml_dtypes.bfloat16
CACHE_DTYPES = ["fp8_ds_mla", "bf16"]
SCALE = 576 ** -0.55  # FlashMLA's decode test scale
TL_MODES = ["none", "rand", "zero", "full"]
SINK_MODES = ["none", "finite", "+inf", "-inf", "mixed"]


# ---------------------------------------------------------------------------------------------
# case construction
# ---------------------------------------------------------------------------------------------

def new_cache(num_blocks, block_size, cd, layers=1):
    """Empty cache; with layers > 1 it is layer 1 of an interleaved allocation, so stride(0) is
    larger than block_size * entry."""
    shape = ref.kv_cache_shape(num_blocks, block_size, cd)
    dt = np.uint8 if cd == "fp8_ds_mla" else BF16
    full = np.zeros((num_blocks, layers) + shape[1:], dt)
    return full[:, layers - 1]


def nan_fill(cache, cd, slots):
    """Overwrite the entries of `slots` with NaN bit patterns (e4m3 0x7f, NaN scales, bf16 0x7fc0)."""
    bs = cache.shape[1]
    blk, off = slots // bs, slots % bs
    if cd == "bf16":
        cache.view(np.uint16)[blk, off] = 0x7FC0
        return
    ent = np.empty(ref.FP8_ENTRY, np.uint8)
    ent[:512] = 0x7F
    ent[512:528] = np.full(4, np.nan, np.float32).view(np.uint8)
    ent[528:] = np.full(64, 0x7FC0, np.uint16).view(np.uint8)
    cache[blk, off] = ent


def rand_q(shape, rng):
    return rng.standard_normal(shape, dtype=np.float32).astype(BF16)


def strided(a, rng):
    """A non-contiguous view equal to `a` (every other head, offset inside a wider last dim), with
    NaN in the gaps so that a stride bug shows."""
    *lead, h, d = a.shape
    big = np.full((*lead, 2 * h, d + 64), np.nan, BF16)
    v = big[..., ::2, 32:32 + d]
    v[...] = a
    return v


def make_sink(mode, h, rng):
    if mode == "none":
        return None
    s = (rng.standard_normal(h) * 2.0 + 1.0).astype(np.float32)
    if mode == "+inf":
        s[:] = np.inf
    elif mode == "-inf":
        s[:] = -np.inf
    elif mode == "mixed":
        s[rng.random(h) < 0.25] = np.inf
        s[rng.random(h) < 0.25] = -np.inf
    return s


def make_topk_length(mode, b, s_q, topk, rng):
    if mode == "none":
        return None
    if mode == "zero":
        return np.zeros((b, s_q), np.int32)
    if mode == "full":
        return np.full((b, s_q), topk, np.int32)
    tl = rng.integers(0, topk + 1, (b, s_q)).astype(np.int32)
    tl.flat[0] = topk
    if tl.size > 1:
        tl.flat[-1] = 0
    return tl


def make_decode_case(cd, b, s_q, h, topk, block_size, *, seed, tl_mode="rand", sink_mode="mixed",
                     layers=1, all_invalid_frac=0.15, scale=SCALE, v_scale=1.0):
    """Requests with varied sequence lengths on shuffled blocks of one paged cache, top-k indices
    mixing their valid slots with the invalid zoo, and NaN in every entry no valid index reads.
    v_scale multiplies the latent values (V) and divides q's latent part (the scores keep their
    spread)."""
    rng = np.random.default_rng(seed)
    seq_lens = rng.integers(1, topk + 65, b)
    nblk = -(-seq_lens // block_size)
    num_blocks = int(nblk.sum()) + 3  # spare blocks that nobody owns (NaN)
    perm = rng.permutation(num_blocks)
    starts = np.concatenate([[0], np.cumsum(nblk)])
    cache = new_cache(num_blocks, block_size, cd, layers)
    limit = num_blocks * block_size

    # Write every token of every request (pack_kv is tested on its own; the oracle reads the cache).
    tok_slots = []
    for r in range(b):
        pos = np.arange(seq_lens[r])
        tok_slots.append(perm[starts[r] + pos // block_size] * block_size + pos % block_size)
    tok_slots = np.concatenate(tok_slots).astype(np.int64)
    t = tok_slots.shape[0]
    mag = 2.0 ** rng.integers(-4, 3, (t, 4, 1))
    kv_c = (rng.standard_normal((t, 4, 128), dtype=np.float32) * mag * v_scale).reshape(t, 512).astype(BF16)
    k_pe = rng.standard_normal((t, 64), dtype=np.float32).astype(BF16)
    smla.pack_kv(kv_c, k_pe, cache, tok_slots, kv_cache_dtype=cd)

    zoo = ref.invalid_index_zoo(limit)
    idx = np.empty((b, s_q, topk), np.int64)
    for bi, si in itertools.product(range(b), range(s_q)):
        L = int(seq_lens[bi])
        if rng.random() < all_invalid_frac:
            idx[bi, si] = rng.choice(zoo, topk)
            continue
        n_valid = int(rng.integers(1, topk + 1))
        pos = rng.choice(L, n_valid, replace=False) if n_valid <= L else rng.integers(0, L, n_valid)
        if n_valid >= 2 and rng.random() < 0.3:
            pos[-1] = pos[0]  # duplicates count twice
        slots = perm[starts[bi] + pos // block_size] * block_size + pos % block_size
        row = np.concatenate([slots, rng.choice(zoo, topk - n_valid)])
        if rng.random() < 0.5:
            rng.shuffle(row)  # invalid entries interleaved with valid ones
        else:
            row[n_valid:] = -1  # vLLM style: valid first, then -1 padding
        idx[bi, si] = row
    if b * s_q >= 2 and all_invalid_frac > 0:
        idx[-1, -1] = rng.choice(zoo, topk)  # at least one all-invalid row
    idx = idx.astype(np.int32)
    tl = make_topk_length(tl_mode, b, s_q, topk, rng)

    valid = (idx >= 0) & (idx < limit)
    if tl is not None:
        valid &= np.arange(topk) < tl[..., None]
    unread = np.setdiff1d(np.arange(limit), idx[valid])
    nan_fill(cache, cd, unread)

    q = rand_q((b, s_q, h, 576), rng)
    q[..., :512] = (q[..., :512].astype(np.float32) / v_scale).astype(BF16)
    return dict(q=q, kv_cache=cache, indices=idx, topk_length=tl, attn_sink=make_sink(sink_mode, h, rng),
                softmax_scale=scale, kv_cache_dtype=cd)


def run_decode(c, **kw):
    return smla.sparse_mla_decode(c["q"], c["kv_cache"], c["indices"], softmax_scale=c["softmax_scale"],
                                  kv_cache_dtype=c["kv_cache_dtype"], topk_length=c["topk_length"],
                                  attn_sink=c["attn_sink"], **kw)


def ref_decode(c, return_abs=False):
    return ref.sparse_mla_decode_ref(np.ascontiguousarray(c["q"]), c["kv_cache"], c["indices"],
                                     c["softmax_scale"], c["kv_cache_dtype"], c["topk_length"], c["attn_sink"],
                                     return_abs)


# CPU levels whose attention has bf16 dot products: precision="fast" rounds P to bf16 there
BF16_DOT_LEVELS = ("avx512bf16", "avx2-emulated-bf16")


def assert_fast_runs_bf16_p(out_fast, out_high):
    """A CPU "fast" output next to "high"'s (same inputs): other bits where the CPU level that ran has
    bf16 dot products (P rounded to bf16 for P*V), the same bits elsewhere (the CPU runs high)."""
    if smla.build_info()["cpu_isa"] in BF16_DOT_LEVELS:
        assert (ref.as_bf16_bits(out_fast) != ref.as_bf16_bits(out_high)).any(), "fast ran high's P*V"
    else:
        ref.assert_bf16_equal(out_fast, out_high)


def check_against_ref(c, out, lse, precision="high"):
    out_ref, lse_ref, *out_abs = ref_decode(c, return_abs=precision == "fast")  # out_abs: the fast rule's
    ref.check_decode(out, lse, out_ref, lse_ref, precision=precision, out_abs=out_abs[0] if out_abs else None)
    assert out.dtype == BF16 and out.shape == out_ref.shape
    assert lse.dtype == np.float32 and lse.shape == lse_ref.shape


# ---------------------------------------------------------------------------------------------
# grid 1: shapes. h x topk x cache dtype in full; s_q, block_size, batch and features rotate with a
# fixed seed so that every value of each appears without the cartesian product of the big ones.
# ---------------------------------------------------------------------------------------------

def _shape_cases():
    rnd = random.Random(20251202)
    cases = []
    combos = list(itertools.product(CACHE_DTYPES, [1, 16, 64, 128], [1, 64, 100, 2048]))
    for i, (cd, h, topk) in enumerate(combos * 2):  # every (cache, h, topk) twice, other s_q / block_size
        s_q = [1, 2, 3][i % 3]
        bs = [1, 16, 64, 61][(i // 3 + i // len(combos)) % 4]
        b = rnd.randint(1, 3 if h * topk >= 64 * 2048 else 16)
        tl_mode = rnd.choices(TL_MODES, weights=[3, 4, 1, 1])[0]  # the trivial modes less often
        sink_mode = rnd.choices(SINK_MODES, weights=[3, 3, 1, 1, 2])[0]
        strided_q = rnd.random() < 0.5
        cases.append(pytest.param(cd, h, topk, s_q, bs, b, tl_mode, sink_mode, strided_q, i,
                                  id=f"{i}-{cd}-h{h}-topk{topk}-sq{s_q}-bs{bs}-b{b}-tl_{tl_mode}-sink_{sink_mode}"
                                     f"{'-strided' if strided_q else ''}"))
    return cases


@pytest.mark.parametrize("cd,h,topk,s_q,bs,b,tl_mode,sink_mode,strided_q,seed", _shape_cases())
def test_decode_shapes(cd, h, topk, s_q, bs, b, tl_mode, sink_mode, strided_q, seed):
    c = make_decode_case(cd, b, s_q, h, topk, bs, seed=seed, tl_mode=tl_mode, sink_mode=sink_mode)
    if strided_q:
        c["q"] = strided(c["q"], np.random.default_rng(seed))
    out, lse = run_decode(c)
    check_against_ref(c, out, lse)


# ---------------------------------------------------------------------------------------------
# grid 2: features on a small shape (every topk_length x sink mode), heads that are not a multiple
# of the kernel's head group, softmax scales from flat to peaked.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sink_mode", SINK_MODES)
@pytest.mark.parametrize("tl_mode", TL_MODES)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_features(cd, tl_mode, sink_mode):
    c = make_decode_case(cd, 3, 2, 16, 100, 16, seed=7, tl_mode=tl_mode, sink_mode=sink_mode)
    out, lse = run_decode(c)
    check_against_ref(c, out, lse)


@pytest.mark.parametrize("h", [2, 5, 7, 33, 127])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_odd_heads(cd, h):
    c = make_decode_case(cd, 2, 2, h, 130, 64, seed=h)
    out, lse = run_decode(c)
    check_against_ref(c, out, lse)


@pytest.mark.parametrize("scale", [1e-3, SCALE, 1.0, 4.0])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_softmax_scale(cd, scale):
    # large scales make the softmax peak on a few rows found anywhere in the list (online max updates)
    c = make_decode_case(cd, 2, 2, 16, 300, 16, seed=3, tl_mode="none", sink_mode="none", scale=scale)
    out, lse = run_decode(c)
    check_against_ref(c, out, lse)


@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_interleaved_cache_and_out_views(cd):
    """stride(0) > block_size * entry (layer-interleaved cache), a strided q, and out= / lse= given as
    strided views: results land in the views and nothing around them is touched."""
    c = make_decode_case(cd, 4, 2, 16, 64, 16, seed=11, layers=2)
    rng = np.random.default_rng(0)
    c["q"] = strided(c["q"], rng)
    b, s_q, h = c["q"].shape[:3]
    out_big = np.full((b, s_q, 2 * h, 512 + 32), 7.0, BF16)
    lse_big = np.full((b, 3, s_q, h), 7.0, np.float32)
    out_v, lse_v = out_big[:, :, 1::2, 16:528], lse_big[:, 1]
    out, lse = run_decode(c, out=out_v, lse=lse_v)
    assert out is out_v and lse is lse_v
    check_against_ref(c, out_v, lse_v)
    gaps = np.ones(out_big.shape, bool)
    gaps[:, :, 1::2, 16:528] = False
    assert (out_big[gaps].astype(np.float32) == 7.0).all()
    assert (lse_big[:, [0, 2]] == 7.0).all()


# ---------------------------------------------------------------------------------------------
# corner cases
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sink_mode", ["none", "finite", "+inf", "-inf"])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_all_invalid(cd, sink_mode):
    """No valid index anywhere (every zoo value, positions past topk_length): out 0, lse -inf, and no
    cache row is read (the whole cache is NaN)."""
    rng = np.random.default_rng(5)
    cache = new_cache(4, 16, cd)
    nan_fill(cache, cd, np.arange(64))
    zoo = ref.invalid_index_zoo(64)
    b, s_q, h, topk = 3, 2, 16, 40
    idx = rng.choice(zoo, (b, s_q, topk)).astype(np.int32)
    idx[0, 0, 5:] = 3  # valid slots, but beyond topk_length
    tl = np.full((b, s_q), topk, np.int32)
    tl[0, 0] = 5
    q = rand_q((b, s_q, h, 576), rng)
    out, lse = smla.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE, kv_cache_dtype=cd, topk_length=tl,
                                      attn_sink=make_sink(sink_mode, h, rng))
    assert (out.view(np.uint16) == 0).all()
    assert (lse == -np.inf).all()


@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_single_row_is_exact(cd):
    """One valid index (topk = 1, or the same slot repeated): p = 1, so out is the dequantised row's
    latent part exactly, and lse = score + log(count)."""
    c = make_decode_case(cd, 2, 3, 16, 1, 16, seed=21, tl_mode="none", sink_mode="none", all_invalid_frac=0)
    out, lse = run_decode(c)
    rows = ref.unpack_kv(c["kv_cache"], c["indices"].reshape(-1), cd).reshape(2, 3, 1, 576)
    want = np.broadcast_to(rows[..., :512], out.shape)
    ref.assert_bf16_equal(out, want)
    check_against_ref(c, out, lse)

    c["indices"] = np.repeat(c["indices"], 5, axis=2)  # duplicates: still the same row, lse + log(5)
    out5, lse5 = run_decode(c)
    ref.assert_bf16_equal(out5, want)
    ref.check_close(lse5, lse.astype(np.float64) + np.log(5.0), abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL)
    check_against_ref(c, out5, lse5)


EMPTY_SHAPES = [(0, 1), (0, 3), (2, 0)]  # (b, s_q): no query row


@pytest.mark.parametrize("b,s_q", EMPTY_SHAPES)
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_empty_batch(cd, b, s_q):
    """No query row: empty out / lse of the right shapes and dtypes; given out= / lse= (zero-length
    views of larger buffers, an empty topk_length) come back as the same objects and nothing of the
    buffers around them is written."""
    cache = new_cache(2, 16, cd)
    nan_fill(cache, cd, np.arange(32))
    h, topk = 16, 8
    q = np.zeros((b, s_q, h, 576), BF16)
    idx = np.zeros((b, s_q, topk), np.int32)
    out, lse = smla.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE, kv_cache_dtype=cd)
    assert out.shape == (b, s_q, h, 512) and out.dtype == BF16 and out.size == 0
    assert lse.shape == (b, s_q, h) and lse.dtype == np.float32 and lse.size == 0

    out_big = np.full((3, 3, h, 512), 7.0, BF16)
    lse_big = np.full((3, 3, h), 7.0, np.float32)
    out_v, lse_v = out_big[:b, :s_q], lse_big[:b, :s_q]
    assert out_v.size == 0 and lse_v.size == 0
    res = smla.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE, kv_cache_dtype=cd,
                                 topk_length=np.zeros((b, s_q), np.int32), attn_sink=np.zeros(h, np.float32),
                                 out=out_v, lse=lse_v)
    assert res[0] is out_v and res[1] is lse_v
    assert (out_big.view(np.uint16) == np.array(7.0, BF16).view(np.uint16)).all() and (lse_big == 7.0).all()


@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_merge_of_halves(cd):
    """merge_attn_states of the two halves of the top-k list equals attention over the whole list
    (no sink: it does not distribute over a merge). Rows whose half has no valid index merge as the
    identity; rows with no valid index at all stay out 0, lse -inf.

    Each half's out is rounded to bf16 before the merge, so its error is relative to the half's own
    values, which may cancel in the merge: the bound on the merged out is OUT_ABS + OUT_REL *
    (wa |out_a| + wb |out_b|) with the oracle's weights wa = exp(lse_a - lse), not OUT_REL * |out|."""
    c = make_decode_case(cd, 4, 2, 16, 128, 16, seed=31, tl_mode="none", sink_mode="none")
    idx = c["indices"]
    idx[0, 0, :64] = -1  # first half empty
    idx[1, 1, 64:] = -1  # second half empty
    n, h = 4 * 2, 16
    parts, refs = [], []
    for half in (idx[..., :64], idx[..., 64:]):
        ch = dict(c, indices=np.ascontiguousarray(half))
        o, l = run_decode(ch)
        parts.append((o.reshape(n, h, 512), l.reshape(n, h)))
        ro, rl = ref_decode(ch)
        refs.append((ro.reshape(n, h, 512), rl.reshape(n, h)))
    (oa, la), (ob, lb) = parts
    out_m, lse_m = smla.merge_attn_states(oa, la, ob, lb)
    assert out_m.dtype == BF16 and lse_m.dtype == np.float32

    out_ref, lse_ref = (a.reshape(n, h, *a.shape[3:]) for a in ref_decode(c))
    ref.check_close(lse_m, lse_ref, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name="merged lse")
    with np.errstate(invalid="ignore"):
        wa = np.where(refs[0][1] == -np.inf, 0.0, np.exp(refs[0][1] - lse_ref))
        wb = np.where(refs[1][1] == -np.inf, 0.0, np.exp(refs[1][1] - lse_ref))
    wa, wb = np.nan_to_num(wa)[..., None], np.nan_to_num(wb)[..., None]
    bound = ref.OUT_ABS + ref.OUT_REL * (wa * np.abs(refs[0][0]) + wb * np.abs(refs[1][0]))
    err = np.abs(ref.as_f64(out_m) - out_ref)
    assert (err <= bound).all(), f"merged out: {(err > bound).sum()} elements outside the bound"
    ref.check_close(out_m, out_ref, abs_tol=1.0, rel_tol=0.0, cos_tol=ref.OUT_COS, name="merged out cos")
    assert (ref.as_f64(out_m[0, :]) == 0).sum() < 512 * h  # row 0 (half empty) is not zeroed
    # and the merge itself matches the oracle's merge of the same bf16 halves
    mo, ml = ref.merge_attn_states(oa, la, ob, lb)
    ref.check_decode(out_m, lse_m, mo, ml, name="merge vs oracle merge")


def test_decode_raw_uint16_views():
    """bf16 given as raw uint16 bits (q, cache, out): the same bits as ml_dtypes.bfloat16, both within
    the oracle's tolerance (a bug the two share fails there)."""
    c = make_decode_case("bf16", 2, 2, 16, 64, 16, seed=41)
    out, lse = run_decode(c)
    check_against_ref(c, out, lse)
    c2 = dict(c, q=c["q"].view(np.uint16), kv_cache=c["kv_cache"].view(np.uint16))
    out2 = np.empty(out.shape, np.uint16)
    res, lse2 = run_decode(c2, out=out2)
    assert res is out2
    check_against_ref(c, out2.view(BF16), lse2)
    ref.assert_bf16_equal(out2, out)
    np.testing.assert_array_equal(lse2, lse)


@pytest.mark.parametrize("v_scale", [1.0, 10.0])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_precision(cd, v_scale):
    """precision="high" and "fast" (docs/design.md section 4) meet their tolerances (fast's is the
    looser), latent values of magnitude ~10 included. "fast" changes only P*V: on a CPU level with bf16
    dot products P is rounded to bf16 there (other outputs differ), elsewhere the CPU runs high (the same
    bits); lse keeps high's bits on every level."""
    c = make_decode_case(cd, 3, 2, 16, 300, 16, seed=41, v_scale=v_scale)
    out, lse = run_decode(c, precision="high")
    check_against_ref(c, out, lse)
    out_f, lse_f = run_decode(c, precision="fast")
    check_against_ref(c, out_f, lse_f, precision="fast")
    assert_fast_runs_bf16_p(out_f, out)
    np.testing.assert_array_equal(lse_f, lse)


# ---------------------------------------------------------------------------------------------
# bad inputs: the most specific exception type, naming the argument
# ---------------------------------------------------------------------------------------------

def _good_args(cd="fp8_ds_mla"):
    b, s_q, h, topk = 2, 2, 16, 8
    return dict(q=np.zeros((b, s_q, h, 576), BF16), kv_cache=new_cache(4, 16, cd),
                indices=np.zeros((b, s_q, topk), np.int32), softmax_scale=SCALE, kv_cache_dtype=cd,
                topk_length=np.full((b, s_q), topk, np.int32), attn_sink=np.zeros(h, np.float32),
                out=np.empty((b, s_q, h, 512), BF16), lse=np.empty((b, s_q, h), np.float32))


BAD_DECODE = [
    ("q", dict(q=np.zeros((2, 2, 16, 576), np.float32)), TypeError),
    ("q", dict(q=np.zeros((2, 16, 576), BF16)), ValueError),
    ("q", dict(q=np.zeros((2, 2, 16, 512), BF16)), ValueError),
    ("q", dict(q=np.zeros((2, 2, 129, 576), BF16)), ValueError),
    ("q", dict(q=np.zeros((2, 2, 16, 1152), BF16)[..., ::2]), ValueError),
    ("indices", dict(indices=np.zeros((2, 2, 8), np.int64)), TypeError),
    ("indices", dict(indices=np.zeros((2, 2, 8), np.float32)), TypeError),
    ("indices", dict(indices=np.zeros((2, 8), np.int32)), ValueError),
    ("indices", dict(indices=np.zeros((3, 2, 8), np.int32)), ValueError),
    ("indices", dict(indices=np.zeros((2, 1, 8), np.int32)), ValueError),
    ("kv_cache", dict(kv_cache=np.zeros((4, 16, 656), np.float32)), TypeError),
    ("kv_cache", dict(kv_cache=np.zeros((4, 16, 655), np.uint8)), ValueError),
    ("kv_cache", dict(kv_cache=np.zeros((64, 656), np.uint8)), ValueError),
    ("kv_cache", dict(kv_cache=np.zeros((4, 16, 576), BF16)), TypeError),  # a bf16 cache called fp8
    ("kv_cache_dtype", dict(kv_cache_dtype="fp16"), ValueError),
    ("out", dict(out=np.empty((2, 2, 16, 512), np.float32)), TypeError),
    ("out", dict(out=np.empty((2, 2, 16, 576), BF16)), ValueError),
    ("out", dict(out=np.empty((2, 2, 8, 512), BF16)), ValueError),
    ("out", dict(out=np.empty((2, 2, 16), BF16)), ValueError),
    ("lse", dict(lse=np.empty((2, 2, 16), BF16)), TypeError),
    ("lse", dict(lse=np.empty((2, 2, 15), np.float32)), ValueError),
    ("lse", dict(lse=np.empty((2, 2), np.float32)), ValueError),
    ("attn_sink", dict(attn_sink=np.zeros(15, np.float32)), ValueError),
    ("attn_sink", dict(attn_sink=np.zeros(16, np.float64)), TypeError),
    ("topk_length", dict(topk_length=np.zeros((2, 3), np.int32)), ValueError),
    ("topk_length", dict(topk_length=np.zeros((2, 2), np.float32)), TypeError),
    ("precision", dict(precision="medium"), ValueError),
    ("precision", dict(precision="High"), ValueError),
    ("precision", dict(precision=1), TypeError),
    ("precision", dict(precision=None), TypeError),
]


@pytest.mark.parametrize("name,bad,exc", BAD_DECODE,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD_DECODE)])
def test_decode_bad_inputs(name, bad, exc):
    a = _good_args()
    a.update(bad)
    q, cache, idx = a.pop("q"), a.pop("kv_cache"), a.pop("indices")
    with pytest.raises(exc, match=rf"\b{name}\b"):
        smla.sparse_mla_decode(q, cache, idx, **a)


def test_decode_bad_bf16_cache():
    a = _good_args("bf16")
    q, idx = a.pop("q"), a.pop("indices")
    a.pop("kv_cache")
    with pytest.raises(ValueError, match=r"\bkv_cache\b"):
        smla.sparse_mla_decode(q, np.zeros((4, 16, 512), BF16), idx, **a)
    with pytest.raises(TypeError, match=r"\bkv_cache\b"):
        smla.sparse_mla_decode(q, np.zeros((4, 16, 576), np.float32), idx, **a)


def test_decode_readonly_out():
    a = _good_args()
    a["out"].flags.writeable = False
    q, cache, idx = a.pop("q"), a.pop("kv_cache"), a.pop("indices")
    with pytest.raises(ValueError, match=r"\bout\b"):
        smla.sparse_mla_decode(q, cache, idx, **a)


# ---------------------------------------------------------------------------------------------
# CUDA: the same op on torch CUDA tensors against the CPU op and the oracle
# ---------------------------------------------------------------------------------------------

def to_torch(a, torch):
    """NumPy -> CUDA tensor, keeping any strided view's layout (bf16 travels as int16 bits)."""
    base, view = a, None
    if not a.flags.c_contiguous:  # rebuild the view on the device from its base allocation
        base = a.base if a.base is not None else a
        while base.base is not None and isinstance(base.base, np.ndarray):
            base = base.base
        view = a
    src = base if view is not None else a.copy(order="C")  # the copy normalises size-1 strides
    assert src.flags.c_contiguous
    if src.dtype == BF16:
        t = torch.from_numpy(src.view(np.int16)).cuda().view(torch.bfloat16)
    else:
        t = torch.from_numpy(src).cuda()
    if view is None:
        return t
    item = a.itemsize
    off = (a.__array_interface__["data"][0] - src.__array_interface__["data"][0]) // item
    return t.as_strided(a.shape, tuple(s // item for s in a.strides), off)


def from_torch(t, torch):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _cuda_case(c, torch):
    g = {k: (to_torch(v, torch) if isinstance(v, np.ndarray) else v) for k, v in c.items()}
    return g


def _check_cuda(c, torch):
    out_c, lse_c = run_decode(c)
    g = _cuda_case(c, torch)
    out_g, lse_g = run_decode(g)
    assert out_g.is_cuda and out_g.dtype == torch.bfloat16 and lse_g.dtype == torch.float32
    torch.cuda.synchronize()
    out_g, lse_g = from_torch(out_g, torch), from_torch(lse_g, torch)
    check_against_ref(c, out_g, lse_g)
    ref.check_close(out_g, out_c, abs_tol=ref.OUT_ABS, rel_tol=ref.OUT_REL, cos_tol=ref.OUT_COS,
                    name="cuda vs cpu out")
    ref.check_close(lse_g, lse_c, abs_tol=ref.LSE_ABS, rel_tol=ref.LSE_REL, name="cuda vs cpu lse")


@pytest.mark.cuda
@pytest.mark.parametrize("cd,h,topk,s_q,bs,b,tl_mode,sink_mode,strided_q,seed", _shape_cases())
def test_decode_cuda_shapes(cd, h, topk, s_q, bs, b, tl_mode, sink_mode, strided_q, seed):
    torch = pytest.importorskip("torch")
    c = make_decode_case(cd, b, s_q, h, topk, bs, seed=seed, tl_mode=tl_mode, sink_mode=sink_mode)
    if strided_q:
        c["q"] = strided(c["q"], np.random.default_rng(seed))
    _check_cuda(c, torch)


@pytest.mark.cuda
@pytest.mark.parametrize("h", [1, 7, 16, 33, 64, 100, 128])
@pytest.mark.parametrize("sink_mode", ["none", "mixed"])
@pytest.mark.parametrize("tl_mode", ["none", "rand"])
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_cuda_features(cd, tl_mode, sink_mode, h):
    torch = pytest.importorskip("torch")
    c = make_decode_case(cd, 5, 2, h, 2048, 64, seed=h, tl_mode=tl_mode, sink_mode=sink_mode, layers=2)
    _check_cuda(c, torch)


@pytest.mark.cuda
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_cuda_large_batch(cd):
    """Enough query rows to fill the GPU (b = 64, s_q = 2, h = 128, topk = 2048)."""
    torch = pytest.importorskip("torch")
    c = make_decode_case(cd, 64, 2, 128, 2048, 64, seed=99, tl_mode="rand", sink_mode="finite")
    _check_cuda(c, torch)


@pytest.mark.cuda
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_decode_cuda_out_views(cd):
    torch = pytest.importorskip("torch")
    c = make_decode_case(cd, 3, 2, 64, 256, 16, seed=13)
    g = _cuda_case(c, torch)
    out_big = torch.full((3, 2, 64, 512 + 64), 7.0, dtype=torch.bfloat16, device="cuda")
    lse_big = torch.full((3, 2, 2, 64), 7.0, dtype=torch.float32, device="cuda")
    out_v, lse_v = out_big[..., 32:544], lse_big[:, :, 1]
    run_decode(g, out=out_v, lse=lse_v)
    torch.cuda.synchronize()
    check_against_ref(c, from_torch(out_v, torch), from_torch(lse_v, torch))
    assert (out_big[..., :32] == 7).all() and (out_big[..., 544:] == 7).all() and (lse_big[:, :, 0] == 7).all()
