"""smla.pack_kv against the float64 oracle (tests/reference.py), byte for byte, and CUDA against CPU."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
from torch_arrays import to_torch as to_cuda  # noqa: E402

CACHE_DTYPES = ["fp8_ds_mla", "bf16"]
RULES = ["pow2", "fp32"]


def new_cache(num_blocks, block_size, cd, fill=0xAB, layers=1, layer=0):
    """A cache filled with a sentinel; with layers > 1 it is one layer of an interleaved allocation,
    so block_stride > block_size * entry."""
    dt = np.uint8 if cd == "fp8_ds_mla" else np.uint16
    fill = fill if cd == "fp8_ds_mla" else fill * 0x101
    full = np.full((num_blocks, layers) + ref.kv_cache_shape(1, block_size, cd)[1:], fill, dt)
    return full[:, layer]


def varied_tokens(t, rng):
    """bf16 kv_c / k_pe whose rows span many magnitudes (so scales differ per tile)."""
    mag = 2.0 ** rng.integers(-30, 20, size=(t, 4, 1))
    kv_c = ref.bf16_rne((rng.standard_normal((t, 4, 128)) * mag).reshape(t, 512))
    k_pe = ref.rand_bf16((t, 64), rng, 3.0)
    return kv_c, k_pe


def pack_both(kv_c, k_pe, cache, slots, cd, rule):
    expected = cache.copy()
    ref.pack_kv(kv_c, k_pe, expected, slots, cd, rule)
    smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd, scale_rule=rule)
    return expected


def assert_bytes_equal(actual, expected):
    a, e = actual.view(np.uint8), expected.view(np.uint8)
    if not np.array_equal(a, e):
        bad = np.argwhere(a != e)
        i = tuple(int(v) for v in bad[0])
        raise AssertionError(f"{len(bad)} cache bytes differ; first at {i}: 0x{int(a[i]):02x} != 0x{int(e[i]):02x}")


@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_matches_reference(cd, rule, slot_dtype):
    rng = np.random.default_rng(1)
    nb, bs, t = 37, 16, 500
    cache = new_cache(nb, bs, cd, layers=3, layer=1)
    kv_c, k_pe = varied_tokens(t, rng)
    slots = rng.permutation(nb * bs)[:t].astype(slot_dtype)
    # negative slots are skipped (slots past the cache raise: tests/test_data_checks.py)
    slots[::17] = -1
    slots[9::31] = np.iinfo(slot_dtype).min
    expected = pack_both(kv_c, k_pe, cache, slots, cd, rule)
    assert_bytes_equal(cache, expected)


def test_one_hundred_thousand_tokens():
    rng = np.random.default_rng(2)
    nb, bs, t = 1600, 64, 100_000
    cache = new_cache(nb, bs, "fp8_ds_mla", fill=0)
    kv_c, k_pe = varied_tokens(t, rng)
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    expected = pack_both(kv_c, k_pe, cache, slots, "fp8_ds_mla", "pow2")
    assert_bytes_equal(cache, expected)


def entry_of(kv_c_row, k_pe_row=None, rule="pow2"):
    """Pack one token into a 1-slot cache and return its 656 bytes."""
    cache = new_cache(1, 1, "fp8_ds_mla", fill=0)
    k_pe = np.zeros((1, 64), np.uint16) if k_pe_row is None else k_pe_row[None]
    kv_c = np.asarray(kv_c_row, np.uint16)[None]
    expected = pack_both(kv_c, k_pe, cache, np.zeros(1, np.int32), "fp8_ds_mla", rule)
    assert_bytes_equal(cache, expected)
    return cache[0, 0]


def scales(entry):
    return entry[512:528].copy().view("<f4")


def bf16(vals):
    return ref.bf16_rne(np.asarray(vals, np.float32))


def test_pow2_zero_tile_and_336():
    x = np.zeros(512, np.float32)
    x[128:256] = 1.0
    x[130] = -336.0  # tile 1: amax 336 -> 336/448 = 0.75 -> 1.0
    x[256:384] = 1e-30  # tile 2: below the 1e-4 floor -> 2^-13
    e = entry_of(bf16(x))
    s = scales(e)
    assert s[0] == 2.0**-13 and s[2] == 2.0**-13
    assert s[1] == 1.0
    assert s[3] == 2.0**-13
    assert e[130] == 0xFA  # -336 = -1.3125 * 2^8: sign | exponent field 15 | mantissa 010
    assert (np.delete(e[128:256], 2) == 0x38).all()  # 1.0 / 1.0
    assert not e[:128].any() and not e[384:512].any()


def test_pow2_336_byte():
    x = np.zeros(512, np.float32)
    x[0] = 336.0
    e = entry_of(bf16(x))
    assert scales(e)[0] == 1.0
    assert e[0] == 0x7A  # 336 = 1.3125 * 2^8: exponent field 15, mantissa 010
    # the vLLM writer test case: tiles 336, 336, 336 and zeros -> [1, 1, 1, 2^-13]
    x = np.zeros(512, np.float32)
    x[0], x[128], x[256] = 336.0, -336.0, 336.0
    assert list(scales(entry_of(bf16(x)))) == [1.0, 1.0, 1.0, 2.0**-13]


def test_signed_zero_and_legacy_floor():
    x = np.full(512, -0.0, np.float32)
    x[256:] = 0.0
    for rule, floor in [("pow2", 2.0**-13), ("fp32", float(ref.FLT_MIN))]:
        e = entry_of(bf16(x), rule=rule)
        assert (e[:256] == 0x80).all() and (e[256:512] == 0x00).all()
        assert (scales(e) == np.float32(floor)).all()


@pytest.mark.parametrize("rule", RULES)
def test_saturation_never_nan(rule):
    """Finite inputs never give an fp8 NaN byte; under the fp32 rule x/s can round a hair above 448
    and must saturate to 0x7E / 0xFE (the amax element always lands there)."""
    rng = np.random.default_rng(3)
    t = 2000
    kv_c, k_pe = varied_tokens(t, rng)
    cache = new_cache(t, 1, "fp8_ds_mla", fill=0)
    expected = pack_both(kv_c, k_pe, cache, np.arange(t, dtype=np.int32), "fp8_ds_mla", rule)
    assert_bytes_equal(cache, expected)
    nope = cache[:, 0, :512]
    assert not ((nope & 0x7F) == 0x7F).any()
    x = ref.bf16_to_f32(kv_c).reshape(t, 4, 128)
    amax_pos = np.abs(x).argmax(axis=2)
    top = np.take_along_axis(nope.reshape(t, 4, 128), amax_pos[..., None], 2)[..., 0]
    if rule == "fp32":
        assert ((top & 0x7F) == 0x7E).all()
    else:
        assert ((top & 0x7F) <= 0x7E).all()


def test_nan_and_inf_elements():
    x = np.linspace(-3, 3, 512).astype(np.float32)
    clean = entry_of(bf16(x))
    x_nan = x.copy()
    x_nan[5], x_nan[6] = np.nan, -np.nan  # tile 0
    x_nan[300] = np.inf  # tile 2
    x_nan[400] = -np.inf  # tile 3
    bits = bf16(x_nan)
    bits[6] |= 0x8000  # negative NaN
    e = entry_of(bits)
    s, s_clean = scales(e), scales(clean)
    assert s[0] == s_clean[0]  # NaN does not enter amax
    assert (e[5] & 0x7F) == 0x7F and (e[6] & 0x7F) == 0x7F
    assert np.isinf(s[2]) and np.isinf(s[3]) and s[1] == s_clean[1]
    assert (e[300] & 0x7F) == 0x7F and (e[400] & 0x7F) == 0x7F  # Inf / Inf = NaN
    finite = np.r_[256:300, 301:400, 401:512]
    assert np.isin(e[finite], [0x00, 0x80]).all()  # finite / Inf = +-0
    for rule in RULES:
        entry_of(bits, rule=rule)  # both rules match the oracle byte for byte (checked inside)


def test_rope_is_copied_bit_for_bit():
    rng = np.random.default_rng(4)
    k_pe = rng.integers(0, 2**16, 64, dtype=np.uint16)  # any bits, NaN payloads included
    e = entry_of(bf16(np.ones(512)), k_pe)
    assert np.array_equal(e[528:].view("<u2"), k_pe)


@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_negative_slots_leave_cache_untouched(cd):
    """Negative slots are padding (slots past the cache raise: tests/test_data_checks.py)."""
    rng = np.random.default_rng(5)
    nb, bs = 4, 8
    cache = new_cache(nb, bs, cd)
    before = cache.copy()
    kv_c, k_pe = varied_tokens(6, rng)
    slots = np.array([-1, -2, -(2**31), -(nb * bs), -(nb * bs + 1), -(2**31 - 1)], np.int32)
    smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
    assert_bytes_equal(cache, before)
    slots64 = np.array([-1, -(2**63), -(nb * bs), -(2**40), -(2**63 - 1), -(2**32)], np.int64)
    smla.pack_kv(kv_c, k_pe, cache, slots64, kv_cache_dtype=cd)
    assert_bytes_equal(cache, before)


def test_inputs_longer_than_slot_mapping_and_ml_dtypes():
    """vLLM rule: slot_mapping sets T (inputs may be padded); bf16 data as ml_dtypes arrays, the
    bf16 cache as bfloat16, the fp8 cache as float8_e4m3fn, k_pe as vLLM's [T, 1, 64]."""
    rng = np.random.default_rng(6)
    kv_c, k_pe = varied_tokens(10, rng)
    slots = np.array([3, 1, -1, 0], np.int32)
    for cd, cdt in [("bf16", ml_dtypes.bfloat16), ("fp8_ds_mla", ml_dtypes.float8_e4m3fn)]:
        cache = new_cache(2, 2, cd)
        expected = cache.copy()
        ref.pack_kv(kv_c, k_pe, expected, slots, cd, "pow2")
        typed = cache.view(cdt)
        smla.pack_kv(kv_c.view(ml_dtypes.bfloat16), k_pe.view(ml_dtypes.bfloat16)[:, None, :], typed, slots,
                     kv_cache_dtype=cd)
        assert_bytes_equal(cache, expected)


def test_strided_inputs():
    rng = np.random.default_rng(7)
    big_c = ref.rand_bf16((20, 600), rng)
    big_p = ref.rand_bf16((20, 80), rng)
    kv_c, k_pe = big_c[::2, :512], big_p[::2, 8:72]
    cache = new_cache(4, 4, "fp8_ds_mla")
    slots = np.arange(10, dtype=np.int64)
    expected = pack_both(kv_c, k_pe, cache, slots, "fp8_ds_mla", "pow2")
    assert_bytes_equal(cache, expected)


def test_bad_arguments():
    cache = new_cache(2, 2, "fp8_ds_mla")
    kv_c, k_pe = np.zeros((2, 512), np.uint16), np.zeros((2, 64), np.uint16)
    slots = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match=r"^scale_rule: "):
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla", scale_rule="e8m0")
    with pytest.raises(ValueError, match=r"^kv_cache_dtype: "):
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="int4")
    with pytest.raises(TypeError, match=r"^kv_c: "):
        smla.pack_kv(kv_c.astype(np.float32), k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla")
    # token counts that disagree: either argument may lead the message, both are named
    with pytest.raises(ValueError, match=r"^(slot_mapping|kv_c): .*\b(kv_c|slot_mapping)\b"):
        smla.pack_kv(kv_c[:1], k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla")


# ---------------------------------------------------------------- every CPU path, every e4m3 case

ISA_LEVELS = ["portable", "avx2", "avx512", "avx512bf16"]  # SMLA_CPU_ISA, csrc/cpu/cpu_features.h


@pytest.fixture(params=ISA_LEVELS)
def isa(request, monkeypatch):
    """Each level this CPU has, forced (the binding reads SMLA_CPU_ISA at every call; a level the CPU
    lacks runs the best one below it, which build_info() names). Shared with
    test_convert_topk_indices.py."""
    monkeypatch.setenv("SMLA_CPU_ISA", request.param)
    if smla.build_info()["cpu_isa"] != request.param:
        pytest.skip(f"this CPU has no {request.param} level")
    return request.param


def every_magnitude_tiles(k, rng):
    """Tiles (uint16 bf16 bits, [n, 128]) whose pow2 scale is 2^k: element 0 is 448 * 2^k (amax / 448 =
    2^k exactly; for k = 120, past bf16's range, the largest bf16), the other 127 run through every bf16
    magnitude up to it, in order, with random signs, so that some tiles hold only values the bf16-lane
    encoder takes (|x| >= 2^(k-6)) and some straddle the e4m3 subnormal range (fp32 lanes); then the
    magnitudes from 2^(k-6) up again, so that each of those is in a bf16-lane tile once. Every
    fourth tile also gets a +0.0 or -0.0 at a random place (zeros do not leave the bf16 lanes)."""
    amax = 0x7F7F if k == 120 else int(bf16(448.0 * 2.0**k)[()])
    low = (121 + k) << 7  # 2^(k-6): a second run starts here, so that no value above it shares a tile with one below
    mags = np.r_[np.arange(0, amax + 1), np.arange(low, amax + 1)].astype(np.uint16)
    n = -(-mags.size // 127)
    body = np.resize(mags, n * 127).reshape(n, 127)
    body |= (rng.random(body.shape) < 0.5).astype(np.uint16) << 15
    tiles = np.concatenate([np.full((n, 1), amax, np.uint16), body], axis=1)
    z = np.arange(0, n, 4)
    tiles[z, rng.integers(1, 128, z.size)] = rng.choice(np.array([0, 0x8000], np.uint16), z.size)
    return tiles


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("threads", ["1", "2"])
def test_every_bf16_value_at_every_pow2_scale(isa, rule, threads, monkeypatch):
    """Every bf16 magnitude below 448 * 2^k, both signs, for every power-of-two scale 2^k a tile can
    get (k = -13 .. 120; under the fp32 rule the same tiles also have scale 2^k), byte for byte against
    the oracle: every round-to-nearest-even tie of e4m3, every subnormal result, the 448 edge."""
    monkeypatch.setenv("SMLA_NUM_THREADS", threads)
    rng = np.random.default_rng(11)
    tiles = np.concatenate([every_magnitude_tiles(k, rng) for k in range(-13, 121)])
    tiles = np.resize(tiles, (-(-tiles.shape[0] // 4) * 4, 128))  # whole tokens
    kv_c = tiles.reshape(-1, 512)
    t = kv_c.shape[0]
    k_pe = ref.rand_bf16((t, 64), rng)
    cache = new_cache(-(-t // 64), 64, "fp8_ds_mla")
    slots = rng.permutation(cache.shape[0] * 64)[:t].astype(np.int64)
    expected = pack_both(kv_c, k_pe, cache, slots, "fp8_ds_mla", rule)
    assert_bytes_equal(cache, expected)


# corner values as bf16 bits: NaNs (quiet, signalling payloads, both signs), +-Inf, +-0, bf16 subnormals,
# the largest finite, 448 and its neighbours, e4m3 ties around 1 (1.0625 = 1 + 1/16 ties to 1, 1.1875
# ties to 1.25), the smallest e4m3 subnormal's half (a tie to 0) and just above it
CORNERS = np.array([0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0x7FA5, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001,
                    0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x43E0, 0xC3E0, 0x43DF, 0x43E1, 0x3F88, 0xBF98,
                    0x3A80, 0x3A81, 0xBA81, 0x3B00], np.uint16)


@pytest.mark.parametrize("rule", RULES)
def test_corner_values_in_every_tile_position(isa, rule):
    """Each corner value alone in a tile of zeros, next to 1.0, and next to a large value (its tile's
    scale decides what it becomes), at every position of a vector and of the tile: NaN -> 0x7F | sign,
    Inf -> scale Inf and NaN bytes, -0.0 -> 0x80, saturation, ties, subnormals."""
    rng = np.random.default_rng(12)
    rows = []
    for v in CORNERS:
        for fill in (0x0000, 0x3F80, 0x4700):  # 0, 1.0, 32768
            for pos in (0, 1, 7, 8, 15, 16, 31, 63, 127):
                tile = np.full(128, fill, np.uint16)
                tile[(pos + 1) % 128] ^= 0x8000  # a negative neighbour
                tile[pos] = v
                rows.append(tile)
    tiles = np.array(rows)
    tiles = np.resize(tiles, (-(-tiles.shape[0] // 4) * 4, 128))
    kv_c = tiles.reshape(-1, 512)
    t = kv_c.shape[0]
    cache = new_cache(t, 1, "fp8_ds_mla", fill=0x5A)
    expected = pack_both(kv_c, ref.rand_bf16((t, 64), rng), cache, np.arange(t, dtype=np.int32), "fp8_ds_mla",
                         rule)
    assert_bytes_equal(cache, expected)


@pytest.mark.parametrize("rule", RULES)
def test_scale_boundaries_and_all_zero_tiles(isa, rule):
    """amax exactly 448 * 2^k (scale 2^k) and one bf16 step above (scale 2^(k+1)), amax at the 1e-4
    floor, all-zero and all -0.0 tiles, tiles of bf16 subnormals, and negative slots (skipped) mixed
    with real ones."""
    rng = np.random.default_rng(13)
    rows = []
    for k in range(-20, 121):
        for amax in (448.0 * 2.0**k, 450.0 * 2.0**k, 1e-4 * 448.0):
            tile = ref.bf16_rne(rng.standard_normal(128) * min(amax, 3e38) / 4)
            tile[rng.integers(128)] = bf16(min(amax, 3.3e38))[()]
            rows.append(tile)
    rows += [np.zeros(128, np.uint16), np.full(128, 0x8000, np.uint16),
             rng.integers(0, 0x80, 128).astype(np.uint16) | (rng.integers(0, 2, 128) << 15).astype(np.uint16)]
    tiles = np.resize(np.array(rows, np.uint16), (-(-len(rows) // 4) * 4, 128))
    kv_c = tiles.reshape(-1, 512)
    t = kv_c.shape[0]
    nb, bs = -(-t // 16) + 1, 16
    cache = new_cache(nb, bs, "fp8_ds_mla", fill=0x33)
    slots = rng.permutation(nb * bs)[:t].astype(np.int32)
    slots[::5] = -1
    expected = pack_both(kv_c, ref.rand_bf16((t, 64), rng), cache, slots, "fp8_ds_mla", rule)
    assert_bytes_equal(cache, expected)


@pytest.mark.parametrize("threads", ["1", "2", "3", "8"])
def test_duplicate_slots_last_wins_on_every_team(isa, threads, monkeypatch):
    """Tokens spread over slot classes per thread: of tokens that share a slot the last one wins on any
    team size (more threads than cores included), for both cache dtypes."""
    monkeypatch.setenv("SMLA_NUM_THREADS", threads)
    rng = np.random.default_rng(14)
    nb, bs, t = 20, 16, 1500
    kv_c, k_pe = varied_tokens(t, rng)
    slots = rng.integers(-3, nb * bs, t).astype(np.int64)  # many duplicates
    for cd in CACHE_DTYPES:
        cache = new_cache(nb, bs, cd)
        expected = pack_both(kv_c, k_pe, cache, slots, cd, "pow2")
        assert_bytes_equal(cache, expected)


# ---------------------------------------------------------------- CUDA twin, bit for bit

def from_cuda(t, like):
    import torch

    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.cpu().numpy().view(like.dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("rule", RULES)
def test_cuda_matches_cpu(cd, rule):
    rng = np.random.default_rng(8)
    nb, bs, t = 300, 64, 12_000
    kv_c, k_pe = varied_tokens(t, rng)
    kv_c[3, 7], kv_c[4, 9], kv_c[5, 200] = 0x7FC0, 0x7F80, 0xFF80  # NaN, +Inf, -Inf
    kv_c[6, :128] = 0x8000  # a -0.0 tile
    kv_c[7, 128:256] = 0x7FC0  # a tile of NaNs only: amax 0, as fmaxf over NaNs gives
    kv_c[8, 256:384] = np.where(np.arange(128) % 2, 0xFFC1, 0x8000)  # NaNs (payload, negative) and -0.0
    kv_c[9, 384:512] = np.where(np.arange(128) == 77, 0x7F80, 0x7FC0)  # NaNs and one Inf
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    slots[::97] = -1
    slots[1::89] = nb * bs + 5  # skipped on the GPU; the CPU raises, so it gets -1 there
    cpu = new_cache(nb, bs, cd, layers=2, layer=1)
    gpu = to_cuda(cpu.base if cpu.base is not None else cpu)[:, 1]  # the same interleaved layout
    smla.pack_kv(kv_c, k_pe, cpu, np.where(slots >= nb * bs, -1, slots), kv_cache_dtype=cd, scale_rule=rule)
    smla.pack_kv(to_cuda(kv_c), to_cuda(k_pe), gpu, to_cuda(slots), kv_cache_dtype=cd, scale_rule=rule)
    ref.assert_cache_equal(from_cuda(gpu, cpu), np.ascontiguousarray(cpu), cd)
