// Hopper (sm_90a) sparse MLA kernel for small head counts (h <= 32): tokens on the MMA's M dimension,
// so that a wgmma is full with 16 heads. Used for h <= 32 on compute capability 9.0 (SMLA_ATTN_KERNEL=
// auto or sm90n); semantics, outputs and the split-top-k partials are those of the other kernels.
//
// With heads on M (the wide kernel, sm90/kernel.cuh) a 64-row wgmma would carry 16 heads and 48 rows of
// padding; here the K tile is the M side:
//   S^T [64 tokens x NH heads] = K [64 x 576] Q^T        (wgmma m64nNHk16, A = K tile K-major, B = Q)
//   O^T [512 dims x NH heads] += V^T [512 x 64] P^T      (8 x m64nNHk16 per k-step, A = the K tile read
//                                                          M-major, B = P^T stored by the softmax)
// so the MMA work is proportional to h. (What bounds it, measured: benchmarks/README.md, "Small head
// counts": in prefill the consumer's chain per tile, S, softmax, P V one after the other.)
//
// CTA = one query row x all heads (NH = 16 or 32, rows past h are zero) x one top-k split, 384 threads
// (Cfg::CW = 1 consumer warpgroup; 512 with two, the bf16 cache at 32 heads in "high": SplitConsumer below):
//   the last two warpgroups, the producers (setmaxnreg Cfg::Regs; sm90/producer.cuh with 8 warps): fill
//     the two K buffers as in the wide kernel, a whole tile of fp8 rows in flight in registers.
//   WG0, the consumer (setmaxnreg Cfg::Regs), per K tile:
//     acquire : wait until the producers filled the buffer;
//     scores  : S^T in 3 chains of 12 k-steps summed in fp32 (the wide kernel's accuracy rule);
//     softmax : mask and scale (log2 domain); the lazy maximum (sm90/narrow_softmax.cuh): within 2^8 of
//               the running maxima, P = 2^(S - m) against them, stored, and one barrier that also ORs
//               the threads' verdicts (kBarP); else exactly: overflow saturated, each head's tile maximum
//               over the column's 64 tokens (in-warp shuffles, then the 4 warps through smem: kBarRed),
//               alpha, P = 2^(S - m), O^T rescaled by alpha. Row sums per thread in double; P^T stored as
//               bf16 (high: P_hi and P_lo, split_bf16x2) for all 4 warps' wgmma (kBarP);
//     pv      : O^T += V^T P^T (high: + V^T P_lo^T; at NH = 16 one m64n32k16 per V^T block, P_hi^T and
//               P_lo^T stacked as its 32 B rows, so V^T is read from shared memory once: kStack);
//     release : hand the buffer back.
//   Then the epilogue: row sums across the warps (kBarE), O^T staged transposed in smem, and each warp
//   writes whole head rows (finish_row, attention/epilogue.cuh).
//   FUSED (a fused split decode, a cooperative launch; its own instantiation): then every thread meets at a
//   grid-wide barrier (the producers too, instead of leaving), and each consumer warpgroup merges its share
//   of the (row, head) pairs from all CTAs' partials (attention/combine.cuh); no combine kernel follows.
// FAST: precision="fast" (P rounded to bf16, one P V MMA per k-step).
// ABL != 0 only in profiling builds (sm90/kernel.cuh's bits): 1 no K loads, 2 no S wgmma, 4 no P V
// wgmma, 8 no dequant, 16 no P_lo V wgmma.
#pragma once
#include "attention/combine.cuh"
#include "attention/epilogue.cuh"
#include "attention/table.cuh"
#include "attention/sm90/narrow_plan.cuh"
#include "attention/sm90/narrow_softmax.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/variants.cuh"

namespace attn {
namespace sm90 {
namespace narrow {

// Q [NH heads x 576] into its column blocks (heads past h zero), issued and waited for by the consumers.
template <class C>
__device__ __forceinline__ void load_q(const Args &a, const Cta<C> &c)
{
    issue_q<C::NH, 128 * C::CW>(a, c, 0);
    cp_async_wait_all();
    fence_async_smem();
    named_sync(kBarQ, 128 * C::CW);
}

// The epilogue's last stage: warp wq of nw writes head rows wq, wq + nw, ... of the output from the staged
// O (sO), the warps' row sums (sLsum) and maxima (sM; LAZY: the max logit from red as well).
template <class C, bool LAZY>
__device__ __forceinline__ void write_rows(const Args &a, const Cta<C> &c, int wq, int nw, int lane)
{
    constexpr int NH = C::NH;
    const bool split = a.n_splits > 1;
    const int col0 = 64 * (lane >> 2) + 2 * (lane & 3);
    for (int hd = wq; hd < NH && hd < c.h; hd += nw) {
        const double l = c.sLsum[hd] + c.sLsum[NH + hd] + c.sLsum[2 * NH + hd] + c.sLsum[3 * NH + hd];
        const float *orow = c.sO + hd * C::kOStride + col0;
        float ml = c.sM[hd];  // the max logit (log2 domain)
        if constexpr (LAZY)
            ml = fmaxf(fmaxf(ml, fmaxf(c.sRed[hd], c.sRed[NH + hd])), fmaxf(c.sRed[2 * NH + hd], c.sRed[3 * NH + hd]));
        finish_row<8>(
            a, c.row, c.bi, c.si, c.sp, c.h, hd, split, c.sM[hd], l, ml, [&] { return col0; },
            [&] { return lane == 0; }, [&](int i) { return *reinterpret_cast<const float2 *>(orow + 8 * i); });
    }
}

// A consumer warpgroup's loop over the CTA's tiles, each: acquire K buffer b, wg.scores (S^T issued, waited
// for, summed: this warpgroup's scores), wg.softmax_tile, P V (wg.pv_issue, waited for), release. The S^T
// chains (W::Chains) live across the loop, as the accumulators of wgmma do.
template <class C, class W>
__device__ __forceinline__ void tile_loop(const Args &a, const Cta<C> &c, W &wg)
{
    typename W::Chains t;
#pragma unroll 1
    for (int it = 0; it < c.nt; ++it) {
        const int b = it & 1;
        const uint32_t kb = c.sK + b * kTileBytes;
        float s[W::kScores];
        trace(a, it, 0);
        mbar_wait(c.bar_full + 8 * b, (it >> 1) & 1);
        trace(a, it, 1);
        wg.scores(c, kb, t, s);
        trace(a, it, 2);
        wg.softmax_tile(c, it, b, s);
        trace(a, it, 3);
        wg.pv_issue(c, kb);
        wg_wait0();
        wg.fence_o();
        trace(a, it, 4);
        mbar_arrive(c.bar_empty + 8 * b);
    }
}

// Whether a narrow consumer stacks P_hi^T and P_lo^T ("high": P_hi^T and P_lo^T, rows NH.. of the P
// region, as one 2 NH-row B operand, so each m64nk16 reads its V^T block from shared memory once; O_hi^T
// and O_lo^T are added in the epilogue): the one-warpgroup consumer at NH = 16 (at 32 its n64 accumulator
// would not fit), the split consumer always; so its O^T m-tile width, and its softmax state (one warpgroup:
// all 8 m-tiles, or two: 4 each).
template <class C, int ABL, bool FAST, bool LAZY>
struct ConsumerKind {
    static constexpr bool kNoLo = FAST || (ABL & 16) != 0;
    static constexpr bool kStack = !kNoLo && (C::CW == 2 || (C::NH == 16 && SMLA_NARROW_STACK_P != 0));
    static constexpr int NO = kStack ? C::NH : C::NH / 2;
    using Softmax = HeadSoftmax<C::NH, kNoLo, NO, LAZY, 8 / C::CW, C::CW>;
};

// S^T's k-steps as one commit group, over the K tile at kb and Q at sq (each at the warpgroup's first k-step):
// N k-steps, PB of them in each 64-dim column block (k-step kk: block kk / PB, then (kk % PB) 128 / PB bytes on;
// Q's blocks QBLK bytes apart), k-step kk into the accumulator chain(kk / CH), which starts afresh at kk % CH == 0.
template <int N, int PB, int CH, int QBLK, class Chain>
__device__ __forceinline__ void issue_st(uint32_t kb, uint32_t sq, Chain chain)
{
    const uint32_t kd = opaque(desc_base(kb, 16)), qd = opaque(desc_base(sq, 16));
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < N; ++kk) {
        const uint32_t in = (kk % PB) * (128 / PB);
        wgmma_ss<0>(chain(kk / CH), desc_at(kd, (kk / PB) * kBlk + in), desc_at(qd, (kk / PB) * QBLK + in),
                    kk % CH != 0);
    }
    wg_commit();
}

// The consumer warpgroup: the per-head softmax state and its rules (sm90/narrow_softmax.cuh), the two
// MMAs over the K buffers and the epilogue.
template <class C, int ABL, bool FAST, bool LAZY>
struct Consumer : ConsumerKind<C, ABL, FAST, LAZY>::Softmax {
    using Base = typename ConsumerKind<C, ABL, FAST, LAZY>::Softmax;
    using Base::o, Base::m_r, Base::l_r, Base::w, Base::g, Base::t4, Base::head;
    static constexpr int NH = C::NH, NJ = C::NJ, NS = C::NS, NL = 2 * C::NJ, NO = Base::NO;
    static constexpr bool kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0;
    static constexpr bool kNoLo = ConsumerKind<C, ABL, FAST, LAZY>::kNoLo, kStack = ConsumerKind<C, ABL, FAST, LAZY>::kStack;
    static constexpr bool kLazy = LAZY;

    const Args &a;

    __device__ __forceinline__ Consumer(const Args &a_, const Cta<C> &c) : Base(c.tid), a(a_) {}

    // S^T of K buffer kb, issued (one commit group): k-step kk reads K columns 16 kk.. (A) and Q columns
    // 16 kk.. (B); chains of 12 k-steps into t0, t1, t2, which scores_sum adds (t0 + t1) + t2 as the wide
    // kernel does.
    __device__ __forceinline__ void scores_issue(const Cta<C> &c, uint32_t kb, float (&t0)[NS], float (&t1)[NS],
                                                 float (&t2)[NS]) const
    {
        if constexpr (!kNoS)
            issue_st<36, 4, 12, C::kQBlk>(kb, c.sQ,
                                          [&](int ch) -> float (&)[NS] { return ch == 0 ? t0 : (ch == 1 ? t1 : t2); });
    }
    // Once the S^T group is done: the scores.
    __device__ __forceinline__ void scores_sum(float (&t0)[NS], float (&t1)[NS], float (&t2)[NS], float (&s)[NS]) const
    {
        if constexpr (kNoS) {
#pragma unroll
            for (int i = 0; i < NS; ++i) s[i] = 0.f;
        } else {
            fence_regs(t0);
            fence_regs(t1);
            fence_regs(t2);
#pragma unroll
            for (int i = 0; i < NS; ++i) s[i] = (t0[i] + t1[i]) + t2[i];
        }
    }

    // O^T += V^T P^T over the 4 k-steps of buffer kb, issued (one commit group): m-tile mt is column block
    // mt of the tile read M-major (k-step kk: token rows 16 kk ..).
    __device__ __forceinline__ void pv_issue(const Cta<C> &c, uint32_t kb)
    {
        if constexpr (!kNoPV) {
            const uint32_t pd = opaque(desc_base(c.sP, 16)), vd = opaque(desc_base(kb, kBlk));
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint64_t dh = desc_at(pd, kk * 32);
                const uint64_t dl = desc_at(pd, C::kPBytes + kk * 32);
#pragma unroll
                for (int mt = 0; mt < 8; ++mt) {
                    const uint64_t dv = desc_at(vd, mt * kBlk + kk * 16 * 128);
                    wgmma_ss<1>(o[mt], dv, dh, 1);  // kStack: n32, the rows of dh are P_hi^T then P_lo^T
                    if constexpr (!kNoLo && !kStack) wgmma_ss<1>(o[mt], dv, dl, 1);
                }
            }
            wg_commit();
        }
    }
    // The tile's softmax over its scores s (K buffer b's row flags; red parity it & 1: the other one may
    // still be read by slower warps): P^T stored and visible to wgmma, the row state updated.
    __device__ __forceinline__ void softmax_tile(const Cta<C> &c, int it, int b, float (&s)[NS])
    {
        const int tok = 16 * w + g;
        const bool ok0 = c.sValid[b * kBN + tok] != 0, ok1 = c.sValid[b * kBN + tok + 8] != 0;
        Base::tile(s, ok0, ok1, a.scale_log2, c.sP, c.sRed, it, kBarRed, kBarP);
    }

    // The stages tile_loop runs on each tile (S^T of the next tile queued behind P V was measured slower:
    // benchmarks/README.md).
    struct Chains {
        float t0[NS], t1[NS], t2[NS];
    };
    static constexpr int kScores = NS;
    __device__ __forceinline__ void scores(const Cta<C> &c, uint32_t kb, Chains &t, float (&s)[NS]) const
    {
        scores_issue(c, kb, t.t0, t.t1, t.t2);
        wg_wait0();
        scores_sum(t.t0, t.t1, t.t2, s);
    }

};

// Two consumer warpgroups on every tile (CW = 2, the bf16 cache: cp.async producers leave them the
// registers). Both run the same code (a template on the warpgroup doubled the loop's instructions, and a
// barrier reached from two copies of the code is not one instruction); warpgroup cw, of each tile:
//   scores  : S^T's k-steps 2 kk + cw (every other 16 dims: the same descriptors, 32 bytes on for cw = 1),
//             two chains of 9 (the one-warpgroup kernel's three chains of 12 regrouped), then hands the
//             other warpgroup its partial of that one's heads' columns through xs (kBarX) and adds the
//             other's partial of its own: S^T of its half of the heads (HeadSoftmax's NWG = 2);
//   softmax : its heads' softmax, the verdict of the lazy maximum over both warpgroups through per-warp flags
//             and P^T's barrier (kBarP, 256 threads), an exact tile's alphas through shared memory;
//   pv      : O^T's m-tiles 4 cw .. 4 cw + 3 (dims 256 cw ..) for every head; "high" with P_hi^T and
//             P_lo^T stacked as one n = 2 NH B operand (so V^T is read from shared memory once);
//   release : its own arrival on the buffer's empty barrier (256 arrivals).
// So each warpgroup reads half of the tile from shared memory, and the softmax runs on 256 threads.
template <class C, int ABL, bool FAST, bool LAZY>
struct SplitConsumer : ConsumerKind<C, ABL, FAST, LAZY>::Softmax {
    using Base = typename ConsumerKind<C, ABL, FAST, LAZY>::Softmax;
    using Base::o, Base::m_r, Base::l_r, Base::w, Base::g, Base::t4, Base::cw, Base::head;
    static constexpr int NH = C::NH, NS = C::NS, NSO = Base::NSO, NLO = Base::NLO;
    static constexpr bool kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0, kLazy = LAZY;
    static_assert(C::CW == 2, "the split consumer: two warpgroups");

    const Args &a;
    const int t;  // thread of the warpgroup

    __device__ __forceinline__ SplitConsumer(const Args &a_, const Cta<C> &c) : Base(c.tid), a(a_), t(c.tid & 127) {}

    // This warpgroup's S^T k-steps of K buffer kb, issued (one commit group): k-step 2 kk + cw reads K and Q
    // columns 16 (2 kk + cw) ..; chain t0 kk < 9, t1 the rest.
    __device__ __forceinline__ void scores_issue(const Cta<C> &c, uint32_t kb, float (&t0)[NS], float (&t1)[NS]) const
    {
        if constexpr (!kNoS)
            issue_st<18, 2, 9, C::kQBlk>(kb + 32 * cw, c.sQ + 32 * cw,
                                         [&](int ch) -> float (&)[NS] { return ch == 0 ? t0 : t1; });
    }
    // Once the group is done: the partial t0 + t1; the other warpgroup's heads' columns of it handed over,
    // its own ones' from the other added: s, S^T of this warpgroup's heads.
    __device__ __forceinline__ void scores_exchange(const Cta<C> &c, float (&t0)[NS], float (&t1)[NS], float (&s)[NSO]) const
    {
        float mine[NSO], other[NSO];
        if constexpr (kNoS) {
#pragma unroll
            for (int i = 0; i < NSO; ++i) mine[i] = other[i] = 0.f;
        } else {
            fence_regs(t0);
            fence_regs(t1);
#pragma unroll
            for (int i = 0; i < NSO; ++i) {  // columns cw NSO .. are this warpgroup's heads
                const float lo = t0[i] + t1[i], hi = t0[NSO + i] + t1[NSO + i];
                mine[i] = cw ? hi : lo;
                other[i] = cw ? lo : hi;
            }
        }
        float4 *out = reinterpret_cast<float4 *>(c.sXs + ((1 - cw) * 128 + t) * NSO);
#pragma unroll
        for (int v = 0; v < NSO / 4; ++v) out[v] = make_float4(other[4 * v], other[4 * v + 1], other[4 * v + 2], other[4 * v + 3]);
        named_sync(kBarX, 256);
        const float4 *in = reinterpret_cast<const float4 *>(c.sXs + (cw * 128 + t) * NSO);
#pragma unroll
        for (int v = 0; v < NSO / 4; ++v) {
            const float4 q = in[v];
            s[4 * v] = mine[4 * v] + q.x, s[4 * v + 1] = mine[4 * v + 1] + q.y;
            s[4 * v + 2] = mine[4 * v + 2] + q.z, s[4 * v + 3] = mine[4 * v + 3] + q.w;
        }
    }

    // O^T m-tiles 4 cw .. 4 cw + 3 += V^T P^T over the 4 k-steps of buffer kb, issued (one commit group);
    // "high" (ConsumerKind::kStack): n = 2 NH, the B rows P_hi^T then P_lo^T.
    __device__ __forceinline__ void pv_issue(const Cta<C> &c, uint32_t kb)
    {
        if constexpr (!kNoPV) {
            const uint32_t pd = opaque(desc_base(c.sP, 16)), vd = opaque(desc_base(kb + 4 * kBlk * cw, kBlk));
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint64_t dp = desc_at(pd, kk * 32);
#pragma unroll
                for (int mt = 0; mt < 4; ++mt) wgmma_ss<1>(o[mt], desc_at(vd, mt * kBlk + kk * 16 * 128), dp, 1);
            }
            wg_commit();
        }
    }

    // The tile's softmax of this warpgroup's heads (the narrow Consumer's, with both warpgroups' barriers).
    __device__ __forceinline__ void softmax_tile(const Cta<C> &c, int it, int b, float (&s)[NSO])
    {
        const int tok = 16 * w + g;
        const bool ok0 = c.sValid[b * kBN + tok] != 0, ok1 = c.sValid[b * kBN + tok + 8] != 0;
        Base::tile(s, ok0, ok1, a.scale_log2, c.sP, c.sRed, it, cw ? kBarRed1 : kBarRed, kBarP, c.sFlags, c.sAlpha);
    }

    struct Chains {
        float t0[NS], t1[NS];
    };
    static constexpr int kScores = NSO;
    __device__ __forceinline__ void scores(const Cta<C> &c, uint32_t kb, Chains &t, float (&s)[NSO]) const
    {
        scores_issue(c, kb, t.t0, t.t1);
        wg_wait0();
        scores_exchange(c, t.t0, t.t1, s);
    }
};

// Internal linkage: each instantiation file owns its kernels.
namespace {

// A consumer warpgroup's part of the kernel: Q, the tiles, the epilogue.
template <class C, class W>
__device__ __forceinline__ void consume(const Args &a, const Cta<C> &c, W &&wg)
{
    trace_edge(a, kTrStart);
    if (c.nt > 0) {
        load_q(a, c);
        tile_loop(a, c, wg);
    }
    trace_edge(a, kTrEpilogue);
    // row sums and maxima of each warpgroup's heads and its m-tiles of O^T staged (stage_out: O as
    // [NH][kOStride] floats), then the consumer warps (4 a warpgroup) write heads warp, warp + 4 CW, ...
    // (lane: columns 64 (lane >> 2) + 2 (lane & 3) + 8 i; LAZY: each head's max logit from every warp's tmx)
    wg.template stage_out<C::kOStride>(c.sLsum, c.sM, c.sO, c.sRed, kBarE);
    write_rows<C, W::kLazy>(a, c, 4 * wg.cw + wg.w, 4 * C::CW, 4 * wg.g + wg.t4);
    trace_edge(a, kTrEnd);
}

template <class C, bool FP8, int ABL, bool FAST, bool FUSED>
__global__ void __launch_bounds__(C::kThreads, 1) attn_sm90n_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    extern __shared__ uint8_t smem_raw[];
    const Cta<C> c(a, smem_raw);

    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    if (c.tid == 0) {
        mbar_init(c.bar_full, 32 * C::kPW);
        mbar_init(c.bar_full + 8, 32 * C::kPW);
        mbar_init(c.bar_empty, 128 * C::CW);
        mbar_init(c.bar_empty + 8, 128 * C::CW);
        fence_mbarrier_init();
    }
    __syncthreads();

    if (c.tid >= C::kP0) {
        setmaxnreg_dec<C::Regs::producer>();
        if constexpr (FP8) Fp8Producer<ABL, false, C::kP0, C::kPW>(a, c, 0u, 0u).run();
        else Bf16Producer<ABL, C::kP0, C::kPW>(a, c).run(false);
        if constexpr (FUSED) combine_grid_sync();  // every thread takes part in the grid's barrier
        return;
    }
    setmaxnreg_inc<C::Regs::consumer>();
    constexpr bool kLazy = SMLA_NARROW_LAZY_MAX == 2 || (SMLA_NARROW_LAZY_MAX == 1 && !FP8);
    if constexpr (C::CW == 1) {
        consume(a, c, Consumer<C, ABL, FAST, kLazy>(a, c));
    } else {
        static_assert(!FP8, "two consumer warpgroups: the bf16 kernel (its producers hold no data)");
        consume(a, c, SplitConsumer<C, ABL, FAST, kLazy>(a, c));
    }
    if constexpr (FUSED) {  // fused split decode: each consumer warpgroup merges its share of the pairs
        combine_grid_sync();  // (attention/combine.cuh)
        if constexpr (C::CW == 1) combine_share(a, blockIdx.x, gridDim.x, c.tid);
        else combine_share(a, 2 * static_cast<int64_t>(blockIdx.x) + c.tid / 128, 2 * static_cast<int64_t>(gridDim.x), c.tid & 127);
    }
}

template <class C, bool FP8, int ABL, bool FAST>
int launch_variant(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    static OncePerDevice configured;
    // the fused split decode: the full kernel only (the profiling variants keep the combine kernel)
    constexpr bool kFuses = ABL == 0;
    constexpr auto plain = attn_sm90n_kernel<C, FP8, ABL, FAST, false>, fused = attn_sm90n_kernel<C, FP8, ABL, FAST, kFuses>;
    static ResidentCtas resident;  // of the fused kernel
    if (configured.needed(dev)) {
        SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(plain, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<C>::bytes));
        if (kFuses) {
            SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(fused, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<C>::bytes));
            resident.set(dev, smla_resident_ctas(fused, C::kThreads, Smem<C>::bytes, 1, a.n_sms));
        }
        configured.mark(dev);
    }
    // a fused split decode needs its whole grid resident (a cooperative launch), else the combine kernel merges
    if (a.fused && !(kFuses && resident.fits(dev, grid))) a.fused = 0;
    smla_launch_ex(a.fused ? fused : plain, dim3(static_cast<unsigned>(grid)), dim3(C::kThreads), Smem<C>::bytes, s, 1,
                   a.fused != 0, a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

// The configuration a call runs: NH heads, and the consumer warpgroups of its cache and precision.
template <int NH, bool FP8, bool FAST>
using CfgFor = Cfg<NH, FP8 ? 1 : bf16_consumers(NH, FAST)>;

// The variant the call asks for (sm90/variants.cuh).
template <int NH, bool FP8>
int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    return with_variant(a, [&](auto abl, auto fast) {
        constexpr bool kFast = decltype(fast)::value;
        return launch_variant<CfgFor<NH, FP8, kFast>, FP8, decltype(abl)::value, kFast>(a, grid, s, dev, st);
    });
}

}  // namespace

// The table entry of the narrow kernel with NH heads for one cache format (shared memory and threads: the
// larger of its two precisions' configurations).
template <int NH, bool FP8>
constexpr KernelEntry entry()
{
    using F = CfgFor<NH, FP8, true>;
    using H = CfgFor<NH, FP8, false>;
    constexpr int smem = Smem<F>::bytes > Smem<H>::bytes ? Smem<F>::bytes : Smem<H>::bytes;
    constexpr int threads = F::kThreads > H::kThreads ? F::kThreads : H::kThreads;
    return KernelEntry{Family::sm90n, FP8, NH, kBN, smem, 1, threads, &launch<NH, FP8>, /*fuses=*/true};
}

}  // namespace narrow
}  // namespace sm90
}  // namespace attn
