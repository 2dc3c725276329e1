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
//   lsum  : double [4][NH], each consumer warp's row sums (epilogue), m: float [NH], the row maxima.
// The epilogue stages O as float [NH][kOStride] over the K buffers (dead by then).
#pragma once

#include "attention/sm90/plan.cuh"

// 1: "high" at NH = 16 runs P_hi and P_lo through one n32 wgmma per V^T block (Consumer::kStack), 0: two n16.
#define SMLA_NARROW_STACK_P 1
// The lazy maximum (sm90/narrow_softmax.cuh, kLazySlack): a tile within 2^8 of the running maxima skips the
// exchange of its maxima between the warps and the rescale of O^T. 2: over both caches, 1: over bf16 only
// (prefill), 0: every tile exact.
#define SMLA_NARROW_LAZY_MAX 2

namespace attn {
namespace sm90 {
namespace narrow {

template <int NH_>
struct Cfg {
    static constexpr int NH = NH_;           // heads per CTA: the wgmma N
    static constexpr int NJ = NH / 8;        // n8 column blocks of an accumulator
    static constexpr int NS = NH / 2;        // accumulator floats per thread of one [64 x NH] tile
    static constexpr int kThreads = 384;     // WG0: consumer; WG1, WG2: producers
    static constexpr int kP0 = 128, kPW = 8; // producers: 8 warps from thread 128
    static constexpr int kQBlk = NH * 128;   // one Q column block
    static constexpr int kPBytes = NH * 128; // one P^T tile
    static constexpr int kOStride = kDv + 4; // floats per staged output row: rows 2 apart land 8 banks apart
    static_assert(NH == 16 || NH == 32, "wgmma n16 / n32");
};

// Registers after setmaxnreg: the consumer holds O^T (4 NH floats; 8 NH with the stacked P^T at NH = 16),
// three S^T chains (1.5 NH) and the per-head state; the producers their two batches. The three sum to the
// launch allocation, 3 x 168. (Four batches in flight at 200 / 152 were measured slower: benchmarks/README.md.)
constexpr int kConsumerRegs = 240, kProducerRegs = 128;
static_assert(kConsumerRegs + 2 * kProducerRegs <= 3 * 168, "the launch allocation: 64K / 384 -> 168");
// Named barriers of the 128 consumer threads.
constexpr int kBarQ = 1, kBarRed = 2, kBarP = 3, kBarE = 4;

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
    static constexpr int used = m.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && k.off % 1024 == 0 && p.off % 1024 == 0, "swizzled tiles");
    static_assert(bar.off % 8 == 0 && lsum.off % 8 == 0, "mbarriers and row sums are 8-byte");
    static_assert(C::NH * C::kOStride * 4 <= k.bytes, "the staged output fits in the K buffers");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

// One CTA: CtaCommon (one head tile, n_ht = 1: all h <= NH heads) and the narrow kernel's own regions.
template <class C>
struct Cta : CtaCommon {
    using S = Smem<C>;
    uint32_t sP;
    float *sRed, *sM, *sO;
    double *sLsum;

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw)
        : CtaCommon(a, smem_raw, grid_pos(a), S::q.off, S::k.off, S::bar.off, S::valid.off)
    {
        sP = base + S::p.off;
        sRed = reinterpret_cast<float *>(smem + S::red.off);
        sLsum = reinterpret_cast<double *>(smem + S::lsum.off);
        sM = reinterpret_cast<float *>(smem + S::m.off);
        sO = reinterpret_cast<float *>(smem + S::k.off);
    }
};

}  // namespace narrow
}  // namespace sm90
}  // namespace attn
