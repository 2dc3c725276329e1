// The wgmma kernel's fixed configuration (one head tile of 64, K tiles of 64 tokens, 384 threads in
// three warpgroups), its shared-memory plan (Smem) and the 128-byte-swizzled addressing that wgmma
// descriptors describe (blk_addr), and Cta: one CTA's share of the work and where its data lives.
//
// Shared memory (1024-byte aligned, 128-byte swizzle): Q and each K buffer are 9 column blocks of
// [64 rows x 128 B]; element chunk c (8 values) of row r lives at block c/8, byte r*128 +
// ((c%8) ^ (r%8))*16. Total ~227 KB: 1 CTA per SM.
#pragma once

#include "attention/args.cuh"
#include "attention/smem_plan.cuh"
#include "attention/sm90/ptx.cuh"

namespace attn {
namespace sm90 {

constexpr int kHT = 64, kBN = 64;              // heads per CTA, tokens per K tile
constexpr int kThreads = 384;                  // WG0, WG1: consumers; WG2: producer
constexpr int kBlk = 64 * 128;                 // one column block: 64 rows x 128 B
constexpr int kTileBytes = 9 * kBlk;           // 73,728 B: Q or one K buffer
static_assert(kDqk == 36 * 16, "the S phase is written for 3 chains of 12 k-steps");
static_assert(kRowChunks == 9 * 8, "a row is 9 column blocks of 8 chunks");
// Registers per thread after setmaxnreg: WG0 holds half of O (128), S with its second chain (64) and P
// in registers; WG1 only its half of O. setmaxnreg.inc only takes what the other warpgroups released
// with .dec (the CTA's pool), so the three must sum to the launch allocation, 3 x 168 (a larger sum
// blocks WG0's .inc forever).
constexpr int kScoreRegs = 224, kValueRegs = 160, kProducerRegs = 120;
static_assert(kScoreRegs + kValueRegs + kProducerRegs <= 3 * 168, "the launch allocation: 64K / 384 -> 168");
// Named barriers of the 256 consumer threads: P of K buffer b ready (kBarP + b: WG0 arrives, WG1 waits;
// one per buffer, so WG0 can never arrive twice on one before WG1 waited: its next arrival there needs
// the buffer back), P_lo free (WG1 arrives, WG0 waits; high precision only), the epilogue's row
// statistics, Q landed.
constexpr int kBarP = 1, kBarFree = 3, kBarL = 4, kBarQ = 5;

struct Smem {
    static constexpr Region q = first_region(kTileBytes);
    static constexpr Region k = region_after(q, 2 * kTileBytes);    // two K buffers
    static constexpr Region plo = region_after(k, kBlk);            // P_lo [64 heads x 64 tokens] bf16
    static constexpr Region bar = region_after(plo, 64);            // mbarriers: full[2], empty[2], rr[2]
    static constexpr Region valid = region_after(bar, 2 * kBN * 4);  // int [2][64]: row valid, per K buffer
    static constexpr Region alpha = region_after(valid, 2 * kHT * 4);  // float [2][64]: O's rescale, per K buffer
    static constexpr Region row_l = region_after(alpha, kHT * 8);       // double [64]: final row sums (epilogue)
    static constexpr Region row_m = region_after(row_l, kHT * 4);       // float [64]: final row maxima (epilogue)
    static constexpr int used = row_m.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && k.off % 1024 == 0 && plo.off % 1024 == 0, "swizzled tiles");
    static_assert(bar.off % 8 == 0 && row_l.off % 8 == 0, "mbarriers and row sums are 8-byte");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

__device__ __forceinline__ uint32_t blk_addr(uint32_t base, int row, int chunk)
{
    return base + static_cast<uint32_t>((chunk >> 3) * kBlk + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// One CTA: query row (bi, si), heads [h0, h0 + 64), top-k split sp with nt tiles from j0, and the
// shared-memory regions of Smem at the 1024-byte aligned base. XO: the CTA is one of a cluster of
// two (the two head tiles of a row; sm90/producer.cuh), its head tile the cluster rank.
template <bool XO>
struct Cta {
    uint32_t base;
    uint8_t *smem;
    int tid, lane;
    int sp, ht;
    int64_t row, bi, si;
    int h, h0;
    const int32_t *idx_row;
    int L, j0, nt;
    uint32_t sQ, sK, sPlo, bar_full, bar_empty, bar_rr;  // bar_*[b] at + 8 b
    int *sValid;
    float *sAlpha, *sM;
    double *sL;

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw)
    {
        const uint32_t raw_base = smem_u32(smem_raw);
        base = (raw_base + 1023u) & ~1023u;
        smem = smem_raw + (base - raw_base);
        const smla_attn_params &p = a.p;
        tid = threadIdx.x;
        lane = tid & 31;

        if constexpr (XO) {  // blockIdx.x = (row * n_splits + split) * 2 + head tile; head tile = cluster rank
            int64_t bx = blockIdx.x;
            ht = static_cast<int>(bx & 1);
            bx >>= 1;
            sp = static_cast<int>(bx % a.n_splits);
            row = bx / a.n_splits;
            bi = row / p.s_q, si = row % p.s_q;
        } else {
            const GridPos gp = grid_pos(a);
            sp = gp.sp, ht = gp.ht, row = gp.row, bi = gp.bi, si = gp.si;
        }
        h = static_cast<int>(p.h);
        h0 = ht * kHT;
        const RowSlice slice = row_slice(a, bi, si, sp, kBN);
        idx_row = slice.idx;
        L = slice.L, j0 = slice.j0;
        nt = slice.j1 > j0 ? slice.j1 - j0 : 0;

        sQ = base + Smem::q.off;
        sK = base + Smem::k.off;
        sPlo = base + Smem::plo.off;
        bar_full = base + Smem::bar.off, bar_empty = base + Smem::bar.off + 16, bar_rr = base + Smem::bar.off + 32;
        sValid = reinterpret_cast<int *>(smem + Smem::valid.off);
        sAlpha = reinterpret_cast<float *>(smem + Smem::alpha.off);
        sL = reinterpret_cast<double *>(smem + Smem::row_l.off);
        sM = reinterpret_cast<float *>(smem + Smem::row_m.off);
    }
};

}  // namespace sm90
}  // namespace attn
