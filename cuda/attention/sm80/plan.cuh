// The portable kernel's configuration (Cfg: head tile, K tile, cache format and the warp tiling
// that follows from them) and its shared-memory plan (Smem), plus the swizzled addressing of the
// rows it keeps there (row_chunk, p_addr).
//
// Shared memory, in order (Smem<C>): Q [HT x 576] bf16 | K tiles [NKBUF x BN x 576] bf16 | P_lo
// [HT x BN] bf16 | fp8 staging [NRAW x BN x 656 B] | index ring [3 x BN] int32 | per-warp row maxima
// (the epilogue's row sums, as double, over them) | alpha [HT] | row max [HT]. P_hi has no region of
// its own: it lives in the K tile's RoPE columns, which are dead once the S phase has read them.
#pragma once

#include "attention/args.cuh"
#include "attention/ptx.cuh"
#include "attention/smem_plan.cuh"

namespace attn {
namespace sm80 {

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
    static_assert(HT == 16 || HT == 32 || HT == 64, "head tile");
    static_assert(BN == 32 || BN == 64, "token tile");
    static_assert(NW % WR == 0 && TN % 8 == 0 && NTS >= 1 && (NTS == 1 || NTS % 2 == 0), "S warp tiling");
    static_assert(NTO % 2 == 0, "O warp tiling");
    static_assert(HT * BN * 2 <= BN * 128, "P must fit in the RoPE columns of the K tile");
};

template <class C>
struct Smem {
    static constexpr Region q = first_region(C::HT * kRowBytes);
    static constexpr Region k = region_after(q, C::NKBUF * C::BN * kRowBytes);
    static constexpr Region plo = region_after(k, C::HT * C::BN * 2);
    static constexpr Region raw = region_after(plo, C::NRAW * C::BN * kFp8Entry);
    static constexpr Region idx = region_after(raw, 3 * C::BN * 4);
    static constexpr Region red = region_after(idx, C::WC * C::HT * 8);  // float maxima, then double row sums
    static constexpr Region alpha = region_after(red, C::HT * 4);
    static constexpr Region m = region_after(alpha, C::HT * 4);
    static constexpr int bytes = m.end();
    static_assert(k.off % 128 == 0 && plo.off % 128 == 0 && raw.off % 16 == 0 && idx.off % 16 == 0,
                  "cp.async and ldmatrix targets are 16-byte aligned, swizzled rows 128-byte aligned");
    static_assert(red.off % 8 == 0, "row sums are doubles");
};

// Q and K rows are 1152 B = 72 chunks of 16 B; chunk c of row r lives at chunk c ^ (r & 7) (XOR
// swizzle inside each 128-byte group), so that ldmatrix reading 8 consecutive rows at the same
// logical chunk hits 8 different bank groups.
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
constexpr int kRopeOff = 2 * SMLA_D_NOPE;  // 1024: the RoPE columns of a bf16 row, where P_hi goes

// One CTA's share of the work and where its data lives: query row (bi, si), heads [h0, h0 + HT), top-k
// split sp with its tiles [j0, j1), the shared-memory regions of Smem<C>, and this thread's place in
// the warp tiling. Fixed for the whole kernel; the stages read it.
template <class C>
struct Cta {
    int tid, warp, lane, g, t4;
    int sp, ht;
    int64_t row, bi, si;
    int h, h0;
    const int32_t *idx_row;  // the row's top-k indices
    int L, j0, j1;
    uint32_t sQ, sK, sPlo, sRaw, sIdxA;
    const int32_t *sIdx;     // index ring: 3 slots of BN
    float *sRed;             // per-tile row maxima of each S-phase warp column
    double *sRedD;           // epilogue: row sums, over sRed
    float *sAlpha, *sM;
    const uint8_t *raw;      // fp8 staging buffers (generic address, read by the dequant pass)
    const uint8_t *kv_base;
    uint32_t block_size;
    int64_t limit;
    uint64_t pol;            // L2 evict_last policy (prefill), else 0
    int wr, wc;              // S phase: rows wr*16.., tokens wc*TN..

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem)
    {
        const smla_attn_params &p = a.p;
        tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        g = lane >> 2, t4 = lane & 3;

        const GridPos gp = grid_pos(a);
        sp = gp.sp, ht = gp.ht, row = gp.row, bi = gp.bi, si = gp.si;
        h = static_cast<int>(p.h);
        h0 = ht * C::HT;
        const RowSlice slice = row_slice(a, bi, si, sp, C::BN);
        idx_row = slice.idx;
        L = slice.L, j0 = slice.j0, j1 = slice.j1;

        using S = Smem<C>;
        sQ = smem_u32(smem + S::q.off);
        sK = smem_u32(smem + S::k.off);
        sPlo = smem_u32(smem + S::plo.off);
        sRaw = smem_u32(smem + S::raw.off);
        sIdxA = smem_u32(smem + S::idx.off);
        sIdx = reinterpret_cast<const int32_t *>(smem + S::idx.off);
        sRed = reinterpret_cast<float *>(smem + S::red.off);
        sRedD = reinterpret_cast<double *>(smem + S::red.off);
        sAlpha = reinterpret_cast<float *>(smem + S::alpha.off);
        sM = reinterpret_cast<float *>(smem + S::m.off);
        raw = smem + S::raw.off;

        kv_base = static_cast<const uint8_t *>(p.kv.data);
        block_size = static_cast<uint32_t>(p.kv.block_size);
        limit = a.limit;
        pol = a.evict_last ? policy_evict_last() : 0;
        wr = warp % C::WR, wc = warp / C::WR;
    }
};

}  // namespace sm80
}  // namespace attn
