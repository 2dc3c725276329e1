// The narrow wgmma kernel's configuration (sm90/narrow_kernel.cuh: h <= 32 on Hopper, tokens on the
// MMA's M dimension), its shared-memory plan and Cta, one CTA's share of the work.
//
// Shared memory (1024-byte aligned, 128-byte swizzle as in sm90/plan.cuh):
//   q     : Q [NH heads x 576], 9 column blocks of [NH rows x 128 B] (the B operand of S^T = K Q^T);
//   k     : two K buffers, each 9 column blocks of [64 tokens x 128 B], filled by the producers exactly
//           as in the wide kernel (the A operand of S^T, and of O^T = V^T P^T read M-major);
//   p     : P^T as [NH heads x 64 tokens] bf16, K-major (the B operand of O^T): P_hi, then P_lo;
//   bar   : mbarriers full[2] (256 producer arrivals), empty[2] (128 consumer arrivals) (CtaCommon's;
//           no cluster, so no rr);
//   valid : int [2][64], row valid per K buffer;
//   red   : float [2][4][NH], each consumer warp's per-head maxima of a tile (parity of the tile);
//   lsum  : double [4][NH], each consumer warp's row sums (epilogue), m: float [NH], the row maxima;
//   CW = 2 only: xs, float [2][128][NS / 2], the partial S^T each consumer warpgroup hands the other (its
//           half of the heads' columns; xs[cw] is what warpgroup cw reads), and alpha, float [NH], the
//           rescale factors of an exact tile (each warpgroup's own heads, read by both), and flags, int [8],
//           each consumer warp's verdict of the lazy maximum.
// The epilogue stages O as float [NH][kOStride] over the K buffers (dead by then).
#pragma once

#include "attention/sm90/plan.cuh"

// 1: "high" at NH = 16 runs P_hi and P_lo through one n32 wgmma per V^T block (Consumer::kStack), 0: two n16.
#define SMLA_NARROW_STACK_P 1
// The lazy maximum (sm90/narrow_softmax.cuh, kLazySlack): a tile within 2^8 of the running maxima skips the
// exchange of its maxima between the warps and the rescale of O^T. 2: over both caches, 1: over bf16 only
// (prefill), 0: every tile exact.
#define SMLA_NARROW_LAZY_MAX 2
// The bf16 narrow kernel's consumers (sm90/narrow_kernel.cuh): two warpgroups that split each tile's work by
// dimension (S^T's k-steps, O^T's m-tiles) and the softmax by head (SplitConsumer), or one that runs the
// whole tile (Consumer; the fp8 kernel always: its producers need the registers). 0: two where they were
// measured faster, 32 heads in "high" (P_hi^T and P_lo^T then go to one n64 MMA per V^T block; one
// warpgroup cannot hold that accumulator), else one (benchmarks/README.md, issue 17, twenty-second
// session); 1: always one; 2: always two.
#ifndef SMLA_NARROW_BF16_CW
#define SMLA_NARROW_BF16_CW 0
#endif

namespace attn {
namespace sm90 {
namespace narrow {

// Registers after setmaxnreg. CW = 1: the consumer holds O^T (4 NH floats; 8 NH with the stacked P^T at
// NH = 16), three S^T chains (1.5 NH) and the per-head state; the producers their two batches; the three
// sum to the launch allocation, 3 x 168. (Four batches in flight at 200 / 152 were measured slower:
// benchmarks/README.md.) CW = 2 (bf16 only: cp.async producers hold no data): each consumer holds half of
// O^T (at most 4 m-tiles x 2 NH floats) and two S^T chains; 2 x 208 + 2 x 48 = 4 x 128, the launch
// allocation of 512 threads.
template <int CW>
struct NarrowRegs {
    static constexpr int launch = CW == 1 ? 168 : 128;
    static constexpr int consumer = CW == 1 ? 240 : 208;
    static constexpr int producer = CW == 1 ? 128 : 48;
    static_assert(CW * consumer + 2 * producer <= (CW + 2) * launch && consumer % 8 == 0 && producer % 8 == 0,
                  "setmaxnreg: multiples of 8 within the launch allocation");
};

constexpr int bf16_consumers(int nh, bool fast)
{
    return SMLA_NARROW_BF16_CW != 0 ? SMLA_NARROW_BF16_CW : (nh == 32 && !fast ? 2 : 1);
}

template <int NH_, int CW_ = 1>
struct Cfg {
    static constexpr int NH = NH_;           // heads per CTA: the wgmma N
    static constexpr int CW = CW_;           // consumer warpgroups
    static constexpr int NJ = NH / 8;        // n8 column blocks of an accumulator
    static constexpr int NS = NH / 2;        // accumulator floats per thread of one [64 x NH] tile
    static constexpr int kP0 = 128 * CW, kPW = 8;  // producers: 8 warps after the consumers
    static constexpr int kThreads = kP0 + 256;
    static constexpr int kQBlk = NH * 128;   // one Q column block
    static constexpr int kPBytes = NH * 128; // one P^T tile
    static constexpr int kOStride = kDv + 4; // floats per staged output row: rows 2 apart land 8 banks apart
    using Regs = NarrowRegs<CW>;
    static_assert(NH == 16 || NH == 32, "wgmma n16 / n32");
    static_assert(CW == 1 || CW == 2, "one or two consumer warpgroups");
};

// Named barriers of the consumer threads: Q landed, warpgroup 0's exchange of tile maxima, P^T stored (all
// consumers), the epilogue (all consumers); CW = 2: warpgroup 1's exchange of tile maxima, the partial S^T
// handed over.
constexpr int kBarQ = 1, kBarRed = 2, kBarP = 3, kBarE = 4, kBarRed1 = 5, kBarX = 6;

template <class C>
struct Smem {
    static constexpr Region q = first_region(9 * C::kQBlk);
    static constexpr Region k = region_after(q, 2 * kTileBytes);
    static constexpr Region p = region_after(k, 2 * C::kPBytes);
    static constexpr Region bar = region_after(p, 64);
    static constexpr Region valid = region_after(bar, 2 * kBN * 4);
    static constexpr Region red = region_after(valid, 2 * 4 * C::NH * 4);
    static constexpr Region lsum = region_after(red, 4 * C::NH * 8);
    static constexpr Region m = region_after(lsum, C::NH * 4);
    static constexpr Region xs = region_after(m, C::CW == 2 ? 2 * 128 * (C::NS / 2) * 4 : 0);
    static constexpr Region alpha = region_after(xs, C::CW == 2 ? C::NH * 4 : 0);
    static constexpr Region flags = region_after(alpha, C::CW == 2 ? 8 * 4 : 0);
    static constexpr int used = flags.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && k.off % 1024 == 0 && p.off % 1024 == 0, "swizzled tiles");
    static_assert(bar.off % 8 == 0 && lsum.off % 8 == 0 && xs.off % 16 == 0 && flags.off % 16 == 0,
                  "mbarriers and row sums are 8-byte, xs and flags 16");
    static_assert(C::NH * C::kOStride * 4 <= k.bytes, "the staged output fits in the K buffers");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

// One CTA: CtaCommon (one head tile, n_ht = 1: all h <= NH heads) and the narrow kernel's own regions.
template <class C>
struct Cta : CtaCommon {
    using S = Smem<C>;
    uint32_t sP;
    float *sRed, *sM, *sO, *sXs, *sAlpha;
    int *sFlags;
    double *sLsum;

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw)
        : CtaCommon(a, smem_raw, grid_pos(a), S::q.off, S::k.off, S::bar.off, S::valid.off)
    {
        sP = base + S::p.off;
        sRed = reinterpret_cast<float *>(smem + S::red.off);
        sLsum = reinterpret_cast<double *>(smem + S::lsum.off);
        sM = reinterpret_cast<float *>(smem + S::m.off);
        sO = reinterpret_cast<float *>(smem + S::k.off);
        sXs = reinterpret_cast<float *>(smem + S::xs.off);
        sAlpha = reinterpret_cast<float *>(smem + S::alpha.off);
        sFlags = reinterpret_cast<int *>(smem + S::flags.off);
    }
};

}  // namespace narrow
}  // namespace sm90
}  // namespace attn
