// The narrow wgmma kernel's configuration (sm90/narrow_kernel.cuh: h <= 32 on Hopper, tokens on the
// MMA's M dimension), its shared-memory plan and Cta, one CTA's share of the work.
//
// Shared memory (1024-byte aligned, 128-byte swizzle as in sm90/plan.cuh):
//   q     : Q [NH heads x 576], 9 column blocks of [NH rows x 128 B] (the B operand of S^T = K Q^T);
//   k     : two K buffers, each 9 column blocks of [64 tokens x 128 B], filled by the producers exactly
//           as in the wide kernel (the A operand of S^T, and of O^T = V^T P^T read M-major);
//   p     : per consumer warpgroup, P^T as [NH heads x 64 tokens] bf16, K-major (the B operand of O^T):
//           P_hi, then P_lo;
//   bar   : mbarriers full[2] (one arrival per producer thread), empty[2] (128 consumer arrivals)
//           (CtaCommon's; no cluster, so no rr);
//   valid : int [2][64], row valid per K buffer;
//   red   : per consumer warpgroup, float [2][4][NH], each warp's per-head maxima of a tile (parity of the
//           warpgroup's tile);
//   lsum  : per consumer warpgroup, double [4][NH], each warp's row sums (epilogue); m: per consumer
//           warpgroup, float [NH], the row maxima;
//   blk   : mbarriers empty[2][9] per column block (4 consumer-warp arrivals; the bf16 block release).
// The epilogue stages O as float [NH][kOStride] over the K buffers (dead by then).
#pragma once

#include "attention/sm90/plan.cuh"

// 1: "high" at NH = 16 runs P_hi and P_lo through one n32 wgmma per V^T block (Consumer::kStack), 0: two n16.
#define SMLA_NARROW_STACK_P 1
// 1: over a bf16 cache a K buffer goes back to the producers column block by column block (Bf16Producer's BR:
// block 8 once S is done, block mt once the P V products of O^T m-tile mt are), 0: whole, after P V.
#define SMLA_NARROW_BLOCK_RELEASE 1
// Consumer warpgroups over a bf16 cache: 2 take alternate K tiles (each its own softmax state and O^T, merged
// in the epilogue), so one's softmax runs beside the other's MMAs; 1: one takes every tile (fp8 always).
#define SMLA_NARROW_BF16_CONSUMERS 2

namespace attn {
namespace sm90 {
namespace narrow {

// NC consumer warpgroups (1, or 2 over a bf16 cache: SMLA_NARROW_BF16_CONSUMERS), 384 threads either way:
//   NC = 1: WG0 the consumer, WG1 and WG2 the producers (8 warps from thread 128);
//   NC = 2: WG0 and WG1 the consumers (tiles it with it % 2 == the warpgroup, so always K buffer it % 2),
//           WG2 the producer (4 warps from thread 256).
// Registers after setmaxnreg: a consumer holds O^T (4 NH floats; 8 NH with the stacked P^T at NH = 16),
// three S^T chains (1.5 NH) and the per-head state; the fp8 producers their two batches, the bf16 ones only
// their rows' addresses. The warpgroups' sum is the launch allocation, 3 x 168. (Four fp8 batches in flight at
// 200 / 152 were measured slower: benchmarks/README.md.)
template <int NH_, int NC_ = 1>
struct Cfg {
    static constexpr int NH = NH_;            // heads per CTA: the wgmma N
    static constexpr int NC = NC_;            // consumer warpgroups
    static constexpr int NJ = NH / 8;         // n8 column blocks of an accumulator
    static constexpr int NS = NH / 2;         // accumulator floats per thread of one [64 x NH] tile
    static constexpr int kThreads = 384;
    static constexpr int kP0 = 128 * NC, kPW = NC == 1 ? 8 : 4;  // the producer warps: kPW from thread kP0
    static constexpr int kConsumerRegs = NC == 1 ? 240 : 232, kProducerRegs = NC == 1 ? 128 : 40;
    static constexpr int kQBlk = NH * 128;    // one Q column block
    static constexpr int kPBytes = NH * 128;  // one P^T tile
    static constexpr int kOStride = kDv + 4;  // floats per staged output row: rows 2 apart land 8 banks apart
    static_assert(NH == 16 || NH == 32, "wgmma n16 / n32");
    static_assert(NC == 1 || NC == 2, "one or two consumer warpgroups");
    static_assert(NC * kConsumerRegs + (3 - NC) * kProducerRegs <= 3 * 168, "the launch allocation: 64K / 384 -> 168");
};

// Named barriers: Q landed and the epilogue (all consumer threads); per consumer warpgroup cw, the tile
// maxima exchanged and P^T written (its 128 threads).
constexpr int kBarQ = 1, kBarE = 4;
__device__ __forceinline__ constexpr int bar_red(int cw) { return cw == 0 ? 2 : 5; }
__device__ __forceinline__ constexpr int bar_p(int cw) { return cw == 0 ? 3 : 6; }

template <class C>
struct Smem {
    static constexpr Region q = first_region(9 * C::kQBlk);
    static constexpr Region k = region_after(q, 2 * kTileBytes);
    static constexpr Region p = region_after(k, C::NC * 2 * C::kPBytes);
    static constexpr Region bar = region_after(p, 64);
    static constexpr Region valid = region_after(bar, 2 * kBN * 4);
    static constexpr Region red = region_after(valid, C::NC * 2 * 4 * C::NH * 4);
    static constexpr Region lsum = region_after(red, C::NC * 4 * C::NH * 8);
    static constexpr Region m = region_after(lsum, C::NC * C::NH * 4);
    static constexpr Region blk = region_after(m, 2 * 9 * 8);
    static constexpr int used = blk.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && k.off % 1024 == 0 && p.off % 1024 == 0, "swizzled tiles");
    static_assert(bar.off % 8 == 0 && blk.off % 8 == 0 && lsum.off % 8 == 0, "mbarriers and row sums are 8-byte");
    static_assert(C::NH * C::kOStride * 4 <= k.bytes, "the staged output fits in the K buffers");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

// One CTA: CtaCommon (one head tile, n_ht = 1: all h <= NH heads) and the narrow kernel's own regions.
template <class C>
struct Cta : CtaCommon {
    using S = Smem<C>;
    uint32_t sP, bar_blk;
    float *sRed, *sM, *sO;
    double *sLsum;

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw)
        : CtaCommon(a, smem_raw, grid_pos(a), S::q.off, S::k.off, S::bar.off, S::valid.off)
    {
        sP = base + S::p.off;
        bar_blk = base + S::blk.off;
        sRed = reinterpret_cast<float *>(smem + S::red.off);
        sLsum = reinterpret_cast<double *>(smem + S::lsum.off);
        sM = reinterpret_cast<float *>(smem + S::m.off);
        sO = reinterpret_cast<float *>(smem + S::k.off);
    }
};

}  // namespace narrow
}  // namespace sm90
}  // namespace attn
