// The split-top-k merge of one (row, head) pair, shared by the combine kernel (combine.cu) and the
// fused split decode (a kernel that merges its own partials after a grid-wide barrier: combine_share).
// When decode splits a row's top-k list across CTAs (launch.cu, plan_splits), each split writes its fp32
// partial O and log2-domain lse into the caller's workspace (finish_row, attention/epilogue.cuh); the
// merge is out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - M). When a split saturated (part_lse's
// boxes), the splits saturated at +FLT_MAX (else, when no split has an ordinary lse, those at -FLT_MAX)
// count instead, w_s = their token counts. Empty splits are (0, -inf) and their O is never read.
//
// A group of G threads per (row, head) (G = 128: thread t owning columns 4 t .. 4 t + 3; G = 32: one
// warp, lane l owning the float4s at columns 4 l + 128 i). Each warp finds its pair's weights itself
// (lane l: splits l, l + 32, ...; no shared memory, no block barrier), then every thread sums its columns
// over the splits in order, with 8 float4 loads in flight. Many splits (few rows: b = 2 has 32) take
// G = 128, so that the partials (64 KB per (row, head) at 32 splits) stream from L2 with many loads per
// thread (one warp per pair and one dependent load per split took 35 us at b = 2, h = 128); few splits
// take G = 32 (kCombineGroupSplits). Plain loads also in the fused decode, where other CTAs of the same
// grid wrote the partials: the grid-wide barrier's gpu-scope fences order those writes before the reads
// (ld.global.cg instead made the combine kernel 3.5 us slower at b = 2: benchmarks/README.md, issue 18).
#pragma once

#include <cooperative_groups.h>

#include "attention/epilogue.cuh"
#include "attention/ptx.cuh"

namespace attn {

constexpr int kCombineThreads = 128;
constexpr int kInFlight = 8;             // float4 loads per thread issued together
constexpr int kCombineGroupSplits = 8;   // from this many splits on, 128 threads per (row, head), else 32

// The weights of the splits of one (row, head), as each warp of its CTA sees them.
struct SplitWeights {
    int mode;   // the splits that count: 1 saturated at +FLT_MAX, 0 ordinary, -1 saturated at -FLT_MAX, 2 none
    float M;    // the largest ordinary lse (fmaxf: a NaN lse is not one)

    __device__ __forceinline__ SplitWeights(const float *lp, int ns, int64_t sstride, int lane)
    {
        M = -INFINITY;
        bool pos = false, neg = false, nan = false;
        for (int s = lane; s < ns; s += 32) {
            const float ls = lp[s * sstride];
            const int sb = box_sign(ls);
            if (sb == 0) M = fmaxf(M, ls);
            pos = pos || sb > 0;
            neg = neg || sb < 0;
            nan = nan || (sb == 0 && ls != ls);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        pos = __any_sync(0xffffffffu, pos);
        neg = __any_sync(0xffffffffu, neg);
        nan = __any_sync(0xffffffffu, nan);
        // a split that read a NaN makes the row NaN, as the unsplit softmax would: with no ordinary split
        // besides it, mode 0 (M = -inf) still gives it the weight ex2(NaN) (it was "none", zeros, before)
        mode = pos ? 1 : (M != -INFINITY || nan ? 0 : (neg ? -1 : 2));
    }

    // w_s of a split with lse ls (not -inf, an empty split, which is skipped).
    __device__ __forceinline__ float weight(float ls) const
    {
        const int sb = box_sign(ls);
        if (sb != 0) return sb == mode ? box_count(ls) : 0.f;
        if (mode == 0) return ex2(ls - M);
        return ls != ls ? ls : 0.f;  // outweighed by saturated splits; a NaN still poisons
    }
};

// The merge of pair w = row * h + head by G threads (gt: this thread's index among them; lane: in its warp).
template <int G>
__device__ __forceinline__ void combine_pair(const Args &a, int64_t w, int gt, int lane)
{
    constexpr int NV = kDv / 4 / G;
    constexpr int kBatch = kInFlight / NV;  // splits whose loads are issued together
    const smla_attn_params &p = a.p;
    const int64_t row = w / p.h;
    const int hr = static_cast<int>(w - row * p.h);
    const int64_t bi = row / p.s_q, si = row % p.s_q;
    const int ns = a.n_splits;
    const int64_t sstride = a.rows * p.h;  // between splits, in (row, head) units
    const float *lp = a.lse_part + w;
    const float4 *op = reinterpret_cast<const float4 *>(a.o_part + w * kDv) + gt;
    const int64_t ostride = sstride * (kDv / 4);  // between splits, in float4

    const SplitWeights sw(lp, ns, sstride, lane);
    const bool none = sw.mode == 2;
    double W = 0.0;  // this lane's share of sum_s w_s (lane l: splits l, l + 32, ...)
    float4 acc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!none) {
        for (int s0 = 0; s0 < ns; s0 += 32) {
            // lane l holds split s0 + l's weight (0 where empty or past ns) and whether to read it
            const int sl = s0 + lane;
            const float ls = sl < ns ? lp[sl * sstride] : -INFINITY;
            const bool use = ls != -INFINITY;  // empty split: (0, -inf), its O was not written
            const float wl = use ? sw.weight(ls) : 0.f;
            W += wl;
            const uint32_t used = __ballot_sync(0xffffffffu, use);
            const int n = min(32, ns - s0);
            for (int j0 = 0; j0 < n; j0 += kBatch) {
                float4 v[kBatch][NV];
#pragma unroll
                for (int k = 0; k < kBatch; ++k) {
                    const int j = j0 + k;
                    const bool rd = j < n && ((used >> j) & 1u);
#pragma unroll
                    for (int i = 0; i < NV; ++i)
                        v[k][i] = rd ? op[(s0 + j) * ostride + 32 * i] : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int k = 0; k < kBatch; ++k) {
                    const int j = j0 + k;
                    const float ws = __shfl_sync(0xffffffffu, wl, j & 31);
                    if (j < n && ((used >> j) & 1u)) {
#pragma unroll
                        for (int i = 0; i < NV; ++i) {
                            acc[i].x += ws * v[k][i].x;
                            acc[i].y += ws * v[k][i].y;
                            acc[i].z += ws * v[k][i].z;
                            acc[i].w += ws * v[k][i].w;
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) W += __shfl_xor_sync(0xffffffffu, W, o);
    const int mode = sw.mode;
    const double lse_d =
        mode == 0 ? (static_cast<double>(sw.M) + log2(W)) * SMLA_LN2 : (mode == 1 ? INFINITY : -INFINITY);
    const float f = none ? 0.f : static_cast<float>(1.0 / W);
    store_out_row<4, NV, 128>(
        p, bi, si, hr, f, none, lse_d, [&] { return 4 * gt; }, [&] { return gt == 0; },
        [&](int i) { return acc[i]; }, [] {});
}

// Every CTA of a fused split decode, once its partials are written (all of its threads): the grid-wide
// barrier of the cooperative launch, after which every split of every pair is in the workspace.
__device__ __forceinline__ void combine_grid_sync() { cooperative_groups::this_grid().sync(); }

// A fused split decode's merges for one 128-thread group (t: its thread 0..127), group gi of the grid's ng
// (a consumer warpgroup of each CTA): 128 threads per pair, pairs gi, gi + ng, ... The launcher fuses only
// the few-row decodes whose launch cost shows: at least kCombineGroupSplits splits (the combine kernel's
// 128-thread case) and at most kFusedPairsPerCta pairs per CTA (launch.cu).
constexpr int kFusedPairsPerCta = 2;
__device__ __forceinline__ void combine_share(const Args &a, int64_t gi, int64_t ng, int t)
{
    const int64_t pairs = a.rows * a.p.h;
    for (int64_t w = gi; w < pairs; w += ng) combine_pair<kCombineThreads>(a, w, t, t & 31);
}

}  // namespace attn
