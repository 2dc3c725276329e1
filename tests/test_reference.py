"""Self-tests of tests/reference.py: known encodings, cross-checks against ml_dtypes, hand cases and
brute-force loops. They check the oracle itself, so every kernel test can trust it."""

import math
import os
import sys

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


def enc(*vals):
    return [int(b) for b in ref.e4m3fn_satfinite_rne(np.array(vals, np.float32))]


# ---------------------------------------------------------------- e4m3fn

def test_e4m3_known_encodings():
    assert enc(448.0, -448.0) == [0x7E, 0xFE]
    assert enc(0.0, -0.0) == [0x00, 0x80]
    assert enc(1.0, -1.0, 2.0, 0.5) == [0x38, 0xB8, 0x40, 0x30]
    assert enc(np.nan)[0] & 0x7F == 0x7F
    assert enc(500.0, -500.0, 464.0, 1e30) == [0x7E, 0xFE, 0x7E, 0x7E]  # satfinite
    assert enc(np.inf, -np.inf) == [0x7E, 0xFE]  # satfinite: Inf -> +-MAX
    assert enc(2.0**-9, 2.0**-6, 7 * 2.0**-9) == [0x01, 0x08, 0x07]  # subnormals, min normal
    assert enc(-1e-5) == [0x80]  # negative underflow keeps the sign


def test_e4m3_ties_to_even():
    assert enc(2.0**-10) == [0x00]  # halfway 0 / 2^-9 -> 0
    assert enc(3 * 2.0**-10) == [0x02]  # halfway 1 / 2 (x 2^-9) -> 2
    assert enc(1.0625) == [0x38]  # halfway 1.0 / 1.125 -> 1.0 (mantissa 0)
    assert enc(1.1875) == [0x3A]  # halfway 1.125 / 1.25 -> 1.25 (mantissa 2)
    assert enc(336.0) == [0x7A]  # halfway 320 / 352 -> 320
    assert enc(np.nextafter(np.float32(1.0625), np.float32(2))) == [0x39]  # just above the tie


def test_e4m3_decode_matches_ml_dtypes():
    b = np.arange(256, dtype=np.uint8)
    mine = ref.e4m3fn_decode(b)
    theirs = b.view(E4M3).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(mine), np.isnan(theirs))
    assert np.isnan(mine).sum() == 2  # 0x7F and 0xFF
    ok = ~np.isnan(mine)
    np.testing.assert_array_equal(mine[ok].view(np.uint32), theirs[ok].view(np.uint32))
    assert mine[0x7E] == 448 and mine[0x01] == 2.0**-9


def test_e4m3_encoder_matches_ml_dtypes_where_not_saturating():
    # ml_dtypes rounds to nearest even too but maps overflow to NaN, so compare on |x| <= 464
    # (464 itself rounds to 448 by ties-to-even in both).
    rng = np.random.default_rng(0)
    vals = [rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            ref.bf16_to_f32(np.arange(65536, dtype=np.uint16))]
    grid = ref.e4m3fn_decode(np.arange(256, dtype=np.uint8)).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid)])
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)  # every tie is exact in float32
    for m in (mids, -mids):
        vals += [m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))]
    x = np.concatenate(vals)
    x = x[np.isfinite(x) & (np.abs(x) <= 464)]
    mine = ref.e4m3fn_satfinite_rne(x)
    theirs = x.astype(E4M3).view(np.uint8)
    np.testing.assert_array_equal(mine, theirs)
    # Beyond 464 ml_dtypes gives NaN, we saturate.
    assert np.isnan(np.float32(500).astype(E4M3).astype(np.float32))


# ---------------------------------------------------------------- bf16

def test_bf16_rne_matches_ml_dtypes_float32():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(ref.bf16_rne(x), x.astype(BF16).view(np.uint16))
    all_bf16 = np.arange(65536, dtype=np.uint16)
    f = ref.bf16_to_f32(all_bf16)
    ok = ~np.isnan(f)
    np.testing.assert_array_equal(ref.bf16_rne(f)[ok], all_bf16[ok])  # round trip


def test_bf16_rne_special_values():
    bits = ref.bf16_rne(np.array([1.0, -0.0, np.inf, -np.inf, 3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8],
                                 np.float32))
    assert [int(b) for b in bits] == [0x3F80, 0x8000, 0x7F80, 0xFF80, 0x7F80, 0x3F80, 0x3F82]
    nan = ref.bf16_rne(np.array([np.nan, -np.nan], np.float32))
    assert all((int(b) & 0x7FFF) > 0x7F80 and int(b) & 0x0040 for b in nan)
    snan = np.array([0x7F800001], np.uint32).view(np.float32)  # payload only in low bits
    assert int(ref.bf16_rne(snan)[0]) == 0x7FC0  # stays NaN (no truncation to Inf)
    # float64 is rounded once: just above the 1 / 1+2^-7 tie rounds up (float32 first would not).
    assert int(ref.bf16_rne(np.array([1.0 + 2**-8 + 2**-30]))[0]) == 0x3F81
    assert int(ref.bf16_rne(np.array([2.0**-140]))[0]) == 0x0000  # below half the min subnormal
    assert int(ref.bf16_rne(np.array([2.0**-133]))[0]) == 0x0001  # bf16 min subnormal


def test_as_bf16_bits_accepts_both_and_refuses_floats():
    a = np.array([1.5, -2.0], BF16)
    assert ref.as_bf16_bits(a).dtype == np.uint16
    assert ref.as_bf16_bits(a).base is not None  # a view, not a copy
    with pytest.raises(TypeError, match=r"expected bf16 bits .* got float32"):
        ref.as_bf16_bits(np.zeros(2, np.float32))


# ---------------------------------------------------------------- fp8_ds_mla

def test_pow2_scale_examples():
    s = ref.tile_scale(np.array([336.0, 0.0, 448.0, 449.0, 448 * 2**-13, 1e-30, np.inf], np.float32))
    assert list(s) == [1.0, 2.0**-13, 1.0, 2.0, 2.0**-13, 2.0**-13, np.inf]
    # fp32(0.0448) / 448 in fp32 is exactly fp32(1e-4): the floor itself, still 2^-13.
    assert ref.tile_scale(np.float32(0.0448)) == 2.0**-13
    s32 = ref.tile_scale(np.array([336.0, 0.0, np.inf], np.float32), "fp32")
    assert list(s32) == [0.75, ref.FLT_MIN, np.inf]


def _kv(rng, t=1):
    return ref.rand_bf16((t, 512), rng), ref.rand_bf16((t, 64), rng)


def test_fp8_entry_layout_vllm_writer_case():
    # vLLM's writer test: kv_c = 336 for 0..383, 0 after -> scales [1, 1, 1, 2^-13].
    kv_c = ref.bf16_rne(np.where(np.arange(512) < 384, 336.0, 0.0))[None]
    k_pe = np.arange(64, dtype=np.uint16)[None] * 0x0101
    ent = ref.pack_fp8_ds_mla(kv_c, k_pe)
    assert ent.shape == (1, 656)
    np.testing.assert_array_equal(ref.fp8_entry_scales(ent)[0], [1, 1, 1, 2.0**-13])
    assert ent[0, 512:516].tobytes() == np.float32(1).tobytes()  # little-endian at 512 + 4t
    assert (ent[0, :384] == 0x7A).all() and (ent[0, 384:512] == 0).all()  # 336 -> 320 (tie to even)
    assert ent[0, 528:656].tobytes() == k_pe.astype("<u2").tobytes()  # rope bit for bit
    row = ref.bf16_to_f64(ref.unpack_fp8_ds_mla(ent))[0]
    assert (row[:384] == 320).all() and (row[384:512] == 0).all()


def test_fp8_legacy_rule_and_signed_zero():
    kv_c = ref.bf16_rne(np.where(np.arange(512) < 128, 336.0, -0.0))[None]
    ent = ref.pack_fp8_ds_mla(kv_c, np.zeros((1, 64), np.uint16), "fp32")
    np.testing.assert_array_equal(ref.fp8_entry_scales(ent)[0], [0.75] + [ref.FLT_MIN] * 3)
    assert (ent[0, :128] == 0x7E).all()  # 336 / 0.75 = 448
    assert (ent[0, 128:512] == 0x80).all()  # -0.0 stays 0x80
    ent = ref.pack_fp8_ds_mla(kv_c * 0 + 0x8000, np.zeros((1, 64), np.uint16))  # pow2 rule
    assert (ent[0, :512] == 0x80).all()


def test_fp8_nan_and_inf_tiles():
    x = np.ones(512, np.float32)
    x[3] = np.nan  # tile 0: NaN byte, scale from the rest
    x[130] = np.inf  # tile 1: scale Inf, Inf/Inf = NaN byte, the rest +-0
    x[131] = -2.0
    ent = ref.pack_fp8_ds_mla(ref.bf16_rne(x)[None], np.zeros((1, 64), np.uint16))
    s = ref.fp8_entry_scales(ent)[0]
    assert s[0] == 2.0**-8 and s[1] == np.inf and s[2] == 2.0**-8  # 1/448 -> 2^-8
    assert ent[0, 3] & 0x7F == 0x7F and ent[0, 130] & 0x7F == 0x7F
    assert ent[0, 129] == 0x00 and ent[0, 131] == 0x80
    row = ref.bf16_to_f64(ref.unpack_fp8_ds_mla(ent))[0]
    assert np.isnan(row[3]) and row[0] == 1.0
    assert np.isnan(row[128:256]).all()  # dequant of an Inf tile: 0 * Inf = NaN for every element


def test_pack_unpack_roundtrip_and_slots():
    rng = np.random.default_rng(2)
    kv_c, k_pe = _kv(rng, 6)
    for dt in ref.KV_CACHE_DTYPES:
        cache = ref.new_kv_cache(3, 4, dt)
        assert cache.shape == ref.kv_cache_shape(3, 4, dt)
        slots = np.array([0, 5, -1, 11, 12, 7], np.int64)  # -1 and 12 (= 3*4) are skipped
        before = cache.copy()
        ref.pack_kv(kv_c, k_pe, cache, slots, dt)
        rows = ref.unpack_kv(cache, np.array([0, 5, 11, 7, -1, 12]), dt)
        want = np.concatenate([kv_c, k_pe], 1)[[0, 1, 3, 5]]
        if dt == "bf16":
            np.testing.assert_array_equal(rows[:4], want)
        else:
            np.testing.assert_array_equal(rows[:4, 512:], want[:, 512:])
            # pow2 scales + bf16 inputs: dequant error is e4m3 rounding only (rel <= 2^-4).
            err = np.abs(ref.bf16_to_f64(rows[:4, :512]) - ref.bf16_to_f64(want[:, :512]))
            s = np.repeat(ref.read_fp8_scales(cache, [0, 5, 11, 7]), 128, axis=1)
            assert (err <= np.maximum(np.abs(ref.bf16_to_f64(want[:, :512])) / 16, s * 2.0**-10)).all()
        assert (rows[4:] == 0).all()
        touched = np.zeros(12, bool)
        touched[[0, 5, 11, 7]] = True
        untouched = cache.reshape(12, -1)[~touched]
        np.testing.assert_array_equal(untouched, before.reshape(12, -1)[~touched])
        np.testing.assert_array_equal(ref.dequant_rows(cache, [5], dt), ref.bf16_to_f64(rows[1:2]))


def test_pack_kv_strided_cache_and_ml_dtypes():
    # A cache interleaved with another layer (stride(0) > block_size * entry) is written in place.
    rng = np.random.default_rng(3)
    kv_c, k_pe = _kv(rng, 2)
    big = np.zeros((4, 2, 3, 656), np.uint8)
    cache = big[:, 0]
    ref.pack_kv(kv_c.view(BF16), k_pe.view(BF16), cache.view(E4M3), np.array([1, 10], np.int32),
                "fp8_ds_mla")
    np.testing.assert_array_equal(cache[0, 1], ref.pack_fp8_ds_mla(kv_c[:1], k_pe[:1])[0])
    np.testing.assert_array_equal(cache[3, 1], ref.pack_fp8_ds_mla(kv_c[1:], k_pe[1:])[0])
    assert (big[:, 1] == 0).all()
    ref.assert_cache_equal(cache, cache.copy(), "fp8_ds_mla")


def test_assert_cache_equal_nan_bytes():
    a = ref.new_kv_cache(1, 1, "fp8_ds_mla")
    b = a.copy()
    a[0, 0, 7], b[0, 0, 7] = 0x7F, 0xFF
    ref.assert_cache_equal(a, b, "fp8_ds_mla")
    a[0, 0, 600] = 1
    with pytest.raises(AssertionError, match="rope byte"):
        ref.assert_cache_equal(a, b, "fp8_ds_mla")


def test_gather_upconvert():
    rng = np.random.default_rng(4)
    nb, bs = 6, 4
    for dt in ref.KV_CACHE_DTYPES:
        kv_c, k_pe = _kv(rng, nb * bs)
        cache = ref.pack_kv(kv_c, k_pe, ref.new_kv_cache(nb, bs, dt), np.arange(nb * bs), dt)
        bt = np.array([[3, 1, -1], [5, 99, 0]], np.int32)
        ws = np.full((16, 576), 0x1234, np.uint16)
        # req 0: tokens 2..7 -> rows 0..5 (token 6, 7 are in block 1); req 1: tokens 0..7 -> rows
        # 10..17 (rows 16, 17 skipped; tokens 4..7 in block id 99 -> zero rows).
        ref.gather_upconvert(cache, ws, bt, np.array([6, 8]), np.array([0, 10]), np.array([2, 0]),
                             kv_cache_dtype=dt)
        want = ref.unpack_kv(cache, [14, 15, 4, 5, 6, 7], dt)
        np.testing.assert_array_equal(ws[0:6], want)
        np.testing.assert_array_equal(ws[10:14], ref.unpack_kv(cache, [20, 21, 22, 23], dt))
        assert (ws[14:16] == 0).all()
        assert (ws[6:10] == 0x1234).all()  # untouched
        # past max_blocks and negative block ids -> zero rows
        ws2 = np.full((8, 576), 0x1234, np.uint16)
        ref.gather_upconvert(cache, ws2.view(BF16), bt[:1], [8], [0], [8])  # blocks 2 (id -1), 3
        assert (ws2 == 0).all()


# ---------------------------------------------------------------- index conversion

def test_convert_topk_indices_paged_and_prefill():
    bt = np.array([[7, 2, -3], [1, 0, 4]], np.int32)
    bs = 4
    req = np.array([0, 1, 2, -1, 0], np.int32)
    tok = np.array([[0, 5, 9, 12, -1],
                    [3, 4, 11, -7, 8],
                    [0, 1, 2, 3, 4],
                    [0, 1, 2, 3, 4],
                    [2147483647, 6, 0, 1, -2147483648]], np.int32)
    out, cnt = ref.convert_topk_indices(req, bt, tok, bs)
    np.testing.assert_array_equal(out, [[28, 9, -1, -1, -1],     # block id -3 -> -1; 12//4 = 3 >= M
                                        [7, 0, 19, -1, 16],
                                        [-1] * 5,                 # req_id 2 >= num_reqs
                                        [-1] * 5,                 # req_id -1
                                        [-1, 10, 28, 29, -1]])
    np.testing.assert_array_equal(cnt, [2, 4, 0, 0, 3])
    assert out.dtype == np.int32 and cnt.dtype == np.int32
    # prefill rows: start + tok, no block-table check, req_id ignored; p >= num_prefills -> -1
    pid = np.array([-1, 0, 1, 2, 0], np.int32)
    starts = np.array([100, 2147483640], np.int32)
    out, cnt = ref.convert_topk_indices(req, bt, tok, bs, pid, starts)
    np.testing.assert_array_equal(out[1], [103, 104, 111, -1, 108])
    np.testing.assert_array_equal(out[2], [2147483640, 2147483641, 2147483642, 2147483643,
                                           2147483644])
    np.testing.assert_array_equal(out[3], [-1] * 5)
    np.testing.assert_array_equal(out[4], [-1, 106, 100, 101, -1])  # 100 + INT32_MAX overflows
    np.testing.assert_array_equal(cnt, [2, 4, 5, 0, 3])


def test_convert_int32_overflow():
    bt = np.array([[2**31 // 4]], np.int32)  # slot = 2^31 + tok overflows
    out, cnt = ref.convert_topk_indices([0], bt, np.array([[0, 3]], np.int32), 4)
    np.testing.assert_array_equal(out, [[-1, -1]])
    bt = np.array([[2**31 // 4 - 1]], np.int32)
    out, _ = ref.convert_topk_indices([0], bt, np.array([[3]], np.int32), 4)
    assert out[0, 0] == 2**31 - 1


def _dcp_brute(bt, tok, bs, size, rank, il, compact):
    row = []
    for g in tok:
        if g < 0 or (g // il) % size != rank:
            row.append(-1)
            continue
        local = (g // (size * il)) * il + g % il
        b = local // bs
        row.append(int(bt[b]) * bs + local % bs if b < len(bt) and bt[b] >= 0 else -1)
    if compact:
        row = [v for v in row if v != -1] + [-1] * row.count(-1)
    return row


@pytest.mark.parametrize("size,rank,il", [(1, 0, 1), (2, 0, 1), (2, 1, 2), (3, 2, 1), (4, 1, 4)])
@pytest.mark.parametrize("compact", [True, False])
def test_filter_convert_dcp(size, rank, il, compact):
    rng = np.random.default_rng(size * 10 + rank)
    bs = 4
    bt = rng.permutation(20)[:6].astype(np.int32).reshape(2, 3)
    bt[1, 2] = -1
    tok = rng.integers(-2, 80, (2, 40)).astype(np.int32)
    out, cnt = ref.filter_convert_dcp_indices([0, 1], bt, tok, bs, size, rank, il, compact)
    for n in range(2):
        want = _dcp_brute(bt[n], tok[n], bs, size, rank, il, compact)
        np.testing.assert_array_equal(out[n], want)
        assert cnt[n] == sum(v != -1 for v in want)


def test_dcp_hand_case():
    # size 2, interleave 2: globals 0,1 -> rank 0 local 0,1; 2,3 -> rank 1; 4,5 -> rank 0 local 2,3.
    bt = np.array([[10]], np.int32)
    out, cnt = ref.filter_convert_dcp_indices([0], bt, np.array([[5, 2, 0, 3, 4, -1]], np.int32),
                                              block_size=8, dcp_size=2, dcp_rank=0, interleave=2)
    np.testing.assert_array_equal(out, [[83, 80, 82, -1, -1, -1]])
    assert cnt[0] == 3


# ---------------------------------------------------------------- merge

def test_merge_identities():
    rng = np.random.default_rng(5)
    oa, ob = rng.standard_normal((3, 2, 8)), rng.standard_normal((3, 2, 8))
    la, lb = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    ninf = np.full((3, 2), -np.inf)
    out, lse = ref.merge_attn_states(oa, la, ob, ninf)  # -inf side is the identity
    np.testing.assert_allclose(out, oa, rtol=1e-15)
    np.testing.assert_array_equal(lse, la)
    out, lse = ref.merge_attn_states(oa, la, ob, la)  # equal lse: mean, lse + log 2
    np.testing.assert_allclose(out, (oa + ob) / 2, rtol=1e-14)
    np.testing.assert_allclose(lse, la + math.log(2), rtol=1e-14)
    out1, lse1 = ref.merge_attn_states(oa, la, ob, lb)  # symmetric
    out2, lse2 = ref.merge_attn_states(ob, lb, oa, la)
    np.testing.assert_allclose(out1, out2, rtol=1e-14)
    np.testing.assert_allclose(lse1, lse2, rtol=1e-14)
    out, lse = ref.merge_attn_states(oa, ninf, ob, ninf)  # both empty: out_a, -inf
    np.testing.assert_array_equal(out, oa)
    assert (lse == -np.inf).all()
    # a NaN lse poisons the result, also next to +inf
    out, lse = ref.merge_attn_states(oa[:1], np.array([[np.nan, np.nan]]), ob[:1], np.array([[1.0, np.inf]]))
    assert np.isnan(out).all() and np.isnan(lse).all()
    # a +inf lse (a saturated state) outweighs the other side; two of them weigh equally
    out, lse = ref.merge_attn_states(oa[:1], np.array([[np.inf, np.inf]]), ob[:1], np.array([[-np.inf, np.inf]]))
    np.testing.assert_array_equal(out[0, 0], oa[0, 0])
    np.testing.assert_allclose(out[0, 1], (oa[0, 1] + ob[0, 1]) / 2, rtol=1e-15)
    assert (lse == np.inf).all()


def test_merge_matches_attention_over_split():
    # Attention over two halves of an index set, merged, equals attention over the whole.
    rng = np.random.default_rng(6)
    q = ref.rand_bf16((1, 1, 4, 576), rng, 0.1)
    kv = ref.rand_bf16((50, 576), rng)
    idx = rng.integers(0, 50, 32).astype(np.int32)
    full = ref.sparse_mla_attention(q, kv, idx[None, None], 50, 0.3)
    a = ref.sparse_mla_attention(q, kv, idx[None, None, :20], 50, 0.3)
    b = ref.sparse_mla_attention(q, kv, idx[None, None, 20:], 50, 0.3)
    out, lse = ref.merge_attn_states(a[0][0, 0], a[1][0, 0], b[0][0, 0], b[1][0, 0])
    np.testing.assert_allclose(out, full[0][0, 0], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(lse, full[1][0, 0], rtol=1e-14)


# ---------------------------------------------------------------- attention

def _brute_attention(q, kv, idx, limit, scale, tl, sink):
    """Loop-by-loop float64 with math.* only; out_abs: out with V replaced by |V|."""
    b, s_q, h, _ = q.shape
    out = np.zeros((b, s_q, h, 512))
    out_abs = np.zeros((b, s_q, h, 512))
    lse = np.full((b, s_q, h), -np.inf)
    ml = np.full((b, s_q, h), -np.inf)
    for bi in range(b):
        for si in range(s_q):
            js = [int(v) for j, v in enumerate(idx[bi, si])
                  if 0 <= v < limit and (tl is None or j < tl[bi, si])]
            if not js:
                continue
            for hi in range(h):
                s = [scale * math.fsum(q[bi, si, hi] * kv[j]) for j in js]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                z = math.fsum(w)
                o = sum(wi * kv[j, :512] for wi, j in zip(w, js)) / z
                oa = sum(wi * abs(kv[j, :512]) for wi, j in zip(w, js)) / z
                lse[bi, si, hi] = m + math.log(z)
                ml[bi, si, hi] = m
                if sink is not None:
                    o = o / (1 + math.exp(sink[hi] - lse[bi, si, hi]))
                    oa = oa / (1 + math.exp(sink[hi] - lse[bi, si, hi]))
                out[bi, si, hi] = o
                out_abs[bi, si, hi] = oa
    return out, lse, ml, out_abs


def test_attention_vs_brute_force():
    rng = np.random.default_rng(7)
    b, s_q, h, topk, s_kv = 2, 3, 4, 12, 20
    q = ref.rand_bf16((b, s_q, h, 576), rng, 0.2)
    kv = ref.rand_bf16((s_kv, 576), rng)
    zoo = ref.invalid_index_zoo(s_kv)
    idx = rng.integers(0, s_kv, (b, s_q, topk)).astype(np.int32)
    idx[0, 0, 5] = idx[0, 0, 6]  # duplicate counts twice
    idx[0, 1] = rng.choice(zoo, topk)  # no valid index at all
    mask = rng.random((b, s_q, topk)) < 0.3
    idx[mask] = rng.choice(zoo, int(mask.sum()))
    tl = rng.integers(0, topk + 3, (b, s_q)).astype(np.int32)
    tl[1, 2] = 0
    sink = np.array([0.5, np.inf, -np.inf, -1.0], np.float32)
    scale = 576**-0.5
    s32 = float(np.float32(scale))
    qf, kvf = ref.bf16_to_f64(q), ref.bf16_to_f64(kv)
    for use_tl in (None, tl):
        for use_sink in (None, sink):
            got = ref.sparse_mla_attention(q, kv, idx, s_kv, scale, use_tl, use_sink, return_abs=True)
            want = _brute_attention(qf, kvf, idx, s_kv, s32, use_tl, use_sink)
            assert len(got) == len(want) == 4
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
            np.testing.assert_array_equal(got[0], ref.sparse_mla_attention(q, kv, idx, s_kv, scale, use_tl,
                                                                           use_sink)[0])
    out, lse, ml = ref.sparse_mla_attention(q, kv, idx, s_kv, scale, tl, sink)
    assert (out[0, 1] == 0).all() and (lse[0, 1] == -np.inf).all() and (ml[0, 1] == -np.inf).all()
    assert (out[..., 1, :] == 0).all()  # sink +inf
    np.testing.assert_array_equal(out[..., 2, :], ref.sparse_mla_attention(q, kv, idx, s_kv, scale,
                                                                           tl)[0][..., 2, :])


def test_prefill_wrapper_and_topk_length():
    rng = np.random.default_rng(8)
    q = ref.rand_bf16((3, 2, 576), rng, 0.1)
    kv = ref.rand_bf16((8, 576), rng)
    idx = rng.integers(0, 8, (3, 16)).astype(np.int32)
    out, lse, ml = ref.sparse_mla_prefill_ref(q, kv, idx, 0.5, topk_length=np.ones(3, np.int32))
    idx1 = np.full_like(idx, -1)
    idx1[:, 0] = idx[:, 0]  # FlashMLA smoke test: topk_length 1 == indices[1:] all -1
    out1, lse1, ml1 = ref.sparse_mla_prefill_ref(q, kv.view(BF16), idx1, 0.5)
    np.testing.assert_array_equal(out, out1)
    np.testing.assert_array_equal(lse, lse1)
    np.testing.assert_array_equal(ml, ml1)
    np.testing.assert_array_equal(out[:, 0], ref.bf16_to_f64(kv[idx[:, 0], :512]))  # one row: p = 1
    assert out.shape == (3, 2, 512) and lse.shape == (3, 2)


def test_decode_wrapper_vllm_scale_case():
    # vLLM's bit-exact decode test: q = 0, one page, indices [0, -1, ...] -> out = dequant row.
    kv_c = ref.bf16_rne(np.where(np.arange(512) < 384, 336.0, 0.0))[None]
    cache = ref.new_kv_cache(1, 64, "fp8_ds_mla")
    ref.pack_kv(kv_c, np.zeros((1, 64), np.uint16), cache, [0], "fp8_ds_mla")
    idx = np.full((1, 1, 128), -1, np.int32)
    idx[0, 0, 0] = 0
    out, lse = ref.sparse_mla_decode_ref(np.zeros((1, 1, 64, 576), np.uint16), cache, idx, 0.1,
                                         "fp8_ds_mla")
    assert (out[0, 0, :, :384] == 320).all() and (out[0, 0, :, 384:] == 0).all()
    assert (lse == 0).all()


def test_decode_fp8_uses_dequantised_rows():
    rng = np.random.default_rng(9)
    nb, bs = 3, 8
    kv_c, k_pe = _kv(rng, nb * bs)
    for dt in ref.KV_CACHE_DTYPES:
        cache = ref.pack_kv(kv_c, k_pe, ref.new_kv_cache(nb, bs, dt), np.arange(nb * bs), dt)
        q = ref.rand_bf16((2, 1, 3, 576), rng, 0.1)
        idx = rng.integers(-3, nb * bs + 3, (2, 1, 10)).astype(np.int32)
        out, lse = ref.sparse_mla_decode_ref(q, cache, idx, 0.2, dt)
        rows = ref.unpack_kv(cache, np.arange(nb * bs), dt)
        want = ref.sparse_mla_attention(q, rows, idx, nb * bs, 0.2)
        np.testing.assert_array_equal(out, want[0])
        np.testing.assert_array_equal(lse, want[1])


def _python_calls(fn):
    """Python-level function calls (Python and builtin) made while fn() runs."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        n += event in ("call", "c_call")

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def test_attention_is_vectorised():
    """The oracle must stay fast enough for the kernel tests at FlashMLA's sizes (h = 128, top-k
    2048): its Python-level work is a fixed number of NumPy calls per query row, whatever h and
    top-k (those live inside array operations), and it fetches each distinct cache row once, in one
    call."""
    rng = np.random.default_rng(10)
    nb, bs = 64, 64
    cache = ref.new_kv_cache(nb, bs, "fp8_ds_mla")
    kv_c, k_pe = _kv(rng, nb * bs)
    ref.pack_kv(kv_c, k_pe, cache, np.arange(nb * bs), "fp8_ds_mla")
    calls = {}
    for h, topk in [(1, 4), (128, 2048)]:
        q = ref.rand_bf16((1, 2, h, 576), rng, 0.1)
        idx = rng.integers(0, nb * bs, (1, 2, topk)).astype(np.int32)
        calls[h, topk] = _python_calls(lambda: ref.sparse_mla_decode_ref(q, cache, idx, 0.1, "fp8_ds_mla"))
    assert calls[128, 2048] <= calls[1, 4] + 16, calls  # a loop over heads or top-k would add >= 128 per row

    fetched = []
    rows = ref.unpack_kv(cache, np.arange(nb * bs), "fp8_ds_mla")

    def kv_rows(slots):
        fetched.append(np.array(slots))
        return ref.bf16_to_f64(rows[slots])

    q = ref.rand_bf16((1, 2, 4, 576), rng, 0.1)
    idx = rng.integers(0, nb * bs, (1, 2, 256)).astype(np.int32)
    idx[0, 1, :100] = idx[0, 0, :100]  # rows shared by the two query rows
    out, lse, _ = ref.sparse_mla_attention(q, kv_rows, idx, nb * bs, 0.1)
    assert len(fetched) == 1 and np.array_equal(fetched[0], np.unique(idx))
    assert np.isfinite(out).all() and np.isfinite(lse).all()


# ---------------------------------------------------------------- check_close, helpers

def test_check_close_rules():
    e = np.array([1.0, 100.0, 0.0, -np.inf, np.nan])
    ref.check_close(e + [5e-4, 1.0, 1e-3, 0, 0], e, abs_tol=1e-3, rel_tol=0.01, name="x")
    with pytest.raises(AssertionError, match=r"x: 1 of 5 elements.*worst at \(1,\)"):
        ref.check_close(e + [5e-4, 1.5, 1e-3, 0, 0], e, abs_tol=1e-3, rel_tol=0.01, name="x")
    with pytest.raises(AssertionError, match="NaN"):
        ref.check_close(np.array([1.0, 100, 0, -np.inf, 0]), e, abs_tol=1, rel_tol=1)
    with pytest.raises(AssertionError, match="Inf"):
        ref.check_close(np.array([1.0, 100, 0, np.inf, np.nan]), e, abs_tol=1, rel_tol=1)
    with pytest.raises(AssertionError, match="shape"):
        ref.check_close(e[:2], e, abs_tol=1, rel_tol=1)
    # cosine over finite entries: a uniform 1% bias passes per element but not a 1e-9 cos bound
    rng = np.random.default_rng(11)
    x = rng.standard_normal(1000)
    y = x + 0.01 * rng.standard_normal(1000)
    st = ref.check_close(y, x, abs_tol=1, rel_tol=1, cos_tol=1e-3)
    assert 0 < st["cos_diff"] < 1e-3
    with pytest.raises(AssertionError, match="cosine"):
        ref.check_close(y, x, abs_tol=1, rel_tol=1, cos_tol=1e-9)
    ref.check_close(np.zeros(3), np.zeros(3), abs_tol=0, rel_tol=0, cos_tol=0)
    # bf16 actual vs float64 expected
    ref.check_close(ref.bf16_rne(x).view(BF16), x, abs_tol=0, rel_tol=2.0**-8)


def _fast_rule_case():
    """A prefill oracle case with |V| ~ 10 (q's latent part scaled down so the softmax stays diffuse):
    out, lse, max_logits, out_abs."""
    rng = np.random.default_rng(21)
    s_q, h, s_kv, topk = 4, 8, 300, 256
    kv = np.concatenate([ref.rand_bf16((s_kv, 512), rng, 10.0), ref.rand_bf16((s_kv, 64), rng)], 1)
    q = np.concatenate([ref.rand_bf16((s_q, h, 512), rng, 0.1), ref.rand_bf16((s_q, h, 64), rng)], 2)
    idx = rng.integers(0, s_kv, (s_q, topk)).astype(np.int32)
    return ref.sparse_mla_prefill_ref(q, kv, idx, 576**-0.5, return_abs=True), rng


def test_fast_rule_allows_bf16_probabilities_error():
    """precision="fast" (docs/design.md section 4): an error of 2^-9 * out_abs (each p_j off by one
    bf16 rounding) where the output is near 0 passes the fast rule and fails the high one; 2^-7 *
    out_abs fails both."""
    (out, lse, ml, out_abs), rng = _fast_rule_case()
    assert (out_abs >= np.abs(out)).all() and out_abs.min() > 1  # |V| ~ 10: the slack matters
    near0 = np.abs(out) < out_abs / 32
    assert 0.05 < near0.mean() < 0.3
    sign = np.where(rng.random(out.shape) < 0.5, -1.0, 1.0)
    ok = out + np.where(near0, sign * 2.0**-9 * out_abs, 0)
    ref.check_decode(ok, lse, out, lse, precision="fast", out_abs=out_abs)
    ref.check_prefill(ok, lse, ml, out, lse, ml, precision="fast", out_abs=out_abs)
    with pytest.raises(AssertionError, match=r"decode out: \d+ of 16384 elements outside abs 0.001 / rel"):
        ref.check_decode(ok, lse, out, lse)
    with pytest.raises(AssertionError, match=r"prefill out: \d+ of 16384 elements outside abs 0.0008 / rel"):
        ref.check_prefill(ok, lse, ml, out, lse, ml, precision="high", out_abs=out_abs)
    bad = out + np.where(near0, sign * 2.0**-7 * out_abs, 0)
    for precision in ref.PRECISIONS:
        with pytest.raises(AssertionError, match="elements outside abs"):
            ref.check_decode(bad, lse, out, lse, precision=precision, out_abs=out_abs)
        with pytest.raises(AssertionError, match="elements outside abs"):
            ref.check_prefill(bad, lse, ml, out, lse, ml, precision=precision, out_abs=out_abs)
    # a fast result still needs the lse of the high rule, and its cosine bound
    with pytest.raises(AssertionError, match="decode lse"):
        ref.check_decode(ok, lse + 1e-3, out, lse, precision="fast", out_abs=out_abs)
    with pytest.raises(AssertionError, match=r"cosine difference .* > 1e-05"):
        ref.check_decode(out + 2.0**-9 * out_abs, lse, out, lse, precision="fast", out_abs=out_abs)


def test_fast_rule_arguments():
    (out, lse, _, out_abs), _ = _fast_rule_case()
    assert ref.out_rule("high") == dict(abs_tol=ref.OUT_ABS, rel_tol=ref.OUT_REL, cos_tol=ref.OUT_COS)
    rule = ref.out_rule("fast", out_abs, prefill=True)
    assert (rule["abs_tol"], rule["rel_tol"], rule["cos_tol"]) == (ref.PREFILL_OUT_ABS, ref.PREFILL_OUT_REL,
                                                                   ref.FAST_OUT_COS)
    np.testing.assert_array_equal(rule["slack"], 2.0**-8 * out_abs)
    with pytest.raises(ValueError, match="out_abs"):
        ref.check_decode(out, lse, out, lse, precision="fast")
    with pytest.raises(ValueError, match="precision must be one of"):
        ref.check_decode(out, lse, out, lse, precision="medium", out_abs=out_abs)


def test_decode_wrapper_returns_out_abs():
    rng = np.random.default_rng(22)
    nb, bs = 3, 8
    kv_c, k_pe = _kv(rng, nb * bs)
    cache = ref.pack_kv(kv_c, k_pe, ref.new_kv_cache(nb, bs, "fp8_ds_mla"), np.arange(nb * bs), "fp8_ds_mla")
    q = ref.rand_bf16((2, 1, 3, 576), rng, 0.1)
    idx = rng.integers(-3, nb * bs + 3, (2, 1, 10)).astype(np.int32)
    sink = np.array([0.5, np.inf, -1.0], np.float32)
    out, lse, out_abs = ref.sparse_mla_decode_ref(q, cache, idx, 0.2, "fp8_ds_mla", attn_sink=sink, return_abs=True)
    rows = ref.unpack_kv(cache, np.arange(nb * bs), "fp8_ds_mla")
    want = ref.sparse_mla_attention(q, rows, idx, nb * bs, 0.2, attn_sink=sink, return_abs=True)
    for got, w in zip((out, lse, out_abs), want[:2] + want[3:]):
        np.testing.assert_array_equal(got, w)
    assert (out_abs >= np.abs(out)).all() and (out_abs[:, :, 1] == 0).all()  # sink +inf: 0 as out


def test_assert_bf16_equal():
    a = np.array([0x3F80, 0x7FC0, 0x7F80], np.uint16)
    ref.assert_bf16_equal(a, np.array([0x3F80, 0xFFFF, 0x7F80], np.uint16))
    with pytest.raises(AssertionError, match=r"1 of 3 bf16 values differ; first at \(2,\): actual 0x7f80"):
        ref.assert_bf16_equal(a, np.array([0x3F80, 0x7FC0, 0x7F81], np.uint16))


def test_invalid_index_zoo():
    z = ref.invalid_index_zoo(1000)
    assert z.dtype == np.int32 and 1000 in z and 1001 in z and -2**31 in z and 2**31 - 1 in z
    z = ref.invalid_index_zoo(200000)
    assert 114514 not in z and 1919810 in z
    z = ref.invalid_index_zoo(2**31 - 1)
    assert (z < 0).all() or set(z[z >= 0]) == {2**31 - 1}


def test_rand_bf16():
    rng = np.random.default_rng(12)
    x = ref.rand_bf16((1000,), rng, 3.0)
    assert x.dtype == np.uint16 and 2 < ref.bf16_to_f64(x).std() < 4
