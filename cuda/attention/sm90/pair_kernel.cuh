// Hopper (sm_90a) sparse MLA kernel over a bf16 K source (prefill's kv, a bf16 cache) for head tiles of
// 64, with the two consumer warpgroups on alternate K tiles ("pair" kernel, family sm90p). Semantics,
// outputs and split partials are those of the other kernels (sm80/kernel.cuh).
//
// Why: in the wide kernel (sm90/kernel.cuh) one warpgroup computes every tile's S and softmax, so the
// tensor cores wait for it. Here each consumer warpgroup computes S and the softmax of its own tile of
// a pair (WG0 the even tiles, in K buffer 0; WG1 the odd ones, buffer 1) and each owns half of O
// (WG0 columns 0..255, WG1 256..511), so each multiplies its own P (from registers, "local") with its
// half of V and the peer's P (through shared memory, "remote") with the same half of the peer's tile:
// one warpgroup's softmax runs while the other's products occupy the tensor cores (FlashMLA's sm90
// prefill schedule; this is our own implementation of it).
//
// CTA = one query row x 64 heads x one top-k split, 384 threads:
//   WG0, WG1 (setmaxnreg kConsumerRegs): the consumers (PairConsumer<0>, PairConsumer<1>);
//   WG2 (setmaxnreg kProducerRegs): the producer, cp.async into the K buffers, no register staging; its four
//     warps fill every region together, in the order the consumers first read them (PairProducer).
// Shared-memory plan (Smem): Q and two K buffers of 9 column blocks [64 tokens x 128 B] (128-byte
// swizzle as plan.cuh), one P_lo block ("high"), mbarriers, row flags, the max exchange and the
// non-empty tile mask. (Q's RoPE part in registers instead, as the A operand of S's last 4 k-steps,
// freed a block but cost 16 registers, and at 232 ptxas serialised every wgmma: C7512.)
//
// Each K buffer is two regions with their own full / empty mbarriers, so the part freed first is
// reloaded first: the early region is what its owner's local P V reads (buffer 0: blocks 0..3 = V
// columns 0..255; buffer 1: blocks 4..7 = V columns 256..511), freed by the owner once that product
// is done; the late region is the rest (buffer 0: blocks 4..8, buffer 1: blocks 0..3 and 8), freed by
// the peer after its remote product. The RoPE block (8) is dead once S is done and carries the owner's
// P_hi to the peer (it is in the late region, which the peer frees). "high": WG1's P_lo goes through the
// P_lo block, WG0's through block 0 of buffer 0 once WG0's local product is done (so WG1 frees buffer
// 0's early region then, after its remote product). "fast" has no P_lo: WG1's P goes through the P_lo
// block and buffer 1's RoPE block joins its early region (20 of S's 36 k-steps, freed by WG1 after its
// local product), so WG1's next S waits only for blocks 0..3.
// Each warpgroup's first S chain reads only its early region (the k-step order of kstep()).
// SMLA_SM90P_PARTS (below, 4 by default): in "fast", each region freed and reloaded in 4 (or 2) parts of its V rows.
//
// Per pair of tiles (t0 in buffer 0, t1 in buffer 1; an odd count's last t1 is a tile of zeros with no
// valid row):
//   WG0: mask S0, tile max -> m0 = max(m, mx0) published (kBarM0); P0 = 2^(S0 - m0), O *= 2^(m - m0),
//        O += P0 V0[:, :256] (local, registers); waits for WG1's m1 = max(m0, mx1) (kBarM1); once the
//        local product is done frees the early region ("fast"), rescales P0 and O by 2^(m0 - m1) and
//        stores P0 for WG1 (kBarP0); waits for P1 (kBarP1), O += P1 V1[:, :256] (remote), issues the
//        next pair's first S chain, frees buffer 1's late region when the remote product is done.
//   WG1: mask S1, tile max; waits for m0, publishes m1; P1 = 2^(S1 - m1), O *= 2^(m - m1), O += P1
//        V1[:, 256:] (local) issued, P1 stored for WG0 (kBarP1); waits for P0, O += P0 V0[:, 256:]
//        (remote); frees its early region once the local product is done, buffer 0's late region (and,
//        in "high", its early one, which carried WG0's P_lo) once the remote one is, and only then
//        waits for its next early region: queueing that wait before the frees made WG0 wait for two
//        reloads in a row (issue 16, sixteenth session: 5654-5672 -> 5261-5297 us fast, h=128 32K).
//   Both keep m equal after every pair; each keeps the row sums of its own tiles (scaled alike), added
//   in the epilogue.
// Empty tiles cost nothing: before loading, the producer marks the CTA's tiles that hold any valid
// index (scan_tiles, producer.cuh); only those are loaded and paired.
// S is kSChains chains summed in fp32 (the accuracy rule of sm90/score_tile.cuh); row sums in
// double; overflowed scores saturate (attention/softmax.cuh). FAST: precision="fast" (P one bf16
// term); otherwise P = P_hi + P_lo, two products per k-step.
// ABL (profiling builds only, sm90/kernel.cuh's bits): 1 no K loads (zeros), 2 no S wgmma, 4 no P V
// wgmma, 16 no P_lo V wgmma. Results are wrong then.
#pragma once

#include "attention/epilogue.cuh"
#include "attention/table.cuh"
#include "attention/sm90/plan.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/score_tile.cuh"
#include "attention/sm90/trace.cuh"
#include "attention/sm90/variants.cuh"

// SMLA_SM90P_QTMA_SCAN (default 1): the wide kernel's prologue for the pair kernel. Q comes by TMA from one thread
// (where the launcher described q) instead of the consumers' 256 cp.async, and the 256 consumer threads scan the tiles
// (scan_tiles_vec) instead of all 384 threads after Q's copies. Measured no faster in the thirty-second session (H100,
// h=128 32K fast 5,257 / 5,322 us against 5,255 / 5,257), when the kernel's boundary was bound by instruction fetch
// (SMLA_SM90P_ONE_BODY below); with ONE_BODY, 4,513 / 4,316 against 4,668 / 4,395 us (h=64 equal; thirty-fifth
// session, call 2). On since then (the attention suites passed with it, same session). 0: Q by the consumers'
// cp.async, the tiles scanned by all threads after them.
#ifndef SMLA_SM90P_QTMA_SCAN
#define SMLA_SM90P_QTMA_SCAN 1
#endif
// SMLA_SM90P_SPECULATE (default 0, only with SMLA_SM90P_QTMA_SCAN): the wide kernel's speculated tile 0 for the pair
// kernel: 1 in "fast" only, 2 in both variants, 0 in neither. While the consumers scan, the producer copies slice tile 0
// into K buffer 0 (both regions) and writes its row flags; after the scan it keeps them where tile 0 runs (it arrives on
// the two full barriers, which then complete once the whole tile landed), else lets them land and copies as without.
// Measured with QTMA_SCAN (thirty-second session): correct (713 sm90p tests), no faster (5,290 / 5,375 us); again with
// ONE_BODY and the lazy maximum (thirty-sixth session, H100, calls 3 and 8): within the spread (h=128 32K fast
// 4,512-4,568 against 4,526-4,622 us), and copying both tiles of the first pair during the scan 1.5-3% slower
// (4,509-4,622 against 4,416-4,478; code in d6d2fd1); with the lean producer and 4 parts (thirty-ninth session, H100,
// call 6) 4,429 / 4,048 us against 4,364 / 4,390. By Nsight Compute's kernel durations (fortieth session, H100, six
// launches a tree, +-0.3%; benchmarks/README.md), on a tree that also had block_size's divisor from the launcher:
// "fast" 0.9% faster at h = 128 and 64, 32K (3.99-4.00 against 4.03-4.04 ms; 2.13 against 2.15), level at h = 128 8K,
// and 0.6-0.7% faster on the causal fresh prompt (tools/ab_prefill.py); "high" 0.9-1.6% slower (5.40 against
// 5.32-5.33 ms at h = 128 32K). On this tree (without that divisor) "fast" with 1 is not measured yet: the tree's own
// "fast" ran 3.98-4.00 ms there, as fast as that tree with speculation, and any change re-schedules the kernel (±1-3%).
// Against this tree (forty-first session, H100, Nsight Compute's durations, six launches): "fast" h=128 32K 3.97-3.98 ms
// against 3.97-3.99, level. So 0.
#ifndef SMLA_SM90P_SPECULATE
#define SMLA_SM90P_SPECULATE 0
#endif

// SMLA_SM90P_ONE_BODY (default 1): every pair, the last included, runs the loop's one copy of the pair's code, which
// returns early where there is no next pair (the caller's loop then ends), instead of the last pair being its own
// instantiation (NEXT = false). Why: the kernel ran ~7,700 distinct instructions (~120 KB; the wide kernel ~4,400) and
// 13.7% of its warps' stall samples were "no instruction" (instruction cache misses; the wide kernel's 1.9%):
// Nsight Compute on an H100, thirty-fifth session, tools/sass_regions.py. The last pair's copy (~600-700 instructions
// a warpgroup) ran once per CTA, fetched cold each time, beside the epilogue (~2,000) and the prologue. Measured
// (same session, H100, tools/gpu_variants.sh): h=128 32K fast 4,411 / 4,553 us against 5,208 / 5,244, h=64 2,447 /
// 2,375 against 2,889 / 2,884 (15-17% faster); with QTMA_SCAN and SMLA_SM90_OUT_HOIST "high" 6,101 / 3,121 against
// 6,881 / 3,659. "No instruction" then 3.4% of the samples. (A run-time branch around the next pair's S chain instead
// made ptxas serialise every wgmma, C7518; the early return does not.) "high" spilled 4 B with it until the lazy
// maximum below (none since). 0: the last pair as its own instantiation.
#ifndef SMLA_SM90P_ONE_BODY
#define SMLA_SM90P_ONE_BODY 1
#endif

// SMLA_SM90P_LAZY_MAX (default 1): the lazy maximum of the wide kernel (sm90/score_tile.cuh, move_ref_max) for the
// pair kernel. The maximum both warpgroups agree on per pair moves only where a tile's maximum exceeds it by more than
// kLazySlack (log2 units, attention/softmax.cuh), so P <= 2^8 and WG0's two rescales of O and its P's rescale (and
// WG1's rescale of O) are skipped by their warp votes in most pairs (with the exact maximum they ran in most pairs:
// the maximum of a row creeps up in ~1 of t tiles, and a warp holds 16 rows). Each warpgroup keeps the true maximum of
// its own tiles beside it for max_logits (added in the epilogue) in shared memory, one load and store a tile by each
// quad's lead (in registers "high" spilled 16 B, and measured no faster). Measured (H100, thirty-sixth session, calls
// 1 and 3, tools/gpu_variants.sh): h=128 32K "fast" 4,509 / 4,572 us against 4,720 / 4,833, h=64 2,352-2,365 against
// 2,444-2,481; "high" within the spread. 0: the running maximum itself.
#ifndef SMLA_SM90P_LAZY_MAX
#define SMLA_SM90P_LAZY_MAX 1
#endif
// SMLA_SM90P_CLUSTER (default 1): with two head tiles and no top-k split, a row's two CTAs launched as a cluster of 2
// (the wide kernel's SMLA_SM90_BF16_CLUSTER, plan.cuh: side by side in one GPC, for the L2; nothing in the kernel uses
// the cluster). Measured (H100, thirty-sixth session, call 4, four alternated rounds): h=128 32K "fast" 4,386-4,447
// us against 4,470-4,542, with SMLA_SM90P_OUT_STSM 4,330-4,345 against 4,424-4,487; "high" and h=64 within the spread.
// 0: the CTAs scheduled one by one.
#ifndef SMLA_SM90P_CLUSTER
#define SMLA_SM90P_CLUSTER 1
#endif
// SMLA_SM90P_OUT_STSM (default 1): the staged output by stmatrix in the pair kernel's "fast" variant only
// (SMLA_SM90_OUT_STSM, plan.cuh, is every staging kernel's, and an fp8 wide kernel spills with it). Measured (same
// call): h=64 32K "fast" 2,238-2,279 us against 2,301-2,472 (h=128 4,424-4,487 against 4,470-4,542); in "high" 1-3%
// slower (h=64 3,062-3,136 against 2,992-3,040), so "high" keeps the 4-byte shared stores. 0: those in both.
#ifndef SMLA_SM90P_OUT_STSM
#define SMLA_SM90P_OUT_STSM 1
#endif

// SMLA_SM90P_PARTS (default 4; 1 and 2 kept for comparison): in "fast", each K region
// comes back in 2 or 4 parts. A product over a region's V blocks (the local or the remote P V) is that many commit
// groups (4: one a k-step of 16 tokens, V rows 16 q .. 16 q + 15; 2: two k-steps each), and its warpgroup frees part
// q (those rows of the region's V blocks) as group q completes, the region's other block (8: RoPE, P0's carrier) with
// the last; the producer's thread (g, cl) holds rows 16 i + g, so it reloads its rows of part q once part q is free.
// So a region's copies start while the product that frees it still runs, where they start after it now (the
// consumers' waits for K regions, ~1,100-1,850 cycles a pair each, are waits for that chain, not for L2: issue 16,
// thirty-seventh session, the ablation without L2 reads). "high" keeps whole regions (its buffer 0 early region
// carries WG0's P_lo). Status: 4 parts with WG1's two products pending as 8 wgmma groups hung the sm90p prefill tests
// on an H100 (same session, call 4; code in 94a2552); wgmma.wait_group takes 0..7, so at most 7 are pending now
// (WG1's remote product as 3 groups); 2 parts keep at most 4. Measured on an H200 (issue 16, thirty-ninth session
// in benchmarks/README.md: tools/gpu_variants.sh, three alternated rounds of h=128 / h=64 32K "fast"), with the lean
// producer: 4 parts 3,899 / 3,896 / 4,224 us against 1 part 3,944-4,141 (h=64 2,268-2,278 against 2,215-2,293), 2
// parts 3,949-4,358; first check (the full-GPU case included), the sm90p prefill tests, memcheck and racecheck (only
// the exchange of maxima's known reports, docs/design.md) passed. With 1 the pair kernel's device code is the one
// before the switch but for two back-to-back mbarrier arrivals of WG1 in "high" in the other order (cuobjdump). 1 part
// against 4 on this tree (forty-first session, H100, Nsight Compute, six launches): "fast" h=128 32K 4.01-4.02 ms against
// 3.97-3.99 (the fortieth session's 0.2-0.8% the other way was on a tree with another schedule).
#ifndef SMLA_SM90P_PARTS
#define SMLA_SM90P_PARTS 4
#endif
// SMLA_SM90P_LEAN_PRODUCER (default 1; 0 the producer before it): the producer's copies in one form per launch and its
// row addresses without a division. As it was, each 16-byte copy is two predicated instructions (with and without the
// L2 policy: ProducerLane::copy16 tests Args::evict_last at run time) and each row's cache block a 32-bit division by
// block_size (~20 instructions a row, 8 rows a pair); the producer issued ~730 instructions a pair, beside the
// consumers' ~690 and ~630 on the same schedulers (Nsight Compute, issue 16, thirty-seventh session), and its loop is
// a third of the loops' code (the kernel was bound by instruction fetch before SMLA_SM90P_ONE_BODY). With it the
// producer's loop is instantiated once per form (a launch runs one), the division is a multiply-shift whose
// divisor the producer makes during the tile scan, and an invalid row's address needs no branch (KvSource::row): the
// loop's code 710 -> 440 instructions (cuobjdump, "fast"). Measured on an H200 (issue 16, thirty-ninth session in
// benchmarks/README.md, three alternated rounds): h=128 32K "fast" 4,107 / 3,982 / 4,141 us against 4,426 / 4,291 /
// 4,069, h=64 2,250 / 2,293 / 2,274 against 2,326 / 2,299 / 2,297; the sm90p prefill tests passed.
#ifndef SMLA_SM90P_LEAN_PRODUCER
#define SMLA_SM90P_LEAN_PRODUCER 1
#endif
// SMLA_SM90P_PREFETCH_NEXT (default 0: off; an experiment): N > 0: N pairs before its last, the producer's first warp
// asks L2 for the Q rows and the index row of the CTA one wave later (blockIdx.x + Args::n_sms), so that its prologue
// reads them from L2 rather than DRAM. Why: the pair kernel's CTAs run in step (thirty-fourth session's grid traces),
// so each wave boundary reads every SM's Q (132 x 72 KB) and writes its output at once; with every index -1 (nothing
// but Q in and the output out) a wave takes 7.0 us at ~2.6 TB/s (thirty-seventh session), about the fixed cost per CTA
// that the pair kernel has beyond FlashMLA's. (Written in the thirty-fourth session, removed unrun when that
// session's boundary was bound by instruction fetch; here again after SMLA_SM90P_ONE_BODY fixed that.) Measured
// (thirty-ninth session, benchmarks/README.md): N = 3 no faster on an H200 (4,323 / 4,286 us against 4,259, h=128 32K
// fast) and 3-7% slower with the lean producer and 4 parts on an H100 (4,487 / 4,627 against 4,364 / 4,390).
#ifndef SMLA_SM90P_PREFETCH_NEXT
#define SMLA_SM90P_PREFETCH_NEXT 0
#endif
// SMLA_SM90P_PERSISTENT (default 1; 0 compiles it out): without a top-k split and with Q by TMA, the pair kernel as
// persistent CTAs, at most one per SM (clusters of 2 with two head tiles), CTA j taking work items j, j + gridDim.x, ..
// (an item is what one CTA of attn_sm90p_kernel does), the K ring running on across items, so that an item's
// boundary overlaps its neighbours' work: the producer scans item k + 1 and issues its Q (once both consumer
// warpgroups' last S of item k is done: Q is read by S alone) and its first regions while the consumers run item k's
// last pair and epilogue; the output goes out from registers (store_out_cols_regs), not through Q's region. Why: the
// boundary is ~15% of a CTA (~10,000 cycles of prologue, ~7,000 of epilogue, Nsight Compute, fortieth session) against
// FlashMLA's ~5% (attn_sm90p_persistent_kernel below). Where it runs is decided per call (persistent_here): the call's
// SMLA_ATTN_PERSISTENT (smla_run.attn_persistent): auto (default) where it measured faster, off never, on wherever
// it can run. Measured (H200, Nsight Compute's durations, forty-second session, benchmarks/README.md): "fast" h=128
// 8K 3.71 ms against 3.78 (-1.9%), 32K 3.90-3.92 against 3.87-3.88 (+0.8%), 128K 4.20 against 4.14 (+1.4%), h=64
// 32K level (2.03-2.06 against 2.02-2.03); "high" h=128 8K 4.89 against 5.00 (-2.2%), 32K 5.18 against 5.28 (-1.8%),
// 128K level (5.48-5.49 against 5.47-5.48), h=64 32K 2.67 against 2.72 (-1.8%); in one process (tools/ab_prefill.py)
// the causal fresh prompt (2,048 tokens) 6.3% faster at h=128 and 4% at h=64 (causal / full 0.548 against 0.558 at
// h=128). The forty-first session's H100 figures agree. So auto: "high" always, "fast" where the K source (the
// cache's slots, 1,152 B a row) fits in half of the device's L2 (8K tokens: 9.4 MB; 32K: 37.7 MB against the
// H200's 50 MB). Where "fast" loses (Nsight Compute's stall samples, forty-first session): the boundary's time is
// gone but the consumers' waits for K regions grow by as much (WG1's early region 6.0% of the samples against 2.7%):
// with the K source out of L2 the gather, not the boundary, sets the pace.
#ifndef SMLA_SM90P_PERSISTENT
#define SMLA_SM90P_PERSISTENT 1
#endif
// SMLA_SM90P_FLAG_BYTES (default 0: not yet run on a GPU): a K buffer's 64 row flags as bytes placed so that a
// consumer thread's 16 columns are 16 consecutive bytes and a flag writer's 4 rows 4 (flag_pos): a consumer thread
// loads its flags by one 16-byte load instead of 16 4-byte ones, a writer stores one word instead of 4 ints. Why:
// Nsight Compute (issue 16, forty-fifth session, H100, h=64 32K "fast") counted 11.8 M shared-load instructions of ours
// against FlashMLA's 4.75 M (33.3 M wavefronts against 18.0 M), ~180 a pair against ~72, most of them the 16 flag
// loads of each consumer warp and tile; shared memory is the kernel's busiest pipe. (A 64-bit word from the producer
// warps' ballots instead spilled the producer's 56 registers.) 0: the ints.
#ifndef SMLA_SM90P_FLAG_BYTES
#define SMLA_SM90P_FLAG_BYTES 0
#endif
static_assert(SMLA_SM90P_PARTS == 1 || SMLA_SM90P_PARTS == 2 || SMLA_SM90P_PARTS == 4, "SMLA_SM90P_PARTS: 1, 2 or 4");

namespace attn {
namespace sm90 {
namespace pair {

constexpr bool kQTmaScan = SMLA_SM90P_QTMA_SCAN != 0;
static_assert(SMLA_SM90P_SPECULATE == 0 || SMLA_SM90P_QTMA_SCAN != 0,
              "SMLA_SM90P_SPECULATE copies tile 0 while the consumers scan: it needs SMLA_SM90P_QTMA_SCAN");
static_assert(SMLA_SM90P_SPECULATE >= 0 && SMLA_SM90P_SPECULATE <= 2, "SMLA_SM90P_SPECULATE: 0, 1 (fast) or 2");
// Whether a variant speculates (SMLA_SM90P_SPECULATE).
constexpr bool speculates(bool fast) { return SMLA_SM90P_SPECULATE == 2 || (SMLA_SM90P_SPECULATE == 1 && fast); }
constexpr bool kOneBody = SMLA_SM90P_ONE_BODY != 0;
constexpr bool kLazy = SMLA_SM90P_LAZY_MAX != 0;
constexpr bool kCluster = SMLA_SM90P_CLUSTER != 0;
// The staged output's stores (stage_out_cols, score_tile.cuh) of a variant: stmatrix in "fast" (SMLA_SM90P_OUT_STSM)
constexpr bool out_stsm(bool fast) { return (SMLA_SM90P_OUT_STSM != 0 && fast) || kOutStsm; }
// The parts a K region is freed and reloaded in (SMLA_SM90P_PARTS): in "fast", else 1; kSplit: any variant has parts.
constexpr bool kSplit = SMLA_SM90P_PARTS > 1;
constexpr int kEmptyBars = kSplit ? 16 : 4;  // empty[b][r] (kSplit: [b][r][q], 4 parts whether 2 or 4 are used)
constexpr int parts(bool fast) { return fast ? SMLA_SM90P_PARTS : 1; }
constexpr bool kLeanProducer = SMLA_SM90P_LEAN_PRODUCER != 0;
constexpr bool kPersistent = SMLA_SM90P_PERSISTENT != 0;
constexpr bool kFlagBytes = SMLA_SM90P_FLAG_BYTES != 0;
// kFlagBytes: the byte of row r = 16 i + g of a K tile among its buffer's 64 flag bytes. The producer's flag writer g
// holds rows 16 i + g (i = 0..3), all columns of consumer thread t4 = (g >> 1) & 3 (column 8 jn + 2 t4 + e is row
// 16 (jn >> 1) + g with g = 8 (jn & 1) + 2 t4 + e): thread t4's 16 bytes from 16 t4, in them writer g's 4 at
// 4 ((g & 1) + 2 (g >> 3)), row i at + i.
constexpr int flag_word(int g) { return 4 * ((g >> 1) & 3) + (g & 1) + 2 * (g >> 3); }
constexpr int flag_pos(int r) { return 4 * flag_word(r & 15) + (r >> 4); }
// flag_pos is a permutation of 0..63 that puts consumer thread t4's column 8 jn + 2 t4 + e where mask_scores reads it.
constexpr bool flag_pos_ok()
{
    bool seen[64] = {};
    for (int r = 0; r < 64; ++r) {
        const int p = flag_pos(r);
        if (p < 0 || p > 63 || seen[p]) return false;
        seen[p] = true;
    }
    for (int t4 = 0; t4 < 4; ++t4)
        for (int jn = 0; jn < 8; ++jn)
            for (int e = 0; e < 2; ++e)
                if (flag_pos(8 * jn + 2 * t4 + e) != 16 * t4 + 4 * (e + 2 * (jn & 1)) + (jn >> 1)) return false;
    return true;
}
static_assert(flag_pos_ok(), "flag_pos: the producer's and the consumers' flag bytes disagree");
static_assert(SMLA_SM90P_PERSISTENT == 0 || SMLA_SM90P_PERSISTENT == 1, "SMLA_SM90P_PERSISTENT: 0 or 1");

// setmaxnreg: the three warpgroups share the launch allocation, 3 x 168 (plan.cuh).
constexpr int kConsumerRegs = 224, kProducerRegs = 56;
static_assert(2 * kConsumerRegs + kProducerRegs <= 3 * 168, "the launch allocation: 64K / 384 -> 168");
// Named barriers (0 is __syncthreads): the max and P exchanges of a pair (256 consumer threads: one
// warpgroup arrives, the other waits), the epilogue's row sums, Q landed, the start (the producers'
// tile scan done, all 384 threads; scan_tiles in producer.cuh), each warpgroup's staged output written
// (kBarOut + W, 128 threads).
// kPersistent: the producer warpgroup's own meetings (kBarProd, 128 threads).
constexpr int kBarM0 = 1, kBarM1 = 2, kBarP0 = 3, kBarP1 = 4, kBarL = 5, kBarQ = 6, kBarStart = 7, kBarOut = 8;
constexpr int kBarProd = 10;
struct Smem {
    static constexpr Region q = first_region(kTileBytes);            // Q, 9 column blocks
    static constexpr Region k = region_after(q, 2 * kTileBytes);     // K buffers 0, 1
    static constexpr Region plo = region_after(k, kBlk);             // P_lo of buffer 1's tile (high)
    // mbarriers: full[b][r] at 8 (2b + r), empty[b][r] at 32 + 8 (2b + r); kSplit: empty[b][r][q] at
    // 32 + 8 (4 (2b + r) + q)
    static constexpr Region bar = region_after(plo, 32 + 8 * kEmptyBars);
    static constexpr Region valid = region_after(bar, 2 * kBN * 4);  // int [2][64]: row valid, per buffer
    static constexpr Region mrow = region_after(valid, 2 * kHT * 4); // float [2][64]: m0, m1 of the exchange
    static constexpr Region mask = region_after(mrow, kMaskWords * 4);  // the non-empty tiles
    static constexpr Region qbar = region_after(mask, 8);                // Q's TMA mbarrier (kQTmaScan, a.q_tma)
    static constexpr Region mtrue = region_after(qbar, kLazy ? 2 * kHT * 4 : 0);  // float [2][64]: kLazy's true maxima
    // kPersistent: mbarriers q_free, item_full[2], item_free[2], then ItemSlot [2] (attn_sm90p_persistent_kernel)
    static constexpr Region pers = region_after(mtrue, kPersistent ? 40 + 2 * 32 : 0);
    static constexpr int used = pers.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && k.off % 1024 == 0 && plo.off % 1024 == 0, "swizzled tiles");
    static_assert(bar.off % 8 == 0 && qbar.off % 8 == 0 && pers.off % 8 == 0, "mbarriers are 8-byte");
    static_assert(valid.off % 16 == 0, "kFlagBytes: a consumer thread's 16 flag bytes by one load");
    static_assert(2 * kHT * 8 <= kBlk, "the epilogue's row sums reuse the P_lo block");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

constexpr int kEarly = 0, kLate = 1;

// Trace events per pair (profiling builds, sm90/trace.cuh). WG0: 0 start, 1 its max published, 2 its
// local P V issued, 3 WG1's max received, 4 local P V done, 5 P0 published, 6 P1 received, 7 the next
// pair's first S chain issued (its early region landed), 8 remote P V done, 9 the next late region
// landed, 10 the next S done. WG1: 0 start, 1 WG0's max received, 2 P1 published, 3 P0 received, 4 local
// P V done, 5..8 as WG0's 7..10. Producer (each warp): 0 a pair's start; buffer b's early region free 1 + 4 b,
// its row flags written 9 + 2 b, its copies issued 2 + 4 b, its late region free 3 + 4 b, its copies issued 4 + 4 b.
template <int W>
struct PairEv {
    static constexpr int kFirst = W == 0 ? 7 : 5, kRemoteDone = kFirst + 1, kLate = kFirst + 2, kS = kFirst + 3;
};

// One CTA: CtaCommon (plan.cuh) and the pair kernel's regions.
struct Cta : CtaCommon {
    int h0;
    uint32_t sPlo;
    float *sM;       // [2][64]: m0 (WG0), m1 (WG1)
    uint32_t *mask;  // [kMaskWords]: the non-empty tiles
    double *sL;      // [2][64], the epilogue's row sums (over the P_lo block)
    float *sMt;      // [2][64]: kLazy's true row maxima

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw, const GridPos &gp)
        : CtaCommon(a, smem_raw, gp, Smem::q.off, Smem::k.off, Smem::bar.off, Smem::valid.off)
    {
        h0 = gp.ht * kHT;
        sPlo = base + Smem::plo.off;
        sM = reinterpret_cast<float *>(smem + Smem::mrow.off);
        mask = reinterpret_cast<uint32_t *>(smem + Smem::mask.off);
        sL = reinterpret_cast<double *>(smem + Smem::plo.off);
        sMt = reinterpret_cast<float *>(smem + Smem::mtrue.off);
    }
    // full[b][r] and empty[b][r][q] (part q of the region, kSplit; CtaCommon's bar_full is the first)
    __device__ __forceinline__ uint32_t full(int b, int r) const { return bar_full + 8 * (2 * b + r); }
    __device__ __forceinline__ uint32_t empty(int b, int r, int q = 0) const
    {
        return bar_full + 32 + 8 * (kSplit ? 4 * (2 * b + r) + q : 2 * b + r);
    }
    __device__ __forceinline__ uint32_t kbuf(int b) const { return sK + b * kTileBytes; }
    // The K ring's mbarriers (one thread, before the CTA's first barrier): full[b][r] counts the 128 producer threads
    // (+ 16 flag writers: early regions), empty[b][r][q] a consumer warpgroup.
    __device__ __forceinline__ void init_ring() const
    {
#pragma unroll
        for (int i = 0; i < 4; ++i) mbar_init(bar_full + 8 * i, (i & 1) == kEarly ? 144 : 128);
        for (int i = 0; i < kEmptyBars; ++i) mbar_init(empty(0, 0) + 8 * i, 128);
    }
};

// ------------------------------------------------------------------------------------------------
// The producer (WG2), after the tile scan: its four warps together, thread (g, cl) = (its 8-lane group 0..15, its
// lane in the group) copies 16-byte chunk cl of rows 16 i + g (i = 0..3) of both tiles of a pair, region by region
// in the order the consumers first read them (buffer 0 early, buffer 1 early, buffer 0 late, buffer 1 late), each
// once its owners freed it. (Two warps per buffer, each buffer's regions on their own, was 4-5% slower: a region's
// copies then came from 64 threads instead of 128, issue 16, thirty-first session.)
// ------------------------------------------------------------------------------------------------
template <int ABL, bool FAST>
struct PairProducer {
    static constexpr bool kNoLoad = (ABL & 1) != 0;
    static constexpr int kRows = 4;  // rows per thread and tile: 128 threads x 4 rows x 1 chunk per block
    static constexpr int kP = parts(FAST), kRowsPart = kRows / kP;  // a region's parts, this thread's rows in one
    const Args &a;
    const Cta &c;
    const ProducerLane lp;  // its chunk lp.cl of each column block, the row source, the L2 policy (producer.cuh)
    const int g;            // rows 16 i + g of each tile (g = 4 warp + lane / 8)
    const smla_udiv bs_div;  // kLeanProducer: the cache's block_size as a multiply-shift divisor
    static constexpr int kHintAny = ProducerLane::kHintAny;

    struct Rows {
        const uint8_t *src[kRows];
        uint32_t ok;
    };

    __device__ __forceinline__ PairProducer(const Args &a_, const Cta &cta, smla_udiv bs_div_ = smla_udiv{0u, 0u})
        : a(a_), c(cta), lp(a_, cta.tid - 256, cta.lane), g((cta.tid - 256) >> 3), bs_div(bs_div_)
    {
    }

    // The indices of this thread's rows of slice tile t (nt_all: none, all -1).
    __device__ __forceinline__ void fetch(int t, int (&idx)[kRows]) const
    {
#pragma unroll
        for (int i = 0; i < kRows; ++i) idx[i] = tile_row_index(c, t, 16 * i + g);
    }
    __device__ __forceinline__ void locate(const int (&idx)[kRows], Rows &R) const
    {
        R.ok = 0;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            const bool ok = lp.kv.valid(idx[i]);
            R.src[i] = (kLeanProducer ? lp.kv.row(idx[i], ok, bs_div) : lp.kv.row(idx[i], ok)) + lp.cl * 16;
            R.ok |= (ok ? 1u : 0u) << i;
        }
    }
    // The row flags of this thread's rows of buffer b (lanes of chunk 0): 4 ints, or (kFlagBytes) one word of 4 bytes,
    // row i in byte i, at flag_pos.
    __device__ __forceinline__ void flags(const Rows &R, int b) const
    {
        if constexpr (kFlagBytes) {
            const uint32_t ok = R.ok;
            c.sValid[b * (kBN / 4) + flag_word(g)] =
                (ok & 1u) | ((ok & 2u) << 7) | ((ok & 4u) << 14) | ((ok & 8u) << 21);
        } else {
#pragma unroll
            for (int i = 0; i < kRows; ++i) c.sValid[b * kBN + 16 * i + g] = (R.ok >> i) & 1u;
        }
    }
    // Column blocks [c0, c1) of this thread's row i (row 16 i + g of the tile) into K buffer b; copy: of all its rows.
    // HINT: the copies' form (ProducerLane::copy16_as).
    template <int HINT>
    __device__ __forceinline__ void copy_row(const Rows &R, int b, int i, int c0, int c1) const
    {
        const int nb = (((R.ok >> i) & 1u) && !kNoLoad) ? 16 : 0;
        const uint32_t dst = lp.chunk_dst(c.kbuf(b), 16 * i + g);
#pragma unroll
        for (int c8 = c0; c8 < c1; ++c8) lp.copy16_as<HINT>(dst + c8 * kBlk, R.src[i] + c8 * 128, nb);
    }
    template <int HINT>
    __device__ __forceinline__ void copy(const Rows &R, int b, int c0, int c1) const
    {
#pragma unroll
        for (int i = 0; i < kRows; ++i) copy_row<HINT>(R, b, i, c0, c1);
    }
    // Region R of buffer B for its use-th tile: wait until its owners freed it (part by part: kP), copy, and let
    // the full barrier's phase complete once this thread's copies landed (each of the 128 threads arrives once,
    // `.noinc`). The row flags go with the early region (its owner reads them; its owner frees part 0 after its
    // mask): the 16 flag writers' plain arrival (release) orders them, so full(B, early) counts 128 + 16.
    // speculated: the copies and row flags are speculate()'s (buffer 0's first use), only the arrivals remain.
    template <int B, int R, int HINT>
    __device__ __forceinline__ void region(const Rows &rows, int use, bool speculated = false) const
    {
        if (use > 0) mbar_wait(c.empty(B, R), (use - 1) & 1);
        trace(a, use, 1 + 4 * B + 2 * R);
        if constexpr (R == kEarly) {
            if (lp.cl == 0) {
                if (!speculated) flags(rows, B);
                mbar_arrive(c.full(B, R));
            }
            trace(a, use, 9 + 2 * B);  // the flags written: its copies start
        }
        if (speculated) {
            cp_async_mbar_arrive_noinc(c.full(B, R));
            trace(a, use, 2 + 4 * B + 2 * R);
            return;
        }
        // buffer 0: early = blocks 0..3, late = 4..8; buffer 1: early = 4..8 ("fast") or 4..7, late = 0..3 (and 8:
        // "high")
        if constexpr (kP > 1) {  // "fast" in parts: row i of the V blocks once its part is free, block 8 last
            constexpr int v0 = (B == 0) == (R == kEarly) ? 0 : 4;
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                if (i > 0 && i % kRowsPart == 0 && use > 0) mbar_wait(c.empty(B, R, i / kRowsPart), (use - 1) & 1);
                copy_row<HINT>(rows, B, i, v0, v0 + 4);
            }
            if constexpr (v0 == 4) copy<HINT>(rows, B, 8, 9);
        } else if constexpr (B == 0) {
            if constexpr (R == kEarly) copy<HINT>(rows, 0, 0, 4);
            else copy<HINT>(rows, 0, 4, 9);
        } else if constexpr (FAST) {
            if constexpr (R == kEarly) copy<HINT>(rows, 1, 4, 9);
            else copy<HINT>(rows, 1, 0, 4);
        } else {
            if constexpr (R == kEarly) {
                copy<HINT>(rows, 1, 4, 8);
            } else {
                copy<HINT>(rows, 1, 0, 4);
                copy<HINT>(rows, 1, 8, 9);
            }
        }
        cp_async_mbar_arrive_noinc(c.full(B, R));
        trace(a, use, 2 + 4 * B + 2 * R);
    }

    // speculates(FAST): slice tile 0 into buffer 0 with its row flags, before the tile scan (the slice has a tile).
    __device__ __forceinline__ void speculate() const
    {
        int idx[kRows];
        Rows R;
        fetch(0, idx);
        locate(idx, R);
        if (lp.cl == 0) flags(R, 0);
        copy<kHintAny>(R, 0, 0, 9);
        trace_edge(a, kTrSpec);
    }

    // SMLA_SM90P_PREFETCH_NEXT: the next wave's CTA's Q rows (64 heads, each its latent and RoPE parts) and index row
    // into L2, from the producer's first warp (two heads a lane; a part whose address is not 16-byte aligned is left).
    __device__ __forceinline__ void prefetch_next() const
    {
        if (c.tid >= 256 + 32) return;
        const int64_t bx = static_cast<int64_t>(blockIdx.x) + a.n_sms;
        if (bx >= static_cast<int64_t>(gridDim.x)) return;
        const GridPos gp = grid_pos_of(a, bx);
        const smla_attn_params &p = a.p;
        const int lane = c.tid - 256;
        const auto pf = [](const void *src, uint32_t bytes) {
            if ((reinterpret_cast<uintptr_t>(src) & 15u) == 0) bulk_prefetch_l2(src, bytes);
        };
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int h = gp.ht * kHT + 2 * lane + i;
            if (h >= c.h) break;
            pf(smla_q_at(&p, gp.bi, gp.si, h, 0), 2 * kDv);
            pf(smla_q_at(&p, gp.bi, gp.si, h, kDv), 2 * (kDqk - kDv));
        }
        if (lane == 0) {
            const RowSlice sl = row_slice(a, gp.bi, gp.si, gp.sp, kBN);
            const int n = min(sl.L - sl.j0 * kBN, (sl.j1 - sl.j0) * kBN);  // the slice's indices; whole 16-byte pieces
            if (n >= 4) pf(sl.idx + sl.j0 * kBN, static_cast<uint32_t>(4 * n) & ~15u);
        }
    }

    // speculated: speculate() ran. kLeanProducer: the loop in the call's copy form. g0: the pairs the K ring ran before
    // this item's (kPersistent: the ring runs on across items); drain: wait for every copy at the end (the last item).
    __device__ __forceinline__ void run(bool speculated, int g0 = 0, bool drain = true) const
    {
        if constexpr (kLeanProducer) {
            if (a.evict_last) run_as<ProducerLane::kHintLast>(speculated, g0, drain);
            else run_as<ProducerLane::kHintNone>(speculated, g0, drain);
        } else {
            run_as<kHintAny>(speculated, g0, drain);
        }
    }
    template <int HINT>
    __device__ __forceinline__ void run_as(bool speculated, int g0, bool drain) const
    {
        const int np = (c.nt + 1) / 2;
        // this pair's (c0, c1) and the next pair's (n0, n1) indices of its two tiles (an odd count's last t1 is
        // nt_all: a tile of zeros)
        int c0[kRows], c1[kRows], n0[kRows], n1[kRows];
        int t0 = c.next_tile(0);
        int t1 = c.next_tile(t0 + 1);
        const bool have0 = speculated && c.nt > 0 && t0 == 0;
        if (speculated && !have0) cp_async_wait_all();  // a wasted guess lands before buffer 0 is rewritten
        fetch(t0, c0);
        fetch(t1, c1);
        for (int use = g0; use < g0 + np; ++use) {  // the ring's use of both buffers: this item's pair use - g0
            const int k = use - g0;
            t0 = c.next_tile(t1 + 1);
            t1 = c.next_tile(t0 + 1);
            fetch(t0, n0);
            fetch(t1, n1);
            Rows r0, r1;
            locate(c0, r0);
            locate(c1, r1);
            trace(a, k, 0);
            const bool spec0 = have0 && k == 0;  // buffer 0's copies issued: both its arrivals first
            region<0, kEarly, HINT>(r0, use, spec0);
            if (spec0) region<0, kLate, HINT>(r0, use, true);
            region<1, kEarly, HINT>(r1, use);
            if (!spec0) region<0, kLate, HINT>(r0, use);
            region<1, kLate, HINT>(r1, use);
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                c0[i] = n0[i];
                c1[i] = n1[i];
            }
            constexpr int kPf = SMLA_SM90P_PREFETCH_NEXT;
            if (kPf > 0 && k == (np > kPf ? np - 1 - kPf : 0)) prefetch_next();
        }
        if (drain) cp_async_wait_all();
    }
};

// ------------------------------------------------------------------------------------------------
// The consumers. W = 0: even tiles (buffer 0), O columns 0..255; W = 1: odd tiles, columns 256..511.
// ------------------------------------------------------------------------------------------------

// The k-step order of W's S: 36 steps of 16 dims (0..31 the latent part, 32..35 RoPE), its early region
// first: WG0 0..35 in order; WG1 16..35 (blocks 4..8), 0..15 ("fast") or 16..31, 0..15, 32..35 ("high").
template <int W, bool FAST>
__device__ __forceinline__ constexpr int kstep(int i)
{
    if (W == 0) return i;
    if (FAST) return i < 20 ? i + 16 : i - 20;
    return i < 16 ? i + 16 : (i < 32 ? i - 16 : i);
}

// PERS: a warpgroup of the persistent kernel (g, q_free below).
template <int W, int ABL, bool FAST, bool PERS = false>
struct PairConsumer {
    static constexpr bool kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0, kNoLo = FAST || (ABL & 16) != 0;
    static constexpr int kPeer = 1 - W;
    static constexpr int kP = parts(FAST);  // commit groups per P V product, parts a region is freed in
    // The remote product's commit groups: WG1's local and remote products are pending together, and a warpgroup may
    // have at most 7 wgmma groups pending (wgmma.wait_group's range, 0..7; 8 hung the pair kernel's tests in the
    // thirty-seventh session's call 4), so with 4 parts WG1's remote product is 3 groups (k-steps 0, 1, then 2 and 3).
    static constexpr int kRemoteGroups = kP == 4 && W == 1 ? 3 : kP;
    // A product of G commit groups (kP > 1) commits after k-step kk when this is true.
    static constexpr bool commit_after(int kk, int g) { return g == 3 ? kk != 2 : (kk + 1) % (4 / g) == 0; }
    // WG1 frees the regions of its pair before it acquires its next early region; WG0 queues its next S chain
    // 0 behind its remote product first (its early region was freed long before). after_remote, next_first.
    static constexpr bool kReleaseFirst = W == 1;

    const Args &a;
    const Cta &c;
    const int t4, r0;  // rows r0, r0 + 8 of the 64 heads
    float o[128];         // O[r0 / r0 + 8][256 W + 8 jn + 2 t4 + {0, 1}] at o[4 jn + {0, 1} / {2, 3}]
    float m[2] = {-INFINITY, -INFINITY};  // the maximum P is taken against (kLazy: lazy; c.sMt the true one)
    double l[2] = {0.0, 0.0};  // row sums of this warpgroup's tiles (see sm80/tile.cuh)
    // PERS: the pairs the K ring ran before this item (its barriers' phases run on), and the mbarrier this
    // warpgroup's warps arrive at once its last S of the item is done
    int g = 0;
    uint32_t q_free = 0u;

    __device__ __forceinline__ PairConsumer(const Args &a_, const Cta &cta)
        : a(a_), c(cta), t4(cta.lane & 3), r0(16 * ((cta.tid >> 5) & 3) + (cta.lane >> 2))
    {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.f;
        if (kLazy && t4 == 0) c.sMt[W * kHT + r0] = c.sMt[W * kHT + r0 + 8] = -INFINITY;
    }

    __device__ __forceinline__ void wait_q() const
    {
        cp_async_wait_all();
        fence_async_smem();
        named_sync(kBarQ, 256);
    }

    __device__ __forceinline__ void acquire(int b, int r, int use) const
    {
        mbar_wait(c.full(b, r), ((PERS ? g : 0) + use) & 1);
        fence_async_smem();  // the producer's cp.async data, read by wgmma (the async proxy)
    }
    __device__ __forceinline__ void release(int b, int r, int q = 0) const { mbar_arrive(c.empty(b, r, q)); }
    // Waits for the product over region (b, r) (its G commit groups, with AFTER groups issued behind them), freeing
    // the region's parts as they complete (part q with group q, the last group's with the rest; kP = 1: the region).
    template <int AFTER, int G = kP>
    __device__ __forceinline__ void free_region(int b, int r) const
    {
        static_assert(AFTER + G <= 7 && (G == kP || (kP == 4 && G == 3)), "at most 7 wgmma groups pending");
        if constexpr (G >= 2) {
            wg_wait<AFTER + G - 1>();
            release(b, r, 0);
        }
        if constexpr (G >= 3) {
            wg_wait<AFTER + G - 2>();
            release(b, r, 1);
        }
        if constexpr (G == 4) {
            wg_wait<AFTER + 1>();
            release(b, r, 2);
        }
        wg_wait<AFTER>();
        if constexpr (G == 3) release(b, r, 2);
        release(b, r, kP - 1);
    }

    // --- S ---------------------------------------------------------------------------------------
    // d (+)= k-steps i0 .. i1 - 1 (in kstep order) over buffer W's tile.
    __device__ __forceinline__ void s_chain(float (&d)[32], int i0, int i1, bool add)
    {
        const uint32_t kd = opaque(desc_base(c.kbuf(W), 16)), qd = opaque(desc_base(c.sQ, 16));
        wg_fence();
#pragma unroll
        for (int i = i0; i < i1; ++i) {
            const int ks = kstep<W, FAST>(i);
            const uint32_t off = (ks >> 2) * kBlk + (ks & 3) * 32;
            wgmma_ss<0>(d, desc_at(qd, off), desc_at(kd, off), add || i > i0);
        }
        wg_commit();
    }
    // The chains of S (the accuracy rule, sm90/score_tile.cuh): 3 chains of 12 k-steps, or 2 (or 1) split
    // at the region boundary (the early region's k-steps); chain 0 reads only the early region.
    static constexpr int kEarlySteps = (W == 1 && FAST) ? 20 : 16;
    static constexpr int kFirst = kSChains == 3 ? 12 : kEarlySteps;
    // Chain 0 once the early region of use `use` landed.
    __device__ __forceinline__ void s_first(float (&s)[32], int use)
    {
        acquire(W, kEarly, use);
        if constexpr (!kNoS) s_chain(s, 0, kFirst, false);
    }
    // The other chains once the late region landed, summed into s in fp32; returns with S complete.
    __device__ __forceinline__ void s_rest(float (&s)[32], int use)
    {
        acquire(W, kLate, use);
        trace(a, use - 1, PairEv<W>::kLate);
        if constexpr (kNoS) {
#pragma unroll
            for (int i = 0; i < 32; ++i) s[i] = 0.f;
        } else if constexpr (kSChains == 1) {
            s_chain(s, kFirst, 36, true);
            wg_wait0();
            fence_regs(s);
        } else {
            float t[32];
            constexpr int kStep = (36 - kFirst) / (kSChains > 1 ? kSChains - 1 : 1);
#pragma unroll
            for (int ch = 0; ch + 1 < kSChains; ++ch) {
                s_chain(t, kFirst + ch * kStep, kFirst + (ch + 1) * kStep, false);
                wg_wait0();
                fence_regs(s);
                fence_regs(t);
#pragma unroll
                for (int i = 0; i < 32; ++i) s[i] += t[i];
            }
        }
        trace(a, use - 1, PairEv<W>::kS);
    }

    // --- softmax -----------------------------------------------------------------------------------
    // Mask (row flags of buffer W), scale, the tile's row maxima (sm90/score_tile.cuh); kLazy: the true maxima.
    __device__ __forceinline__ void mask_scores(float (&s)[32], float (&mx)[2])
    {
        if constexpr (kFlagBytes) {  // column 8 jn + 2 t4 + e: word e + 2 (jn & 1), byte jn >> 1 (flag_pos)
            const uint4 v = *reinterpret_cast<const uint4 *>(c.sValid + W * (kBN / 4) + 4 * t4);
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
            const auto ok = [&](int jn, int e) { return ((w[e + 2 * (jn & 1)] >> (8 * (jn >> 1))) & 0xffu) != 0; };
            sm90::mask_scale_cols<8>(ok, a.scale_log2, m, s, mx);
            sm90::quad_max(mx);
        } else {
            sm90::mask_scores(c.sValid + W * kBN, a.scale_log2, t4, m, s, mx);
        }
        if (kLazy && t4 == 0) {
            float *const p = c.sMt + W * kHT + r0;  // only this thread reads and writes its rows' entries
            p[0] = fmaxf(p[0], mx[0]);
            p[8] = fmaxf(p[8], mx[1]);
        }
    }

    // The exponent base of row max mn (0 for a row with nothing yet: its p are all 0).
    __device__ __forceinline__ static float base_of(float mn) { return mn == -INFINITY ? 0.f : mn; }

    // Moves the running max to mn: O and l scaled by 2^(m - mn).
    __device__ __forceinline__ void move_max(const float (&mn)[2])
    {
        float f[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            f[i] = ex2(m[i] - base_of(mn[i]));
            m[i] = mn[i];
        }
        rescale(f);
    }
    __device__ __forceinline__ void rescale(const float (&f)[2])
    {
        rescale_rows(o, f);
        l[0] *= static_cast<double>(f[0]);
        l[1] *= static_cast<double>(f[1]);
    }

    // P = 2^(S - base) in place (fp32), its A fragments (hi; lo: high only) and the row sums.
    __device__ __forceinline__ void probs(float (&s)[32], const float (&mn)[2], uint32_t (&hi)[16],
                                          uint32_t (&lo)[16])
    {
        const float b0 = base_of(mn[0]), b1 = base_of(mn[1]);
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int jn = 0; jn < 8; ++jn) {
            s[4 * jn + 0] = ex2(s[4 * jn + 0] - b0);
            s[4 * jn + 1] = ex2(s[4 * jn + 1] - b0);
            s[4 * jn + 2] = ex2(s[4 * jn + 2] - b1);
            s[4 * jn + 3] = ex2(s[4 * jn + 3] - b1);
            rs[0] += s[4 * jn + 0] + s[4 * jn + 1];
            rs[1] += s[4 * jn + 2] + s[4 * jn + 3];
            const int f = 4 * (jn >> 1) + 2 * (jn & 1);
            if constexpr (FAST) {
                hi[f] = pack_bf16x2(s[4 * jn + 0], s[4 * jn + 1]);
                hi[f + 1] = pack_bf16x2(s[4 * jn + 2], s[4 * jn + 3]);
            } else {
                split_bf16x2(s[4 * jn + 0], s[4 * jn + 1], hi[f], lo[f]);
                split_bf16x2(s[4 * jn + 2], s[4 * jn + 3], hi[f + 1], lo[f + 1]);
            }
        }
        l[0] += static_cast<double>(rs[0]);
        l[1] += static_cast<double>(rs[1]);
    }

    // Where warpgroup w's P_lo goes ("high"): WG0's into block 0 of K buffer 0, dead once WG0's local
    // product is done (so in "high" buffer 0's early region is freed by WG1, after its remote product);
    // WG1's into the P_lo block.
    __device__ __forceinline__ uint32_t lo_block(int w) const { return w == 0 ? opaque(c.kbuf(0)) : opaque(c.sPlo); }
    // Where warpgroup w's P_hi goes: the RoPE block of its K buffer, dead once its S is done; in "fast"
    // WG1's into the P_lo block (unused then), so that buffer 1's RoPE block is in its early region.
    __device__ __forceinline__ uint32_t hi_block(int w) const
    {
        return (FAST && w == 1) ? opaque(c.sPlo) : c.kbuf(w) + 8 * kBlk;
    }

    // The A fragments of P (hi, lo) for the peer: P_hi into buffer W's RoPE block, P_lo into lo_block(W),
    // as the K-major A operand [64 heads x 64 tokens] of its remote product.
    __device__ __forceinline__ void store_p(const uint32_t (&hi)[16], const uint32_t (&lo)[16]) const
    {
        const uint32_t hb = hi_block(W), lb = lo_block(W);
        store_p_frags(hb, r0, c.lane, hi);
        if constexpr (!kNoLo) store_p_frags(lb, r0, c.lane, lo);
        fence_async_smem();
    }
    // P *= f (rows r0 / r0 + 8 by f[0] / f[1]) on its fragments, split again (a no-op where f is 1).
    __device__ __forceinline__ void rescale_p(uint32_t (&hi)[16], uint32_t (&lo)[16], const float (&f)[2]) const
    {
        if (!__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) return;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const float fi = f[i & 1];  // fragment register i holds row r0 + 8 (i & 1)
            float x = __uint_as_float(hi[i] << 16) * fi, y = __uint_as_float(hi[i] & 0xffff0000u) * fi;
            if constexpr (!kNoLo) {
                x = fmaf(__uint_as_float(lo[i] << 16), fi, x);
                y = fmaf(__uint_as_float(lo[i] & 0xffff0000u), fi, y);
                split_bf16x2(x, y, hi[i], lo[i]);
            } else {
                hi[i] = pack_bf16x2(x, y);
            }
        }
    }

    // --- P V ---------------------------------------------------------------------------------------
    // V = the K buffer's (descriptor base vd = desc_base(kb, kBlk)) columns 256 W .. + 255, k-step kk
    // (tokens 16 kk ..), N-major.
    __device__ __forceinline__ uint64_t v_desc(uint32_t vd, int kk) const
    {
        return desc_at(vd, (4 * W) * kBlk + (16 * kk) * 128);
    }
    // The commit groups of a P V product of G groups: with parts, one after each k-step kk that ends a part (k-step kk
    // reads V rows 16 kk .., free_region); else one at the end; without the product (kNoPV) G empty ones, so that the
    // waits count the same.
    template <int G>
    __device__ __forceinline__ void commit_part(int kk) const
    {
        if constexpr (kP > 1) {
            if (commit_after(kk, G)) wg_commit();
        }
    }
    template <int G>
    __device__ __forceinline__ void commit_end() const
    {
        if constexpr (kNoPV) {
#pragma unroll
            for (int i = 0; i < G; ++i) wg_commit();
        } else if constexpr (kP == 1) {
            wg_commit();
        }
    }
    // O += P V over this warpgroup's own tile, P from registers (kP commit groups).
    __device__ __forceinline__ void pv_local(uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        if constexpr (!kNoPV) {
            const uint32_t vd = opaque(desc_base(c.kbuf(W), kBlk));
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint64_t dv = v_desc(vd, kk);
                wgmma_n256_rs(o, reinterpret_cast<const uint32_t(&)[4]>(hi[4 * kk]), dv);
                if constexpr (!kNoLo) wgmma_n256_rs(o, reinterpret_cast<const uint32_t(&)[4]>(lo[4 * kk]), dv);
                commit_part<kP>(kk);
            }
        }
        commit_end<kP>();
    }
    // O += P V over the peer's tile, its P from smem (kRemoteGroups commit groups).
    __device__ __forceinline__ void pv_remote()
    {
        if constexpr (!kNoPV) {
            const uint32_t kb = c.kbuf(kPeer), vd = opaque(desc_base(kb, kBlk));
            const uint32_t hd = opaque(desc_base(hi_block(kPeer), 16)), ld = desc_base(lo_block(kPeer), 16);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint64_t dv = v_desc(vd, kk);
                wgmma_n256_tb(o, desc_at(hd, kk * 32), dv);
                if constexpr (!kNoLo) wgmma_n256_tb(o, desc_at(ld, kk * 32), dv);
                commit_part<kRemoteGroups>(kk);
            }
        }
        commit_end<kRemoteGroups>();
    }

    // --- the exchange of maxima ---------------------------------------------------------------------
    __device__ __forceinline__ void put_m(int w, const float (&v)[2]) const
    {
        if (t4 == 0) {
            c.sM[w * kHT + r0] = v[0];
            c.sM[w * kHT + r0 + 8] = v[1];
        }
    }
    __device__ __forceinline__ void get_m(int w, float (&v)[2]) const
    {
        v[0] = c.sM[w * kHT + r0];
        v[1] = c.sM[w * kHT + r0 + 8];
    }
    // This warpgroup's new maximum mn per row after its tile's mx (next_ref_max, sm90/score_tile.cuh: kLazy's rule),
    // published for the peer (barrier bar).
    __device__ __forceinline__ void publish_max(const float (&ref)[2], const float (&mx)[2], float (&mn)[2],
                                                int bar) const
    {
#pragma unroll
        for (int i = 0; i < 2; ++i) mn[i] = next_ref_max<kLazy>(ref[i], mx[i]);
        put_m(W, mn);
        named_arrive(bar, 256);
    }

    // --- the schedules --------------------------------------------------------------------------------
    // Pairs k = 0 .. np - 1: tile 2k in buffer 0, 2k + 1 in buffer 1 (an odd count's last pair has a
    // tile of zeros with no valid row in buffer 1, so that every pair is whole). Every path through a
    // pair waits for the same tensor-core groups: a branch around a wgmma would make the compiler
    // serialise every wgmma of the kernel. So the last pair returns early from the loop's copy (kOneBody:
    // the early return is no such branch) or is its own instantiation (NEXT = false).
    __device__ __forceinline__ void run(int np)
    {
        float s[32];
        if (np > 0) {
            s_first(s, 0);
            s_rest(s, 0);
            if constexpr (kOneBody) {
#pragma unroll 1
                for (int k = 0;; ++k) {
                    const bool more = k + 1 < np;
                    pair<true>(s, k, more);
                    if (!more) break;
                }
            } else {
#pragma unroll 1
                for (int k = 0; k + 1 < np; ++k) pair<true>(s, k, true);
                pair<false>(s, np - 1, false);
            }
        }
    }

    // NEXT: the code that queues the next pair's S is compiled in; more: there is a next pair (run time: NEXT's one
    // copy of the code for every pair, kOneBody).
    template <bool NEXT>
    __device__ __forceinline__ void pair(float (&s)[32], int k, bool more)
    {
        if constexpr (W == 0) pair0<NEXT>(s, k, more);
        else pair1<NEXT>(s, k, more);
    }

    // The local product (this pair's first commit group) completed: its registers may change again.
    __device__ __forceinline__ void local_done(uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        fence_regs(o);
        fence_regs(hi);
        if constexpr (!kNoLo) fence_regs(lo);
    }
    // Queues the next pair's first S chain behind the remote product (NEXT), then waits for the latter, freeing the
    // peer buffer's late region it read (free_region). kReleaseFirst: no S chain (the caller calls next_first).
    template <bool NEXT>
    __device__ __forceinline__ void after_remote(float (&s)[32], int k)
    {
        if constexpr (NEXT && !kReleaseFirst) {
            s_first(s, k + 1);
            trace(a, k, PairEv<W>::kFirst);
            free_region<1, kRemoteGroups>(kPeer, kLate);
        } else {
            free_region<0, kRemoteGroups>(kPeer, kLate);
        }
        trace(a, k, PairEv<W>::kRemoteDone);
        fence_regs(o);
    }
    // kReleaseFirst: the next pair's first S chain, once this pair's regions are freed.
    template <bool NEXT>
    __device__ __forceinline__ void next_first(float (&s)[32], int k)
    {
        if constexpr (NEXT && kReleaseFirst) {
            s_first(s, k + 1);
            trace(a, k, PairEv<W>::kFirst);
        }
    }

    // PERS: the item's last pair starts, so this warpgroup's last S of the item is done (Q may be replaced): one
    // arrival a warp at q_free.
    __device__ __forceinline__ void last_s_done(bool more) const
    {
        if constexpr (PERS) {
            if (!more && c.lane == 0) mbar_arrive(q_free);
        }
    }

    // WG0's pair k: its tile's softmax and local product, the exchange, WG1's P.
    template <bool NEXT>
    __device__ __forceinline__ void pair0(float (&s)[32], int k, bool more)
    {
        float mx[2], m0[2], m1[2], f[2];
        uint32_t hi[16], lo[16];
        last_s_done(more);
        trace(a, k, 0);
        mask_scores(s, mx);
        publish_max(m, mx, m0, kBarM0);
        trace(a, k, 1);
        move_max(m0);
        probs(s, m0, hi, lo);
        pv_local(hi, lo);
        trace(a, k, 2);
        named_sync(kBarM1, 256);
        trace(a, k, 3);
        get_m(1, m1);
#pragma unroll
        for (int i = 0; i < 2; ++i) f[i] = m0[i] == -INFINITY ? 1.f : ex2(m0[i] - base_of(m1[i]));
        if constexpr (kNoLo) free_region<0>(0, kEarly);  // else WG1 frees it (lo_block)
        else wg_wait0();
        local_done(hi, lo);
        trace(a, k, 4);
        rescale_p(hi, lo, f);
        store_p(hi, lo);  // P0 relative to m1, for WG1
        named_arrive(kBarP0, 256);
        trace(a, k, 5);
        rescale(f);
        m[0] = m1[0];
        m[1] = m1[1];
        named_sync(kBarP1, 256);
        trace(a, k, 6);
        pv_remote();
        if (kOneBody && !more) {  // the last pair: as NEXT = false, out of the one copy (the caller's loop ends)
            after_remote<false>(s, k);
            return;
        }
        after_remote<NEXT>(s, k);
        next_first<NEXT>(s, k);
        if constexpr (NEXT) s_rest(s, k + 1);
    }

    // WG1's pair k: its tile's softmax after WG0's max, P1 for WG0, local and remote products.
    template <bool NEXT>
    __device__ __forceinline__ void pair1(float (&s)[32], int k, bool more)
    {
        float mx[2], m0[2], m1[2];
        uint32_t hi[16], lo[16];
        last_s_done(more);
        trace(a, k, 0);
        mask_scores(s, mx);
        named_sync(kBarM0, 256);
        trace(a, k, 1);
        get_m(0, m0);
        publish_max(m0, mx, m1, kBarM1);
        move_max(m1);
        probs(s, m1, hi, lo);
        pv_local(hi, lo);  // before P1's store: its product starts sooner (1-2% faster in "high", equal in "fast")
        store_p(hi, lo);
        named_arrive(kBarP1, 256);
        trace(a, k, 2);
        named_sync(kBarP0, 256);
        trace(a, k, 3);
        pv_remote();
        free_region<kRemoteGroups>(1, kEarly);  // the local product, the remote one's groups behind it
        local_done(hi, lo);
        trace(a, k, 4);
        after_remote<NEXT>(s, k);
        if constexpr (!kNoLo) release(0, kEarly);  // WG0's P_lo was in it (lo_block)
        if (kOneBody && !more) return;  // the last pair (the caller's loop ends)
        next_first<NEXT>(s, k);
        if constexpr (NEXT) s_rest(s, k + 1);
    }

    // The row sums of both warpgroups added (both hold the same m) into the P_lo block, once both loops are over.
    __device__ __forceinline__ void share_row_sums()
    {
        named_sync(kBarL, 256);  // both loops are over: the P_lo block is free for the row sums
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        }
        if (t4 == 0) {
            c.sL[W * kHT + r0] = l[0];
            c.sL[W * kHT + r0 + 8] = l[1];
        }
        named_sync(kBarL, 256);  // every S is done too: Q's region may hold the staged output
        trace_edge(a, kTrStats);
    }
    // Row rl = r0 + 8 hf's statistics (share_row_sums; kLazy: the true maximum over both warpgroups' tiles).
    __device__ __forceinline__ RowStat row_stat(int hf, int rl) const
    {
        return RowStat{m[hf], c.sL[rl] + c.sL[kHT + rl], kLazy ? fmaxf(c.sMt[rl], c.sMt[kHT + rl]) : m[hf]};
    }

    // The row sums, then this warpgroup's columns.
    __device__ __forceinline__ void epilogue()
    {
        share_row_sums();
        const auto stat = [&](int hf, int rl) { return row_stat(hf, rl); };
        finish_o_cols<false, out_stsm(FAST)>(a, c, c.h0, r0, 256 * W, t4, o, stat, c.sQ, kBarOut + W);
    }

    // The persistent kernel's epilogue (a direct output): the row sums, each row's statistics read once, a third
    // meeting (after it the next item may write the row sums' block, the maxima and the true maxima), then this
    // warpgroup's columns straight from registers (Q's region holds the next item's Q).
    __device__ __forceinline__ void epilogue_item()
    {
        share_row_sums();
        const RowStat rs[2] = {row_stat(0, r0), row_stat(1, r0 + 8)};
        finish_cols_direct<false>(a, c, c.h0, r0, 256 * W, t4, o, [&](int hf, int) { return rs[hf]; }, 0u, 0,
                                  [](const float (&)[2]) { named_sync(kBarL, 256); });
    }
};

// Internal linkage: the instantiation file owns its kernels.
namespace {

template <int ABL, bool FAST>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90p_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    stagger_start(a);
    extern __shared__ uint8_t smem_raw[];
    Cta c(a, smem_raw, grid_pos(a));

    trace_edge(a, kTrStart);
    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    // kQTmaScan: Q by TMA where the launcher described q (decided on the slice's tile count before the scan, as the
    // wide kernel's q_by_tma: the consumers wait for a TMA that was issued even where every tile is then empty)
    const bool q_tma = kQTmaScan && a.q_tma && c.nt_all > 0;
    const uint32_t qbar = c.base + Smem::qbar.off;
    if (c.tid == 0) {
        c.init_ring();
        if (q_tma) mbar_init(qbar, 1);
        fence_mbarrier_init();
    }
    if (!q_tma && c.tid < 256) issue_q<kHT, 256>(a, c, c.h0);
    if (c.tid < kMaskWords) c.mask[c.tid] = 0u;
    __syncthreads();
    if (q_tma && c.tid == 0) {
        tma_q(a, c.sQ, c.h0, static_cast<int>(c.si), static_cast<int>(c.bi), qbar);
        trace_edge(a, kTrQIssued);
    }
    const bool spec = speculates(FAST) && c.nt_all > 0;
    smla_udiv bs_div{0u, 0u};  // kLeanProducer: made by the producer threads (while the consumers scan: kQTmaScan)
    if (kLeanProducer && c.tid >= 256) bs_div = smla_udiv_of(static_cast<uint64_t>(a.p.kv.block_size));
    if constexpr (kQTmaScan) {
        skip_empty_tiles_by_consumers<kThreads>(a, c, c.mask, kBarStart, [&] {
            if (spec) PairProducer<ABL, FAST>(a, c).speculate();
        });
    } else {
        skip_empty_tiles<256, 4, kThreads>(a, c, c.mask, kBarStart);
    }
    trace_edge(a, kTrScanned);
    if (c.tid >= 256) {
        setmaxnreg_dec<kProducerRegs>();
        PairProducer<ABL, FAST>(a, c, bs_div).run(spec);
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    const auto wait_q = [&](const auto &wg) {
        if (q_tma) mbar_wait(qbar, 0);  // TMA's bytes are visible to wgmma once the phase completes
        else wg.wait_q();
    };
    if (c.tid < 128) {
        PairConsumer<0, ABL, FAST> wg(a, c);
        wait_q(wg);
        trace_edge(a, kTrQ);
        wg.run((c.nt + 1) / 2);
        trace_edge(a, kTrEpilogue);
        wg.epilogue();
        trace_edge(a, kTrEnd);
    } else {
        PairConsumer<1, ABL, FAST> wg(a, c);
        wait_q(wg);
        wg.run((c.nt + 1) / 2);
        trace_edge(a, kTrEpilogue);
        wg.epilogue();
        trace_edge(a, kTrEnd);
    }
}

// kPersistent: what the producer tells the consumers of an item (Smem::pers, two slots, item k in slot k & 1): its
// place, its non-empty tile count (-1: no more items) and the K ring's pairs before it.
struct ItemSlot {
    int64_t bi, si;
    int ht, nt, g, pad;
};
static_assert(sizeof(ItemSlot) == 32, "Smem::pers holds two 32-byte slots");

// kPersistent: the pair kernel without a top-k split as persistent CTAs (at most one per SM; with two head tiles
// clusters of 2, which take the two head tiles of the same rows, as attn_sm90p_kernel's clusters), CTA j taking work
// items j, j + gridDim.x, .. (grid_pos_of). The K ring (full / empty) runs on across items. Per item k:
//   the producer (WG2) makes the item's place and slice, scans its tiles (all 128 threads, scan_tiles_vec), and its
//     thread 0 writes slot k & 1 (item_full; item_free: the 256 consumer threads are done with item k - 2, which used
//     the slot) and issues the item's Q by TMA once both consumer warpgroups' last S of item k - 1 is done (q_free, 8
//     arrivals: Q is read by S alone), then the item's pairs, as attn_sm90p_kernel's; so item k + 1's scan, Q and
//     first regions run while the consumers finish item k. After its last item a slot with no tile count ends the
//     consumers' loop.
//   the consumers take the slot's tile count, wait for Q, run the pairs (arriving at q_free at the last pair's start)
//     and write the output from registers (PairConsumer::epilogue_item) at the slot's place (read then, so that
//     nothing of the item's place stays in registers through the pairs).
template <int ABL, bool FAST>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90p_persistent_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    extern __shared__ uint8_t smem_raw[];
    Cta c(a, smem_raw, grid_pos_of(a, blockIdx.x));  // the regions (the same for every item), item 0's place
    trace_edge(a, kTrStart);
    pdl_launch_dependents();
    const uint32_t qbar = c.base + Smem::qbar.off;
    const uint32_t q_free = c.base + Smem::pers.off, item_full = q_free + 8, item_free = q_free + 24;  // [2] each
    ItemSlot *const slot = reinterpret_cast<ItemSlot *>(c.smem + Smem::pers.off + 40);
    if (c.tid == 0) {
        c.init_ring();
        mbar_init(qbar, 1);
        mbar_init(q_free, 8);
        for (int i = 0; i < 2; ++i) {
            mbar_init(item_full + 8 * i, 1);
            mbar_init(item_free + 8 * i, 256);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (c.tid >= 256) {
        setmaxnreg_dec<kProducerRegs>();
        const int tw = c.tid - 256;
        const smla_udiv bs_div = kLeanProducer ? smla_udiv_of(static_cast<uint64_t>(a.p.kv.block_size))
                                               : smla_udiv{0u, 0u};
        // this CTA's items: blockIdx.x + k gridDim.x < rows x head tiles (no top-k split: launch)
        const int n_items = static_cast<int>((a.rows * a.n_ht - blockIdx.x + gridDim.x - 1) / gridDim.x);
        // slot k & 1 for item k (nt -1: none), once the consumers are done with item k - 2
        const auto put_slot = [&](int k, int64_t bi, int64_t si, int ht, int nt, int g) {
            if (k >= 2) mbar_wait(item_free + 8 * (k & 1), ((k >> 1) - 1) & 1);
            ItemSlot &sl = slot[k & 1];
            sl.bi = bi, sl.si = si, sl.ht = ht, sl.nt = nt, sl.g = g;
            mbar_arrive(item_full + 8 * (k & 1));  // release: the slot's stores
        };
        int g = 0, k = 0;
        for (; k < n_items; ++k) {
            const GridPos gp = grid_pos_of(a, blockIdx.x + static_cast<int64_t>(k) * gridDim.x);
            Cta ci(a, smem_raw, gp);
            if (tw == 0 && k == 0) tma_q(a, ci.sQ, ci.h0, static_cast<int>(ci.si), static_cast<int>(ci.bi), qbar);
            named_sync(kBarProd, 128);  // every producer thread is done with the last item's mask
            if (tw < kMaskWords) ci.mask[tw] = 0u;
            named_sync(kBarProd, 128);
            scan_tiles_vec<256, 4>(a, ci, ci.mask);
            named_sync(kBarProd, 128);
            use_tile_mask(ci, ci.mask);
            if (tw == 0) {
                put_slot(k, ci.bi, ci.si, gp.ht, ci.nt, g);
                if (k > 0) {
                    mbar_wait(q_free, (k - 1) & 1);  // item k - 1's last S chains are done
                    tma_q(a, ci.sQ, ci.h0, static_cast<int>(ci.si), static_cast<int>(ci.bi), qbar);
                }
            }
            PairProducer<ABL, FAST>(a, ci, bs_div).run(false, g, k + 1 == n_items);
            g += (ci.nt + 1) / 2;
        }
        if (tw == 0) put_slot(k, 0, 0, 0, -1, g);
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    const auto items_of = [&](auto wg_tag) {
        constexpr int W = decltype(wg_tag)::value;
        for (int k = 0;; ++k) {
            const ItemSlot &sl = slot[k & 1];
            mbar_wait(item_full + 8 * (k & 1), (k >> 1) & 1);
            c.nt = sl.nt;
            if (c.nt < 0) break;
            PairConsumer<W, ABL, FAST, true> wg(a, c);
            wg.g = sl.g;
            wg.q_free = q_free;
            const int np = (c.nt + 1) / 2;
            mbar_wait(qbar, k & 1);  // TMA's bytes are visible to wgmma once the phase completes
            // no S: Q is free once it landed (not before: the next item's TMA would arrive on qbar's pending phase)
            if (np == 0 && c.lane == 0) mbar_arrive(q_free);
            trace_edge(a, kTrQ);
            wg.run(np);
            trace_edge(a, kTrEpilogue);
            c.bi = sl.bi, c.si = sl.si, c.h0 = sl.ht * kHT;
            wg.epilogue_item();
            trace_edge(a, kTrEnd);
            // the slot may take item k + 2: every consumer thread, after its own reads of it (one arrival a warp after
            // __syncwarp drew racecheck's reports on the slot's stores, forty-first session)
            mbar_arrive(item_free + 8 * (k & 1));
        }
    };
    if (c.tid < 128) items_of(std::integral_constant<int, 0>{});
    else items_of(std::integral_constant<int, 1>{});
}

// The rule for the persistent form (SMLA_SM90P_PERSISTENT): a call without a top-k split whose Q the launcher described
// for TMA, and its SMLA_ATTN_PERSISTENT: on; auto (the measured rule above): "high", or a K source of at most half the
// device's L2.
bool persistent_here(const Args &a, bool fast)
{
    if (!kPersistent || a.n_splits != 1 || !a.q_tma) return false;
    switch (a.p.run.attn_persistent) {
    case SMLA_PERSISTENT_OFF: return false;
    case SMLA_PERSISTENT_ON: return true;
    default: return !fast || a.limit * kRowBytes <= static_cast<int64_t>(a.l2_bytes) / 2;  // SMLA_PERSISTENT_AUTO
    }
}

int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    // kCluster: a row's two head tiles are CTAs 2 m, 2 m + 1 (grid_pos_of)
    const int cluster = kCluster && a.n_ht == 2 && a.n_splits == 1 ? 2 : 1;
    return with_variant(a, [&](auto abl, auto fast) {
        constexpr int kAbl = decltype(abl)::value;
        constexpr bool kFast = decltype(fast)::value;
        if constexpr (kPersistent) {
            if (persistent_here(a, kFast))
                return launch_persistent<attn_sm90p_persistent_kernel<kAbl, kFast>>(a, grid, kThreads, Smem::bytes, s,
                                                                                     dev, st, cluster);
        }
        return launch_kernel<attn_sm90p_kernel<kAbl, kFast>>(a, grid, kThreads, Smem::bytes, s, dev, st, cluster);
    });
}

}  // namespace

// The table entry (bf16 K only).
constexpr KernelEntry entry()
{
    return KernelEntry{Family::sm90p, false, kHT, kBN, Smem::bytes, 1, kThreads, &launch, /*fuses=*/false,
                       /*q_tma=*/kQTmaScan};
}

}  // namespace pair
}  // namespace sm90
}  // namespace attn
