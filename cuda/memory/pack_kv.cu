// pack_kv: write T tokens (kv_c [T,512] bf16, k_pe [T,64] bf16) into a paged cache at slot_mapping.
// One warp per token; every warp-wide access is contiguous (lane l owns 16-byte pieces l and 32+l of
// the latent row, lanes 0..7 the k_pe row). fp8_ds_mla tiles are 16 lanes wide, so the tile amax is a
// 16-lane shuffle reduction (tile_amax). The rules are core/fp8_ds_mla.h's, shared with csrc/cpu/pack_kv.c:
// amax = fmaxf over |x| (NaN ignored; tile_amax gets the same from the bf16 values),
// s = smla_fp8_scale(amax, rule), byte = smla_fp8_quant(x, s), here in its vector form quant8.
// Slots: negative ones are padding and skipped, as on the CPU. A slot >= num_blocks * block_size is
// also skipped here (nothing is written), where the CPU raises: the slots live on the device, and
// reporting one would need a sync (or a device flag read back later) on a path that must stay
// asynchronous and graph-capturable. Callers on the GPU own that check (docs/design.md section 4).
#include "cache_rows.cuh"

namespace {

using namespace smla;

constexpr int kWarpsPerBlock = 8;
// Read-ahead distance in tokens (about one wave of resident warps on a 132-SM H200; 0: none).
#ifndef SMLA_PACK_PREFETCH_TOKENS
#define SMLA_PACK_PREFETCH_TOKENS 8192
#endif
constexpr int kPrefetchTokens = SMLA_PACK_PREFETCH_TOKENS;

template <bool I64> __device__ __forceinline__ int64_t load_slot(const void *s, int64_t t)
{
    return I64 ? static_cast<const int64_t *>(s)[t] : static_cast<int64_t>(static_cast<const int32_t *>(s)[t]);
}

// k_pe is often a slice of a wider activation, so its alignment is checked on its own (run time).
__device__ __forceinline__ uint4 load_rope(const uint16_t *p, bool vec)
{
    return vec ? ld16_u16_stream<true>(p) : ld16_u16_stream<false>(p);
}

// 8 bf16 (one uint4, low half first) -> 8 floats.
__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float f[8])
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = smla_bf16_to_f32(static_cast<uint16_t>(w[i]));
        f[2 * i + 1] = smla_bf16_to_f32(static_cast<uint16_t>(w[i] >> 16));
    }
}

// The largest |x| of tile a (this lane's piece va) and of tile b (vb) over the 16 lanes that hold each tile,
// as (amax_a, amax_b), computed on the bf16 values themselves: clearing the sign bit is |x|, bf16 max is
// exact and lets a NaN lose as fmaxf does (a tile of NaNs only gives 0, from the last max with 0), and
// widening to float is exact; so the result is fmaxf's over the floats, bit for bit, in 10 bf16x2 max and
// 4 shuffles instead of 16 float max and 8 shuffles, and the kernel fits 32 registers instead of 40 (8
// blocks an SM instead of 6). H200, bench_memory_ops.py --quick, t=16384: 0.85 -> 0.87 of the copy rate.
__device__ __forceinline__ float2 tile_amax(uint4 va, uint4 vb)
{
    const auto mx = [](uint32_t x, uint32_t y) {
        const __nv_bfloat162 r = __hmax2(*reinterpret_cast<const __nv_bfloat162 *>(&x),
                                         *reinterpret_cast<const __nv_bfloat162 *>(&y));
        return *reinterpret_cast<const uint32_t *>(&r);
    };
    constexpr uint32_t kAbs = 0x7fff7fffu;
    const uint32_t a = mx(mx(va.x & kAbs, va.y & kAbs), mx(va.z & kAbs, va.w & kAbs));
    const uint32_t b = mx(mx(vb.x & kAbs, vb.y & kAbs), mx(vb.z & kAbs, vb.w & kAbs));
    uint32_t m = mx(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632)); // low half: tile a, high: tile b
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) m = mx(m, __shfl_xor_sync(kFullMask, m, o));
    m = mx(m, 0u);
    return make_float2(__uint_as_float(m << 16), __uint_as_float(m & 0xffff0000u));
}

// smla_fp8_quant(x, s) = e4m3_satfinite_rne(x / s) for 8 values -> 8 bytes. With a power-of-two s (pow2
// rule, s <= 2^120 or Inf) 1/s is exact, so x * (1/s) is the same correctly rounded value as x / s, bit
// for bit (Inf/NaN included: x * 0 = x / Inf for finite x, Inf * 0 and Inf / Inf are NaN); the legacy
// fp32 rule divides.
__device__ __forceinline__ uint2 quant8(const float f[8], float s, bool pow2)
{
    const float inv = __frcp_rn(s);
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        uint32_t acc = 0;
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
            const float a = f[4 * h + i], b = f[4 * h + i + 1];
            const float2 pr = pow2 ? make_float2(__fmul_rn(a, inv), __fmul_rn(b, inv))
                                   : make_float2(__fdiv_rn(a, s), __fdiv_rn(b, s));
            acc |= static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(pr, __NV_SATFINITE, __NV_E4M3)) << (8 * i);
        }
        w[h] = acc;
    }
    return make_uint2(w[0], w[1]);
}

// One token's inputs as one warp holds them: lane l has 16-byte pieces l and 32+l of the latent row and,
// lanes < 8, piece l of k_pe.
struct TokenRow {
    int64_t slot;
    uint4 a, b, rope;
};

// The token's row is read once: streaming loads (evict first), so that it does not push the cache lines
// this kernel writes out of L2 before their neighbouring entries (656-byte entries share a 32-byte
// sector with a neighbour) are written too.
template <bool VIN, bool I64>
__device__ __forceinline__ TokenRow load_token(const smla_pack_kv_params &p, int64_t t, int lane, bool rope_vec)
{
    TokenRow r;
    r.slot = load_slot<I64>(p.slot_mapping, t);
    const uint16_t *x = p.kv_c + t * p.kv_c_stride;
    r.a = ld16_u16_stream<VIN>(x + 8 * lane);
    r.b = ld16_u16_stream<VIN>(x + 256 + 8 * lane);
    if (lane < 8) r.rope = load_rope(p.k_pe + t * p.k_pe_stride + 8 * lane, rope_vec);
    return r;
}

// The token's cache entry at e: bf16 as loaded, or fp8_ds_mla (per-tile scale, quantised latent, k_pe).
template <int DT, bool POW2, bool VOUT>
__device__ __forceinline__ void write_entry(const smla_pack_kv_params &p, const TokenRow &r, uint8_t *e, int lane)
{
    if constexpr (DT == SMLA_CACHE_BF16) {
        st16<VOUT>(e + 16 * lane, r.a);
        st16<VOUT>(e + 512 + 16 * lane, r.b);
        if (lane < 8) st16<VOUT>(e + 1024 + 16 * lane, r.rope);
    } else {
        float fa[8], fb[8];
        bf16x8_to_f32(r.a, fa);
        bf16x8_to_f32(r.b, fb);
        // lanes 0-15 hold tiles 0 (a) and 2 (b), lanes 16-31 tiles 1 and 3
        const float2 amax = tile_amax(r.a, r.b);
        const float sa = smla_fp8_scale(amax.x, p.scale_rule), sb = smla_fp8_scale(amax.y, p.scale_rule);

        st8<VOUT>(e + 8 * lane, quant8(fa, sa, POW2));
        st8<VOUT>(e + 256 + 8 * lane, quant8(fb, sb, POW2));
        if ((lane & 15) == 0) {
            st4<VOUT>(e + SMLA_FP8_SCALE_OFF + 4 * (lane >> 4), smla_f32_to_bits(sa));
            st4<VOUT>(e + SMLA_FP8_SCALE_OFF + 8 + 4 * (lane >> 4), smla_f32_to_bits(sb));
        }
        if (lane < 8) st16<VOUT>(e + SMLA_FP8_ROPE_OFF + 16 * lane, r.rope);
    }
}

// One token per warp: its loads, a read-ahead of the token kPrefetchTokens later (its kv_c row, lanes
// 0-7, and k_pe row, lane 8), then its entry. POW2: the fp8 scale rule is SMLA_SCALE_POW2 (its
// quantisation multiplies; a run-time test per value compiled to two paths and a branch per pair of values).
template <int DT, bool POW2, bool VIN, bool VOUT, bool I64>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) pack_kernel(smla_pack_kv_params p, bool rope_vec)
{
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
    if (t >= p.num_tokens) return;
    const TokenRow r = load_token<VIN, I64>(p, t, lane, rope_vec);
    const int64_t ta = t + kPrefetchTokens;
    if (kPrefetchTokens > 0 && ta < p.num_tokens) {
        if (lane < 8) prefetch_l2(p.kv_c + ta * p.kv_c_stride + 64 * lane);
        else if (lane == 8) prefetch_l2(p.k_pe + ta * p.k_pe_stride);
    }
    uint8_t *e = smla_cache_entry(&p.cache, r.slot);
    if (e != nullptr) write_entry<DT, POW2, VOUT>(p, r, e, lane); // else padded / invalid: nothing is written
}

template <bool VIN, bool VOUT, bool I64> void launch(const smla_pack_kv_params &p, bool rope_vec, dim3 grid,
                                                     dim3 block, cudaStream_t s)
{
    if (p.cache.dtype == SMLA_CACHE_BF16)
        smla_launch(pack_kernel<SMLA_CACHE_BF16, false, VIN, VOUT, I64>, grid, block, 0, s, 1, p, rope_vec);
    else if (p.scale_rule == SMLA_SCALE_POW2)
        smla_launch(pack_kernel<SMLA_CACHE_FP8_DS_MLA, true, VIN, VOUT, I64>, grid, block, 0, s, 1, p, rope_vec);
    else
        smla_launch(pack_kernel<SMLA_CACHE_FP8_DS_MLA, false, VIN, VOUT, I64>, grid, block, 0, s, 1, p, rope_vec);
}

template <bool VIN, bool VOUT> void launch_slots(const smla_pack_kv_params &p, bool rope_vec, dim3 grid,
                                                 dim3 block, cudaStream_t s)
{
    if (p.slot_is_i64) launch<VIN, VOUT, true>(p, rope_vec, grid, block, s);
    else launch<VIN, VOUT, false>(p, rope_vec, grid, block, s);
}

} // namespace

// p passed smla_check_pack_kv (csrc/core/checks.c); what is left is this launch's grid
extern "C" int smla_cuda_pack_kv(const smla_pack_kv_params *p, smla_status *st)
{
    const smla_cache &c = p->cache;
    if (p->num_tokens == 0 || c.num_blocks == 0) return SMLA_OK;
    const int64_t nblk = smla_ceil_div(p->num_tokens, kWarpsPerBlock);
    if (nblk > 0x7fffffffLL)
        return smla_fail(st, SMLA_ERR_VALUE, "slot_mapping: %lld tokens exceed one CUDA grid",
                         static_cast<long long>(p->num_tokens));
    const bool vin = aligned16(p->kv_c, 2 * p->kv_c_stride);
    const bool rope_vec = aligned16(p->k_pe, 2 * p->k_pe_stride);
    const bool vout = aligned16(c.data, c.block_stride, c.entry_stride);
    const dim3 grid(static_cast<unsigned>(nblk)), block(kWarpsPerBlock * kWarp);
    cudaStream_t s = smla_stream(p->stream);
    if (vin && vout) launch_slots<true, true>(*p, rope_vec, grid, block, s);
    else if (vin) launch_slots<true, false>(*p, rope_vec, grid, block, s);
    else if (vout) launch_slots<false, true>(*p, rope_vec, grid, block, s);
    else launch_slots<false, false>(*p, rope_vec, grid, block, s);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
