"""Every CUDA memory op (pack_kv, unpack_kv, gather_upconvert, convert_topk_indices /
filter_convert_dcp_indices, merge_attn_states) against its CPU twin, bit for bit (any NaN equals any
NaN: NaN bit patterns are no contract): regular, irregular and invalid-value grids, the large cases
of the issue (1e6 tokens packed, 4096 x 2048 indices, a 128K-token gather), torch and CuPy inputs,
strided caches (stride(0) > block_size * entry), the narrow-access fallbacks, a side stream, and one
CUDA graph capture + replay of each op."""
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402

pytestmark = pytest.mark.cuda

CDS = ["fp8_ds_mla", "bf16"]
RULES = ["pow2", "fp32"]
LIBS = ["torch", "cupy"]
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
SENTINEL16 = 0x5A5A
BF16 = ml_dtypes.bfloat16


# ------------------------------------------------------------------------------------------ helpers

def need(lib):
    return pytest.importorskip("cupy" if lib == "cupy" else "torch")


def dev(a, lib="torch"):
    """A device copy of a NumPy array; bf16 bits (uint16 / ml_dtypes.bfloat16) become torch.bfloat16
    (CuPy has no bf16: it gets the uint16 bits, which smla accepts where the layout is what matters)."""
    a = np.ascontiguousarray(a)
    bf = a.dtype in (np.uint16, np.dtype(BF16))
    if lib == "cupy":
        import cupy

        return cupy.asarray(a.view(np.uint16) if bf else a)
    import torch

    if bf:
        return torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(a).cuda()


def host(x):
    """NumPy copy of a device array; bf16 comes back as uint16 bits."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy.asnumpy(x)
    import torch

    torch.cuda.synchronize()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).cpu().numpy().view(np.uint16)
    return x.cpu().numpy()


def assert_float_bits_equal(actual, expected, name):
    """Bit equality of float16 / float32 arrays except that any NaN equals any NaN."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape and a.dtype == e.dtype, f"{name}: {a.shape} {a.dtype} vs {e.shape} {e.dtype}"
    ib = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    bad = (nan_a != nan_e) | (~nan_a & (a.view(ib) != e.view(ib)))
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} of {a.size} differ; first at {i}: {a[i]!r} vs {e[i]!r}")


def random_cache(nb, bs, cd, rng, layers=1):
    """Arbitrary entries (every e4m3 code, any bf16), fp8 scales from a zoo of powers of two,
    arbitrary fp32, FLT_MIN, subnormals, 0, Inf and NaN. Returns the full [nb, layers, bs, entry]
    allocation; layer l of it is a cache with stride(0) = layers * block_size * entry."""
    shape = (nb, layers) + ref.kv_cache_shape(1, bs, cd)[1:]
    if cd == "bf16":
        return rng.integers(0, 2**16, shape, dtype=np.uint16)
    full = rng.integers(0, 256, shape, dtype=np.uint8)
    n = nb * layers * bs * 4
    zoo = np.array([1.0, 2.0**-13, 2.0**-20, 0.75, 3.1e-3, ref.FLT_MIN, 1e-40, 0.0, np.inf, np.nan, 1e30],
                   np.float32)
    s = np.where(rng.random(n) < 0.3, zoo[rng.integers(0, len(zoo), n)],
                 (2.0 ** rng.integers(-20, 10, n)).astype(np.float32) * rng.uniform(0.5, 2, n).astype(np.float32))
    full[..., 512:528] = s.astype("<f4").view(np.uint8).reshape(nb, layers, bs, 16)
    return full


def varied_tokens(t, rng):
    """kv_c whose 128-value tiles span many magnitudes, with NaN, +-Inf, -0.0 tiles, tiny values
    (fp8 subnormal range) and saturating ratios sprinkled in; k_pe arbitrary bf16 bits."""
    mag = 2.0 ** rng.integers(-40, 30, size=(t, 4, 1))
    kv_c = ref.bf16_rne((rng.standard_normal((t, 4, 128)) * mag).reshape(t, 512))
    if t > 8:
        kv_c[1, 5] = 0x7FC0          # NaN: ignored by amax
        kv_c[2, 130] = 0x7F80        # +Inf: tile scale Inf
        kv_c[3, 300] = 0xFF80        # -Inf
        kv_c[4, :128] = 0x8000       # -0.0 tile
        kv_c[5, 128:256] = 0         # zero tile: 2^-13 (pow2) / FLT_MIN (fp32)
        kv_c[6, 256:384] = 0xFFC1    # all-NaN tile
        kv_c[7, 384:512] = ref.bf16_rne(np.full(128, 336.0))
        kv_c[8, :128] = ref.bf16_rne(np.linspace(-1e-30, 1e-30, 128))
    k_pe = rng.integers(0, 2**16, (t, 64), dtype=np.uint16)
    return kv_c, k_pe


# ---------------------------------------------------------------------------------------- pack_kv

def check_pack(kv_c, k_pe, slots, nb, bs, cd, rule, lib="torch", layers=2, layer=1, rng=None, sentinel=False):
    rng = rng or np.random.default_rng(0)
    if sentinel:
        shape = (nb, layers) + ref.kv_cache_shape(1, bs, cd)[1:]
        full = np.full(shape, 0xA5, np.uint8) if cd == "fp8_ds_mla" else np.full(shape, SENTINEL16, np.uint16)
    else:
        full = random_cache(nb, bs, cd, rng, layers)
    g_full = dev(full, lib)
    cpu = full[:, layer]
    # the GPU skips slots past the cache, where the CPU raises: -1 (skipped) gives the CPU the same job
    smla.pack_kv(kv_c, k_pe, cpu, np.where(slots >= nb * bs, -1, slots), kv_cache_dtype=cd, scale_rule=rule)
    smla.pack_kv(dev(kv_c, lib), dev(k_pe, lib), g_full[:, layer], dev(slots, lib), kv_cache_dtype=cd,
                 scale_rule=rule)
    got = host(g_full)
    for l in range(layers):  # the other layers of the interleaved allocation are untouched
        ref.assert_cache_equal(got[:, l], full[:, l], cd, name=f"layer {l}")


@pytest.mark.parametrize("cd", CDS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("nb,bs,t", [(300, 64, 12_000), (7, 17, 100), (40, 1, 33), (1, 16, 1)])
def test_pack_kv(cd, rule, slot_dtype, nb, bs, t):
    rng = np.random.default_rng(100 + t)
    kv_c, k_pe = varied_tokens(t, rng)
    cap = nb * bs
    slots = rng.permutation(max(cap, t))[:t].astype(slot_dtype)  # distinct; some beyond the cache
    slots[::7] = -1
    if t > 20:
        zoo = ref.invalid_index_zoo(cap).astype(slot_dtype)
        slots[1:1 + len(zoo)] = zoo
        if slot_dtype == np.int64:
            slots[-3:] = [-(2**63), 2**63 - 1, 2**40]
    check_pack(kv_c, k_pe, slots, nb, bs, cd, rule, rng=rng)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("cd", CDS)
def test_pack_kv_libs_and_slices(lib, cd):
    """kv_c / k_pe as slices of one wider activation (k_pe only 4-byte aligned: the narrow rope path),
    tokens beyond slot_mapping ignored."""
    need(lib)
    rng = np.random.default_rng(7)
    t = 500
    kv_c, k_pe = varied_tokens(t + 20, rng)
    wide = np.zeros((t + 20, 512 + 2 + 64 + 6), np.uint16)
    wide[:, :512] = kv_c
    wide[:, 514:578] = k_pe
    slots = rng.permutation(2000)[:t].astype(np.int64)
    full = random_cache(40, 50, cd, rng, 1)
    cpu = full[:, 0]
    smla.pack_kv(wide[:, :512], wide[:, 514:578], cpu, slots, kv_cache_dtype=cd)
    g_wide = dev(wide, lib)
    g_full = dev(full, lib)
    smla.pack_kv(g_wide[:, :512], g_wide[:, 514:578], g_full[:, 0], dev(slots, lib), kv_cache_dtype=cd)
    ref.assert_cache_equal(host(g_full)[:, 0], cpu, cd)


@pytest.mark.parametrize("cd", CDS)
def test_pack_kv_byte_fallback(cd):
    """Caches whose only block has an odd stride, or whose blocks hold one entry at an odd entry
    stride, pass the binding's alignment check (size-1 dims) and take the byte-wise path."""
    import torch

    rng = np.random.default_rng(8)
    e = 656 if cd == "fp8_ds_mla" else 576
    kv_c, k_pe = varied_tokens(40, rng)
    for nb, bs, s0, s1 in [(1, 40, 40 * e + 3, e), (40, 1, 16 * (e // 8 + 2), e + 1)]:
        n = (nb - 1) * s0 + (bs - 1) * s1 + e
        flat = rng.integers(0, 256 if cd == "fp8_ds_mla" else 2**16, n + 64,
                            dtype=np.uint8 if cd == "fp8_ds_mla" else np.uint16)
        cpu = np.lib.stride_tricks.as_strided(flat, (nb, bs, e), (s0 * flat.itemsize, s1 * flat.itemsize, flat.itemsize))
        g_flat = dev(flat)
        gpu = torch.as_strided(g_flat, (nb, bs, e), (s0, s1, 1))
        slots = rng.permutation(40).astype(np.int32)
        slots[3] = -1
        smla.pack_kv(kv_c, k_pe, cpu, slots, kv_cache_dtype=cd)
        smla.pack_kv(dev(kv_c), dev(k_pe), gpu, dev(slots), kv_cache_dtype=cd)
        got = host(g_flat)
        ref.assert_cache_equal(host(gpu.contiguous()), np.ascontiguousarray(cpu), cd)
        # bytes between entries (the padding of the odd strides) are untouched
        mask = np.ones(n + 64, bool)
        for b in range(nb):
            for o in range(bs):
                mask[b * s0 + o * s1: b * s0 + o * s1 + e] = False
        assert np.array_equal(got[mask], flat[mask])


@pytest.mark.slow
@pytest.mark.parametrize("cd", CDS)
def test_pack_kv_one_million_tokens(cd):
    rng = np.random.default_rng(9)
    t, bs = 1_000_000, 64
    nb = (t + 4096) // bs + 1
    base_c, base_pe = varied_tokens(8192, rng)  # rows repeat: cheap to make, specials included
    pick = rng.integers(0, 8192, t)
    kv_c, k_pe = base_c[pick], base_pe[pick]
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    slots[::1001] = -1
    check_pack(kv_c, k_pe, slots, nb, bs, cd, "pow2", layers=1, layer=0, rng=rng, sentinel=True)


def test_pack_kv_no_tokens():
    cache = dev(np.zeros((2, 4, 656), np.uint8))
    smla.pack_kv(dev(np.zeros((0, 512), np.uint16)), dev(np.zeros((0, 64), np.uint16)), cache,
                 dev(np.zeros(0, np.int32)), kv_cache_dtype="fp8_ds_mla")
    assert not host(cache).any()


# -------------------------------------------------------------------------------------- unpack_kv

@pytest.mark.parametrize("cd", CDS)
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("nb,bs,n", [(200, 64, 20_000), (9, 5, 77), (3, 1, 1)])
def test_unpack_kv(cd, lib, slot_dtype, nb, bs, n):
    need(lib)
    rng = np.random.default_rng(200 + n)
    full = random_cache(nb, bs, cd, rng, layers=2)
    slots = rng.integers(-50, nb * bs + 50, n).astype(slot_dtype)
    if n > 20:
        zoo = ref.invalid_index_zoo(nb * bs).astype(slot_dtype)
        slots[: len(zoo)] = zoo
        if slot_dtype == np.int64:
            slots[len(zoo):len(zoo) + 3] = [-(2**63), 2**63 - 1, 2**40]
    cpu = smla.unpack_kv(full[:, 1], slots, kv_cache_dtype=cd)
    big = dev(np.full((n, 600), SENTINEL16, np.uint16), lib)  # out rows strided (1200 B)
    out = big[:, 8:584]
    res = smla.unpack_kv(dev(full, lib)[:, 1], dev(slots, lib), kv_cache_dtype=cd, out=out)
    assert res is out
    got = host(big)
    ref.assert_bf16_equal(got[:, 8:584], cpu)
    assert (got[:, :8] == SENTINEL16).all() and (got[:, 584:] == SENTINEL16).all()


@pytest.mark.parametrize("cd", CDS)
def test_unpack_kv_large_and_fallback(cd):
    import torch

    rng = np.random.default_rng(21)
    full = random_cache(2048, 64, cd, rng)
    slots = rng.integers(-10, 2048 * 64 + 10, 300_000).astype(np.int32)
    cpu = smla.unpack_kv(full[:, 0], slots, kv_cache_dtype=cd)
    ref.assert_bf16_equal(host(smla.unpack_kv(dev(full)[:, 0], dev(slots), kv_cache_dtype=cd)), cpu)
    # one block at an odd block stride: byte-wise cache reads; one output row: any row stride
    e = 656 if cd == "fp8_ds_mla" else 576
    flat = full.reshape(-1)[: 64 * e + 5].copy()
    cpu_c = np.lib.stride_tricks.as_strided(flat, (1, 64, e), ((64 * e + 5) * flat.itemsize, e * flat.itemsize,
                                                               flat.itemsize))
    g_c = torch.as_strided(dev(flat), (1, 64, e), (64 * e + 5, e, 1))
    s = np.array([63], np.int64)
    out = dev(np.zeros((1, 580), np.uint16))[:, :576]
    smla.unpack_kv(g_c, dev(s), kv_cache_dtype=cd, out=out)
    ref.assert_bf16_equal(host(out.contiguous()), smla.unpack_kv(cpu_c, s, kv_cache_dtype=cd))


# -------------------------------------------------------------------------------- gather_upconvert

def check_gather(full, layer, cd, w, bt, lens, starts, seq_starts=None, lib="torch", bt_pad=0, ws_pad=0,
                 oracle=False):
    """CPU (or, with oracle, for requests the CPU rejects: the oracle, the GPU's documented skipped /
    zero rows) and CUDA into a sentinel-filled workspace; block table and workspace optionally strided."""
    cache = full[:, layer]
    bt_full = np.full((bt.shape[0], bt.shape[1] + bt_pad), -7, np.int32)
    bt_full[:, : bt.shape[1]] = bt
    ws_full = np.full((w, 576 + ws_pad), SENTINEL16, np.uint16)
    ws = ws_full[:, :576]
    if oracle:
        ref.gather_upconvert(cache, ws, bt, lens, starts, seq_starts, kv_cache_dtype=cd)
    else:
        smla.gather_upconvert(cache, ws, bt_full[:, : bt.shape[1]], lens, starts, seq_starts=seq_starts,
                              kv_cache_dtype=cd)
    g_ws_full = dev(np.full((w, 576 + ws_pad), SENTINEL16, np.uint16), lib)
    g_bt = dev(bt_full, lib)[:, : bt.shape[1]]
    res = smla.gather_upconvert(dev(full, lib)[:, layer], g_ws_full[:, :576], g_bt, dev(lens, lib),
                                dev(starts, lib), seq_starts=None if seq_starts is None else dev(seq_starts, lib),
                                kv_cache_dtype=cd)
    got = host(g_ws_full)
    ref.assert_bf16_equal(got, ws_full, name="workspace")
    return res


@pytest.mark.parametrize("cd", CDS)
@pytest.mark.parametrize("with_seq_starts", [False, True])
@pytest.mark.parametrize("lib", LIBS)
def test_gather_upconvert_requests(cd, with_seq_starts, lib):
    """Irregular lengths (0, 1, partial blocks), shuffled and invalid block ids, positions past
    max_blocks, negative / past-the-end workspace starts, negative seq_starts, INT32 extremes."""
    need(lib)
    rng = np.random.default_rng(31)
    nb, bs, r, m = 120, 16, 9, 12
    full = random_cache(nb, bs, cd, rng, layers=3)
    bt = rng.integers(0, nb, (r, m)).astype(np.int32)
    bt[1, 2], bt[2, 0], bt[3, 5] = -1, nb, I32_MAX
    bt[4, 1] = I32_MIN
    # rows: r1 7, r2 10-46, r3 60-209, r4 300-499, r5 0-5 (from i = 10), r6 505-509, r7 510-511 (clipped),
    # r8 past the end; no two requests share a row (overlaps are unspecified on the GPU)
    lens = np.array([0, 1, 37, 150, 200, 16, 5, I32_MAX, 64], np.int32)
    starts = np.array([0, 7, 10, 60, 300, -10, 505, 510, 2000], np.int32)
    w = 512
    seq_starts = None
    if with_seq_starts:
        seq_starts = np.array([4, 0, 17, -5, 0, 3, I32_MIN, 100, 1], np.int32)
    check_gather(full, 2, cd, w, bt, lens, starts, seq_starts, lib=lib, bt_pad=5, ws_pad=24, oracle=True)


@pytest.mark.parametrize("cd", CDS)
def test_gather_upconvert_vllm_cases(cd):
    """vLLM's test_cp_gather_fp8 shapes (block 64): seq_lens [1], [64], [128], [512], [256,128,384],
    [128]x4, [64]x16; and block 4 with seq_starts."""
    rng = np.random.default_rng(32)
    full = random_cache(128, 64, cd, rng)
    for lens in ([1], [64], [128], [512], [256, 128, 384], [128] * 4, [64] * 16):
        lens = np.array(lens, np.int32)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
        bt = rng.permutation(128)[: len(lens) * 8].reshape(len(lens), 8).astype(np.int32)
        check_gather(full, 0, cd, int(lens.sum()), bt, lens, starts)
    full4 = random_cache(12, 4, cd, rng)
    bt = rng.permutation(12)[:9].reshape(3, 3).astype(np.int32)
    for lens, ss in [([6, 5, 3], [3, 4, 5]), ([0, 5, 3], [12, 4, 5])]:
        lens = np.array(lens, np.int32)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
        check_gather(full4, 0, cd, int(lens.sum()), bt, lens, starts, np.array(ss, np.int32))


@pytest.mark.slow
@pytest.mark.parametrize("cd", CDS)
@pytest.mark.parametrize("lens", [[131072], [16384] * 8, [100_000, 7, 31_000]])
def test_gather_upconvert_large(cd, lens):
    rng = np.random.default_rng(33)
    bs = 64
    lens = np.array(lens, np.int32)
    m = int(-(-lens.max() // bs))
    nb = int(m * len(lens)) + 10
    full = random_cache(nb, bs, cd, rng)
    bt = rng.permutation(nb)[: m * len(lens)].reshape(len(lens), m).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int32)
    check_gather(full, 0, cd, int(lens.sum()), bt, lens, starts)


def test_gather_upconvert_byte_fallback():
    """One cache block at an odd block stride (byte-wise reads) into a workspace that fits the request."""
    import torch

    rng = np.random.default_rng(34)
    flat = rng.integers(0, 256, 64 * 656 + 7, dtype=np.uint8)
    cpu = np.lib.stride_tricks.as_strided(flat, (1, 64, 656), (64 * 656 + 7, 656, 1))
    g = torch.as_strided(dev(flat), (1, 64, 656), (64 * 656 + 7, 656, 1))
    bt = np.array([[0]], np.int32)
    lens, starts, ss = (np.array([v], np.int32) for v in (5, 0, 40))
    ws = np.zeros((5, 576), np.uint16)
    smla.gather_upconvert(cpu, ws, bt, lens, starts, seq_starts=ss, kv_cache_dtype="fp8_ds_mla")
    g_ws = dev(np.zeros((5, 576), np.uint16))
    smla.gather_upconvert(g, g_ws, dev(bt), dev(lens), dev(starts), seq_starts=dev(ss), kv_cache_dtype="fp8_ds_mla")
    ref.assert_bf16_equal(host(g_ws), ws)


def test_gather_upconvert_nothing_to_do():
    cache = dev(np.zeros((2, 4, 656), np.uint8))
    ws = dev(np.full((3, 576), SENTINEL16, np.uint16))
    z = dev(np.zeros(0, np.int32))
    smla.gather_upconvert(cache, ws, dev(np.zeros((0, 2), np.int32)), z, z, kv_cache_dtype="fp8_ds_mla")
    assert (host(ws) == SENTINEL16).all()


# ---------------------------------------------------------------------------- convert_topk_indices

def index_case(n, k, bs, rng, r=6, m=None, prefill=False):
    """Inputs covering every value class: valid positions, past max_blocks, negative zoo, INT32_MAX;
    req_id out of range; negative and int32-overflowing block ids; prefill rows with valid,
    past-num_prefills and overflowing workspace starts."""
    m = m or max(1, -(-k // bs) + 2)
    nb = 1000
    bt = rng.integers(0, nb, (r, m)).astype(np.int32)
    bt[0, 0] = -1
    if m > 1:
        bt[1, 1] = min(I32_MAX, I32_MAX // bs + 1)  # slot overflows int32 (bs > 1)
        bt[2, m - 1] = I32_MIN
    req = rng.integers(0, r, n).astype(np.int32)
    req[:: max(1, n // 5)] = rng.choice([-1, r, I32_MAX, I32_MIN])
    lim = min(m * bs, I32_MAX - 5)
    tok = rng.integers(-3, lim + 5, (n, k)).astype(np.int32)
    zoo = np.array([I32_MIN, -123456, -1, I32_MAX, lim, lim - 1, 0], np.int32)
    flat = tok.reshape(-1)
    flat[rng.integers(0, flat.size, min(flat.size, 50))] = rng.choice(zoo, min(flat.size, 50))
    pids = starts = None
    if prefill:
        p = 4
        pids = rng.integers(-1, p + 2, n).astype(np.int32)
        starts = np.array([0, 100, I32_MAX - 50, -40], np.int32)
    return req, bt, tok, pids, starts


def run_convert_both(req, bt, tok, bs, pids, starts, dcp=None, lib="torch", in_place=False, tok_pad=0):
    """CPU and CUDA (optionally in place, optionally on a topk slice at a 4-byte offset)."""
    kw = dict(block_size=bs, prefill_request_ids=pids, prefill_workspace_starts=starts)
    gkw = dict(block_size=bs, prefill_request_ids=None if pids is None else dev(pids, lib),
               prefill_workspace_starts=None if starts is None else dev(starts, lib))
    n, k = tok.shape
    wide = np.full((n, k + tok_pad), 77, np.int32)
    wide[:, tok_pad:] = tok
    g_wide = dev(wide, lib)
    g_tok = g_wide[:, tok_pad:]
    g_out = g_tok if in_place else None
    if dcp is None:
        e_out, e_cnt = smla.convert_topk_indices(req, bt, tok, return_valid_counts=True, **kw)
        a_out, a_cnt = smla.convert_topk_indices(dev(req, lib), dev(bt, lib), g_tok, return_valid_counts=True,
                                                 out=g_out, **gkw)
    else:
        size, rank, il, compact = dcp
        e_out, e_cnt = smla.filter_convert_dcp_indices(req, bt, tok, dcp_size=size, dcp_rank=rank, interleave=il,
                                                       compact=compact, **kw)
        a_out, a_cnt = smla.filter_convert_dcp_indices(dev(req, lib), dev(bt, lib), g_tok, dcp_size=size,
                                                       dcp_rank=rank, interleave=il, compact=compact, out=g_out,
                                                       **gkw)
    np.testing.assert_array_equal(host(a_out), e_out)
    np.testing.assert_array_equal(host(a_cnt), e_cnt)
    if not in_place:
        np.testing.assert_array_equal(host(g_wide), wide)  # input untouched
    return e_out, e_cnt


@pytest.mark.parametrize("n,k,bs", [(1, 1, 64), (5, 7, 16), (33, 129, 64), (64, 2048, 64), (17, 300, 7),
                                    (8, 4100, 1), (3, 64, 2**20), (40, 2056, 2**31 - 1), (9, 33, 3)])
@pytest.mark.parametrize("prefill", [False, True])
def test_convert_topk_indices(n, k, bs, prefill):
    rng = np.random.default_rng(n * 1000 + k)
    req, bt, tok, pids, starts = index_case(n, k, bs, rng, prefill=prefill)
    run_convert_both(req, bt, tok, bs, pids, starts)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("tok_pad", [0, 1])
def test_convert_topk_indices_layouts(lib, in_place, tok_pad):
    """torch / CuPy, in place (out is topk_indices), and a topk slice 4 bytes off 16-byte alignment
    (the scalar path)."""
    need(lib)
    rng = np.random.default_rng(41)
    req, bt, tok, pids, starts = index_case(50, 1000, 64, rng, prefill=True)
    run_convert_both(req, bt, tok, 64, pids, starts, lib=lib, in_place=in_place, tok_pad=tok_pad)
    run_convert_both(req, bt, tok, 64, None, None, dcp=(2, 1, 2, True), lib=lib, in_place=in_place,
                     tok_pad=tok_pad)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("il", [1, 2, 4, 3])
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("k", [2048, 100, 5000])
def test_filter_convert_dcp_indices(size, il, compact, k):
    rng = np.random.default_rng(size * 100 + il * 10 + k)
    req, bt, tok, pids, starts = index_case(24, k, 64, rng, m=k // 64 + 3, prefill=(k == 100))
    for rank in sorted({0, size - 1}):
        run_convert_both(req, bt, tok, 64, pids, starts, dcp=(size, rank, il, compact))


@pytest.mark.parametrize("n", [4096, 256])
def test_convert_topk_indices_large(n):
    rng = np.random.default_rng(n)
    k, bs, r = 2048, 64, 64
    m = 4096 // bs * 2
    bt = rng.permutation(r * m).reshape(r, m).astype(np.int32)
    req = rng.integers(0, r, n).astype(np.int32)
    tok = rng.integers(-1, 4096 * 2, (n, k)).astype(np.int32)
    tok[:, k // 2:] = -1  # valid prefix, as an indexer writes it
    run_convert_both(req, bt, tok, bs, None, None)
    run_convert_both(req, bt, tok, bs, None, None, dcp=(4, 3, 1, True))


def test_convert_topk_indices_valid_prefix_counts():
    """vLLM's counts test: prefix lengths K/2, K/4, K, 1 (x2) give exactly those counts."""
    rng = np.random.default_rng(43)
    for k in (128, 384, 2048):
        lens = [k // 2, k // 4, k, 1] * 2
        tok = np.full((8, k), -1, np.int32)
        for i, l in enumerate(lens):
            tok[i, :l] = rng.integers(0, 10 * 64, l)
        bt = rng.integers(0, 100, (4, 10)).astype(np.int32)
        req = np.arange(8, dtype=np.int32) % 4
        _, cnt = run_convert_both(req, bt, tok, 64, None, None)
        assert list(cnt) == lens


# ------------------------------------------------------------------------------- merge_attn_states

MDT = {"bfloat16": BF16, "float16": np.float16, "float32": np.float32}


def merge_inputs(n, h, d, dtype, rng, spread=30.0):
    oa = (rng.standard_normal((n, h, d)) * 3).astype(MDT[dtype])
    ob = (rng.standard_normal((n, h, d)) * 3).astype(MDT[dtype])
    la = (rng.standard_normal((n, h)) * spread).astype(np.float32)
    lb = (rng.standard_normal((n, h)) * spread).astype(np.float32)
    specials = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0, 88.0, -95.0, 1e-30, 200.0, -200.0], np.float32)
    m = min(la.size, 100)
    la.reshape(-1)[:m] = np.repeat(specials, 10)[:m]
    lb.reshape(-1)[:m] = np.tile(specials, 10)[:m]
    q = min(la.size, 120)
    lb.reshape(-1)[m:q] = la.reshape(-1)[m:q]
    if oa.size > 8:
        oa.reshape(-1)[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(MDT[dtype])
    return oa, la, ob, lb


def check_merge_outputs(g_out, g_lse, e_out, e_lse, dtype):
    a = host(g_out)
    if dtype == "bfloat16":
        ref.assert_bf16_equal(a, e_out, name="out")
    else:
        assert_float_bits_equal(a.view(MDT[dtype]), np.asarray(e_out), "out")
    assert_float_bits_equal(host(g_lse), np.asarray(e_lse), "lse")


@pytest.mark.parametrize("dtype", list(MDT))
@pytest.mark.parametrize("n,h,d", [(1, 1, 1), (613, 16, 512), (7, 3, 33), (64, 128, 512), (5, 2, 8),
                                   (3, 4, 1000), (100, 1, 576)])
def test_merge_attn_states(dtype, n, h, d):
    rng = np.random.default_rng(n + h + d)
    oa, la, ob, lb = merge_inputs(n, h, d, dtype, rng)
    e_out, e_lse = smla.merge_attn_states(oa, la, ob, lb)
    g_out, g_lse = smla.merge_attn_states(dev(oa), dev(la), dev(ob), dev(lb))
    check_merge_outputs(g_out, g_lse, e_out, e_lse, dtype)


@pytest.mark.parametrize("dtype", list(MDT))
def test_merge_attn_states_strided_and_in_place(dtype):
    """vLLM's lse layout [h, n] (transposed views), out_a / out_b as head slices of wider tensors
    (16-byte vector path and, with an odd offset, the scalar path), and out = out_a in place."""
    import torch

    rng = np.random.default_rng(51)
    n, h, d = 97, 8, 256
    for off in (0, 1):
        oa_w = merge_inputs(n, h + 2, d + 8, dtype, rng)[0]
        oa, la, ob, lb = merge_inputs(n, h, d, dtype, rng)
        oa_w[:, 1:h + 1, off:off + d] = oa
        la_t, lb_t = np.ascontiguousarray(la.T), np.ascontiguousarray(lb.T)
        e_out, e_lse = smla.merge_attn_states(oa, la, ob, lb)
        g_oa_w = dev(oa_w)
        g_oa = g_oa_w[:, 1:h + 1, off:off + d]
        g_lse_out = torch.empty((h, n), dtype=torch.float32, device=g_oa_w.device)
        g_out, g_lse = smla.merge_attn_states(g_oa, dev(la_t).t(), dev(ob), dev(lb_t).t(), out=g_oa,
                                              out_lse=g_lse_out.t())
        assert g_out is g_oa
        check_merge_outputs(g_oa.contiguous(), g_lse.contiguous(), e_out, e_lse, dtype)
        rest = host(g_oa_w)
        keep = np.ones(oa_w.shape, bool)
        keep[:, 1:h + 1, off:off + d] = False
        assert np.array_equal(rest.view(np.uint8).reshape(-1)[np.repeat(keep.reshape(-1), oa_w.itemsize)],
                              oa_w.view(np.uint8).reshape(-1)[np.repeat(keep.reshape(-1), oa_w.itemsize)])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_merge_attn_states_cupy(dtype):
    need("cupy")
    rng = np.random.default_rng(52)
    oa, la, ob, lb = merge_inputs(300, 16, 128, dtype, rng)
    e_out, e_lse = smla.merge_attn_states(oa, la, ob, lb)
    g_out, g_lse = smla.merge_attn_states(*(dev(x, "cupy") for x in (oa, la, ob, lb)))
    check_merge_outputs(g_out, g_lse, e_out, e_lse, dtype)


@pytest.mark.slow
def test_merge_attn_states_large():
    rng = np.random.default_rng(53)
    oa, la, ob, lb = merge_inputs(1024, 128, 512, "bfloat16", rng, spread=5.0)
    e_out, e_lse = smla.merge_attn_states(oa, la, ob, lb)
    g_out, g_lse = smla.merge_attn_states(dev(oa), dev(la), dev(ob), dev(lb))
    check_merge_outputs(g_out, g_lse, e_out, e_lse, "bfloat16")


# ------------------------------------------------------------------------- streams and CUDA graphs

def test_side_stream():
    """Launched on the caller's current stream: a pack queued behind a long kernel on a side stream is
    still ordered after it."""
    import torch

    rng = np.random.default_rng(61)
    kv_c, k_pe = varied_tokens(1000, rng)
    slots = rng.permutation(4096)[:1000].astype(np.int32)
    cpu = np.zeros((64, 64, 656), np.uint8)
    smla.pack_kv(kv_c, k_pe, cpu, slots, kv_cache_dtype="fp8_ds_mla")
    g_kv, g_pe, g_slots = dev(kv_c), dev(k_pe), dev(slots)
    cache = torch.zeros((64, 64, 656), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x = torch.randn(4096, 4096, device="cuda")
        for _ in range(4):
            x = x @ x / 64  # keep the stream busy
        cache.zero_()
        smla.pack_kv(g_kv, g_pe, cache, g_slots, kv_cache_dtype="fp8_ds_mla")
    s.synchronize()
    ref.assert_cache_equal(host(cache), cpu, "fp8_ds_mla")


def capture(fn):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def test_cuda_graph_capture_and_replay():
    """Each op captured once with fixed buffers; replays see new input contents."""
    import torch

    rng = np.random.default_rng(71)
    t, nb, bs, cd = 300, 16, 64, "fp8_ds_mla"
    kv_c, k_pe = varied_tokens(t, rng)
    slots = rng.permutation(nb * bs)[:t].astype(np.int64)
    g_kv, g_pe, g_slots = dev(kv_c), dev(k_pe), dev(slots)
    g_cache = torch.zeros((nb, bs, 656), dtype=torch.uint8, device="cuda")
    u_slots = rng.integers(-2, nb * bs + 2, 500).astype(np.int32)
    g_uslots, g_uout = dev(u_slots), dev(np.zeros((500, 576), np.uint16))
    bt = rng.permutation(nb).reshape(2, 8).astype(np.int32)
    lens, starts = np.array([300, 200], np.int32), np.array([0, 300], np.int32)
    g_bt, g_lens, g_starts = dev(bt), dev(lens), dev(starts)
    g_ws = dev(np.zeros((500, 576), np.uint16))
    req, bt2, tok, pids, pstarts = index_case(40, 2048, 64, rng, prefill=True)
    gi = [dev(a) for a in (req, bt2, tok, pids, pstarts)]
    g_idx_out, g_cnt = dev(np.zeros_like(tok)), dev(np.zeros(40, np.int32))
    g_dcp_out, g_dcp_cnt = dev(np.zeros_like(tok)), dev(np.zeros(40, np.int32))
    oa, la, ob, lb = merge_inputs(64, 16, 512, "bfloat16", rng)
    gm = [dev(a) for a in (oa, la, ob, lb)]
    g_mout, g_mlse = dev(np.zeros_like(oa)), dev(np.zeros_like(la))

    def step():
        smla.pack_kv(g_kv, g_pe, g_cache, g_slots, kv_cache_dtype=cd)
        smla.unpack_kv(g_cache, g_uslots, kv_cache_dtype=cd, out=g_uout)
        smla.gather_upconvert(g_cache, g_ws, g_bt, g_lens, g_starts, kv_cache_dtype=cd)
        smla.convert_topk_indices(gi[0], gi[1], gi[2], block_size=64, prefill_request_ids=gi[3],
                                  prefill_workspace_starts=gi[4], out=g_idx_out, valid_counts=g_cnt,
                                  return_valid_counts=True)
        smla.filter_convert_dcp_indices(gi[0], gi[1], gi[2], block_size=64, dcp_size=2, dcp_rank=1,
                                        out=g_dcp_out, valid_counts=g_dcp_cnt)
        smla.merge_attn_states(*gm, out=g_mout, out_lse=g_mlse)

    graph = capture(step)
    for it in range(2):
        # new contents in the captured input buffers
        kv_c, k_pe = varied_tokens(t, rng)
        g_kv.copy_(dev(kv_c))
        g_pe.copy_(dev(k_pe))
        tok = rng.integers(-1, 2000, tok.shape).astype(np.int32)
        gi[2].copy_(dev(tok))
        oa, la, ob, lb = merge_inputs(64, 16, 512, "bfloat16", rng)
        for gd, a in zip(gm, (oa, la, ob, lb)):
            gd.copy_(dev(a))
        g_cache.zero_()
        graph.replay()
        torch.cuda.synchronize()
        cache = np.zeros((nb, bs, 656), np.uint8)
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
        ref.assert_cache_equal(host(g_cache), cache, cd)
        ref.assert_bf16_equal(host(g_uout), smla.unpack_kv(cache, u_slots, kv_cache_dtype=cd))
        ws = np.zeros((500, 576), np.uint16)
        smla.gather_upconvert(cache, ws, bt, lens, starts, kv_cache_dtype=cd)
        ref.assert_bf16_equal(host(g_ws), ws)
        e_out, e_cnt = smla.convert_topk_indices(req, bt2, tok, block_size=64, prefill_request_ids=pids,
                                                 prefill_workspace_starts=pstarts, return_valid_counts=True)
        np.testing.assert_array_equal(host(g_idx_out), e_out)
        np.testing.assert_array_equal(host(g_cnt), e_cnt)
        e_out, e_cnt = smla.filter_convert_dcp_indices(req, bt2, tok, block_size=64, dcp_size=2, dcp_rank=1)
        np.testing.assert_array_equal(host(g_dcp_out), e_out)
        np.testing.assert_array_equal(host(g_dcp_cnt), e_cnt)
        e_out, e_lse = smla.merge_attn_states(oa, la, ob, lb)
        check_merge_outputs(g_mout, g_mlse, e_out, e_lse, "bfloat16")
