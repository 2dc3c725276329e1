"""smla.unpack_kv against the float64 oracle (tests/reference.py), bit for bit, and CUDA against CPU."""
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


def random_cache(nb, bs, cd, rng, layers=1):
    """Arbitrary bytes (every e4m3 code, NaN payloads, any bf16); fp8 scales drawn from a zoo of
    powers of two, arbitrary fp32, FLT_MIN, subnormals, 0, Inf and NaN."""
    shape = (nb, layers) + ref.kv_cache_shape(1, bs, cd)[1:]
    if cd == "bf16":
        return rng.integers(0, 2**16, shape, dtype=np.uint16)[:, 0]
    full = rng.integers(0, 256, shape, dtype=np.uint8)
    n = nb * layers * bs * 4
    zoo = np.array([1.0, 2.0**-13, 2.0**-20, 0.75, 3.1e-3, ref.FLT_MIN, 1e-40, 0.0, np.inf, np.nan, 1e30],
                   np.float32)
    s = np.where(rng.random(n) < 0.5, zoo[rng.integers(0, len(zoo), n)],
                 (2.0 ** rng.integers(-20, 10, n)).astype(np.float32) * rng.uniform(0.5, 2, n).astype(np.float32))
    full[..., 512:528] = s.astype("<f4").view(np.uint8).reshape(nb, layers, bs, 16)
    return full[:, 0]


@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_matches_reference(cd, slot_dtype):
    rng = np.random.default_rng(11)
    nb, bs = 23, 32
    cache = random_cache(nb, bs, cd, rng, layers=2)
    slots = rng.integers(-5, nb * bs + 5, 3000).astype(slot_dtype)
    zoo = ref.invalid_index_zoo(nb * bs)
    slots[: len(zoo)] = zoo
    if slot_dtype == np.int64:
        slots[len(zoo):len(zoo) + 3] = [-(2**63), 2**63 - 1, 2**40]
    out = smla.unpack_kv(cache, slots, kv_cache_dtype=cd)
    assert out.shape == (3000, 576) and out.dtype == ml_dtypes.bfloat16
    expected = ref.unpack_kv(cache, slots, cd)
    ref.assert_bf16_equal(out, expected)  # NaN bit patterns are no contract: any NaN equals any NaN
    invalid = (slots < 0) | (slots >= nb * bs)
    assert invalid.sum() >= len(zoo) and not out.view(np.uint16)[invalid].any()


@pytest.mark.parametrize("rule", ["pow2", "fp32"])
def test_roundtrip_after_pack(rule):
    """pack then unpack: rope exact; with pow2 scales the dequant is exact, so the latent values are
    exactly the e4m3 grid times the scale."""
    rng = np.random.default_rng(12)
    t = 256
    kv_c = ref.rand_bf16((t, 512), rng, 5.0)
    k_pe = ref.rand_bf16((t, 64), rng)
    cache = np.zeros(smla.kv_cache_shape(8, 32, "fp8_ds_mla"), np.uint8)
    slots = rng.permutation(t).astype(np.int32)
    smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla", scale_rule=rule)
    out = smla.unpack_kv(cache, slots, kv_cache_dtype="fp8_ds_mla").view(np.uint16)
    assert np.array_equal(out[:, 512:], k_pe)
    ent = cache.reshape(-1, 656)[slots]
    exact = ref.e4m3fn_decode(ent[:, :512]).astype(np.float64) * np.repeat(ref.fp8_entry_scales(ent), 128, 1)
    if rule == "pow2":
        assert np.array_equal(ref.bf16_to_f64(out[:, :512]), exact)
    np.testing.assert_allclose(ref.bf16_to_f64(out[:, :512]), ref.bf16_to_f64(kv_c), rtol=2**-3, atol=1e-2)


def test_out_buffer_strided_and_zero_rows():
    rng = np.random.default_rng(13)
    cache = random_cache(4, 4, "fp8_ds_mla", rng)
    big = np.full((10, 600), 0x1234, np.uint16)
    out = big[::2, 8:584]
    slots = np.array([0, -1, 15, 16, 3], np.int64)
    res = smla.unpack_kv(cache, slots, kv_cache_dtype="fp8_ds_mla", out=out)
    assert res is out
    ref.assert_bf16_equal(out, ref.unpack_kv(cache, slots, "fp8_ds_mla"))
    assert not out[1].any() and not out[3].any()
    assert (big[1::2] == 0x1234).all() and (big[:, :8] == 0x1234).all() and (big[:, 584:] == 0x1234).all()


@pytest.mark.parametrize("cd", CACHE_DTYPES)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("num_blocks", [2, 0])
def test_no_slots(cd, slot_dtype, num_blocks):
    """No slot (also from an empty cache): an empty bf16 [0, 576] result; a given out= (a zero-length
    view of a larger buffer) comes back as-is and nothing of the buffer is written."""
    cache = random_cache(max(num_blocks, 1), 4, cd, np.random.default_rng(14))[:num_blocks]
    slots = np.zeros(0, slot_dtype)
    out = smla.unpack_kv(cache, slots, kv_cache_dtype=cd)
    assert out.shape == (0, 576) and out.dtype == ml_dtypes.bfloat16
    big = np.full((3, 576), 0x1234, np.uint16)
    for view in (big[:0], big[1:1], big[2:2]):
        assert view.size == 0
        assert smla.unpack_kv(cache, slots, kv_cache_dtype=cd, out=view) is view
    assert (big == 0x1234).all()


def test_ml_dtypes_caches():
    rng = np.random.default_rng(14)
    cache = random_cache(2, 4, "bf16", rng)
    slots = np.array([7, 0, -1], np.int64)
    a = smla.unpack_kv(cache.view(ml_dtypes.bfloat16), slots, kv_cache_dtype="bf16")
    ref.assert_bf16_equal(a, ref.unpack_kv(cache, slots, "bf16"))
    c8 = random_cache(2, 4, "fp8_ds_mla", rng)
    slots = np.arange(8, dtype=np.int32)
    a = smla.unpack_kv(c8.view(ml_dtypes.float8_e4m3fn), slots, kv_cache_dtype="fp8_ds_mla")
    ref.assert_bf16_equal(a, ref.unpack_kv(c8, slots, "fp8_ds_mla"))


# ---------------------------------------------------------------- CUDA twin, bit for bit

@pytest.mark.cuda
@pytest.mark.parametrize("cd", CACHE_DTYPES)
def test_cuda_matches_cpu(cd):
    import torch

    rng = np.random.default_rng(15)
    nb, bs = 200, 64
    cache = random_cache(nb, bs, cd, rng, layers=2)
    full = cache.base
    gpu_cache = to_cuda(full)[:, 0]
    slots = rng.integers(-100, nb * bs + 100, 20_000).astype(np.int32)
    slots[:9] = ref.invalid_index_zoo(nb * bs)
    cpu = smla.unpack_kv(cache, slots, kv_cache_dtype=cd)
    gpu = smla.unpack_kv(gpu_cache, to_cuda(slots), kv_cache_dtype=cd)
    torch.cuda.synchronize()
    ref.assert_bf16_equal(gpu.view(torch.int16).cpu().numpy().view(np.uint16), cpu)
