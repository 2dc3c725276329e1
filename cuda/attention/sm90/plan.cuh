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

// Three changes measured faster on the H200 (benchmarks/README.md, "Issue 16, sixth session"), on by
// default since the whole CUDA suite passed with them, run alone (seventh session; the failures of the
// sixth session's crowded run were out-of-memory errors of the concurrent processes). 0 restores the
// code they replaced.
#ifndef SMLA_SM90_SPECULATE
#define SMLA_SM90_SPECULATE 1  // the wide bf16 producers issue tile 0 before the tile scan
#endif
// The wide bf16 kernel's tile scan by the 256 consumer threads with 16-byte loads (scan_tiles_vec, producer.cuh),
// which wait for Q meanwhile, while the producers issue tile 0; before, the producers scanned after issuing tile 0, so
// the scan's 2,048 loads queued behind its copies. H100 (benchmarks/README.md, issue 16, twenty-sixth session):
// a mid-run CTA's scan done 3,694 instead of 5,553 cycles after its start and its tile 1 at 8,543 instead of
// 10,587; the causal fresh prompt at h = 128 "fast" 1-5% faster (1,234 / 1,256 against 1,303 us in one call, 1,282 /
// 1,294 against 1,285 / 1,325 in another), the full calls within the spread. 0: the producers scan.
#ifndef SMLA_SM90_CONSUMER_SCAN
#define SMLA_SM90_CONSUMER_SCAN 1
#endif
// The staged direct output (stage_out_cols, sm90/score_tile.cuh) one 64-column block at a time: staged, met,
// stored, so that the next block's staging overlaps this one's stores. 0: all staged, then all stored.
// This and SMLA_SM90_EARLY_OUT: on an H100 the calls with them measured within the spread of those without
// (twenty-sixth session); in their final form WG1 meets WG0's factors 601 cycles into its epilogue, and its last P V
// to the CTA's end takes 5,006 cycles against 5,254 before them (trace, twenty-seventh session; benchmarks/README.md).
#ifndef SMLA_SM90_OUT_PIPE
#define SMLA_SM90_OUT_PIPE 1
#endif
// The wide kernel's direct output: WG0 hands WG1 the rows' output factors and stores its columns without waiting for
// WG1's last P V (ConsumerBase::early_out, sm90/consumer.cuh). 0: both meet first, each computes the factors.
#ifndef SMLA_SM90_EARLY_OUT
#define SMLA_SM90_EARLY_OUT 1
#endif
// The staged direct output written into the stage by stmatrix, four per 64-column block and thread, instead of 16
// 4-byte shared stores (stage_out_cols, sm90/score_tile.cuh). Measured on an H100 (benchmarks/README.md, issue 16,
// twenty-eighth session, two calls of two alternated rounds): WG1's store phase 2,890 instead of ~3,470 cycles, but h=128
// 32K "fast" 4,465.5 / 4,560.4 / 4,522.7 / 4,527.8 us against the tree's 4,535.7 / 4,569.5 / 4,531.4 / 4,570.4 and
// h=64 within the spread: under 1%, and one fp8 kernel spills 4 B with it. 0 (off): 4-byte shared stores.
#ifndef SMLA_SM90_OUT_STSM
#define SMLA_SM90_OUT_STSM 0
#endif
// The staged output's stores (kOutPipe) with each thread's four row addresses (stage and output) taken once for all
// blocks, instead of per store (a 64-bit multiply and the swizzle each): the store phase was ~550 of the ~2,000
// instructions of the pair kernel's epilogue, code a CTA runs once and an H100 fetched cold at every CTA (Nsight
// Compute, thirty-fifth session); with it ~430 fewer. Measured with SMLA_SM90P_ONE_BODY and QTMA_SCAN (same session,
// H100): the pair kernel within the spread of those two alone (h=128 32K fast 4,313-4,636 us, h=64 2,379-2,473 with or
// without stmatrix); the attention suites passed with it (and stmatrix). 0: the addresses per store.
#ifndef SMLA_SM90_OUT_HOIST
#define SMLA_SM90_OUT_HOIST 1
#endif
#ifndef SMLA_SM90_STAGED_OUT
#define SMLA_SM90_STAGED_OUT 1  // direct output rows staged through Q's smem, 16-byte stores
#endif
#ifndef SMLA_SM90_LAZY_MAX
#define SMLA_SM90_LAZY_MAX 1  // the wide kernel's reference max moves only by more than 8 (log2)
#endif
// The bf16 wide kernel without a top-k split as persistent CTAs (sm90/kernel.cuh), off: correct (the attention suite,
// 1,172 tests, on an H100), but slower. Its first form reloaded Q only once both consumer warpgroups had written the
// item's output through Q's region, so an item's epilogue and Q still ran alone (H200, seventh session: h=128 32K fast
// 4976-5047 vs 4743-4752 us; H100, twenty-first session: 3-7% slower in "fast"). This form (twenty-eighth session)
// overlaps the items: WG0 loads the next item's Q once its last S is done, the output goes out from registers
// (store_out_cols_regs), WG0 starts the next item while WG1 finishes this one, and the producers scan the next item
// during this one (ItemScan). On an H100 it is still 2-8% slower ("fast" h=128 32K 4,718.5 / 4,790.2 vs 4,561.5 /
// 4,718.4 us, h=64 6-8%): its trace (tools/trace_attn.py --steps) shows the step across an item boundary at ~14,400
// cycles instead of ~3,900, its last tile's copies landing in ~3,100 instead of ~600, and the steady tile ~4,000
// instead of ~3,650. With uniform items and a static order all 132 CTAs reach their boundaries together, so every
// boundary is a burst of Q loads, output stores and first tiles; the one-item kernel's CTAs drift apart after the
// first wave (benchmarks/README.md, issue 16, twenty-eighth session).
#ifndef SMLA_SM90_PERSISTENT
#define SMLA_SM90_PERSISTENT 0
#endif
// The bf16 wide kernel's two head-tile CTAs of a row (h > 64, no top-k split) are launched as a cluster of 2,
// so that they run at the same time in one GPC, behind one L2 partition, where the second CTA's gather of the
// row's K rows finds what the first one's brought in; nothing in the kernel uses the cluster. Measured on an
// H100 (benchmarks/README.md, "Issue 16, nineteenth session"): h=128 "fast" 1.9-2.0% faster over five
// alternated pairs at s_kv 32K and 128K (the 32K spread is as wide); the whole CUDA suite passed with it.
// 0: the CTAs scheduled one by one.
#ifndef SMLA_SM90_BF16_CLUSTER
#define SMLA_SM90_BF16_CLUSTER 1
#endif
// WG0's softmax in the wide kernel (sm90/consumer.cuh, ScoreWarpgroup::softmax_spec): the exponents are taken
// against the reference max the tile will most likely keep (the lazy max) while the row maxima are still being
// reduced, so the maxima's shuffles and the verdict run beside them; a tile that moves the reference (a first
// tile, a jump by more than kLazySlack) takes them again. The scale is applied by the exponent's FFMA (where
// softmax_scale > 0, so that the maximum of the raw scores is the scaled one's, and the thread's maxima are
// within kFoldLimit, sm90/score_tile.cuh), and over a bf16 cache the producers mark a tile whose 64 rows are all valid
// (Bf16Producer, TILE_FLAG), which WG0 then does not mask. H100: 1.7% faster at h = 128 "fast", 2.7% at h = 64
// "high", the rest equal (benchmarks/README.md, issue 16, twenty-third session). 0: the softmax as it was (mask
// and scale, maxima, then the exponents).
#ifndef SMLA_SM90_SPEC_SOFTMAX
#define SMLA_SM90_SPEC_SOFTMAX 1
#endif
// The first SMLA_SM90_QREG k-steps of S (Q's dims 0 .. 16 SMLA_SM90_QREG - 1) in the wide bf16 kernel's "fast"
// variant take their A operand from WG0's registers (loaded once per CTA), so that S reads less of shared memory,
// which it shares with the K copies; WG0 takes the 4 registers a k-step needs from the producers' budget (WgRegs).
// 0: Q from smem.
#ifndef SMLA_SM90_QREG
#define SMLA_SM90_QREG 0
#endif
constexpr int kQRegSteps = SMLA_SM90_QREG;
static_assert(kQRegSteps >= 0 && kQRegSteps <= 12 && kQRegSteps % 2 == 0, "SMLA_SM90_QREG: 0..12, even");
// The rule: S's k-steps with Q from registers in a kernel variant (the fp8 kernel's budget has no room, and "high"
// measured slower with them).
constexpr int q_reg_steps(bool fp8, bool fast) { return !fp8 && fast ? kQRegSteps : 0; }
constexpr bool kBf16Cluster = SMLA_SM90_BF16_CLUSTER != 0;
constexpr bool kSpeculate = SMLA_SM90_SPECULATE != 0, kStagedOut = SMLA_SM90_STAGED_OUT != 0;
constexpr bool kConsumerScan = SMLA_SM90_CONSUMER_SCAN != 0;
constexpr bool kOutPipe = SMLA_SM90_OUT_PIPE != 0;
constexpr bool kOutHoist = SMLA_SM90_OUT_HOIST != 0;
constexpr bool kEarlyOut = SMLA_SM90_EARLY_OUT != 0;
constexpr bool kOutStsm = SMLA_SM90_OUT_STSM != 0;
constexpr bool kLazyMax = SMLA_SM90_LAZY_MAX != 0, kPersistent = SMLA_SM90_PERSISTENT != 0;
static_assert(!kLazyMax || kStagedOut, "the lazy max writes max_logits from the true max (finish_half_direct)");
constexpr bool kSpecSoftmax = SMLA_SM90_SPEC_SOFTMAX != 0 && kLazyMax;  // it speculates on the lazy max

// The CTAs' starts spread out (profiling builds only; an experiment): SMLA_ATTN_STAGGER_NS (run.attn_stagger_ns): in
// a grid of at least 4 waves of one CTA per SM, CTA b < the SMs of the bf16 wide and pair kernels waits b / SMs of that
// many ns before it starts, so that the SMs' CTA boundaries (Q loads, index loads, output stores) start spread over
// time instead of in one burst; SMLA_ATTN_JITTER_NS (run.attn_jitter_ns): every CTA of such a grid waits a
// pseudo-random part of that many ns (a hash of b), so that waves which fall back into step are pulled apart again at
// each start. The thirty-third session's mid-run traces (benchmarks/README.md, issue 16) found the pair kernel's CTAs
// starting in step (16 CTAs of one wave within 0.1 us, the wide kernel's within 1.8 us) and its prologue ~20,000
// cycles long; the first-wave spread as a compile-time switch (40 or 80 us) measured no faster (pair kernel 1-2%
// slower, wide kernel within the spread). Whether the spread lasts is what tools/trace_attn.py --stagger-ns /
// --jitter-ns measure (its whole-grid start times).
__device__ __forceinline__ void stagger_start(const Args &a)
{
#if defined(SMLA_ATTN_ABLATION)
    const uint64_t spread = a.p.run.attn_stagger_ns, jitter = a.p.run.attn_jitter_ns;
    const uint32_t sms = static_cast<uint32_t>(a.n_sms), b = blockIdx.x;
    if ((spread == 0 && jitter == 0) || sms == 0 || gridDim.x < 4u * sms) return;
    uint64_t d = b < sms ? spread * b / sms : 0;
    if (jitter > 0) d += ((b * 2654435761u) >> 8) % jitter;  // Knuth's multiplicative hash of b
    const uint64_t t0 = globaltimer();
    while (globaltimer() - t0 < d) __nanosleep(256);
#else
    (void)a;
#endif
}

constexpr int kHT = 64, kBN = 64;              // heads per CTA, tokens per K tile
constexpr int kThreads = 384;                  // WG0, WG1: consumers; WG2: producer
constexpr int kMaskWords = 32, kMaskTiles = 32 * kMaskWords;  // the non-empty tile mask (CtaCommon); tiles
                                                              // past kMaskTiles always run
constexpr int kBlk = 64 * 128;                 // one column block: 64 rows x 128 B
constexpr int kTileBytes = 9 * kBlk;           // 73,728 B: Q or one K buffer
static_assert(kDqk == 36 * 16, "S is written as 36 k-steps of 16 dims (kSChains chains, score_tile.cuh)");
static_assert(kRowChunks == 9 * 8, "a row is 9 column blocks of 8 chunks");
// Registers per thread after setmaxnreg: WG0 holds half of O (128), S with its second chain (64) and P
// in registers; WG1 only its half of O. setmaxnreg.inc only takes what the other warpgroups released
// with .dec (the CTA's pool), so the three must sum to the launch allocation, 3 x 168 (a larger sum
// blocks WG0's .inc forever).
constexpr int kLaunchRegs = 168;  // 64K / 384, rounded down to a multiple of 8
constexpr int kScoreRegs = 224, kValueRegs = 160, kProducerRegs = 120;
static_assert(kScoreRegs + kValueRegs + kProducerRegs <= 3 * kLaunchRegs, "the launch allocation: 64K / 384 -> 168");
// The O columns of WG0 in the bf16 wide kernel (the fp8 one: always 256): 128, the default, or 256 (the
// even split it replaced). With 128 WG0 holds 64 accumulator registers instead of 128 and its P V, on the
// critical path of every tile, is half as long; WG1, idle half of its time with 256, takes the other 384.
// Measured on the H200 (benchmarks/README.md, "Issue 16, eighth session"): h=128 32K "fast" 4369-4530
// against 4710-4764 us, the whole CUDA suite passing.
#ifndef SMLA_SM90_SPLIT
#define SMLA_SM90_SPLIT 128
#endif
constexpr int kSplit = SMLA_SM90_SPLIT;
static_assert(kSplit == 256 || kSplit == 128, "SMLA_SM90_SPLIT: WG0 takes 256 or 128 of O's 512 columns");
// setmaxnreg budgets of the three warpgroups for a split (their sum is the launch allocation, as above).
// QR: WG0's k-steps with Q in registers (q_reg_steps), 4 registers each, taken from the producers.
template <int SPLIT, int QR = 0>
struct WgRegs {
    static_assert(QR == 0 || SPLIT == 128, "Q in registers: the 128-column split's budget");
    static constexpr int score = SPLIT == 256 ? kScoreRegs : 176 + 4 * QR;
    static constexpr int value = SPLIT == 256 ? kValueRegs : 224;
    static constexpr int producer = SPLIT == 256 ? kProducerRegs : 104 - 4 * QR;
    static_assert(score + value + producer <= 3 * kLaunchRegs && score % 8 == 0 && value % 8 == 0 &&
                      producer % 8 == 0,
                  "setmaxnreg: multiples of 8 within the launch allocation");
};
// setmaxnreg to N registers from the launch allocation: .inc above it, .dec below (ptxas rejects a .dec
// that would raise the count).
template <int N>
__device__ __forceinline__ void setmaxnreg_to()
{
    if constexpr (N > kLaunchRegs) setmaxnreg_inc<N>();
    else setmaxnreg_dec<N>();
}
// Named barriers of the 256 consumer threads: P of K buffer b ready (kBarP + b: WG0 arrives, WG1 waits;
// one per buffer, so WG0 can never arrive twice on one before WG1 waited: its next arrival there needs
// the buffer back), P_lo free (WG1 arrives, WG0 waits; high precision only), the epilogue's row
// statistics, Q landed; bf16: the producers' tile scan done (all 384 threads); each warpgroup's staged
// output written (kBarOut + warpgroup, 128 threads); the persistent kernel's producer warpgroup (128) and its
// consumers' meeting across items (kBarItem: WG1 has read the rows' factors, or statistics, and is done with P_lo
// before WG0 writes the next item's).
constexpr int kBarP = 1, kBarFree = 3, kBarL = 4, kBarQ = 5, kBarStart = 6, kBarOut = 7, kBarProd = 9, kBarItem = 10;

struct Smem {
    static constexpr Region q = first_region(kTileBytes);
    static constexpr Region k = region_after(q, 2 * kTileBytes);    // two K buffers
    static constexpr Region plo = region_after(k, kBlk);            // P_lo [64 heads x 64 tokens] bf16
    static constexpr Region bar = region_after(plo, 64);            // mbarriers: full[2], empty[2], rr[2], q (TMA)
    static constexpr Region valid = region_after(bar, 2 * kBN * 4);  // int [2][64]: row valid, per K buffer
    static constexpr Region alpha = region_after(valid, 2 * kHT * 4);  // float [2][64]: O's rescale, per K buffer
    static constexpr Region row_l = region_after(alpha, kHT * 8);       // double [64]: final row sums (epilogue)
    static constexpr Region row_m = region_after(row_l, kHT * 4);       // float [64]: final row maxima (epilogue)
    static constexpr Region mask = region_after(row_m, kMaskWords * 4);  // bf16: the non-empty tiles
    // bf16 with kSpecSoftmax: uint8 [2][4], byte w of buffer b: producer warp w's rows of the tile all valid
    static constexpr Region full_tile = region_after(mask, 8);
    // kPersistent: mbarriers q_full, scan_full[2], nt_free[2] and int nt[2] (sm90/kernel.cuh)
    static constexpr Region pers = region_after(full_tile, kPersistent ? 48 : 0);
    static constexpr int used = pers.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && k.off % 1024 == 0 && plo.off % 1024 == 0, "swizzled tiles");
    static_assert(bar.off % 8 == 0 && row_l.off % 8 == 0 && pers.off % 8 == 0, "mbarriers and row sums are 8-byte");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

// The full-tile flags (Smem::full_tile; kSpecSoftmax, the bf16 wide kernel): producer warp w of 4 sets byte w
// of K buffer b's word to whether its 16 rows of the tile are all valid; the tile is full when all four are.
__device__ __forceinline__ void set_full_rows(uint8_t *smem, int b, int w, bool full)
{
    smem[Smem::full_tile.off + 4 * b + w] = full ? 1 : 0;
}
__device__ __forceinline__ bool tile_full(const uint8_t *smem, int b)
{
    return *reinterpret_cast<const int *>(smem + Smem::full_tile.off + 4 * b) == 0x01010101;
}

__device__ __forceinline__ uint32_t blk_addr(uint32_t base, int row, int chunk)
{
    return base + static_cast<uint32_t>((chunk >> 3) * kBlk + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// What every sm90 CTA knows and the producers (sm90/producer.cuh) read, the same in both kernels: its
// place (query row `row` = (bi, si), top-k split sp; the row's indices, top-k length L and its nt tiles
// from j0), the 1024-byte aligned shared-memory base (the swizzled tiles need it) and the regions both
// kernels have: Q, the two K buffers, the mbarriers full[2], empty[2] and, in cluster kernels, rr[2]
// (bar_*[b] at + 8 b) and the row-valid flags of each K buffer.
// Empty tiles (the bf16 kernels, scan_tiles in producer.cuh): nt is then the count of the slice's
// tiles that hold a valid index, the it-th of them the slice tile next_tile() walks to, and nt_all the
// slice's tile count; otherwise tile_mask is null and the it-th tile is tile it.

struct CtaCommon {
    uint32_t base;
    uint8_t *smem;
    int tid, lane;
    int sp;
    int64_t row, bi, si;
    int h;
    const int32_t *idx_row;
    int L, j0, nt, nt_all;
    const uint32_t *tile_mask = nullptr;
    uint32_t sQ, sK, bar_full, bar_empty, bar_rr;
    int *sValid;

    // The first slice tile from t on that runs (nt_all: none).
    __device__ __forceinline__ int next_tile(int t) const
    {
        if (!tile_mask) return t < nt_all ? t : nt_all;
        while (t < nt_all) {
            if (t >= kMaskTiles) return t;
            const uint32_t w = tile_mask[t >> 5] >> (t & 31);
            if (w) return t + __ffs(w) - 1;
            t = (t | 31) + 1;
        }
        return nt_all;
    }

    // bn: tokens per K tile (the three-buffer kernel's 48; the others' kBN)
    __device__ __forceinline__ CtaCommon(const Args &a, uint8_t *smem_raw, const GridPos &gp, int q_off, int k_off,
                                         int bar_off, int valid_off, int bn = kBN)
    {
        const uint32_t raw_base = smem_u32(smem_raw);
        base = (raw_base + 1023u) & ~1023u;
        smem = smem_raw + (base - raw_base);
        tid = threadIdx.x;
        lane = tid & 31;
        sp = gp.sp, row = gp.row, bi = gp.bi, si = gp.si;
        h = static_cast<int>(a.p.h);
        const RowSlice slice = row_slice(a, bi, si, sp, bn);
        idx_row = slice.idx;
        L = slice.L, j0 = slice.j0;
        nt = slice.j1 > j0 ? slice.j1 - j0 : 0;
        nt_all = nt;
        sQ = base + q_off;
        sK = base + k_off;
        bar_full = base + bar_off, bar_empty = base + bar_off + 16, bar_rr = base + bar_off + 32;
        sValid = reinterpret_cast<int *>(smem + valid_off);
    }
};

// Q rows h0 .. h0 + ROWS - 1 of the CTA's query row into 9 column blocks of [ROWS x 128 B] at c.sQ, in
// blk_addr's swizzled layout (block size ROWS * 128; ROWS = 64 is blk_addr itself), rows past h zero;
// issued by NT threads (t: this thread's place among them, by default its tid) as one cp.async group (the
// caller waits for it). CH: the chunks of a row it loads (the three-buffer kernel: the latent part's 64).
template <int ROWS, int NT, int CH = kRowChunks>
__device__ __forceinline__ void issue_q(const Args &a, const CtaCommon &c, int h0, int t)
{
    const smla_attn_params &p = a.p;
    const uint64_t pol = policy_evict_first();  // Q is read once: it should not push K rows out of L2
    for (int i = t; i < ROWS * CH; i += NT) {
        const int r = i / CH, ch = i - r * CH;
        const bool ok = h0 + r < c.h;
        const uint16_t *src = ok ? smla_q_at(&p, c.bi, c.si, h0 + r, ch * 8) : p.q;  // q or q_pe
        const uint32_t dst = c.sQ + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
        cp_async16_hint(dst, src, ok ? 16 : 0, pol);
    }
    cp_async_commit();
}
template <int ROWS, int NT>
__device__ __forceinline__ void issue_q(const Args &a, const CtaCommon &c, int h0)
{
    issue_q<ROWS, NT>(a, c, h0, c.tid);
}

// The same tile by TMA (a.q_tma; one thread): NB (9) boxes of [64 values x 64 heads] of query row (bi, si) from
// q_map (and block 8 from qpe_map where q_pe is given) to sQ, which the tensor map's 128-byte swizzle lays out as
// issue_q does (heads past h read as zeros), completing NB x 8 KB on the mbarrier bar (NB = 8: the latent part
// only, the three-buffer kernel's). Not inlined: it runs in one thread once, and inlined it made ptxas spill in
// the fused "high" kernel.
template <int NB = kDqk / 64>
static __device__ __noinline__ void tma_q(const Args &a, uint32_t sQ, int h0, int si, int bi, uint32_t bar)
{
    const uint64_t pol = policy_evict_first();
    mbar_arrive_expect_tx(bar, NB * kBlk);
#pragma unroll 1
    for (int j = 0; j < NB; ++j) {
        const bool pe = a.p.q_pe && j == kDv / 64;
        tma_load_4d(sQ + j * kBlk, pe ? &a.qpe_map : &a.q_map, pe ? 0 : 64 * j, h0, si, bi, bar, pol);
    }
}

// One CTA of the wide kernel: CtaCommon with heads [h0, h0 + 64) and its own regions. XO: the CTA is one
// of a cluster of two (the two head tiles of a row; sm90/producer.cuh), its head tile the cluster rank.
template <bool XO>
struct Cta : CtaCommon {
    int ht, h0;
    uint32_t sPlo;
    float *sAlpha, *sM;
    double *sL;

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw) : Cta(a, smem_raw, place(a)) {}
    // The CTA's share for work item gp (a persistent CTA takes several, sm90/kernel.cuh).
    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw, const GridPos &gp)
        : CtaCommon(a, smem_raw, gp, Smem::q.off, Smem::k.off, Smem::bar.off, Smem::valid.off)
    {
        ht = gp.ht;
        h0 = ht * kHT;
        sPlo = base + Smem::plo.off;
        sAlpha = reinterpret_cast<float *>(smem + Smem::alpha.off);
        sL = reinterpret_cast<double *>(smem + Smem::row_l.off);
        sM = reinterpret_cast<float *>(smem + Smem::row_m.off);
    }

  private:
    // XO: blockIdx.x = (row * n_splits + split) * 2 + head tile; head tile = cluster rank
    __device__ __forceinline__ static GridPos place(const Args &a)
    {
        if constexpr (!XO) {
            return grid_pos(a);
        } else {
            GridPos g;
            int64_t bx = blockIdx.x;
            g.ht = static_cast<int>(bx & 1);
            bx >>= 1;
            g.sp = static_cast<int>(bx % a.n_splits);
            g.row = bx / a.n_splits;
            g.bi = g.row / a.p.s_q, g.si = g.row % a.p.s_q;
            return g;
        }
    }
};

}  // namespace sm90
}  // namespace attn
