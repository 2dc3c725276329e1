"""NumPy float64 oracle for every smla op.

Written from the format definitions (docs/design.md sections 3-4) and the
invalid-input rules in csrc/core/params.h, never from kernel code, so kernel tests compare against an
independent implementation.

Conventions:
- bf16 data travels as uint16 bit patterns; ml_dtypes.bfloat16 arrays are accepted and viewed as
  uint16 (no copy, so in-place writers really write into the caller's array).
- fp8 data travels as uint8 bytes; ml_dtypes.float8_e4m3fn arrays are viewed as uint8.
- KV caches: uint8 [num_blocks, block_size, 656] for "fp8_ds_mla", uint16 [num_blocks, block_size,
  576] for "bf16". Any NumPy strides work (in-place writes use fancy indexing, never reshape).
- Attention / merge results are float64; the kernels' bf16 / fp32 outputs are compared to them with
  check_close and the tolerances of docs/design.md below.
- NaN bit patterns are not part of any contract (CUDA's cvt makes canonical NaNs, NumPy keeps
  payloads), so the assert_* helpers treat every NaN as equal to every other NaN.
"""

import numpy as np

# ---- model dims and fp8_ds_mla layout (docs/design.md section 3) ----
D_NOPE = 512
D_ROPE = 64
D_QK = 576
D_V = 512
FP8_ENTRY = 656
FP8_SCALE_OFF = 512
FP8_ROPE_OFF = 528
FP8_TILE = 128
FP8_NUM_TILES = 4
E4M3_MAX = 448.0
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
FLT_MIN = np.float32(np.finfo(np.float32).tiny)  # 2**-126, the legacy scale floor
KV_CACHE_DTYPES = ("bf16", "fp8_ds_mla")
SCALE_RULES = ("pow2", "fp32")

# ---- tolerances against this oracle (docs/design.md section 4; FlashMLA's test values) ----
OUT_ABS = 1e-3
OUT_REL = 2.01 / 128
OUT_COS = 5e-6
LSE_ABS = 1e-6
LSE_REL = 8.01 / 65536
PREFILL_OUT_ABS = 8e-4
PREFILL_OUT_REL = 3.01 / 128
PREFILL_OUT_COS = 7e-6
PREFILL_LSE_ABS = 1e-6  # also for max_logits
PREFILL_LSE_REL = 2.01 / 65536
# precision="fast" (docs/design.md section 4, "Precision"): the probabilities may be rounded to bf16
# before P.V, each p_j off by at most 2^-9 relative, so out may also differ by up to that times
# ref_abs = sum_j p_j |V_j| (the oracle with V replaced by |V|); allowed: twice that, on top of the
# high rule's abs and rel terms (summed, not either-or); lse as for high.
PRECISIONS = ("high", "fast")
FAST_OUT_ABS_REF = 2.0**-8  # times ref_abs
FAST_OUT_COS = 1e-5


# =============================================================================================
# dtype plumbing
# =============================================================================================

def as_bf16_bits(a):
    """uint16 view of bf16 data (uint16 or ml_dtypes.bfloat16); shares memory with `a`."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return a
    if a.dtype.name == "bfloat16":
        return a.view(np.uint16)
    # Floats are refused on purpose: silently rounding them would hide a test bug.
    raise TypeError(f"expected bf16 bits (uint16) or ml_dtypes.bfloat16, got {a.dtype}")


def _as_bytes(a):
    a = np.asarray(a)
    if a.dtype == np.uint8:
        return a
    if a.dtype.itemsize == 1:  # float8_e4m3fn, int8: the bytes are what matter
        return a.view(np.uint8)
    raise TypeError(f"expected a byte array (uint8 / float8_e4m3fn), got {a.dtype}")


def as_f64(a):
    """Float64 copy of any array: uint16 and bfloat16 are read as bf16, 1-byte floats as e4m3fn."""
    a = np.asarray(a)
    if a.dtype == np.uint16 or a.dtype.name == "bfloat16":
        return bf16_to_f64(a)
    if a.dtype.name == "float8_e4m3fn":
        return e4m3fn_decode(a).astype(np.float64)
    return a.astype(np.float64)


# =============================================================================================
# bf16 and float8 e4m3fn, bit level
# =============================================================================================

def bf16_to_f32(bits):
    """bf16 bits -> float32 (exact: bf16 is the top half of a float32)."""
    b = as_bf16_bits(bits)
    return (b.astype(np.uint32) << 16).view(np.float32)


def bf16_to_f64(bits):
    return bf16_to_f32(bits).astype(np.float64)


def _round_to_grid(ax, frac_bits, min_exp):
    """Round finite ax >= 0 (float64) to a binary format with `frac_bits` fraction bits and minimum
    normal exponent `min_exp`, ties to even; no overflow handling. Exact in float64: only scaling by
    powers of two and np.rint (which rounds half to even)."""
    _, e = np.frexp(ax)  # ax = f * 2**e, f in [0.5, 1): unbiased exponent is e - 1
    q = np.maximum(e - 1 - frac_bits, min_exp - frac_bits)  # exponent of one ulp (subnormals: fixed)
    return np.ldexp(np.rint(np.ldexp(ax, -q)), q)


def bf16_rne(x):
    """float32 / float64 -> bf16 bits (uint16), one rounding to nearest even from the input value.

    Overflow gives +-Inf (IEEE), -0.0 keeps its sign, NaN stays NaN with the quiet bit set (float32
    input keeps its sign and top payload bits; float64 NaN gives 0x7FC0 | sign). Float64 input is
    rounded once, not via float32 (that double rounding would differ on near-ties)."""
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened
        xd = x.astype(np.float64)
    finite = np.isfinite(xd)
    ax = np.where(finite, np.abs(xd), 0.0)
    r = _round_to_grid(ax, 7, -126)
    r = np.where(np.isinf(xd) | (r >= 2.0**128), np.inf, r)
    with np.errstate(over="ignore"):
        mag = (r.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    sign = np.where(np.signbit(xd), np.uint16(0x8000), np.uint16(0))
    out = mag | sign
    nan = np.isnan(xd)
    if nan.any():
        if x.dtype == np.float32:
            nan_bits = ((x.view(np.uint32) >> 16) | 0x0040).astype(np.uint16)
        else:
            nan_bits = np.uint16(0x7FC0) | sign
        out = np.where(nan, nan_bits, out)
    return out.astype(np.uint16)


def bf16_round(x):
    """x rounded to the nearest bf16, as float64 (convenience for building expected values)."""
    return bf16_to_f64(bf16_rne(x))


def _e4m3fn_table():
    # e4m3fn: sign | 4 exponent bits (bias 7) | 3 mantissa bits; no Inf; S.1111.111 is NaN.
    b = np.arange(256)
    e, m = (b >> 3) & 0xF, b & 0x7
    mag = np.where(e == 0, m * 2.0**-9, np.ldexp(1.0 + m / 8.0, e - 7))
    val = np.where(b & 0x80, -mag, mag)
    val[(b & 0x7F) == 0x7F] = np.nan
    return val.astype(np.float32)


_E4M3_TABLE = _e4m3fn_table()


def e4m3fn_decode(b):
    """fp8 e4m3fn bytes -> float32 (exact). 0x7F / 0xFF are NaN."""
    return _E4M3_TABLE[_as_bytes(b)]


def e4m3fn_satfinite_rne(x):
    """float32 (or float64) -> e4m3fn byte, round to nearest even, saturating like PTX
    cvt.rn.satfinite.e4m3x2.f32 / __nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3):
    |x| that rounds above 448 -> 448 (0x7E / 0xFE), +-Inf -> +-448, NaN -> 0x7F | sign,
    -0.0 and negative values that round to zero -> 0x80.

    ml_dtypes' float8_e4m3fn cast is also RNE but turns overflow (|x| > 464) and Inf into NaN;
    everywhere else the two agree (see tests/test_reference.py)."""
    xd = np.asarray(x, dtype=np.float64)
    nan = np.isnan(xd)
    ax = np.where(np.isfinite(xd), np.abs(xd), 0.0)
    r = _round_to_grid(ax, 3, -6)
    sat = np.isinf(xd) | (r > E4M3_MAX)
    r = np.where(sat, 0.0, r)
    _, e = np.frexp(r)
    e = e - 1
    normal = r >= 2.0**-6
    mant = np.where(normal, np.ldexp(r, -e) * 8.0 - 8.0, 0.0)  # 0..7 exactly
    code = np.where(normal, ((e + 7) << 3) + mant.astype(np.int64),
                    (r * 512.0).astype(np.int64))  # subnormal: r = k * 2**-9, k in 0..8
    code = np.where(sat, 0x7E, code)
    code = np.where(nan, 0x7F, code)
    code = code | np.where(np.signbit(xd), 0x80, 0)
    return code.astype(np.uint8)


# =============================================================================================
# fp8_ds_mla packing
# =============================================================================================

def tile_scale(amax, scale_rule="pow2"):
    """Per-tile fp32 scale from the tile's float32 amax (NaNs already excluded).

    pow2: smallest power of two >= max(amax/448, 1e-4), the division one fp32 op, the max in fp32,
          the power of two taken from the bits (exponent + 1 when the mantissa is non-zero).
          amax = Inf gives Inf.
    fp32: max(amax/448, FLT_MIN) in fp32."""
    amax = np.asarray(amax, dtype=np.float32)
    with np.errstate(all="ignore"):
        ratio = amax / np.float32(448.0)
    if scale_rule == "pow2":
        m = np.maximum(ratio, np.float32(1e-4))  # always a positive normal or +Inf
        u = m.view(np.uint32)
        exp = ((u >> 23) & 0xFF) + ((u & 0x7FFFFF) != 0)  # 255 stays Inf (Inf has mantissa 0)
        return (exp.astype(np.uint32) << 23).view(np.float32)
    if scale_rule == "fp32":
        return np.maximum(ratio, FLT_MIN)
    raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")


def pack_fp8_ds_mla(kv_c, k_pe, scale_rule="pow2"):
    """Entries of T tokens: kv_c [T,512] bf16, k_pe [T,64] bf16 -> uint8 [T,656]."""
    kv_c = as_bf16_bits(kv_c).reshape(-1, D_NOPE)
    k_pe = as_bf16_bits(k_pe).reshape(-1, D_ROPE)
    t = kv_c.shape[0]
    x = bf16_to_f32(kv_c).reshape(t, FP8_NUM_TILES, FP8_TILE)
    # NaN does not enter amax (fmaxf ignores it); an all-NaN tile thus has amax 0, which gives the
    # same scale as a kernel whose amax comes out NaN (max(NaN, floor) = floor).
    amax = np.where(np.isnan(x), np.float32(0), np.abs(x)).max(axis=2)
    s = tile_scale(amax, scale_rule)  # [T, 4] float32
    with np.errstate(all="ignore"):
        v = x / s[:, :, None]  # float32 / float32: one IEEE division, as the kernel does
    ent = np.zeros((t, FP8_ENTRY), np.uint8)
    ent[:, :FP8_SCALE_OFF] = e4m3fn_satfinite_rne(v).reshape(t, D_NOPE)
    ent[:, FP8_SCALE_OFF:FP8_ROPE_OFF] = s.astype("<f4").view(np.uint8).reshape(t, 16)
    ent[:, FP8_ROPE_OFF:] = k_pe.astype("<u2").view(np.uint8).reshape(t, 2 * D_ROPE)
    return ent


def fp8_entry_scales(entries):
    """float32 [n,4] tile scales of fp8_ds_mla entries [n,656]."""
    e = _as_bytes(entries).reshape(-1, FP8_ENTRY)
    return np.ascontiguousarray(e[:, FP8_SCALE_OFF:FP8_ROPE_OFF]).view("<f4").astype(np.float32)


def unpack_fp8_ds_mla(entries):
    """fp8_ds_mla entries [n,656] -> bf16 bits [n,576]: bf16_rne(float(e4m3) * scale) with the
    product in fp32, and the rope bf16 copied bit for bit."""
    e = _as_bytes(entries).reshape(-1, FP8_ENTRY)
    n = e.shape[0]
    nope = e4m3fn_decode(e[:, :D_NOPE]).reshape(n, FP8_NUM_TILES, FP8_TILE)
    with np.errstate(all="ignore"):
        prod = nope * fp8_entry_scales(e)[:, :, None]  # float32 product, rounded once in fp32
    out = np.empty((n, D_QK), np.uint16)
    out[:, :D_NOPE] = bf16_rne(prod).reshape(n, D_NOPE)
    out[:, D_NOPE:] = np.ascontiguousarray(e[:, FP8_ROPE_OFF:]).view("<u2")
    return out


# =============================================================================================
# paged cache: shape, pack, unpack, gather
# =============================================================================================

def _check_cache_dtype(kv_cache_dtype):
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def kv_cache_shape(num_blocks, block_size, kv_cache_dtype):
    _check_cache_dtype(kv_cache_dtype)
    return (num_blocks, block_size, FP8_ENTRY if kv_cache_dtype == "fp8_ds_mla" else D_QK)


def new_kv_cache(num_blocks, block_size, kv_cache_dtype, fill=0):
    """Zero (or `fill`) cache in the reference layout: uint8 for fp8_ds_mla, uint16 for bf16."""
    dt = np.uint8 if kv_cache_dtype == "fp8_ds_mla" else np.uint16
    return np.full(kv_cache_shape(num_blocks, block_size, kv_cache_dtype), fill, dt)


def infer_cache_dtype(kv_cache):
    a = np.asarray(kv_cache)
    if a.ndim == 3 and a.dtype.itemsize == 1 and a.shape[2] == FP8_ENTRY:
        return "fp8_ds_mla"
    if a.ndim == 3 and a.dtype.itemsize == 2 and a.shape[2] == D_QK:
        return "bf16"
    raise ValueError(f"cannot tell the layout of a cache of shape {a.shape} and dtype {a.dtype}")


def _cache_view(kv_cache, kv_cache_dtype):
    """Memory-sharing uint8 / uint16 view of a cache, checked against the layout."""
    _check_cache_dtype(kv_cache_dtype)
    c = _as_bytes(kv_cache) if kv_cache_dtype == "fp8_ds_mla" else as_bf16_bits(kv_cache)
    want = FP8_ENTRY if kv_cache_dtype == "fp8_ds_mla" else D_QK
    if c.ndim != 3 or c.shape[2] != want:
        raise ValueError(f"{kv_cache_dtype} cache must be [num_blocks, block_size, {want}], got {c.shape}")
    return c


def pack_kv(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale_rule="pow2"):
    """Write tokens into the cache in place and return it. T = len(slot_mapping) (inputs may be
    longer, as under CUDA-graph padding). Slots < 0 or >= num_blocks*block_size are skipped. With
    duplicate slots the last token wins (kernels do not promise an order: tests avoid duplicates)."""
    c = _cache_view(kv_cache, kv_cache_dtype)
    slots = np.asarray(slot_mapping).astype(np.int64).reshape(-1)
    t = slots.shape[0]
    kv_c = as_bf16_bits(kv_c)[:t]
    k_pe = as_bf16_bits(k_pe)[:t]
    nb, bs = c.shape[:2]
    idx = np.nonzero((slots >= 0) & (slots < nb * bs))[0]
    _, last = np.unique(slots[idx][::-1], return_index=True)
    idx = idx[::-1][last]
    if idx.size == 0:
        return kv_cache
    if kv_cache_dtype == "fp8_ds_mla":
        ent = pack_fp8_ds_mla(kv_c[idx], k_pe[idx], scale_rule)
    else:
        ent = np.concatenate([kv_c[idx], k_pe[idx]], axis=1)  # exact copy, no conversion
    s = slots[idx]
    c[s // bs, s % bs] = ent
    return kv_cache


def unpack_kv(kv_cache, slots, kv_cache_dtype):
    """Dequantised rows as bf16 bits [n,576]; a slot outside [0, num_blocks*block_size) gives zeros."""
    c = _cache_view(kv_cache, kv_cache_dtype)
    slots = np.asarray(slots).astype(np.int64).reshape(-1)
    nb, bs = c.shape[:2]
    ok = (slots >= 0) & (slots < nb * bs)
    out = np.zeros((slots.shape[0], D_QK), np.uint16)
    s = slots[ok]
    ent = c[s // bs, s % bs]
    out[ok] = unpack_fp8_ds_mla(ent) if kv_cache_dtype == "fp8_ds_mla" else ent
    return out


def dequant_rows(kv_cache, slots, kv_cache_dtype):
    """float64 [n,576] of the dequantised rows (exactly the bf16 values); invalid slots -> zeros."""
    return bf16_to_f64(unpack_kv(kv_cache, slots, kv_cache_dtype))


def read_fp8_scales(kv_cache, slots):
    """float32 [n,4] tile scales stored at the given (valid) slots of an fp8_ds_mla cache."""
    c = _cache_view(kv_cache, "fp8_ds_mla")
    s = np.asarray(slots).astype(np.int64).reshape(-1)
    bs = c.shape[1]
    return fp8_entry_scales(c[s // bs, s % bs])


def gather_upconvert(kv_cache, workspace, block_table, seq_lens, workspace_starts, seq_starts=None,
                     *, kv_cache_dtype=None):
    """In place into workspace [W,576] bf16 (returned). For request r and 0 <= i < seq_lens[r]:
    row workspace_starts[r] + i = dequantised token p = seq_starts[r] + i of request r, read from
    block block_table[r, p // block_size] at offset p % block_size. Rows outside [0, W) are skipped;
    a token whose block index is past max_blocks (or p < 0), or whose block id is outside
    [0, num_blocks), gives a zero row. Requests run in order, so a later one wins an overlap."""
    if kv_cache_dtype is None:
        kv_cache_dtype = infer_cache_dtype(kv_cache)
    c = _cache_view(kv_cache, kv_cache_dtype)
    ws = as_bf16_bits(workspace)
    if ws.ndim != 2 or ws.shape[1] != D_QK:
        raise ValueError(f"workspace must be [W, 576], got {ws.shape}")
    nb, bs = c.shape[:2]
    bt = np.asarray(block_table).astype(np.int64)
    lens = np.asarray(seq_lens).astype(np.int64).reshape(-1)
    starts = np.asarray(workspace_starts).astype(np.int64).reshape(-1)
    sq = (np.zeros_like(lens) if seq_starts is None
          else np.asarray(seq_starts).astype(np.int64).reshape(-1))
    num_reqs, max_blocks = bt.shape
    if not (lens.shape[0] == starts.shape[0] == sq.shape[0] == num_reqs):
        raise ValueError("block_table, seq_lens, workspace_starts and seq_starts disagree on num_reqs")
    w = ws.shape[0]
    for r in range(num_reqs):
        if lens[r] <= 0:
            continue
        i = np.arange(max(0, -starts[r]), min(lens[r], w - starts[r]), dtype=np.int64)  # rows in [0, w)
        rows = starts[r] + i
        keep = (rows >= 0) & (rows < w)
        if not keep.any():
            continue
        p = sq[r] + i
        bi = p // bs
        in_table = (p >= 0) & (bi < max_blocks)
        blk = np.where(in_table, bt[r, np.clip(bi, 0, max_blocks - 1)], -1)
        good = in_table & (blk >= 0) & (blk < nb)
        slot = np.where(good, blk * bs + p % bs, -1)  # -1 -> zero row in unpack_kv
        ws[rows[keep]] = unpack_kv(c, slot[keep], kv_cache_dtype)
    return workspace


# =============================================================================================
# index conversion (params.h, smla_convert_indices_params)
# =============================================================================================

def _convert_indices(req_id, block_table, topk_indices, block_size, prefill_request_ids,
                     prefill_workspace_starts, dcp_size, dcp_rank, interleave, compact):
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    tok = np.asarray(topk_indices).astype(np.int64)
    if tok.ndim != 2:
        raise ValueError(f"topk_indices must be [N, topk], got {tok.shape}")
    n, _ = tok.shape
    rid = np.asarray(req_id).astype(np.int64).reshape(-1)
    if rid.shape[0] != n:
        raise ValueError(f"req_id has {rid.shape[0]} rows, topk_indices {n}")
    bt = np.asarray(block_table).astype(np.int64)
    num_reqs, max_blocks = bt.shape
    ok = tok >= 0

    # DCP filter: only tokens this rank owns survive, renumbered to this rank's local positions.
    if dcp_size:
        owner = (tok // interleave) % dcp_size
        local = (tok // (dcp_size * interleave)) * interleave + tok % interleave
        owned = owner == dcp_rank
    else:
        local, owned = tok, np.ones_like(ok)

    # Paged rows: through the block table, with every bounds check params.h lists.
    rid_ok = ((rid >= 0) & (rid < num_reqs))[:, None]
    b = local // block_size
    b_ok = b < max_blocks  # local >= 0 wherever tok >= 0
    if num_reqs and max_blocks:
        blk = bt[np.clip(rid, 0, num_reqs - 1)[:, None], np.clip(b, 0, max_blocks - 1)]
    else:
        blk = np.full(tok.shape, -1, np.int64)
    slot = blk * block_size + local % block_size
    paged_ok = ok & owned & rid_ok & b_ok & (blk >= 0) & (slot <= INT32_MAX)
    out = np.where(paged_ok, slot, -1)

    # Prefill-workspace rows: start + tok, no block-table bounds check and (with DCP) no ownership
    # filter, as in vLLM's fix: the workspace already holds the request's whole gathered context.
    if prefill_request_ids is not None:
        if prefill_workspace_starts is None:
            raise ValueError("prefill_request_ids needs prefill_workspace_starts")
        pid = np.asarray(prefill_request_ids).astype(np.int64).reshape(-1)
        if pid.shape[0] != n:
            raise ValueError(f"prefill_request_ids has {pid.shape[0]} rows, topk_indices {n}")
        pws = np.asarray(prefill_workspace_starts).astype(np.int64).reshape(-1)
        num_prefills = pws.shape[0]
        is_pf = (pid >= 0)[:, None]
        p_ok = (pid < num_prefills)[:, None]
        start = pws[np.clip(pid, 0, max(num_prefills - 1, 0))][:, None] if num_prefills else 0
        v = start + tok
        pf_ok = ok & p_ok & (v >= INT32_MIN) & (v <= INT32_MAX)
        out = np.where(is_pf, np.where(pf_ok, v, -1), out)

    if dcp_size and compact:
        # Stable partition: valid entries first, in their original order.
        order = np.argsort(out == -1, axis=1, kind="stable")
        out = np.take_along_axis(out, order, axis=1)
    out = out.astype(np.int32)
    counts = (out != -1).sum(axis=1).astype(np.int32)
    return out, counts


def convert_topk_indices(req_id, block_table, topk_indices, block_size, prefill_request_ids=None,
                         prefill_workspace_starts=None):
    """Request-local positions [N,K] -> global slots (paged rows) or workspace rows (prefill rows).
    Returns (out int32 [N,K], counts int32 [N]), counts = entries != -1 per row. Invalid -> -1:
    tok < 0; paged row: req_id outside [0, num_reqs), tok // block_size >= max_blocks, negative
    block id, slot > INT32_MAX; prefill row (prefill_request_ids[n] = p >= 0): p >= num_prefills
    or starts[p] + tok outside int32. No compaction: out column = in column."""
    return _convert_indices(req_id, block_table, topk_indices, block_size, prefill_request_ids,
                            prefill_workspace_starts, 0, 0, 1, False)


def filter_convert_dcp_indices(req_id, block_table, topk_indices, block_size, dcp_size, dcp_rank,
                               interleave=1, compact=True, prefill_request_ids=None,
                               prefill_workspace_starts=None):
    """Decode context parallel: global positions g -> this rank's slots. Owner of g is
    (g // interleave) % dcp_size; others -> -1; owned -> local position
    (g // (dcp_size*interleave)) * interleave + g % interleave, converted as in
    convert_topk_indices. compact=True stably moves the valid entries to the front (params.h: also
    for dcp_size == 1). Returns (out, counts)."""
    if dcp_size < 1 or not 0 <= dcp_rank < dcp_size or interleave < 1:
        raise ValueError(f"bad DCP config size={dcp_size} rank={dcp_rank} interleave={interleave}")
    return _convert_indices(req_id, block_table, topk_indices, block_size, prefill_request_ids,
                            prefill_workspace_starts, dcp_size, dcp_rank, interleave, compact)


# =============================================================================================
# merge_attn_states
# =============================================================================================

def merge_attn_states(out_a, lse_a, out_b, lse_b):
    """(out [..., d], lse [...]) in float64, docs/design.md's formula: M = max(la, lb) (NaN
    propagates); both -inf -> (out_a, -inf); a +inf side (a state whose maximum score overflowed) with
    no NaN -> weights 1 on the +inf sides and 0 on the other, lse +inf; else wa = exp(la-M),
    wb = exp(lb-M), lse = M + log(wa+wb); out = (wa*oa + wb*ob)/(wa+wb).
    Consequences: any NaN lse -> NaN out and lse (no remapping; vLLM's kernels map +inf to -inf, an
    empty state, instead); a side of weight 0 still makes 0 * (Inf or NaN in its out) NaN."""
    oa, ob = as_f64(out_a), as_f64(out_b)
    la, lb = as_f64(lse_a), as_f64(lse_b)
    both = (la == -np.inf) & (lb == -np.inf)
    sat = ((la == np.inf) | (lb == np.inf)) & ~np.isnan(la) & ~np.isnan(lb)
    with np.errstate(all="ignore"):
        m = np.maximum(la, lb)
        wa = np.where(sat, (la == np.inf).astype(np.float64), np.exp(la - m))
        wb = np.where(sat, (lb == np.inf).astype(np.float64), np.exp(lb - m))
        out = (wa[..., None] * oa + wb[..., None] * ob) / (wa + wb)[..., None]
        lse = np.where(sat, np.inf, m + np.log(wa + wb))
    out = np.where(both[..., None], oa, out)
    lse = np.where(both, -np.inf, lse)
    return out, lse


# =============================================================================================
# sparse MLA attention
# =============================================================================================

def sparse_mla_attention(q, kv_rows, indices, limit, softmax_scale, topk_length=None,
                         attn_sink=None, return_abs=False):
    """Shared semantics of decode and prefill (docs/design.md section 4).

    q [b,s_q,h,576] bf16 bits; kv_rows: a callable slots(int64 [u]) -> float64 [u,576], or an array
    of rows indexable by slot (bf16 bits or floats); indices [b,s_q,topk]; topk_length [b,s_q].
    Index j of a row is valid iff 0 <= idx < limit and j < topk_length. Duplicates count twice.
    s_j = scale * dot(q, K_j) in float64 on the exact bf16 values; out = sum_j p_j K_j[:512];
    lse = log sum_j exp(s_j) (natural); max_logits = max_j s_j. No valid index: out 0, lse -inf,
    max_logits -inf, whatever the sink. attn_sink [h]: out *= 1/(1+exp(sink - lse)), lse unchanged.
    softmax_scale and attn_sink are first rounded to float32: that is what the kernels receive.
    Returns float64 (out [b,s_q,h,512], lse [b,s_q,h], max_logits [b,s_q,h]); with return_abs also
    out_abs [b,s_q,h,512], the same out with V replaced by |V| (sum_j p_j |V_j|, sink factor applied),
    the scale of precision="fast"'s tolerance (check_close's slack)."""
    qf = as_f64(q)
    if qf.ndim != 4 or qf.shape[3] != D_QK:
        raise ValueError(f"q must be [b, s_q, h, 576], got {qf.shape}")
    b, s_q, h, _ = qf.shape
    idx = np.asarray(indices).astype(np.int64)
    if idx.ndim != 3 or idx.shape[:2] != (b, s_q):
        raise ValueError(f"indices must be [{b}, {s_q}, topk], got {idx.shape}")
    topk = idx.shape[2]
    valid = (idx >= 0) & (idx < limit)
    if topk_length is not None:
        tl = np.asarray(topk_length).astype(np.int64).reshape(b, s_q)
        valid &= np.arange(topk)[None, None, :] < tl[:, :, None]

    # Fetch every distinct valid row once; each query row then gathers from that small table.
    uniq, inv = np.unique(idx[valid], return_inverse=True)
    if callable(kv_rows):
        rows = np.asarray(kv_rows(uniq), dtype=np.float64).reshape(uniq.shape[0], D_QK)
    else:
        rows = as_f64(np.asarray(kv_rows)[uniq]).reshape(uniq.shape[0], D_QK)
    pos = np.full(idx.shape, -1, np.int64)
    pos[valid] = inv.reshape(-1)

    scale = float(np.float32(softmax_scale))
    out = np.zeros((b, s_q, h, D_V))
    out_abs = np.zeros((b, s_q, h, D_V)) if return_abs else None
    lse = np.full((b, s_q, h), -np.inf)
    max_logits = np.full((b, s_q, h), -np.inf)
    has_valid = valid.any(axis=2)
    with np.errstate(all="ignore"):
        for bi in range(b):
            for si in range(s_q):
                if not has_valid[bi, si]:
                    continue
                k = rows[pos[bi, si][valid[bi, si]]]  # [nv, 576]; MQA: all heads share K
                s = scale * (qf[bi, si] @ k.T)  # [h, nv]
                m = s.max(axis=1)
                e = np.exp(s - m[:, None])
                z = e.sum(axis=1)
                out[bi, si] = (e @ k[:, :D_V]) / z[:, None]
                if return_abs:
                    out_abs[bi, si] = (e @ np.abs(k[:, :D_V])) / z[:, None]
                lse[bi, si] = m + np.log(z)
                max_logits[bi, si] = m
        if attn_sink is not None:
            sink = np.asarray(attn_sink, dtype=np.float32).astype(np.float64).reshape(h)
            factor = 1.0 / (1.0 + np.exp(sink[None, None, :] - lse))  # sink +inf -> 0, -inf -> 1
            out = np.where(has_valid[:, :, None, None], out * factor[..., None], 0.0)
            if return_abs:
                out_abs = np.where(has_valid[:, :, None, None], out_abs * factor[..., None], 0.0)
    if return_abs:
        return out, lse, max_logits, out_abs
    return out, lse, max_logits


def sparse_mla_decode_ref(q, kv_cache, indices, softmax_scale, kv_cache_dtype, topk_length=None,
                          attn_sink=None, return_abs=False):
    """Decode over a paged cache: indices are global slots, limit = num_blocks * block_size, K rows
    are the dequantised cache rows. Returns float64 (out [b,s_q,h,512], lse [b,s_q,h]), and out_abs
    (sparse_mla_attention) after them with return_abs."""
    c = _cache_view(kv_cache, kv_cache_dtype)
    nb, bs = c.shape[:2]
    res = sparse_mla_attention(
        q, lambda slots: dequant_rows(c, slots, kv_cache_dtype), indices, nb * bs, softmax_scale,
        topk_length, attn_sink, return_abs)
    return res[:2] + res[3:]


def sparse_mla_prefill_ref(q, kv, indices, softmax_scale, topk_length=None, attn_sink=None, return_abs=False):
    """Prefill over kv [s_kv,576] bf16: q [s_q,h,576], indices [s_q,topk], topk_length [s_q],
    limit = s_kv. Returns float64 (out [s_q,h,512], lse [s_q,h], max_logits [s_q,h]), and out_abs
    [s_q,h,512] (sparse_mla_attention) after them with return_abs."""
    kv_bits = as_bf16_bits(kv)
    if kv_bits.ndim != 2 or kv_bits.shape[1] != D_QK:
        raise ValueError(f"kv must be [s_kv, 576], got {kv_bits.shape}")
    q4 = as_bf16_bits(q)[None]
    idx = np.asarray(indices)[None]
    tl = None if topk_length is None else np.asarray(topk_length)[None]
    res = sparse_mla_attention(q4, lambda rows: bf16_to_f64(kv_bits[rows]), idx, kv_bits.shape[0],
                               softmax_scale, tl, attn_sink, return_abs)
    return tuple(r[0] for r in res)


# =============================================================================================
# comparison
# =============================================================================================

def check_close(actual, expected, *, abs_tol, rel_tol, cos_tol=None, slack=None, name="value"):
    """docs/design.md's tolerance rule. An element passes if |a-e| <= abs_tol or |a-e| <= rel_tol*|e|
    (with slack, an array broadcast to e: if |a-e| <= abs_tol + rel_tol*|e| + slack, the "fast" rule of
    out_rule); NaN positions and Inf positions (with their signs) must be equal; with cos_tol, 1 - cos(a, e)
    over all entries finite in both, in float64, must be <= cos_tol (two all-zero arrays: 0; one
    all-zero: 1). Inputs go through as_f64 (uint16 / bfloat16 = bf16). Raises AssertionError with
    the worst element; returns a dict of error statistics."""
    a, e = as_f64(actual), as_f64(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {e.shape}")

    def where(mask, what):
        bad = np.argwhere(mask)
        i = tuple(int(v) for v in bad[0])
        raise AssertionError(f"{name}: {len(bad)} of {a.size} elements have {what}; first at {i}: "
                             f"actual {a[i]!r}, expected {e[i]!r}")

    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if (nan_a != nan_e).any():
        where(nan_a != nan_e, "mismatched NaN")
    inf_bad = (np.isinf(a) | np.isinf(e)) & ~(nan_a | nan_e) & (a != e)
    if inf_bad.any():
        where(inf_bad, "mismatched Inf")

    fin = np.isfinite(a) & np.isfinite(e)
    with np.errstate(invalid="ignore"):  # inf - inf at positions already known to agree
        err = np.where(fin, np.abs(a - e), 0.0)
    rel_bound = rel_tol * np.abs(np.where(fin, e, 0.0))
    if slack is None:
        bound = np.maximum(abs_tol, rel_bound)
    else:
        slack = np.where(fin, np.broadcast_to(as_f64(slack), e.shape), 0.0)
        bound = abs_tol + rel_bound + slack
    with np.errstate(all="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound)  # <= 1 passes
    stats = {"max_abs": float(err.max(initial=0.0)), "max_ratio": float(ratio.max(initial=0.0)),
             "cos_diff": None}
    bad = ratio > 1
    if bad.any():
        i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        rel = err[i] / abs(e[i]) if e[i] != 0 else np.inf
        rule = f"abs {abs_tol:g} / rel {rel_tol:g}" if slack is None else \
            f"abs {abs_tol:g} + rel {rel_tol:g} + slack (here {slack[i]:.3g})"
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {a.size} elements outside {rule}; worst at "
            f"{tuple(int(v) for v in i)}: actual {a[i]!r}, expected {e[i]!r}, abs err {err[i]:.3g}, "
            f"rel err {rel:.3g}; first bad at {tuple(int(v) for v in np.argwhere(bad)[0])}")

    if cos_tol is not None:
        av, ev = a[fin], e[fin]
        na, ne = np.linalg.norm(av), np.linalg.norm(ev)
        if na == 0 and ne == 0:
            cd = 0.0
        elif na == 0 or ne == 0:
            cd = 1.0
        else:
            cd = float(1.0 - np.dot(av, ev) / (na * ne))
        stats["cos_diff"] = cd
        if not cd <= cos_tol:
            raise AssertionError(f"{name}: cosine difference {cd:.3g} > {cos_tol:g} "
                                 f"(max abs err {stats['max_abs']:.3g})")
    return stats


def out_rule(precision, out_abs=None, *, prefill=False):
    """check_close's keywords for an attention output of `precision` (docs/design.md section 4):
    "high": the op's abs / rel / cosine tolerances; "fast": the same abs and rel summed with
    FAST_OUT_ABS_REF * out_abs (the oracle's return_abs output), cosine FAST_OUT_COS."""
    abs_tol, rel_tol, cos_tol = ((PREFILL_OUT_ABS, PREFILL_OUT_REL, PREFILL_OUT_COS) if prefill
                                 else (OUT_ABS, OUT_REL, OUT_COS))
    if precision == "high":
        return dict(abs_tol=abs_tol, rel_tol=rel_tol, cos_tol=cos_tol)
    if precision != "fast":
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if out_abs is None:
        raise ValueError('precision="fast" needs out_abs, the oracle\'s output with V replaced by |V| '
                         "(return_abs=True)")
    # out_abs is float64 (the oracle's): a NumPy array, or a torch tensor for a device-side check
    return dict(abs_tol=abs_tol, rel_tol=rel_tol, cos_tol=FAST_OUT_COS, slack=FAST_OUT_ABS_REF * out_abs)


def check_decode(out, lse, out_ref, lse_ref, name="decode", *, precision="high", out_abs=None):
    """Decode outputs against the oracle with docs/design.md's tolerances for `precision` ("fast"
    needs out_abs: sparse_mla_decode_ref(..., return_abs=True))."""
    check_close(out, out_ref, **out_rule(precision, out_abs), name=f"{name} out")
    check_close(lse, lse_ref, abs_tol=LSE_ABS, rel_tol=LSE_REL, name=f"{name} lse")


def check_prefill(out, lse, max_logits, out_ref, lse_ref, ml_ref, name="prefill", *, precision="high",
                  out_abs=None):
    """Prefill outputs against the oracle with FlashMLA's prefill tolerances ("fast": out_rule)."""
    check_close(out, out_ref, **out_rule(precision, out_abs, prefill=True), name=f"{name} out")
    check_close(lse, lse_ref, abs_tol=PREFILL_LSE_ABS, rel_tol=PREFILL_LSE_REL, name=f"{name} lse")
    check_close(max_logits, ml_ref, abs_tol=PREFILL_LSE_ABS, rel_tol=PREFILL_LSE_REL,
                name=f"{name} max_logits")


def assert_bf16_equal(actual, expected, name="bf16"):
    """Bit equality of bf16 arrays, except that any NaN equals any NaN."""
    a, e = as_bf16_bits(actual), as_bf16_bits(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {e.shape}")
    nan_a = (a & 0x7FFF) > 0x7F80
    nan_e = (e & 0x7FFF) > 0x7F80
    bad = (nan_a != nan_e) | (~nan_a & (a != e))
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(f"{name}: {int(bad.sum())} of {a.size} bf16 values differ; first at {i}: "
                             f"actual 0x{int(a[i]):04x} ({bf16_to_f32(a[i])}), expected "
                             f"0x{int(e[i]):04x} ({bf16_to_f32(e[i])})")


def assert_cache_equal(actual, expected, kv_cache_dtype, name="kv_cache"):
    """Byte equality of two caches; in fp8_ds_mla entries the e4m3 NaN bytes 0x7F / 0xFF are
    interchangeable (scales and rope are compared bit for bit)."""
    a, e = _cache_view(actual, kv_cache_dtype), _cache_view(expected, kv_cache_dtype)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {e.shape}")
    if kv_cache_dtype == "bf16":
        bad = a != e
    else:
        bad = a != e
        nope = np.zeros(a.shape[2], bool)
        nope[:D_NOPE] = True
        both_nan = ((a & 0x7F) == 0x7F) & ((e & 0x7F) == 0x7F)
        bad &= ~(both_nan & nope)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        what = ("nope byte" if i[2] < D_NOPE else "scale byte" if i[2] < FP8_ROPE_OFF
                else "rope byte") if kv_cache_dtype == "fp8_ds_mla" else "bf16 value"
        raise AssertionError(f"{name}: {int(bad.sum())} elements differ; first at {i} ({what}): "
                             f"actual 0x{int(a[i]):x}, expected 0x{int(e[i]):x}")


# =============================================================================================
# random data
# =============================================================================================

def rand_bf16(shape, rng, scale=1.0):
    """uint16 bits of bf16_rne(scale * standard normal)."""
    return bf16_rne(rng.standard_normal(shape) * scale)


def invalid_index_zoo(limit):
    """int32 indices that are invalid for `limit` valid rows (FlashMLA's zoo plus limit + 1); values
    that would be valid (0 <= v < limit) or do not fit int32 are dropped."""
    cand = [INT32_MIN, -123456, -1, limit, limit + 1, 114514, 1919810, 2147480000, INT32_MAX]
    keep = []
    for v in cand:
        if (v < 0 or v >= limit) and INT32_MIN <= v <= INT32_MAX and v not in keep:
            keep.append(v)
    return np.array(keep, np.int32)
