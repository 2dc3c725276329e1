// Hopper (sm_90a) sparse MLA decode kernel for h <= 16 over the fp8_ds_mla cache: the "dims kernel"
// (family sm90d). Heads on the MMA's M side with mma.sync (m16n8k16: M = 16 heads, so no padding at h =
// 16), and the 576 dims cut across warps instead of the tokens, so that every cache value is dequantised
// once, in registers, and feeds both products:
//   S  [16 heads x 8 tokens]  += Q [16 x 16 dims] K^T [16 dims x 8 tokens]   (B = K^T: a thread's pair of
//                                                                             dims of one token)
//   O  [16 heads x 8 dims]    += P [16 x 16 tokens] V [16 tokens x 8 dims]    (B = V: a pair of tokens of
//                                                                             one dim: the same values,
//                                                                             transposed by movmatrix)
// Why: the narrow wgmma kernel (sm90/narrow_kernel.cuh) writes every tile to shared memory as bf16 and
// reads it back twice as 16-head MMAs' A operand, and its tile time went to that shared-memory traffic;
// the register kernel (sm90/reg_kernel.cuh) removed the traffic but dequantised every value twice and
// lost it to instruction issue (benchmarks/README.md, issue 17). Here the cache rows land in shared
// memory as they are (bulk copies, 656 B a token), each value is read once by one thread and
// dequantised once, and the only other shared-memory traffic is the exchange of S's partial sums and P.
// Measured on the H200 step by step (benchmarks/README.md, issue 17, fifteenth session; dropped forms in
// the history): at h = 16, b = 128 1.24x ("high") and 1.33x ("fast") the narrow kernel's speed; bound
// by each warp's chain per tile.
//
// CTA = one query row x all heads (h <= 16; rows past h are zero) x one top-k split, 384 threads: two
// groups of four warps on alternate tiles of 32 tokens (group G: tiles G, G + 2, ..), each with its own
// online softmax (merged in the epilogue), and a producer warpgroup (setmaxnreg: the groups 232
// registers, it 40) whose warp p copies rows 8 p .. 8 p + 7 of every tile into its stage (one bulk copy
// a row; kStages stages, refilled once the group has read them: the empty mbarrier). Warp w of a group
// owns latent dims [128 w, 128 w + 128) (exactly scale tile w) and RoPE dims 512 + [16 w, 16 w + 16).
// Per tile and warp:
//   acquire : wait for the tile's stage (the full mbarrier: the producer warps' arrivals and the copied
//             bytes) and read its valid-token mask; a tile whose 32 tokens are all valid skips masking;
//   scores  : the 4 token blocks' loads (a thread's token 8 j + g: two 16-byte pieces of its latent
//             bytes, its scale, 8 bytes of RoPE; an invalid token's bytes and scale read as 0), then
//             k-step by k-step across the blocks: dequantised (dequant_e4m3x4, bf16_rne(float(e4m3) *
//             scale), the rule of every kernel) into the B fragment, the S MMA into the block's partial
//             S, and the fragment transposed (movmatrix) into P V's B fragments, kept in registers (64);
//   softmax : split_softmax: the 4 blocks' partial S through shared memory (a barrier of the group),
//             warp w sums block w's and runs its softmax against a lazy reference maximum, the blocks'
//             P fragments and maxima through shared memory (a second barrier; a third on the rare exact
//             step); then the group's thread 0 frees the stage;
//   pv      : O [16 x 128 dims of the warp] += P V: 2 k-steps x 16 dim blocks (high: twice).
// Dimension order: a k-step's fragment columns 2 t + e and 2 t + 8 + e (t = lane & 3) are the four
// consecutive dims 4 t + {0, 1, 2, 3} of a 16-dim piece, so a thread's B fragments of four k-steps are one
// 16-byte load; Q's fragments are kept in shared memory in the same order (one 16-byte load a k-step: held
// in registers they took 36 a thread, which the S phase's scheduling needs; benchmarks/README.md, issue
// 17, eighteenth session), and O's columns come out as 16 consecutive dims per thread
// and 64-dim chunk (epilogue).
// FAST: precision="fast" (P rounded to bf16, one P V MMA per k-step and dim block). STACK ("high" at h <= 8,
// where rows 8..15 of the MMAs are padding): row g of P carries head g's P_hi and row g + 8 its P_lo, so one
// P V MMA per k-step and dim block does both halves (O's rows g and g + 8, added in the epilogue).
// ABL != 0 only in profiling builds (sm90/kernel.cuh's bits): 1 no copies (stale bytes; the rows still
// arrive), 2 no S MMA, 4 no P V MMA, 8 no dequant (the raw words are the fragments), 32 idle consumers
// (each tile's stage waited for and freed at once: the producers' gather alone). Profiling builds also
// record the stage timestamps of sm90/trace.cuh (DimsEv; tools/trace_attn.py --kernel sm90d).
#pragma once

#include "attention/epilogue.cuh"
#include "attention/table.cuh"
#include "attention/sm90/plan.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/trace.cuh"
#include "attention/sm90/variants.cuh"

namespace attn {
namespace sm90 {
namespace dims {

constexpr int NH = 16;                        // heads per CTA: the MMA's M
constexpr int kTT = 32;                       // tokens per tile
constexpr int kBlocks = kTT / 8;              // 8-token blocks (the MMA's N) per tile
constexpr int kGroups = 2, kWarps = 4;        // groups of warps on alternate tiles; warps per group
constexpr int kConsumers = 32 * kWarps * kGroups;  // the two groups' threads
constexpr int kThreads = kConsumers + 128;         // and the producer warpgroup
constexpr int kConsumerRegs = 232, kProducerRegs = 40;  // setmaxnreg
static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "the register file");
constexpr int kStages = 8;                    // raw tiles in flight; even, so a stage serves one group
constexpr int kEntry = SMLA_FP8_ENTRY;        // 656 B: one token as the cache holds it
constexpr int kPitch = kEntry + 48;           // 704 B a row in smem: rows 8 j + g and + 1 are 64 B apart in
                                              // the 128-byte bank cycle, so a quarter warp's 16-byte loads
                                              // (two rows, 64 B each) hit 32 different banks
constexpr int kStageBytes = kTT * kPitch;     // 22,528 B
constexpr int kRowsPerWarp = kTT / kWarps;    // rows each warp of a group copies per refill
constexpr int kOStride = kDv + 4;             // floats per staged output row
constexpr int kKSteps = 9;                    // k-steps of a warp: 8 latent (128 dims) + 1 RoPE (16)
constexpr int kDimBlocks = 16;                // O's 8-dim blocks per warp (128 dims)
static_assert(kPitch % 128 == 64 && kPitch % 16 == 0, "row pitch: bank spread, bulk-copy alignment");
static_assert(kStages % kGroups == 0 && kRowsPerWarp == 8, "stages per group; a refill is 8 rows a warp");
static_assert(SMLA_FP8_TILE == 128 && SMLA_FP8_NUM_TILES == kWarps, "warp w owns scale tile w");
constexpr int kBarGroup = 1;                  // + group: the group's named barrier (128 threads)
constexpr int kBarAll = 3;                    // the two groups (kConsumers threads; the epilogue)

// Trace events (profiling builds, sm90/trace.cuh): a group's first warp at step k (its k-th tile), the
// producer's first and third warps at step i / 2 (tile i; events + 3 for odd tiles).
enum DimsEv {
    kDvTop = 0,      // consumer: the tile's loop top (before the full mbarrier)
    kDvLanded = 1,   // its stage is full
    kDvScores = 2,   // its loads, dequant and S MMAs issued
    kDvPartials = 3, // past the partial-S barrier
    kDvP = 4,        // past the P / maxima barrier
    kDvSoftmax = 5,  // the tile's P fragments in registers (after a rare exact step)
    kDvPv = 6,       // its P V MMAs issued
    kPrWait = 0,     // producer: before the empty mbarrier
    kPrFree = 1,     // the stage is free
    kPrIssued = 2,   // its copies issued
};
// Shared memory:
//   raw   : kStages raw tiles [32 tokens x kPitch] (tile i in stage i % kStages);
//   red   : float4 [kGroups][kWarps][kBlocks][32 lanes], each warp's partial S (rewritten for the group's
//           next tile only after its second barrier, which every read of this tile's precedes);
//   bar   : mbarriers full[kStages] (kWarps arrivals: the producer warps, with the copied bytes),
//           empty[kStages] (one arrival: the group's thread 0 once the group has read the stage);
//   mask  : uint32 [kStages], the valid tokens of each stage (byte w: warp w's rows);
//   pfr   : uint4 [kGroups][2 (P_hi, P_lo)][2 k-steps][32 lanes], the tile's P A fragments (split softmax);
//   smx   : float [kGroups][NH][kWarps], each warp's token block maxima (split softmax);
//   lsum  : double [kGroups][kWarps][NH], each warp's row sums; m: float [kGroups][NH], the row maxima;
//   qf    : uint4 [kWarps][kKSteps][32 lanes], Q's A fragments (both groups': warp w of either owns the
//           same dims), read per k-step rather than held in 36 registers a thread.
// The epilogue stages group G's O as float [NH][kOStride] over the raw tiles (all consumed by then).
struct Smem {
    static constexpr Region raw = first_region(kStages * kStageBytes);
    static constexpr Region red = region_after(raw, kGroups * kWarps * kBlocks * 32 * 16);
    static constexpr Region bar = region_after(red, 2 * kStages * 8);
    static constexpr Region mask = region_after(bar, kStages * 4);
    static constexpr Region pfr = region_after(mask, kGroups * 2 * 2 * 32 * 16);
    static constexpr Region smx = region_after(pfr, kGroups * NH * kWarps * 4);
    static constexpr Region lsum = region_after(smx, kGroups * kWarps * NH * 8);
    static constexpr Region m = region_after(lsum, kGroups * NH * 4);
    static constexpr Region qf = region_after(m, kWarps * kKSteps * 32 * 16);
    static constexpr int used = qf.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B (CtaCommon)
    static_assert(bar.off % 8 == 0 && lsum.off % 8 == 0 && red.off % 16 == 0 && pfr.off % 16 == 0 && smx.off % 16 == 0 &&
                      qf.off % 16 == 0,
                  "mbarriers, doubles, 16-byte vectors");
    static_assert(kGroups * NH * kOStride * 4 <= raw.bytes, "the staged outputs fit in the raw tiles");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

__device__ __forceinline__ uint32_t movm_trans(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// One warp of a group: its share of Q, O and the softmax state, and its part of the copies.
template <int ABL, bool FAST, bool STACK = false>
struct Warp {
    static constexpr bool kNoLoad = (ABL & 1) != 0, kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0;
    static constexpr bool kNoDq = (ABL & 8) != 0, kIdle = (ABL & 32) != 0;
    static constexpr bool kStack = STACK && !FAST, kOneP = FAST || kStack;  // one P V MMA per step

    const Args &a;
    const CtaCommon &c;
    const KvSource kv;
    const int grp, w, lane, g, t;
    const int tok0, tok_end, n;  // the slice's tokens [tok0, tok_end) and its tiles of kTT
    uint8_t *const raw;          // the stages (generic pointer: the reads are C++ loads after the mbarrier)
    float o[kDimBlocks][4];      // O [16 heads x 128 dims]: block n, columns 2 t + e (epilogue for the dims)
    uint32_t vb[kBlocks][8][2];  // this tile's P V B fragments: token block j, k-step s, half r
    float m_r[2];                // running maxima (log2 domain) of heads g, g + 8
    double l_r[2];               // this thread's share of their row sums
    const smla_udiv bs_div;      // the cache's block_size as a multiply-shift divisor

    __device__ __forceinline__ Warp(const Args &a_, const CtaCommon &c_)
        : a(a_), c(c_), kv(a_), grp(c_.tid >> 7), w((c_.tid >> 5) & 3), lane(c_.lane), g(c_.lane >> 2),
          t(c_.lane & 3), tok0(c_.j0 * kBN), tok_end(min(c_.L, (c_.j0 + c_.nt) * kBN)),
          n(c_.nt > 0 && tok_end > tok0 ? (tok_end - tok0 + kTT - 1) / kTT : 0),
          raw(c_.smem + Smem::raw.off),
          bs_div(smla_udiv_of(static_cast<uint64_t>(a_.p.kv.block_size)))
    {
#pragma unroll
        for (int i = 0; i < kDimBlocks; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
        m_r[0] = m_r[1] = -INFINITY;
        l_r[0] = l_r[1] = 0.0;
    }

    __device__ __forceinline__ uint32_t full(int st) const { return c.bar_full + 8 * st; }
    __device__ __forceinline__ uint32_t empty(int st) const { return c.bar_full + 8 * (kStages + st); }
    __device__ __forceinline__ uint32_t *mask() const { return reinterpret_cast<uint32_t *>(c.smem + Smem::mask.off); }

    // Q's A fragments (heads g, g + 8) into qf, by group 0 (both groups wait for them: kBarAll): k-step s
    // < 8 is latent dims 128 w + 64 (s / 4) + 16 t + 4 (s % 4) + {0..3}, k-step 8 RoPE dims 512 + 16 w + 4 t
    // + {0..3}; the first two are columns 2 t, + 1, the last two 2 t + 8, + 9.
    __device__ __forceinline__ void load_q() const
    {
        if (grp == 0) {
#pragma unroll
            for (int s = 0; s < kKSteps; ++s) {
                uint2 v[2];
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int hd = g + 8 * hf;
                    const int d = s < 8 ? 128 * w + 64 * (s >> 2) + 16 * t + 4 * (s & 3) : kDv + 16 * w + 4 * t;
                    v[hf] = make_uint2(0u, 0u);
                    if (hd < c.h) v[hf] = __ldg(reinterpret_cast<const uint2 *>(smla_q_at(&a.p, c.bi, c.si, hd, d)));
                }
                st_shared_v4(q_frag(s), make_uint4(v[0].x, v[1].x, v[0].y, v[1].y));
            }
        }
        named_sync(kBarAll, kConsumers);
    }

    // The shared-memory address of this thread's Q fragment of k-step s.
    __device__ __forceinline__ uint32_t q_frag(int s) const
    {
        return c.base + Smem::qf.off + ((w * kKSteps + s) * 32 + lane) * 16;
    }

    // The index of row 8 w + lane of tile i (lanes < 8; -1 past the slice's tokens or tiles).
    __device__ __forceinline__ int fetch(int i) const
    {
        const int pos = tok0 + kTT * i + kRowsPerWarp * w + lane;
        return i < n && lane < kRowsPerWarp && pos < tok_end ? __ldg(c.idx_row + pos) : -1;
    }

    // The cache row of a valid slot (the division by block_size precomputed).
    __device__ __forceinline__ const uint8_t *row_of(int idx) const
    {
        return bs_div.m ? smla_cache_entry_udiv(kv.kv_base, static_cast<uint32_t>(idx), kv.block_size, bs_div,
                                                a.p.kv.block_stride, a.p.kv.entry_stride)
                        : kv.row(idx, true);
    }

    // This warp's 8 rows of tile i into its stage: the mask byte and the expected bytes by lane 0 (its
    // arrival), then one bulk copy per valid row. (16-byte cp.async, four lanes a row, measured slower:
    // benchmarks/README.md.)
    __device__ __forceinline__ void issue(int i, int idx) const
    {
        const int st = i % kStages;
        const bool ok = kv.valid(idx);  // lanes >= 8: idx -1
        const uint32_t vm = __ballot_sync(0xffffffffu, ok);
        if (lane == 0) {
            reinterpret_cast<uint8_t *>(mask() + st)[w] = static_cast<uint8_t>(vm);
            mbar_arrive_expect_tx(full(st), kNoLoad ? 0u : static_cast<uint32_t>(__popc(vm)) * kEntry);
        }
        __syncwarp();
        if (ok && !kNoLoad)
            bulk_copy_g2s(c.sK + st * kStageBytes + (kRowsPerWarp * w + lane) * kPitch, row_of(idx), kEntry, full(st));
    }

    // The producer warpgroup's warp w: its rows of every tile, the first kStages at once (their indices
    // loaded together), then each once its stage is free (the empty mbarrier: the group has read it).
    __device__ __forceinline__ void produce()
    {
        int v[kStages];
#pragma unroll
        for (int u = 0; u < kStages; ++u) v[u] = fetch(u);
#pragma unroll
        for (int u = 0; u < kStages; ++u)
            if (u < n) issue(u, v[u]);
        int nx = fetch(kStages);
#pragma unroll 1
        for (int i = kStages; i < n; ++i) {
            const int cur = nx;
            nx = fetch(i + 1);
            trace(a, i >> 1, kPrWait + 3 * (i & 1));
            mbar_wait(empty(i % kStages), ((i / kStages) - 1) & 1);
            trace(a, i >> 1, kPrFree + 3 * (i & 1));
            issue(i, cur);
            trace(a, i >> 1, kPrIssued + 3 * (i & 1));
        }
    }

    // Partial S of tile i's stage (valid tokens vm; FULL: all) into acc, and the P V fragments into vb: the
    // 4 token blocks' loads, then k-step by k-step across the blocks (4 independent MMA chains).
    template <bool FULL>
    __device__ __forceinline__ void scores(const uint8_t *stage, uint32_t vm, float (&acc)[kBlocks][4])
    {
        uint4 x[kBlocks][2];
        float sc[kBlocks];
        uint2 rp[kBlocks];
#pragma unroll
        for (int j = 0; j < kBlocks; ++j) {
            const uint8_t *row = stage + (8 * j + g) * kPitch;
            x[j][0] = *reinterpret_cast<const uint4 *>(row + 128 * w + 16 * t);
            x[j][1] = *reinterpret_cast<const uint4 *>(row + 128 * w + 64 + 16 * t);
            sc[j] = *reinterpret_cast<const float *>(row + SMLA_FP8_SCALE_OFF + 4 * w);
            rp[j] = *reinterpret_cast<const uint2 *>(row + SMLA_FP8_ROPE_OFF + 32 * w + 8 * t);
            if (!FULL && !((vm >> (8 * j + g)) & 1u)) {  // stale or never-written bytes: V must be 0 (0 * NaN
                x[j][0] = x[j][1] = make_uint4(0u, 0u, 0u, 0u);  // would not be)
                sc[j] = 0.f;
            }
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
        }
        // k-step s < 8 of block j: dequantise, the S MMA, the two P V fragments
        auto step = [&](int j, int s, const uint32_t (&qa)[4]) {
            uint32_t k0, k1;
            const uint32_t v = word(x[j][s >> 2], s & 3);
            if constexpr (kNoDq) k0 = k1 = v;
            else dequant_e4m3x4(v, sc[j], k0, k1);
            if constexpr (!kNoS) mma_bf16(acc[j], qa, k0, k1);
            vb[j][s][0] = movm_trans(k0);
            vb[j][s][1] = movm_trans(k1);
        };
        auto q_at = [&](int s, uint32_t (&qa)[4]) {
            const uint4 u = ld_shared_v4(q_frag(s));
            qa[0] = u.x, qa[1] = u.y, qa[2] = u.z, qa[3] = u.w;
        };
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            uint32_t qa[4];
            q_at(s, qa);
#pragma unroll
            for (int j = 0; j < kBlocks; ++j) step(j, s, qa);
        }
        uint32_t qr[4];
        q_at(8, qr);
#pragma unroll
        for (int j = 0; j < kBlocks; ++j)  // the RoPE k-step, last (the same order either way)
            if constexpr (!kNoS) mma_bf16(acc[j], qr, rp[j].x, rp[j].y);
    }

    // The split softmax of the group's k-th tile (valid tokens vm; FULL: all): partial S in acc (all 4
    // blocks) -> P A fragments (pa: P_hi, pl: P_lo) of the whole tile.
    //   partials : every warp's 4 blocks into red; barrier; warp w sums block w's 4 partials (warp order);
    //   block    : mask, scale, saturation, the block's per-head maxima (in-warp shuffles), P = 2^(S - m_r)
    //              against the running (reference) maximum, P's fragments and the maxima into smem; barrier;
    //   verdict  : the tile's maxima from all 4 warps; if every head's is within kLazySlack of m_r (the same
    //              verdict in every warp: all read the same maxima), P stands and nothing is rescaled; else
    //              (a new maximum, the first tile, saturation) the exact step: m_r moves to the tile's
    //              maximum, P again, O and the row sums rescaled by alpha, P rewritten; barrier;
    //   gather   : the tile's P fragments.
    template <bool FULL>
    __device__ __forceinline__ void split_softmax(int k, float (&acc)[kBlocks][4], uint32_t vm, uint32_t (&pa)[2][4],
                                                  uint32_t (&pl)[2][4])
    {
        const uint32_t red = c.base + Smem::red.off + grp * kWarps * kBlocks * 32 * 16;
#pragma unroll
        for (int j = 0; j < kBlocks; ++j)
            st_shared_v4(red + ((w * kBlocks + j) * 32 + lane) * 16,
                         make_uint4(__float_as_uint(acc[j][0]), __float_as_uint(acc[j][1]),
                                    __float_as_uint(acc[j][2]), __float_as_uint(acc[j][3])));
        named_sync(kBarGroup + grp, 32 * kWarps);
        trace(a, k, kDvPartials);
        float x[4];
#pragma unroll
        for (int v = 0; v < kWarps; ++v) {
            const uint4 u = ld_shared_v4(red + ((v * kBlocks + w) * 32 + lane) * 16);
            const float f[4] = {__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w)};
#pragma unroll
            for (int e = 0; e < 4; ++e) x[e] = v == 0 ? f[e] : x[e] + f[e];
        }
        // x[e]: head g + 8 (e >> 1), token 8 w + 2 t + (e & 1)
        bool ok[4];
        float bm[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            ok[e] = FULL || ((vm >> (8 * w + 2 * t + (e & 1))) & 1u);
            x[e] = ok[e] ? x[e] * a.scale_log2 : -INFINITY;
            bm[e >> 1] = fmaxf(bm[e >> 1], x[e]);
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            if (sat_needed(bm[hf], m_r[hf])) {
#pragma unroll
                for (int e = 2 * hf; e < 2 * hf + 2; ++e)
                    if (ok[e]) x[e] = sat_score(x[e]);
                bm[hf] = fmaxf(x[2 * hf], x[2 * hf + 1]);
            }
            bm[hf] = fmaxf(bm[hf], __shfl_xor_sync(0xffffffffu, bm[hf], 1));
            bm[hf] = fmaxf(bm[hf], __shfl_xor_sync(0xffffffffu, bm[hf], 2));
        }
        float *smx = reinterpret_cast<float *>(c.smem + Smem::smx.off) + grp * NH * kWarps;
        const uint32_t pfr = c.base + Smem::pfr.off + grp * 2 * 2 * 32 * 16;
        // this block's part of the A fragment of k-step w / 2: registers 2 (w & 1) + {0, 1} (heads g, g + 8)
        const uint32_t pdst = pfr + ((w >> 1) * 32 + lane) * 16 + (w & 1) * 8;
        auto put = [&](const float (&p)[4]) {
            uint32_t h0, h1, l0, l1;
            if constexpr (FAST) {
                h0 = pack_bf16x2(p[0], p[1]);
                h1 = pack_bf16x2(p[2], p[3]);
                st_shared_v2(pdst, h0, h1);
            } else if constexpr (kStack) {  // rows g + 8: head g's P_lo (heads g + 8 are padding)
                split_bf16x2(p[0], p[1], h0, l0);
                st_shared_v2(pdst, h0, l0);
            } else {
                split_bf16x2(p[0], p[1], h0, l0);
                split_bf16x2(p[2], p[3], h1, l1);
                st_shared_v2(pdst, h0, h1);
                st_shared_v2(pdst + 2 * 32 * 16, l0, l1);
            }
        };
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) p[e] = ex2(x[e] - m_r[e >> 1]);
        put(p);
        if (t == 0) {
            smx[g * kWarps + w] = bm[0];
            smx[(g + 8) * kWarps + w] = bm[1];
        }
        named_sync(kBarGroup + grp, 32 * kWarps);
        trace(a, k, kDvP);
        float tm[2];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const float4 q = *reinterpret_cast<const float4 *>(smx + (g + 8 * hf) * kWarps);
            tm[hf] = fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w));
        }
        const bool lazy = m_r[0] != -INFINITY && m_r[1] != -INFINITY && tm[0] <= m_r[0] + kLazySlack &&
                          tm[1] <= m_r[1] + kLazySlack;
        if (__all_sync(0xffffffffu, lazy)) {
            l_r[0] += static_cast<double>(p[0] + p[1]);
            l_r[1] += static_cast<double>(p[2] + p[3]);
        } else {  // the exact step (every warp of the group takes it)
            float base[2], alpha[2];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const float mn = fmaxf(m_r[hf], tm[hf]);
                base[hf] = mn == -INFINITY ? 0.f : mn;
                alpha[hf] = ex2(m_r[hf] - base[hf]);
                m_r[hf] = mn;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) p[e] = ex2(x[e] - base[e >> 1]);
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
                l_r[hf] = l_r[hf] * static_cast<double>(alpha[hf]) + static_cast<double>(p[2 * hf] + p[2 * hf + 1]);
#pragma unroll
            for (int i = 0; i < kDimBlocks; ++i) {
                o[i][0] *= alpha[0], o[i][1] *= alpha[0];
                o[i][2] *= alpha[kStack ? 0 : 1], o[i][3] *= alpha[kStack ? 0 : 1];
            }
            put(p);  // over the lazy P, which no warp reads
            named_sync(kBarGroup + grp, 32 * kWarps);
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            const uint4 u = ld_shared_v4(pfr + (kk * 32 + lane) * 16);
            pa[kk][0] = u.x, pa[kk][1] = u.y, pa[kk][2] = u.z, pa[kk][3] = u.w;
            if constexpr (!kOneP) {
                const uint4 v = ld_shared_v4(pfr + 2 * 32 * 16 + (kk * 32 + lane) * 16);
                pl[kk][0] = v.x, pl[kk][1] = v.y, pl[kk][2] = v.z, pl[kk][3] = v.w;
            }
        }
    }

    __device__ __forceinline__ void pv(const uint32_t (&pa)[2][4], const uint32_t (&pl)[2][4])
    {
        if constexpr (!kNoPV) {
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
#pragma unroll
                for (int i = 0; i < kDimBlocks; ++i) {
                    mma_bf16(o[i], pa[kk], vb[2 * kk][i >> 1][i & 1], vb[2 * kk + 1][i >> 1][i & 1]);
                    if constexpr (!kOneP)
                        mma_bf16(o[i], pl[kk], vb[2 * kk][i >> 1][i & 1], vb[2 * kk + 1][i >> 1][i & 1]);
                }
        }
    }

    __device__ __forceinline__ void run()
    {
#pragma unroll 1
        for (int i = grp, k = 0; i < n; i += kGroups, ++k) {
            const int st = i % kStages;
            trace(a, k, kDvTop);
            mbar_wait(full(st), (i / kStages) & 1);
            trace(a, k, kDvLanded);
            if constexpr (kIdle) {  // profiling: the gather alone
                if (w == 0 && lane == 0) mbar_arrive(empty(st));
                continue;
            }
            const uint32_t vm = mask()[st];
            const bool full = vm == 0xffffffffu;  // all 32 tokens valid: no masking (the same in every warp)
            float s[kBlocks][4];
            if (full) scores<true>(raw + st * kStageBytes, vm, s);
            else scores<false>(raw + st * kStageBytes, vm, s);
            trace(a, k, kDvScores);
            uint32_t pa[2][4], pl[2][4];
            if (full) split_softmax<true>(k, s, vm, pa, pl);
            else split_softmax<false>(k, s, vm, pa, pl);
            trace(a, k, kDvSoftmax);
            // every warp of the group has its bytes of the stage in registers: the producer may refill it
            if (w == 0 && lane == 0) mbar_arrive(empty(st));
            pv(pa, pl);
            trace(a, k, kDvPv);
        }
    }

    // Each group's O (dims back in order) and row statistics into smem, then warp W of the CTA writes
    // heads W and W + 8 with the two states merged (finish_merged_row).
    __device__ __forceinline__ void epilogue()
    {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            l_r[hf] += __shfl_xor_sync(0xffffffffu, l_r[hf], 1);
            l_r[hf] += __shfl_xor_sync(0xffffffffu, l_r[hf], 2);
        }
        double *sl = reinterpret_cast<double *>(c.smem + Smem::lsum.off);
        float *sm = reinterpret_cast<float *>(c.smem + Smem::m.off);
        named_sync(kBarAll, kConsumers);  // both groups are done with the stages the outputs go to
        float *so = reinterpret_cast<float *>(raw) + grp * NH * kOStride;
#pragma unroll
        for (int ch = 0; ch < 2; ++ch)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = 2 * (4 * ch + q), dim = 128 * w + 64 * ch + 16 * t + 4 * q;
                if constexpr (kStack) {  // head g: the P_hi and P_lo rows added
                    *reinterpret_cast<float4 *>(so + g * kOStride + dim) = make_float4(
                        o[i][0] + o[i][2], o[i][1] + o[i][3], o[i + 1][0] + o[i + 1][2], o[i + 1][1] + o[i + 1][3]);
                } else {
                    *reinterpret_cast<float4 *>(so + g * kOStride + dim) =
                        make_float4(o[i][0], o[i][1], o[i + 1][0], o[i + 1][1]);
                    *reinterpret_cast<float4 *>(so + (g + 8) * kOStride + dim) =
                        make_float4(o[i][2], o[i][3], o[i + 1][2], o[i + 1][3]);
                }
            }
        // the row sums: each warp's share (its own token blocks)
        if (t == 0) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) sl[(grp * kWarps + w) * NH + g + 8 * hf] = l_r[hf];
        }
        if (w == 0 && t == 0) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) sm[grp * NH + g + 8 * hf] = m_r[hf];
        }
        named_sync(kBarAll, kConsumers);
        const int wc = c.tid >> 5;
        const float *o0 = reinterpret_cast<const float *>(raw), *o1 = o0 + NH * kOStride;
        for (int hd = wc; hd < NH && hd < c.h; hd += kConsumers / 32) {
            double l0 = 0.0, l1 = 0.0;
#pragma unroll
            for (int v = 0; v < kWarps; ++v) {
                l0 += sl[v * NH + hd];
                l1 += sl[(kWarps + v) * NH + hd];
            }
            finish_merged_row(a, c.row, c.bi, c.si, c.sp, c.h, hd, lane, sm[hd], sm[NH + hd], l0, l1,
                              o0 + hd * kOStride, o1 + hd * kOStride);
        }
    }
};

// Internal linkage: each instantiation file owns its kernels.
namespace {

template <int ABL, bool FAST, bool STACK>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90d_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    extern __shared__ uint8_t smem_raw[];
    const CtaCommon c(a, smem_raw, grid_pos(a), 0, Smem::raw.off, Smem::bar.off, Smem::mask.off);

    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    if (c.tid == 0) {
#pragma unroll
        for (int st = 0; st < kStages; ++st) {
            mbar_init(c.bar_full + 8 * st, kWarps);
            mbar_init(c.bar_full + 8 * (kStages + st), 1);
        }
        fence_mbarrier_init();
    }
    __syncthreads();
    if (c.tid >= kConsumers) {  // the producer warpgroup
        setmaxnreg_dec<kProducerRegs>();
        Warp<ABL, FAST, STACK>(a, c).produce();
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    trace_edge(a, kTrStart);
    Warp<ABL, FAST, STACK> wp(a, c);
    if (wp.n > 0) wp.load_q();  // beside the producer's first index loads and copies
    if (wp.n > 0) wp.run();
    trace_edge(a, kTrEpilogue);
    wp.epilogue();
    trace_edge(a, kTrEnd);
}

// The variant the call asks for (sm90/variants.cuh).
int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    const bool stack = a.p.h <= NH / 2;  // "high" with the heads in rows 0..7: P_hi and P_lo stacked
    return with_variant(a, [&](auto abl, auto fast) {
        constexpr int A = decltype(abl)::value;
        constexpr bool F = decltype(fast)::value;
        if constexpr (!F && A == 0)
            if (stack) return launch_kernel<attn_sm90d_kernel<A, F, true>>(a, grid, kThreads, Smem::bytes, s, dev, st);
        return launch_kernel<attn_sm90d_kernel<A, F, false>>(a, grid, kThreads, Smem::bytes, s, dev, st);
    });
}

}  // namespace

// The table entry of the dims kernel (fp8_ds_mla only, h <= 16). Its split plan counts tiles of kBN = 64
// tokens (row_slice), two of its own.
constexpr KernelEntry entry() { return KernelEntry{Family::sm90d, true, NH, kBN, Smem::bytes, 1, kThreads, &launch}; }

}  // namespace dims
}  // namespace sm90
}  // namespace attn
