// Hopper (sm_90a) sparse MLA kernel for head tiles of 64: warp-specialised, wgmma tensor cores. Used
// for h > 32 on compute capability 9.0 (or for any h with SMLA_ATTN_KERNEL=sm90); semantics, outputs
// and the split-top-k partials are those of the portable kernel (sm80/kernel.cuh).
//
// CTA = one query row x 64 heads x one top-k split, 384 threads in three warpgroups:
//   WG2, the producer (setmaxnreg 120; sm90/producer.cuh): fills two K buffers, bf16 by cp.async or
//     fp8 by register loads and dequant; with two head tiles (h > 64) the fp8 CTAs run as clusters
//     of 2 that each dequantise half of every tile for both (XO, the crossover).
//   WG0, WG1, the consumers (sm90/consumer.cuh): WG0 computes S = Q K^T and the softmax of each whole
//     tile and O += P V for output columns 0..255 with P in registers; WG1 does O += P V for columns
//     256..511 with P from smem, overlapping WG0's next S. Then the epilogue.
//   FUSED (a fused split decode, a cooperative launch; its own instantiation, so that the others carry none
//     of its code): every thread then meets at a grid-wide barrier (the producers too, instead of
//     leaving), and WG0 and WG1 each merge their share of the (row, head) pairs from all CTAs' partials
//     (attention/combine.cuh); no combine kernel follows.
// FAST: precision="fast" (P rounded to bf16, one P V MMA); otherwise P = P_hi + P_lo (two).
// Row sums are kept in double and lse / max_logits are formed in double (see sm80/tile.cuh);
// overflowed scores saturate as there (sat_needed / sat_score, attention/softmax.cuh).
//
// ABL != 0 only in profiling builds (SMLA_PROFILE_BUILD=1 -> SMLA_ATTN_ABLATION, tools/ablate.py):
// leave one stage out to time it by difference. Bits: 1 no global K loads (zeros), 2 no S = Q K^T
// wgmma, 4 no P V wgmma, 8 no fp8 dequant (raw bytes stored), 16 no P_lo V wgmma (bf16 P only), 32 (the
// dims kernel only) consumers that only wait for each stage and free it.
// Results are wrong then. run.attn_ablate (SMLA_ATTN_ABLATE) picks the variant at launch.
#pragma once
#include "attention/combine.cuh"
#include "attention/table.cuh"
#include "attention/sm90/consumer.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/variants.cuh"

namespace attn {
namespace sm90 {

// The mbarriers (thread 0): full[b] counts the 128 producer threads, empty[b] the 256 consumer
// threads (XO: one arrival per consumer warp of both CTAs), rr[b] (XO) the peer's bytes.
template <bool XO>
__device__ __forceinline__ void init_barriers(const Cta<XO> &c, bool q_tma = false)
{
    if (c.tid == 0) {
        if (q_tma) mbar_init(q_bar(c), 1);
        mbar_init(c.bar_full, 128);
        mbar_init(c.bar_full + 8, 128);
        mbar_init(c.bar_empty, XO ? 16 : 256);
        mbar_init(c.bar_empty + 8, XO ? 16 : 256);
        if constexpr (XO) {
            mbar_init(c.bar_rr, 1);
            mbar_init(c.bar_rr + 8, 1);
        }
        fence_mbarrier_init();
    }
}

// The mbarrier of Q's TMA load (a.q_tma): the bar region's seventh (full[2], empty[2], rr[2] before it).
template <bool XO>
__device__ __forceinline__ uint32_t q_bar(const Cta<XO> &c)
{
    return c.bar_full + 48;
}

// Whether the CTA loads Q by TMA (the bf16 kernel, where a.q_tma): decided on the slice's tile count before the
// tile scan (nt_all), which the scan does not change, so that the consumers wait for a TMA that was issued even
// where the scan then finds every tile empty (they would stage the output over Q's region while it lands).
template <bool XO>
__device__ __forceinline__ bool q_by_tma(const Args &a, const Cta<XO> &c)
{
    return a.q_tma && c.nt_all > 0;
}

// The consumers' wait for Q (TMA: the bf16 kernel): TMA's bytes are visible to wgmma once q_bar's phase completes.
template <bool TMA, bool XO>
__device__ __forceinline__ void wait_q(const Args &a, const Cta<XO> &c)
{
    if (TMA && q_by_tma(a, c)) mbar_wait(q_bar(c), 0);
    else wait_q();
}

// The Q tile, issued by the 256 consumer threads (rows past h are zero), which wait for it on their
// own (kBarQ) while the producer already fetches indices and K rows.
template <bool XO>
__device__ __forceinline__ void load_q(const Args &a, const Cta<XO> &c)
{
    issue_q<kHT, 256>(a, c, c.h0);
}

// Internal linkage: each instantiation file owns its kernels (no two files register one kernel).
namespace {

// XO: launched in clusters of 2, the two head tiles of one query row (grid x even).
template <bool FP8, int ABL, bool XO, bool FAST, bool FUSED>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    static_assert(FP8 || !XO, "the crossover is written for the fp8 producer");
    if constexpr (!FP8) stagger_start(a);
    extern __shared__ uint8_t smem_raw[];
    Cta<XO> c(a, smem_raw);
    uint32_t *const mask = reinterpret_cast<uint32_t *>(c.smem + Smem::mask.off);

    trace_edge(a, kTrStart);
    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    // bf16: Q by TMA where the launcher described q (a.q_tma), on the mbarrier q_bar, else by the consumers' cp.async
    const bool q_tma = !FP8 && q_by_tma(a, c);
    init_barriers(c, q_tma);
    if (c.nt > 0 && c.tid < 256 && !q_tma) load_q(a, c);
    if (!FP8 && c.tid < kMaskWords) mask[c.tid] = 0u;
    if constexpr (XO) cluster_sync();  // both CTAs' barriers initialised
    else __syncthreads();              // barriers initialised
    if (q_tma && c.tid == 0) tma_q(a, c.sQ, c.h0, static_cast<int>(c.si), static_cast<int>(c.bi), q_bar(c));
    const uint32_t peer = XO ? (cluster_rank() ^ 1u) : 0u;
    const uint32_t peer_base = XO ? mapa(c.base, peer) : 0u;  // the peer's address of our `base`

    // bf16: the tiles without a valid index are neither loaded nor multiplied (producer.cuh, scan_tiles)
    // (the producers issue the slice's tile 0 first: the scan's round trip overlaps its copies)
    if constexpr (!FP8) {
        const auto pre = [&] {
            if (kSpeculate && c.nt_all > 0) Bf16Producer<ABL, 256, 4, kSpecSoftmax>(a, c).speculate();
            trace_edge(a, kTrSpec);
        };
        if constexpr (kConsumerScan) skip_empty_tiles_by_consumers<kThreads>(a, c, mask, kBarStart, pre);
        else skip_empty_tiles<256, 4, kThreads>(a, c, mask, kBarStart, pre);
        trace_edge(a, kTrScanned);
    }

    constexpr int SPLIT = FP8 ? 256 : kSplit;  // WG0's O columns (plan.cuh)
    using Regs = WgRegs<SPLIT, q_reg_steps(FP8, FAST)>;
    if (c.tid >= 256) {
        setmaxnreg_to<Regs::producer>();
        if constexpr (FP8) Fp8Producer<ABL, XO, 256, 4, /*SPREAD=*/!XO>(a, c, peer, peer_base).run();
        else Bf16Producer<ABL, 256, 4, kSpecSoftmax>(a, c).run(kSpeculate && c.nt_all > 0);
        if constexpr (FUSED) {  // every thread takes part in the consumers' cluster barrier and the grid's
            if constexpr (XO) cluster_sync();
            combine_grid_sync();
        }
        return;
    }

    // XO: before the epilogue the peer may not leave while our arrivals / stores into its shared memory
    // are in flight, nor we while its are (the producers, which have left, are not waited for: their
    // stores completed before the consumers' last rr wait)
    if (c.tid < 128) {
        setmaxnreg_to<Regs::score>();
        wait_q<!FP8>(a, c);
        trace_edge(a, kTrQ);
        ScoreWarpgroup<ABL, XO, FAST, SPLIT, !FP8> wg0(a, c, peer_base);
        wg0.run(c);
        if constexpr (XO) cluster_sync();
        trace_edge(a, kTrEpilogue);
        wg0.template epilogue<FUSED>(c);
        trace_edge(a, kTrEnd);
        if constexpr (FUSED) {
            combine_grid_sync();
            combine_share(a, 2 * static_cast<int64_t>(blockIdx.x), 2 * static_cast<int64_t>(gridDim.x), c.tid);
        }
    } else {
        setmaxnreg_to<Regs::value>();
        wait_q<!FP8>(a, c);
        trace_edge(a, kTrQ);
        ValueWarpgroup<ABL, XO, FAST, SPLIT> wg1(a, c, peer_base);
        for (int it = 0; it < c.nt; ++it) wg1.tile(c, it, c.nt);
        if constexpr (XO) cluster_sync();
        trace_edge(a, kTrEpilogue);
        wg1.template epilogue<FUSED>(c);
        trace_edge(a, kTrEnd);
        if constexpr (FUSED) {
            combine_grid_sync();
            combine_share(a, 2 * static_cast<int64_t>(blockIdx.x) + 1, 2 * static_cast<int64_t>(gridDim.x), c.tid - 128);
        }
    }
}

// kPersistent (plan.cuh): the bf16 kernel without a top-k split as persistent CTAs, at most one per SM, CTA j taking
// work items j, j + gridDim.x, .. (an item is what one CTA of attn_sm90_kernel does, grid_pos_of), so that an item's
// fixed cost - the tile scan, Q, the first tiles, the epilogue - overlaps the neighbouring items' tiles instead of
// running alone. The K ring (full / empty) runs on across items (g: its uses so far). Per item k:
//   the producers scan item 0 at once and item k + 1 during item k, a round of 8 tiles per tile of item k (ItemScan,
//     sm90/producer.cuh: its loads before the wait for a free buffer), into mask_of(k + 1) (Smem::mask, and the
//     row sums' region, which the direct output does not use), and publish the tile count in nt[(k + 1) & 1]
//     (scan_full, one arrival; nt_free: the 8 consumer warps have read it), then run the item's tiles;
//   WG0 loads item 0's Q, and item k + 1's once its last S of item k is done (Q is read by S alone): by TMA from one
//     thread where the launcher described q (a.q_tma), else by its 128 threads' cp.async (q_full); it writes its
//     columns from registers (epilogue_item), handing WG1 the rows' factors, and goes on to the next item while WG1
//     finishes this one (they meet at kBarItem only before WG0 overwrites what WG1 reads: P_lo, the factors).
// Measured against attn_sm90_kernel: benchmarks/README.md, issue 16, twenty-eighth session (2-8% slower), and with
// its producers started (j % 8) x 4,000 or 16,000 cycles late in CTA j, to spread the item boundaries (thirty-first
// session: 6-10% slower, the stagger no help; its code is in 644464e).
template <int ABL, bool FAST>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90_persistent_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    extern __shared__ uint8_t smem_raw[];
    const int64_t items = a.rows * a.n_ht;  // no top-k split (launch_variant)
    const Cta<false> c0(a, smem_raw, grid_pos_of(a, blockIdx.x));  // the regions (the same for every item)
    // the tile masks of items k: Smem::mask (k even) and the row sums' region (k odd; the direct output keeps them in
    // registers), selected, not indexed (an indexed pair of pointers went to local memory)
    uint32_t *const mask_even = reinterpret_cast<uint32_t *>(c0.smem + Smem::mask.off);
    uint32_t *const mask_odd = reinterpret_cast<uint32_t *>(c0.smem + Smem::row_l.off);
    const auto mask_of = [&](int k) { return (k & 1) ? mask_odd : mask_even; };
    const uint32_t q_full = c0.base + Smem::pers.off, scan_full = q_full + 8, nt_free = q_full + 24;  // [2] each
    int *const nt_s = reinterpret_cast<int *>(c0.smem + Smem::pers.off + 40);

    pdl_launch_dependents();
    init_barriers(c0);
    if (c0.tid == 0) {
        mbar_init(q_full, a.q_tma ? 1 : 128);  // Q by TMA (one arrival with its bytes) or by WG0's cp.async
        for (int i = 0; i < 2; ++i) {
            mbar_init(scan_full + 8 * i, 1);
            mbar_init(nt_free + 8 * i, 8);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    using Regs = WgRegs<kSplit, q_reg_steps(false, FAST)>;
    if (c0.tid >= 256) {
        setmaxnreg_to<Regs::producer>();
        const int tw = c0.tid - 256;
        // item k's tile count from its scan in mask, published by one thread (nt[k & 1] once the consumers took item
        // k - 2's)
        const auto publish_nt = [&](int64_t item, int k, const uint32_t *mask) {
            named_sync(kBarProd, 128);  // every producer thread's marks are in
            if (tw == 0) {
                Cta<false> n(a, smem_raw, grid_pos_of(a, item));
                use_tile_mask(n, mask);
                if (k >= 2) mbar_wait(nt_free + 8 * (k & 1), ((k >> 1) - 1) & 1);
                nt_s[k & 1] = n.nt;
                mbar_arrive(scan_full + 8 * (k & 1));
            }
        };
        const auto zero_mask = [&](uint32_t *mask) {
            if (tw < kMaskWords) mask[tw] = 0u;
            named_sync(kBarProd, 128);
        };
        if (static_cast<int64_t>(blockIdx.x) < items) {  // item 0's scan, at once
            zero_mask(mask_even);
            ItemScan(a, c0, mask_even, tw).finish();
            publish_nt(blockIdx.x, 0, mask_even);
        }
        int g = 0, k = 0;
        for (int64_t item = blockIdx.x; item < items; item += gridDim.x, ++k) {
            Cta<false> c(a, smem_raw, grid_pos_of(a, item));
            use_tile_mask(c, mask_of(k));
            // the next item's scan rides on this item's tiles (its mask: the other one, which item k - 1 used)
            const int64_t nxt = item + gridDim.x;
            uint32_t *const mask_n = mask_of(k + 1);
            if (nxt < items) zero_mask(mask_n);
            ItemScan sn(a, Cta<false>(a, smem_raw, grid_pos_of(a, nxt < items ? nxt : item)), mask_n, tw, nxt < items);
            Bf16Producer<ABL, 256, 4, kSpecSoftmax>(a, c).run_ring(g, sn);
            sn.finish();
            if (nxt < items) publish_nt(nxt, k + 1, mask_n);
            g += c.nt;
        }
        cp_async_wait_all();
        return;
    }

    // Each consumer warp takes item k's tile count (each warpgroup's loop on its own: setmaxnreg
    // gives WG0 and WG1 different register budgets, so their code must not share a loop body).
    auto take = [&](Cta<false> &c, int k) {
        mbar_wait(scan_full + 8 * (k & 1), (k >> 1) & 1);
        c.nt = nt_s[k & 1];
        __syncwarp();
        if (c.lane == 0) mbar_arrive(nt_free + 8 * (k & 1));
    };
    if (c0.tid < 128) {
        setmaxnreg_to<Regs::score>();
        // Q of item `it` (WG0's 128 threads; every S of the last item done)
        const auto load_q = [&](int64_t it) {
            const Cta<false> cq(a, smem_raw, grid_pos_of(a, it));
            if (a.q_tma) {
                if (cq.tid == 0) tma_q(a, cq.sQ, cq.h0, static_cast<int>(cq.si), static_cast<int>(cq.bi), q_full);
            } else {
                issue_q<kHT, 128>(a, cq, cq.h0, cq.tid);
                cp_async_mbar_arrive_noinc(q_full);
            }
        };
        int g = 0, k = 0;
        if (static_cast<int64_t>(blockIdx.x) < items) load_q(blockIdx.x);
        for (int64_t item = blockIdx.x; item < items; item += gridDim.x, ++k) {
            Cta<false> c(a, smem_raw, grid_pos_of(a, item));
            take(c, k);
            mbar_wait(q_full, k & 1);
            fence_async_smem();  // Q (cp.async where not by TMA) and the producers' K, read by wgmma
            const auto next_q = [&] {
                if (item + gridDim.x >= items) return;
                named_sync(kBarOut, 128);  // every warp of WG0 is done with this item's Q
                load_q(item + gridDim.x);
            };
            ScoreWarpgroup<ABL, false, FAST, kSplit, true> wg0(a, c, 0u, k > 0);
            if (c.nt == 0) next_q();
            wg0.run(c, g, next_q);
            wg0.epilogue_item(c);
            g += c.nt;
        }
    } else {
        setmaxnreg_to<Regs::value>();
        int g = 0, k = 0;
        for (int64_t item = blockIdx.x; item < items; item += gridDim.x, ++k) {
            Cta<false> c(a, smem_raw, grid_pos_of(a, item));
            take(c, k);
            const int64_t nxt = item + gridDim.x;
            ValueWarpgroup<ABL, false, FAST, kSplit> wg1(a, c, 0u);
            for (int it = 0; it < c.nt; ++it) wg1.tile(c, it, c.nt, g);
            wg1.epilogue_item(c, nxt < items);
            g += c.nt;
        }
    }
}

// Launches ablation variant ABL (0: the full kernel) in the call's precision: for fp8 with two head
// tiles the crossover kernel in clusters of 2, else the plain one (bf16 with two head tiles and no top-k
// split: in clusters of 2 too, for the L2). The shared-memory attribute of each is set once per device.
template <bool FP8, int ABL, bool FAST>
int launch_variant(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    static OncePerDevice configured;
    if constexpr (!FP8 && kPersistent) {  // without a top-k split: at most one CTA per SM, each taking items in turn
        if (a.n_splits == 1) {
            // with two head tiles (kBf16Cluster) CTAs 2 m and 2 m + 1 run as a cluster: with an even grid they take
            // the two head tiles of the same rows, side by side in one GPC (the plain kernel's clusters, for the L2)
            return launch_persistent<attn_sm90_persistent_kernel<ABL, FAST>>(a, grid, kThreads, Smem::bytes, s, dev, st,
                                                                            kBf16Cluster && a.n_ht == 2 ? 2 : 1);
        }
    }
    // fp8 with two head tiles: clusters of the two (the crossover; sm90/producer.cuh)
    const bool xo = FP8 && a.n_ht == 2;
    static_assert(SMLA_MAX_HEADS <= 2 * kHT, "more than two head tiles would need another producer split");
    // the fused split decode: the full kernel only (the profiling variants keep the combine kernel)
    constexpr bool kFuses = ABL == 0;
    using Kern = void (*)(Args);
    constexpr Kern plain[2] = {attn_sm90_kernel<FP8, ABL, false, FAST, false>,
                               attn_sm90_kernel<FP8, ABL, FP8, FAST, false>};
    constexpr Kern fused[2] = {attn_sm90_kernel<FP8, ABL, false, FAST, kFuses>,
                               attn_sm90_kernel<FP8, ABL, FP8, FAST, kFuses>};
    static ResidentCtas resident[2];  // of the fused kernels: plain, clusters of 2
    if (configured.needed(dev)) {
        for (int x = 0; x < (FP8 ? 2 : 1); ++x) {
            SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(plain[x], cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::bytes));
            if (kFuses) {
                SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(fused[x], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         Smem::bytes));
                resident[x].set(dev, smla_resident_ctas(fused[x], kThreads, Smem::bytes, x ? 2 : 1, a.n_sms));
            }
        }
        configured.mark(dev);
    }
    // a fused split decode needs its whole grid resident (a cooperative launch), else the combine kernel merges
    if (a.fused && !(kFuses && resident[xo ? 1 : 0].fits(dev, grid))) a.fused = 0;
    // bf16 with two head tiles: a row's two CTAs as a cluster, co-scheduled only (SMLA_SM90_BF16_CLUSTER,
    // plan.cuh); with one split the grid is (row, head tile) and never fused (that needs 8 splits, launch.cu)
    const bool pair_ctas = xo || (kBf16Cluster && !FP8 && a.n_ht == 2 && a.n_splits == 1);
    smla_launch_ex((a.fused ? fused : plain)[xo ? 1 : 0], dim3(static_cast<unsigned>(grid)), dim3(kThreads), Smem::bytes,
                   s, pair_ctas ? 2 : 1, a.fused != 0, a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

// The variant the call asks for (sm90/variants.cuh).
template <bool FP8>
int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    return with_variant(a, [&](auto abl, auto fast) {
        return launch_variant<FP8, decltype(abl)::value, decltype(fast)::value>(a, grid, s, dev, st);
    });
}

}  // namespace

// The table entry of the kernel for one cache format.
template <bool FP8>
constexpr KernelEntry entry()
{
    return KernelEntry{Family::sm90, FP8, kHT, kBN, Smem::bytes, 1, kThreads, &launch<FP8>, /*fuses=*/true, /*q_tma=*/!FP8};
}

}  // namespace sm90
}  // namespace attn
