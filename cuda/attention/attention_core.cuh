// Shared core of the sparse MLA kernels (decode and prefill): one CTA = one query row x one tile of
// HT heads (16, 32 or 64) x one contiguous range of top-k tiles; flash-attention style loop over
// BN-token K tiles gathered into shared memory, bf16 tensor cores (mma.sync m16n8k16, fp32
// accumulate) fed by ldmatrix, online softmax in fp32 (log2 domain), runs on sm_80 and later.
//
// Per K tile (all warps, CTA-wide barriers):
//   S phase : warp (wr, wc) computes S[16 heads x TN tokens] = Q K^T over 576 dims; masks invalid
//             tokens to -inf; row maxima are exchanged through smem (barrier B1); p = exp2(s - m) is
//             split into two bf16 terms, p = P_hi + P_lo (split_bf16x2): P_hi is written into the K
//             tile's dead RoPE columns (aliases K[:, 512:576]), P_lo into its own [HT x BN] region.
//   PV phase: after barrier B2 every warp owns all HT rows x (512 / NW) output columns in registers
//             and does O = O * alpha + P_hi V + P_lo V with V = K[:, :512] (ldmatrix.trans). A bf16 P
//             alone is NOT accurate enough for docs/design.md's tolerances (it rounds each probability by up
//             to 2^-9 relative; with |V| ~ 10 that is ~1e-2 absolute on the output).
// lse / max_logits accuracy (docs/design.md: 1e-6 absolute near 0): QK^T is summed per 64-dim group and the
// groups added in fp32 (a single 36-step tensor-core chain errs by up to ~1e-6 on a logit), row sums
// are kept in double, and lse = m * ml_factor + ln(l) is formed in double (ml_factor = scale /
// fl(scale * log2 e) also undoes the fp32 rounding of the log2-domain scale).
// K-tile loader policies:
//   bf16 : 16-byte cp.async row gathers into a double-buffered bf16 tile (zero fill for invalid rows).
//   fp8  : cp.async of the raw 656-byte entries into a staging buffer, then a smem->smem dequant pass
//          bf16_rne(float(e4m3) * scale) (bit-exact with the CPU path) into one bf16 tile.
// Indices go through a 3-slot smem ring (cp.async, one tile ahead of the K rows that use them).
// Invalid indices are never dereferenced: their rows are zero-filled and their scores are -inf.
//
// Output: direct (bf16 out, natural-log lse, max_logits, attn_sink) or, when the top-k is split
// across CTAs (decode with few rows), fp32 partial O plus log2-domain lse into the caller's
// workspace and a combine kernel that does the lse-weighted merge (empty splits are (0, -inf)).
// Scores beyond the fp32 range saturate at +-FLT_MAX (see "Overflow" below).
#pragma once

#include <math.h>

#include "common.cuh"

namespace {
namespace attn {

constexpr int kDqk = SMLA_D_QK;             // 576
constexpr int kDv = SMLA_D_V;               // 512
constexpr int kRowBytes = 2 * kDqk;         // one bf16 row of Q / K in smem: 1152 B
constexpr int kRowChunks = kRowBytes / 16;  // 72 sixteen-byte chunks
constexpr int kFp8Entry = SMLA_FP8_ENTRY;   // 656 B
constexpr int kFp8Chunks = kFp8Entry / 16;  // 41
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr double kLn2d = 0.6931471805599453;
constexpr double kLog2ed = 1.4426950408889634;

// ------------------------------------------------------------------------------------------------
// PTX wrappers (all sm_80+)
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async16_hint(uint32_t dst, const void *src, int src_bytes, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ uint64_t policy_evict_last()
{
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a * b: m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v)
{
    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// 2^x, approximate (2 ulp); -inf -> +0.
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ------------------------------------------------------------------------------------------------
// Shared-memory layout helpers. Q and K rows are 1152 B = 72 chunks of 16 B; chunk c of row r lives
// at chunk c ^ (r & 7) (XOR swizzle inside each 128-byte group), so that ldmatrix reading 8
// consecutive rows at the same logical chunk hits 8 different bank groups.
// ------------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t row_chunk(uint32_t base, int row, int chunk)
{
    return base + static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// P[hr][tok] (bf16) in 128-byte rows of 8 chunks, 64 / BN P rows per such row, the chunk XOR-swizzled
// by (row & 7). P_hi lives in the RoPE columns (chunks 64..71) of the K tile (base = tile + 1024, row
// stride 1152: chunk 64 + c ^ (r & 7) = 64 + (c ^ (r & 7))); P_lo in its own region (row stride 128).
template <int BN, int STRIDE>
__device__ __forceinline__ uint32_t p_addr(uint32_t base, int hr, int tok)
{
    constexpr int PR = 64 / BN;  // P rows per 128-byte row
    constexpr int PC = BN / 8;   // chunks per P row
    const int kr = hr / PR;
    const int lc = (hr % PR) * PC + (tok >> 3);
    return base + static_cast<uint32_t>(kr * STRIDE + ((lc ^ (kr & 7)) << 4) + ((tok & 7) << 1));
}

// p = hi + lo with hi = bf16_rne(p) and lo = bf16_rne(p - hi) (p - hi is exact in fp32): P V is done
// as P_hi V + P_lo V, so the probabilities carry ~16 significant bits instead of bf16's 8 (a bf16 P
// alone gives errors of ~2^-9 |V| per dominant token: up to ~1e-2 on outputs whose V entries reach
// ~10, far outside docs/design.md's 1e-3 absolute tolerance).
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo)
{
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

// ------------------------------------------------------------------------------------------------
// Overflow (docs/design.md section 4), shared by both kernels and the combine. A valid score (log2
// domain) beyond the fp32 range saturates at +-FLT_MAX, so the online softmax never meets inf - inf.
// A row whose maximum saturated at +FLT_MAX gives the mean of its saturated tokens' values (every
// other p = ex2(s - FLT_MAX) is 0) and lse = max_logits = +inf; a row whose every valid score
// saturated at -FLT_MAX gives the mean of them all and lse = max_logits = -inf. A thread saturates
// its scores of a tile only when its own row maxima say it may matter (sat_needed), so a tile
// without overflow pays a few compares per row, nothing per score.
// ------------------------------------------------------------------------------------------------
constexpr float kFltMax = 3.40282347e+38f;

// One valid score, saturated; NaN stays NaN.
__device__ __forceinline__ float sat_score(float x)
{
    return x == INFINITY ? kFltMax : (x == -INFINITY ? -kFltMax : x);
}

// mx: the max of this thread's scores of a row in this tile; m: the row's running max before it. +inf
// shows in mx. A valid -inf matters only while the row has nothing above -FLT_MAX (so neither this
// thread nor the row so far); next to a larger score, -inf and -FLT_MAX both weigh 0.
__device__ __forceinline__ bool sat_needed(float mx, float m)
{
    return mx == INFINITY || (mx <= -kFltMax && m <= -kFltMax);
}

// Natural-log lse of a finished row (m: its log2-domain max, -inf when it had no valid index; l: its
// sum of 2^(s - m)) and its natural-log max logit. A saturated max stands for an overflowed one.
__device__ __forceinline__ double row_lse(float m, double l, double ml_factor)
{
    if (m == -INFINITY) return -INFINITY;
    if (l != l) return l;  // a NaN score
    if (m == kFltMax) return INFINITY;
    if (m == -kFltMax) return -INFINITY;
    return static_cast<double>(m) * ml_factor + log(l);
}
__device__ __forceinline__ float row_max_logit(float m, double ml_factor)
{
    if (m == kFltMax) return INFINITY;
    if (m == -kFltMax) return -INFINITY;
    return static_cast<float>(static_cast<double>(m) * ml_factor);  // -inf stays -inf
}

// attn_sink's factor 1 / (1 + exp(sink - lse)); sink +inf -> 0 and -inf -> 1 whatever lse (also the
// infinite lse of a saturated row, where sink - lse would be inf - inf); NaN stays NaN.
__device__ __forceinline__ double sink_factor(float sink, double lse)
{
    if (sink == INFINITY) return 0.0;
    if (sink == -INFINITY) return 1.0;
    return 1.0 / (1.0 + exp(static_cast<double>(sink) - lse));
}

// Split partials. A saturated split has no finite lse, and the combine needs its sign and its count
// of saturated tokens (its row sum l: each of them weighs exactly ex2(0) = 1, any other token 0) to
// weight all saturated tokens of the row equally across splits. Its lse_part is a "box": the bits of
// an infinity of that sign with the count in the 22 low mantissa bits, a signalling-NaN pattern that
// no arithmetic produces (the GPU's NaNs are quiet); counts from 2^22 - 1 on are stored as 2^22 - 1.
// Any other non-empty split stores its lse * log2(e) clamped to the finite range (NaN stays NaN),
// as -inf means an empty split.
constexpr uint32_t kSatCountMax = 0x3fffffu;
__device__ __forceinline__ float part_lse(float m, double l, double lse_d)
{
    if (m == -INFINITY) return -INFINITY;
    if (l == l && (m == kFltMax || m == -kFltMax)) {
        const uint32_t c = l < static_cast<double>(kSatCountMax) ? static_cast<uint32_t>(l) : kSatCountMax;
        return __uint_as_float((m > 0.f ? 0x7f800000u : 0xff800000u) | c);  // l >= 1: c >= 1
    }
    const float v = static_cast<float>(lse_d * kLog2ed);
    return v > kFltMax ? kFltMax : (v < -kFltMax ? -kFltMax : v);
}
// +1 / -1: a box of that sign; 0: any other value
__device__ __forceinline__ int box_sign(float x)
{
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fc00000u) != 0x7f800000u || (u & kSatCountMax) == 0) return 0;
    return (u >> 31) ? -1 : 1;
}
__device__ __forceinline__ float box_count(float x) { return static_cast<float>(__float_as_uint(x) & kSatCountMax); }

// ------------------------------------------------------------------------------------------------
// Kernel arguments
// ------------------------------------------------------------------------------------------------
struct Args {
    smla_attn_params p;
    int64_t limit;     // valid slots: [0, limit)
    int64_t rows;      // b * s_q
    int n_ht;          // head tiles per row
    int n_splits;      // top-k splits per (row, head tile); > 1: partials + combine
    float scale_log2;  // softmax_scale * log2(e), rounded to fp32
    double ml_factor;  // softmax_scale / scale_log2 (~ln 2): log2-domain kernel logits -> natural logits,
                       // undoing scale_log2's fp32 rounding (lse = m * ml_factor + ln(l))
    float *o_part;     // [n_splits, rows, h, 512] fp32 (split mode)
    float *lse_part;   // [n_splits, rows, h] fp32, log2 domain (split mode)
    int evict_last;    // L2 evict_last hint on K rows (prefill: neighbouring rows share K)
};

// What one CTA of query row (bi, si) and top-k split sp reads: the row's indices, its top-k length L
// (topk_length clamped to [0, topk]) and its tiles [j0, j1) of bn tokens (j1 <= j0: none).
struct RowSlice {
    const int32_t *idx;
    int L, j0, j1;
};
__device__ __forceinline__ RowSlice row_slice(const Args &a, int64_t bi, int64_t si, int sp, int bn)
{
    const smla_attn_params &p = a.p;
    const int topk = static_cast<int>(p.topk);
    RowSlice r;
    r.idx = p.indices + bi * p.idx_stride_b + si * p.idx_stride_s;
    r.L = topk;
    if (p.topk_length) {
        const int v = p.topk_length[bi * p.tl_stride_b + si * p.tl_stride_s];
        r.L = v < 0 ? 0 : (v > topk ? topk : v);
    }
    const int ntile = (r.L + bn - 1) / bn;
    const int tps = (ntile + a.n_splits - 1) / a.n_splits;
    r.j0 = sp * tps;
    r.j1 = min(ntile, r.j0 + tps);
    return r;
}

template <int HT_, int BN_, bool FP8_, int NRAW_>
struct Cfg {
    static constexpr int HT = HT_;            // heads per CTA
    static constexpr int BN = BN_;            // tokens per K tile
    static constexpr bool FP8 = FP8_;         // fp8_ds_mla cache
    static constexpr int NRAW = FP8_ ? NRAW_ : 0;  // raw fp8 staging buffers
    static constexpr int NW = HT == 16 ? 4 : 8;    // warps
    static constexpr int NT = NW * 32;
    static constexpr int MINB = HT == 16 ? 2 : 1;  // CTAs per SM the register budget must allow
    static constexpr int WR = HT / 16;        // S phase: warp rows (16 heads each)
    static constexpr int WC = NW / WR;        // S phase: warp columns (token groups)
    static constexpr int TN = BN / WC;        // tokens per warp in the S phase
    static constexpr int NTS = TN / 8;        // n8 tiles per warp in the S phase
    static constexpr int MT = HT / 16;        // PV phase: m16 tiles per warp (all rows)
    static constexpr int OC = kDv / NW;       // PV phase: output columns per warp
    static constexpr int NTO = OC / 8;        // n8 tiles of O per warp
    static constexpr int NKBUF = FP8 ? 1 : 2; // bf16 K tiles
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + HT * kRowBytes;
    static constexpr int PLO_OFF = K_OFF + NKBUF * BN * kRowBytes;  // P_lo [HT x BN] bf16
    static constexpr int RAW_OFF = PLO_OFF + HT * BN * 2;
    static constexpr int IDX_OFF = RAW_OFF + NRAW * BN * kFp8Entry;
    static constexpr int RED_OFF = IDX_OFF + 3 * BN * 4;
    static constexpr int ALPHA_OFF = RED_OFF + WC * HT * 8;  // float maxima, then double row sums
    static constexpr int M_OFF = ALPHA_OFF + HT * 4;
    static constexpr int SMEM = M_OFF + HT * 4;
    static_assert(HT == 16 || HT == 32 || HT == 64, "head tile");
    static_assert(BN == 32 || BN == 64, "token tile");
    static_assert(NW % WR == 0 && TN % 8 == 0 && NTS >= 1 && (NTS == 1 || NTS % 2 == 0), "S warp tiling");
    static_assert(NTO % 2 == 0, "O warp tiling");
    static_assert(HT * BN * 2 <= BN * 128, "P must fit in the RoPE columns of the K tile");
};

// ------------------------------------------------------------------------------------------------
// The attention kernel
// ------------------------------------------------------------------------------------------------
template <class C>
__global__ void __launch_bounds__(C::NT, C::MINB) attn_fwd_kernel(const __grid_constant__ Args a)
{
    constexpr int HT = C::HT, BN = C::BN, NW = C::NW, NT = C::NT;
    extern __shared__ __align__(128) uint8_t smem[];
    const smla_attn_params &p = a.p;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;

    // ---- which (row, head tile, split) ----
    int64_t bx = blockIdx.x;
    const int sp = static_cast<int>(bx % a.n_splits);
    bx /= a.n_splits;
    const int ht = static_cast<int>(bx % a.n_ht);
    const int64_t row = bx / a.n_ht;
    const int64_t bi = row / p.s_q, si = row % p.s_q;
    const int h = static_cast<int>(p.h);
    const int h0 = ht * HT;
    const RowSlice slice = row_slice(a, bi, si, sp, BN);
    const int32_t *idx_row = slice.idx;
    const int L = slice.L, j0 = slice.j0, j1 = slice.j1;

    const uint32_t sQ = smem_u32(smem + C::Q_OFF);
    const uint32_t sK = smem_u32(smem + C::K_OFF);
    const uint32_t sPlo = smem_u32(smem + C::PLO_OFF);
    const uint32_t sRaw = smem_u32(smem + C::RAW_OFF);
    const uint32_t sIdxA = smem_u32(smem + C::IDX_OFF);
    const int32_t *sIdx = reinterpret_cast<const int32_t *>(smem + C::IDX_OFF);
    float *sRed = reinterpret_cast<float *>(smem + C::RED_OFF);     // per-tile row maxima
    double *sRedD = reinterpret_cast<double *>(smem + C::RED_OFF);  // epilogue: row sums
    float *sAlpha = reinterpret_cast<float *>(smem + C::ALPHA_OFF);
    float *sM = reinterpret_cast<float *>(smem + C::M_OFF);

    const uint8_t *kv_base = static_cast<const uint8_t *>(p.kv.data);
    const uint32_t block_size = static_cast<uint32_t>(p.kv.block_size);
    const int64_t limit = a.limit;
    const uint64_t pol = a.evict_last ? policy_evict_last() : 0;

    // S-phase coordinates: rows wr*16.., tokens wc*TN..
    const int wr = warp % C::WR, wc = warp / C::WR;

    // running softmax state of the two rows this thread sees in the S phase (16wr+g, 16wr+g+8)
    float m_r[2] = {-INFINITY, -INFINITY};
    double l_r[2] = {0.0, 0.0};  // row sums in double: thousands of fp32 adds would cost ~1e-7 relative
    float o[C::MT][C::NTO][4];
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NTO; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.f;

    // ---- loaders ----
    auto load_idx = [&](int j, int slot) {
        for (int i = tid; i < BN; i += NT) {
            const int pos = j * BN + i;
            const bool ok = pos < L;
            cp_async4(sIdxA + (slot * BN + i) * 4, ok ? idx_row + pos : idx_row, ok ? 4 : 0);
        }
    };
    // Rows of tile j (indices in ring slot `slot`) into `dst` (bf16 tiles: swizzled rows of kRowBytes;
    // fp8: raw entries of kFp8Entry bytes). A warp copies 4 rows at a time, 8 lanes per row, each lane
    // finding its own row's address (nothing serialised across the warp); in a bf16 row, lane chunk
    // cl = lane & 7 of each 128-byte group has one swizzled offset for all 9 groups.
    auto load_rows = [&](int j, int slot, uint32_t dst) {
        static_assert(BN % (4 * NW) == 0, "4 rows per warp per step");
        const int sub = lane >> 3, cl = lane & 7;
#pragma unroll 1
        for (int r = 4 * warp + sub; r < BN; r += 4 * NW) {
            const int idx = sIdx[slot * BN + r];
            const bool ok = (j * BN + r) < L && idx >= 0 && static_cast<int64_t>(idx) < limit;
            const uint8_t *src = kv_base;
            if (ok) {
                const uint32_t u = static_cast<uint32_t>(idx);
                const uint32_t blk = u / block_size, off = u - blk * block_size;
                src += static_cast<int64_t>(blk) * p.kv.block_stride + static_cast<int64_t>(off) * p.kv.entry_stride;
            }
            const int nbytes = ok ? 16 : 0;
            if constexpr (C::FP8) {
                const uint32_t d = dst + r * kFp8Entry;
                for (int c = cl; c < kFp8Chunks; c += 8) {
                    if (a.evict_last) cp_async16_hint(d + c * 16, src + c * 16, nbytes, pol);
                    else cp_async16(d + c * 16, src + c * 16, nbytes);
                }
            } else {
                const uint32_t d = dst + r * kRowBytes + ((cl ^ (r & 7)) << 4);
                src += cl * 16;
#pragma unroll
                for (int c8 = 0; c8 < kRowChunks / 8; ++c8) {
                    if (a.evict_last) cp_async16_hint(d + c8 * 128, src + c8 * 128, nbytes, pol);
                    else cp_async16(d + c8 * 128, src + c8 * 128, nbytes);
                }
            }
        }
    };
    // fp8 staging -> bf16 K tile. Output chunk c (8 values) of a row: c < 64 from 8 e4m3 bytes and
    // scale c / 16; c >= 64 is a RoPE chunk copied bit for bit. Invalid rows were zero-filled, so
    // they dequantise to zeros (0 * 0).
    auto dequant = [&](const uint8_t *raw, uint32_t kdst) {
#pragma unroll 1
        for (int r = warp; r < BN; r += NW) {
            const uint8_t *rr = raw + r * kFp8Entry;
            const float *sc = reinterpret_cast<const float *>(rr + SMLA_FP8_SCALE_OFF);
            for (int c = lane; c < kRowChunks; c += 32) {
                uint4 v;
                if (c < 64) {
                    const uint2 e = *reinterpret_cast<const uint2 *>(rr + c * 8);
                    const float s = sc[c >> 4];
                    v.x = dequant_e4m3x2(e.x, s);
                    v.y = dequant_e4m3x2(e.x >> 16, s);
                    v.z = dequant_e4m3x2(e.y, s);
                    v.w = dequant_e4m3x2(e.y >> 16, s);
                } else {
                    v = *reinterpret_cast<const uint4 *>(rr + SMLA_FP8_ROPE_OFF + (c - 64) * 16);
                }
                st_shared_v4(row_chunk(kdst, r, c), v);
            }
        }
    };

    // ---- one K tile: S = Q K^T, online softmax, O += P V ----
    auto tile = [&](int j, uint32_t kb, int slot) {
        // S phase
        float acc[C::NTS][4];
#pragma unroll
        for (int i = 0; i < C::NTS; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
        // 36 k-steps as 9 groups of 4 (one 128-byte swizzle group of Q / K columns each): the
        // swizzled offsets within a group are per-lane constants, the group adds 128 B.
        const int qrow = wr * 16 + (lane & 15), qhi = lane >> 4;
        const int tok0 = wc * C::TN;
        const int krow = C::NTS == 1 ? tok0 + (lane & 7) : tok0 + ((lane >> 4) << 3) + (lane & 7);
        const int khi = (lane >> 3) & 1;
        uint32_t qoff[4], koff[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            qoff[u] = row_chunk(sQ, qrow, 2 * u + qhi);
            koff[u] = row_chunk(kb, krow, 2 * u + khi);
        }
        // Each 64-dim group accumulates into its own partial (4 mma steps), added to acc in fp32 with
        // round-to-nearest: one 36-step tensor-core chain loses up to ~1e-6 (natural-log units) on a
        // logit, at docs/design.md's lse / max_logits tolerance.
#pragma unroll 1
        for (int kg = 0; kg < kDqk / 64; ++kg) {
            float pt[C::NTS][4];
#pragma unroll
            for (int i = 0; i < C::NTS; ++i) pt[i][0] = pt[i][1] = pt[i][2] = pt[i][3] = 0.f;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                uint32_t af[4];
                ldsm_x4(af, qoff[u] + kg * 128);
                if constexpr (C::NTS == 1) {
                    uint32_t bf[2];
                    ldsm_x2(bf, koff[u] + kg * 128);
                    mma_bf16(pt[0], af, bf[0], bf[1]);
                } else {
#pragma unroll
                    for (int np = 0; np < C::NTS / 2; ++np) {
                        uint32_t bf[4];
                        ldsm_x4(bf, koff[u] + kg * 128 + np * 16 * kRowBytes);
                        mma_bf16(pt[2 * np], af, bf[0], bf[1]);
                        mma_bf16(pt[2 * np + 1], af, bf[2], bf[3]);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < C::NTS; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][e] += pt[i][e];
        }
        // mask + scale (log2 domain), row max over this warp's tokens
        const int32_t *ring = sIdx + slot * BN;
        auto valid2 = [&](int tok, bool &ok0, bool &ok1) {  // tokens tok, tok + 1 of tile j
            const int2 iv = *reinterpret_cast<const int2 *>(ring + tok);
            const int pos = j * BN + tok;
            ok0 = pos < L && iv.x >= 0 && static_cast<int64_t>(iv.x) < limit;
            ok1 = pos + 1 < L && iv.y >= 0 && static_cast<int64_t>(iv.y) < limit;
        };
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt) {
            bool ok0, ok1;
            valid2(tok0 + nt * 8 + 2 * t4, ok0, ok1);
            acc[nt][0] = ok0 ? acc[nt][0] * a.scale_log2 : -INFINITY;
            acc[nt][1] = ok1 ? acc[nt][1] * a.scale_log2 : -INFINITY;
            acc[nt][2] = ok0 ? acc[nt][2] * a.scale_log2 : -INFINITY;
            acc[nt][3] = ok1 ? acc[nt][3] * a.scale_log2 : -INFINITY;
            mx[0] = fmaxf(mx[0], fmaxf(acc[nt][0], acc[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(acc[nt][2], acc[nt][3]));
        }
        if (sat_needed(mx[0], m_r[0]) || sat_needed(mx[1], m_r[1])) {  // overflow (rare): saturate
            mx[0] = mx[1] = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < C::NTS; ++nt) {
                bool ok0, ok1;
                valid2(tok0 + nt * 8 + 2 * t4, ok0, ok1);
                if (ok0) {
                    acc[nt][0] = sat_score(acc[nt][0]);
                    acc[nt][2] = sat_score(acc[nt][2]);
                }
                if (ok1) {
                    acc[nt][1] = sat_score(acc[nt][1]);
                    acc[nt][3] = sat_score(acc[nt][3]);
                }
                mx[0] = fmaxf(mx[0], fmaxf(acc[nt][0], acc[nt][1]));
                mx[1] = fmaxf(mx[1], fmaxf(acc[nt][2], acc[nt][3]));
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
        const int r0 = wr * 16 + g;
        if (t4 == 0) {
            sRed[wc * HT + r0] = mx[0];
            sRed[wc * HT + r0 + 8] = mx[1];
        }
        __syncthreads();  // B1: row maxima visible; every warp is done reading this tile's RoPE columns
        float base[2], alpha[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float tm = sRed[r0 + 8 * i];
#pragma unroll
            for (int c = 1; c < C::WC; ++c) tm = fmaxf(tm, sRed[c * HT + r0 + 8 * i]);
            const float mn = fmaxf(m_r[i], tm);
            base[i] = mn == -INFINITY ? 0.f : mn;  // all masked so far: exp2(-inf - 0) = 0, no NaN
            alpha[i] = ex2(m_r[i] - base[i]);
            m_r[i] = mn;
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt) {
            const float p0 = ex2(acc[nt][0] - base[0]), p1 = ex2(acc[nt][1] - base[0]);
            const float p2 = ex2(acc[nt][2] - base[1]), p3 = ex2(acc[nt][3] - base[1]);
            rs[0] += p0 + p1;
            rs[1] += p2 + p3;
            const int tok = tok0 + nt * 8 + 2 * t4;
            uint32_t hi01, lo01, hi23, lo23;
            split_bf16x2(p0, p1, hi01, lo01);
            split_bf16x2(p2, p3, hi23, lo23);
            st_shared_u32(p_addr<BN, kRowBytes>(kb + 1024, r0, tok), hi01);
            st_shared_u32(p_addr<BN, kRowBytes>(kb + 1024, r0 + 8, tok), hi23);
            st_shared_u32(p_addr<BN, 128>(sPlo, r0, tok), lo01);
            st_shared_u32(p_addr<BN, 128>(sPlo, r0 + 8, tok), lo23);
        }
        l_r[0] = l_r[0] * static_cast<double>(alpha[0]) + static_cast<double>(rs[0]);
        l_r[1] = l_r[1] * static_cast<double>(alpha[1]) + static_cast<double>(rs[1]);
        if (wc == 0 && t4 == 0) {
            sAlpha[r0] = alpha[0];
            sAlpha[r0 + 8] = alpha[1];
        }
        __syncthreads();  // B2: P (hi and lo) and alpha visible

        // PV phase: this warp owns all HT rows x columns [warp*OC, warp*OC + OC)
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
            const float al0 = sAlpha[mt * 16 + g], al1 = sAlpha[mt * 16 + g + 8];
            if (!__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) continue;  // max unchanged: O as is
#pragma unroll
            for (int nt = 0; nt < C::NTO; ++nt) {
                o[mt][nt][0] *= al0;
                o[mt][nt][1] *= al0;
                o[mt][nt][2] *= al1;
                o[mt][nt][3] *= al1;
            }
        }
        const int vrow = ((lane >> 3) & 1) * 8 + (lane & 7);
        const int vchunk = (warp * C::OC) / 8 + (lane >> 4);
#pragma unroll 1
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t pa[C::MT][4], pl[C::MT][4];
#pragma unroll
            for (int mt = 0; mt < C::MT; ++mt) {
                const int hr = mt * 16 + (lane & 15), tk = kk * 16 + (lane >> 4) * 8;
                ldsm_x4(pa[mt], p_addr<BN, kRowBytes>(kb + 1024, hr, tk));
                ldsm_x4(pl[mt], p_addr<BN, 128>(sPlo, hr, tk));
            }
#pragma unroll
            for (int np = 0; np < C::NTO / 2; ++np) {
                uint32_t bf[4];
                ldsm_x4_t(bf, row_chunk(kb, kk * 16 + vrow, vchunk + np * 2));
#pragma unroll
                for (int mt = 0; mt < C::MT; ++mt) {
                    mma_bf16(o[mt][2 * np], pa[mt], bf[0], bf[1]);
                    mma_bf16(o[mt][2 * np + 1], pa[mt], bf[2], bf[3]);
                    mma_bf16(o[mt][2 * np], pl[mt], bf[0], bf[1]);
                    mma_bf16(o[mt][2 * np + 1], pl[mt], bf[2], bf[3]);
                }
            }
        }
    };

    // ---- main loop: one barrier per tile (plus B1/B2 inside, and one more for the fp8 dequant) ----
    if (j0 < j1) {
        // Q tile (rows past h are zero), first index tile
        {
            const uint16_t *qb = p.q + bi * p.q_stride_b + si * p.q_stride_s;
            for (int i = tid; i < HT * kRowChunks; i += NT) {
                const int r = i / kRowChunks, c = i - r * kRowChunks;
                const bool ok = h0 + r < h;
                const uint16_t *src = ok ? qb + static_cast<int64_t>(h0 + r) * p.q_stride_h + c * 8 : qb;
                cp_async16(row_chunk(sQ, r, c), src, ok ? 16 : 0);
            }
        }
        load_idx(j0, 0);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        load_rows(j0, 0, C::FP8 ? sRaw : sK);
        if (j0 + 1 < j1) load_idx(j0 + 1, 1);
        cp_async_commit();

        for (int j = j0; j < j1; ++j) {
            const int it = j - j0;
            cp_async_wait_all();
            __syncthreads();  // B0: tile j (and index tile j+1) landed; every warp is done with tile j-1
            uint32_t kb;
            if constexpr (!C::FP8) {
                kb = sK + (it & 1) * (BN * kRowBytes);
                if (j + 1 < j1) load_rows(j + 1, (it + 1) % 3, sK + ((it + 1) & 1) * (BN * kRowBytes));
                if (j + 2 < j1) load_idx(j + 2, (it + 2) % 3);
                cp_async_commit();
            } else if constexpr (C::NRAW == 2) {
                kb = sK;
                if (j + 1 < j1) load_rows(j + 1, (it + 1) % 3, sRaw + ((it + 1) & 1) * (BN * kFp8Entry));
                if (j + 2 < j1) load_idx(j + 2, (it + 2) % 3);
                cp_async_commit();
                dequant(smem + C::RAW_OFF + (it & 1) * (BN * kFp8Entry), sK);
                __syncthreads();  // K tile complete
            } else {
                kb = sK;
                dequant(smem + C::RAW_OFF, sK);
                __syncthreads();  // K tile complete, staging buffer free
                if (j + 1 < j1) load_rows(j + 1, (it + 1) % 3, sRaw);
                if (j + 2 < j1) load_idx(j + 2, (it + 2) % 3);
                cp_async_commit();
            }
            tile(j, kb, it % 3);
        }
        cp_async_wait_all();
    }

    // ---- epilogue: row sums across the S-phase warps, normalise, write ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 1);
        l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 2);
    }
    {
        const int r0 = wr * 16 + g;
        if (t4 == 0) {  // sRed (here as double) was last read before B2 of the last tile
            sRedD[wc * HT + r0] = l_r[0];
            sRedD[wc * HT + r0 + 8] = l_r[1];
            if (wc == 0) {
                sM[r0] = m_r[0];
                sM[r0 + 8] = m_r[1];
            }
        }
    }
    __syncthreads();

    const bool split = a.n_splits > 1;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int rl = mt * 16 + g + 8 * hf;
            const int hr = h0 + rl;
            if (hr >= h) continue;
            double l = 0.0;
#pragma unroll
            for (int c = 0; c < C::WC; ++c) l += sRedD[c * HT + rl];
            const float m = sM[rl];
            const bool none = m == -INFINITY;  // no valid index in this range
            // natural-log lse in double (an fp32 m + log2f(l) loses ~1e-6 when lse is near 0)
            const double lse_d = row_lse(m, l, a.ml_factor);
            float f = none ? 0.f : static_cast<float>(1.0 / l);
            if (split) {
                const int64_t prow = (static_cast<int64_t>(sp) * a.rows + row) * h + hr;
                if (!none) {
                    float *op = a.o_part + prow * kDv + warp * C::OC + 2 * t4;
#pragma unroll
                    for (int nt = 0; nt < C::NTO; ++nt)
                        *reinterpret_cast<float2 *>(op + nt * 8) =
                            make_float2(o[mt][nt][2 * hf] * f, o[mt][nt][2 * hf + 1] * f);
                }
                if (warp == 0 && t4 == 0) a.lse_part[prow] = part_lse(m, l, lse_d);
            } else {
                const float lse = static_cast<float>(lse_d);
                if (p.attn_sink && !none) f *= static_cast<float>(sink_factor(p.attn_sink[hr * p.sink_stride], lse_d));
                uint16_t *op = p.out + bi * p.out_stride_b + si * p.out_stride_s + hr * p.out_stride_h +
                               warp * C::OC + 2 * t4;
#pragma unroll
                for (int nt = 0; nt < C::NTO; ++nt)
                    *reinterpret_cast<uint32_t *>(op + nt * 8) =
                        pack_bf16x2(o[mt][nt][2 * hf] * f, o[mt][nt][2 * hf + 1] * f);
                if (warp == 0 && t4 == 0) {
                    p.lse[bi * p.lse_stride_b + si * p.lse_stride_s + hr * p.lse_stride_h] = lse;
                    if (p.max_logits)
                        p.max_logits[bi * p.ml_stride_b + si * p.ml_stride_s + hr * p.ml_stride_h] =
                            row_max_logit(m, a.ml_factor);
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Split-top-k combine: one warp per (row, head). out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - M);
// when a split saturated (part_lse's boxes), the splits saturated at +FLT_MAX (else, when no split
// has an ordinary lse, those at -FLT_MAX) count instead, w_s = their token counts.
// ------------------------------------------------------------------------------------------------
constexpr int kCombineWarps = 8;

__global__ void __launch_bounds__(kCombineWarps * 32) attn_combine_kernel(const __grid_constant__ Args a)
{
    const smla_attn_params &p = a.p;
    const int lane = threadIdx.x & 31;
    const int64_t w = static_cast<int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
    const int64_t h = p.h;
    if (w >= a.rows * h) return;
    const int64_t row = w / h;
    const int hr = static_cast<int>(w - row * h);
    const int64_t bi = row / p.s_q, si = row % p.s_q;
    const int ns = a.n_splits;
    const int64_t sstride = a.rows * h;  // between splits, in (row, head) units
    const float *lp = a.lse_part + w;

    float M = -INFINITY;  // the largest ordinary lse
    bool pos = false, neg = false;
    for (int s = lane; s < ns; s += 32) {
        const float ls = lp[s * sstride];
        const int sb = box_sign(ls);
        if (sb == 0) M = fmaxf(M, ls);
        pos = pos || sb > 0;
        neg = neg || sb < 0;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    pos = __any_sync(0xffffffffu, pos);
    neg = __any_sync(0xffffffffu, neg);
    // the splits that count: 1 saturated at +FLT_MAX, 0 ordinary, -1 saturated at -FLT_MAX, 2 none
    const int mode = pos ? 1 : (M != -INFINITY ? 0 : (neg ? -1 : 2));
    const bool none = mode == 2;

    double W = 0.0;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    if (!none) {
        for (int s = 0; s < ns; ++s) {
            const float ls = lp[s * sstride];
            if (ls == -INFINITY) continue;  // empty split: (0, -inf), its O was not written
            const int sb = box_sign(ls);
            float ws;
            if (sb != 0) ws = sb == mode ? box_count(ls) : 0.f;
            else if (mode == 0) ws = ex2(ls - M);
            else ws = ls != ls ? ls : 0.f;  // outweighed by saturated splits; a NaN still poisons
            W += ws;
            const float4 *op = reinterpret_cast<const float4 *>(a.o_part + (s * sstride + w) * kDv) + lane;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float4 v = op[32 * k];
                acc[4 * k + 0] += ws * v.x;
                acc[4 * k + 1] += ws * v.y;
                acc[4 * k + 2] += ws * v.z;
                acc[4 * k + 3] += ws * v.w;
            }
        }
    }
    const double lse_d = mode == 0 ? (static_cast<double>(M) + log2(W)) * kLn2d : (mode == 1 ? INFINITY : -INFINITY);
    const float lse = static_cast<float>(lse_d);
    float f = none ? 0.f : static_cast<float>(1.0 / W);
    if (p.attn_sink && !none) f *= static_cast<float>(sink_factor(p.attn_sink[hr * p.sink_stride], lse_d));
    uint16_t *out = p.out + bi * p.out_stride_b + si * p.out_stride_s + hr * p.out_stride_h + 4 * lane;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        uint2 v;
        v.x = pack_bf16x2(acc[4 * k] * f, acc[4 * k + 1] * f);
        v.y = pack_bf16x2(acc[4 * k + 2] * f, acc[4 * k + 3] * f);
        *reinterpret_cast<uint2 *>(out + 128 * k) = v;
    }
    if (lane == 0) p.lse[bi * p.lse_stride_b + si * p.lse_stride_s + hr * p.lse_stride_h] = lse;
}

}  // namespace attn
}  // namespace
