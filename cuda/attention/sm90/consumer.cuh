// The two consumer warpgroups of the wgmma kernel. They do not run in lockstep: WG0 owns the scores
// and the softmax of a whole 64-token K tile, WG1 only consumes them, so WG1's share of P V overlaps
// WG0's next S and softmax on the tensor cores (FlashMLA's split of the work).
//
//   WG0, ScoreWarpgroup (setmaxnreg WgRegs::score), per K tile:
//     acquire  : wait until the producer filled the buffer (XO: and the peer's half arrived);
//     s_phase  : S[64 heads x 64 tokens] = Q K^T, wgmma m64n64k16 x 36 from smem (bf16 "fast": the first
//                kQRegSteps with Q from registers, plan.cuh) as kSChains (2) chains summed in fp32 (the
//                accuracy rule, sm90/score_tile.cuh);
//     softmax  : mask and scale (log2 domain), overflow saturated where it matters, row maxima within
//                the thread's quad (no exchange: WG0 sees every token), alpha = 2^(m_old - m_new),
//                P = 2^(S - m) packed as the bf16 A fragments of P V (high: P = P_hi + P_lo, two
//                bf16 terms, split_bf16x2), row sums in double; with kSpecSoftmax (softmax_spec) the
//                exponents first, against the reference max, beside the maxima's reduction;
//     publish  : (stmatrix) P_hi into the tile's RoPE block (dead once S is done), P_lo into its own block (high:
//                after WG1 freed it, kBarFree), alpha into sAlpha[b]; arrive kBarP + b;
//     pv       : O[:, 0:SPLIT] = O * alpha + P V with P from registers (register A: m64n128k16 for the
//                bf16 kernel's default SPLIT = 128, m64n256k16 for 256, plan.cuh);
//     release  : hand the buffer back to the producer(s).
//   WG1, ValueWarpgroup (setmaxnreg WgRegs::value), per K tile: wait kBarP + b, O[:, SPLIT:512] = O * alpha + P V
//     with P from smem, free P_lo (kBarFree), release.
// Then the epilogue: WG0 publishes the final row maxima and sums (kBarL) and each warpgroup writes its
// columns (finish_o_cols, sm90/score_tile.cuh). Register budgets per split: WgRegs (plan.cuh).
// Trace events per tile (profiling builds, sm90/trace.cuh): WG0 0 start, 1 K landed, 2 S done, 3 softmax
// done, 4 P published, 5 its P V done; WG1 0 start, 1 P received, 2 its P V done; producer (Bf16Producer)
// 0 start, 1 buffer free, 2 copies issued, 3 this thread's copies landed.
// FAST (precision="fast", docs/design.md section 4): P is one bf16 term, P V one MMA per k-step.
// ABL (profiling builds only, sm90/kernel.cuh): bit 2 leaves out the S = Q K^T wgmma, 4 the P V
// wgmma, 16 the P_lo V wgmma (high only).
#pragma once

#include "attention/epilogue.cuh"
#include "attention/sm90/plan.cuh"
#include "attention/sm90/score_tile.cuh"
#include "attention/sm90/trace.cuh"

namespace attn {
namespace sm90 {

// The consumers' wait for Q, which they loaded themselves (the producer is already fetching K).
__device__ __forceinline__ void wait_q()
{
    cp_async_wait_all();  // this thread's part of Q
    fence_async_smem();
    named_sync(kBarQ, 256);  // all of Q landed (and visible to wgmma)
}

// What both consumer warpgroups share: the thread's place (rows r0, r0 + 8 of the 64 heads, column
// pairs 2 t4 + 8 jn of its warpgroup's accumulator), the buffer hand-off and its share of O: NC columns
// from C0 (256 each by default; SMLA_SM90_SPLIT = 128, bf16 only: WG0 128, WG1 384, plan.cuh).
template <int ABL, bool XO, bool FAST, int NC = 256, int C0 = 0>
struct ConsumerBase {
    static constexpr bool kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0, kNoLo = FAST || (ABL & 16) != 0;

    const Args &a;
    const uint32_t peer_base;  // XO: the peer's address of our smem base
    const int lane;
    const int wg;              // 0: scores + output columns 0..SPLIT-1; 1: output columns SPLIT..511
    const int g, t4;
    const int r0;              // this thread's rows r0, r0 + 8
    float o[NC / 2];           // O[r0 / r0 + 8][col0 + 8 jn + 2 t4 + {0, 1}] at o[4 jn + {0, 1} / {2, 3}]

    __device__ __forceinline__ ConsumerBase(const Args &a_, const Cta<XO> &cta, uint32_t peer_base_)
        : a(a_), peer_base(peer_base_), lane(cta.lane), wg(cta.tid >> 7), g(cta.lane >> 2), t4(cta.lane & 3),
          r0(16 * ((cta.tid >> 5) & 3) + (cta.lane >> 2))
    {
#pragma unroll
        for (int i = 0; i < NC / 2; ++i) o[i] = 0.f;
    }

    // The first of this warpgroup's O columns (the even split from wg at run time: its measured code).
    __device__ __forceinline__ int col0() const { return NC == 256 ? 256 * wg : C0; }

    __device__ __forceinline__ void acquire(const Cta<XO> &c, int b, int use) const
    {
        mbar_wait(c.bar_full + 8 * b, use & 1);
        if constexpr (XO) {
            mbar_wait(c.bar_rr + 8 * b, use & 1);  // the peer's half of the tile
            fence_async_smem();
        }
    }

    // This warp is done with K buffer b (XO: tell the peer's producer too). XO arrives once per warp
    // (16 arrivals per tile on each CTA's empty barrier instead of 512): the other lanes' reads for the
    // tile - their wgmma operands, complete at wgmma.wait_group, WG0's loads of the sValid flags and
    // WG1's loads of sAlpha[b], consumed before - are ordered before lane 0's arrivals by __syncwarp,
    // which orders memory among the lanes it synchronises. The next writes of those bytes come after
    // the arrivals: the producers' (both CTAs') stores of tile it + 2 wait on them, and WG0 writes
    // sAlpha[b] again only once it acquired tile it + 2 (full[b], which the producer arrives on after
    // its wait). compute-sanitizer racecheck credits an arrival only to the thread that made it, so in
    // the XO kernels it reports those lanes' reads against the next writes as WAR hazards (producer.cuh
    // store / mask_scores on sValid; publish / ValueWarpgroup::tile on sAlpha, "fast" only: "high" also
    // orders them through kBarFree): ordering it cannot see, not a race (docs/design.md, section 1).
    __device__ __forceinline__ void release(const Cta<XO> &c, int b) const
    {
        if constexpr (XO) {
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(c.bar_empty + 8 * b);
                mbar_arrive_remote(peer_base + (c.bar_empty + 8 * b - c.base));
            }
        } else {
            mbar_arrive(c.bar_empty + 8 * b);
        }
    }

    __device__ __forceinline__ void rescale(const float (&alpha)[2]) { rescale_rows(o, alpha); }

    // V = the K buffer's (descriptor base vd = desc_base(kb, kBlk)) columns 256 wg .. + 255 (the even
    // split), k-step kk (tokens 16 kk ..), N-major; v_desc_at: from column block blk (64 columns) on.
    __device__ __forceinline__ uint64_t v_desc(uint32_t vd, int kk) const
    {
        return desc_at(vd, (4 * wg) * kBlk + (16 * kk) * 128);
    }
    __device__ __forceinline__ static uint64_t v_desc_at(uint32_t vd, int kk, int blk)
    {
        return desc_at(vd, blk * kBlk + (16 * kk) * 128);
    }

    // kEarlyOut (plan.cuh), a direct output through shared memory (no top-k split): WG0 hands WG1 each row's output
    // factor (out_factors: Q's block 8, which the staged output leaves alone, dead once WG0's last S is done) and
    // arrives at kBarL without waiting, so that it stages and stores its columns at once; WG1 waits there and takes
    // the factors (no double arithmetic of its own).
    __device__ __forceinline__ bool early_out() const { return kEarlyOut && staged_direct(a); }
    __device__ __forceinline__ static float *out_factors(const Cta<XO> &c)
    {
        return reinterpret_cast<float *>(c.smem + Smem::q.off + 8 * kBlk);
    }

    // The epilogue of this warpgroup's NC columns, once WG0 published the row statistics (kBarL); mt:
    // the rows' true maxima (max_logits, which only WG0, half 0, writes). SPLITS: the kernel always writes
    // split partials (the fused split decode), so the direct output's code is left out.
    template <bool SPLITS>
    __device__ __forceinline__ void finish(const Cta<XO> &c, const float (&mt)[2])
    {
        named_sync(kBarL, 256);  // also: every S is done, so Q's region may hold the staged output
        trace_edge(a, kTrStats);
        const auto stat = [&](int hf, int rl) { return RowStat{c.sM[rl], c.sL[rl], mt[hf]}; };
        finish_o_cols<SPLITS>(a, c, c.h0, r0, col0(), t4, o, stat, c.sQ, kBarOut + wg);
    }
};

// WG0: S, softmax, P for both warpgroups, and P V for output columns 0 .. SPLIT - 1 (256 or 128).
// BF16: the bf16 cache's instantiation, whose producers flag the tiles whose rows are all valid (Bf16Producer's
// TILE_FLAG, with kSpecSoftmax) and whose register budget has room for some of Q in "fast" (q_reg_steps; plan.cuh).
template <int ABL, bool XO, bool FAST, int SPLIT = 256, bool BF16 = false>
struct ScoreWarpgroup : ConsumerBase<ABL, XO, FAST, SPLIT, 0> {
    using B = ConsumerBase<ABL, XO, FAST, SPLIT, 0>;
    static constexpr bool kFullFlag = BF16 && kSpecSoftmax;  // Bf16Producer's TILE_FLAG
    static constexpr int kQr = q_reg_steps(!BF16, FAST);      // S's k-steps with Q from registers (plan.cuh)
    uint32_t qf[kQr > 0 ? kQr : 1][4];                         // their A fragments, this warp's 16 heads
    using B::a, B::g, B::t4, B::r0, B::o;
    float m_r[2] = {-INFINITY, -INFINITY};  // the reference max of P = 2^(S - m_r) (see softmax)
    float m_t[2] = {-INFINITY, -INFINITY};  // the true row max (max_logits)
    double l_r[2] = {0.0, 0.0};  // row sums in double (see sm80/tile.cuh)
    // The persistent kernel's item after the first (sm90/kernel.cuh): before this warpgroup first writes what WG1 still
    // reads from the last item (P_lo, "high": its first tile's publish; the row factors: the epilogue), it meets WG1's
    // arrival at kBarItem (item_sync, once). false in the one-item kernel.
    bool item_pending = false;
    // kLazyMax (plan.cuh): the reference max moves only when a tile's max exceeds it by more than
    // kLazySlack (log2 units, attention/softmax.cuh), so P <= 2^8 and O, l and WG1's O are rescaled
    // rarely (the max of random scores keeps creeping up in most tiles). lse = m_r + log2(l) holds for any reference; m_t gives
    // max_logits. Otherwise m_r is the running max itself.

    __device__ __forceinline__ ScoreWarpgroup(const Args &a_, const Cta<XO> &cta, uint32_t peer_base_,
                                              bool after_item = false)
        : B(a_, cta, peer_base_), item_pending(after_item)
    {
        // Q landed (wait_q / q_full): ldmatrix x4 per k-step, matrices (heads +0 / +8) x (dims +0 / +8)
        const int row = (r0 & ~15) + (B::lane & 7) + 8 * ((B::lane >> 3) & 1);
#pragma unroll
        for (int kk = 0; kk < kQr; ++kk) ldsm_x4(qf[kk], blk_addr(cta.sQ, row, 2 * kk + (B::lane >> 4)));
    }

    // d (+)= Q K^T over k-steps k0 .. k1 - 1 (16 dims each), all 64 tokens.
    __device__ __forceinline__ void s_chain(const Cta<XO> &c, float (&d)[32], int k0, int k1, uint32_t kb,
                                            bool add) const
    {
        const uint32_t qd = opaque(desc_base(c.sQ, 16)), kd = opaque(desc_base(kb, 16));
        wg_fence();  // d was read since its last wgmma
#pragma unroll
        for (int kk = k0; kk < k1; ++kk) {
            const uint32_t off = (kk >> 2) * kBlk + (kk & 3) * 32;
            if (kk < kQr) wgmma_rs(d, qf[kk < kQr ? kk : 0], desc_at(kd, off), add || kk > k0);
            else wgmma_ss<0>(d, desc_at(qd, off), desc_at(kd, off), add || kk > k0);
        }
        wg_commit();
    }

    // S[64 heads x 64 tokens] as kSChains chains of 36 / kSChains k-steps (the accuracy rule,
    // sm90/score_tile.cuh). Chain 0 (into s) is issued by issue_s0 right after the buffer is acquired.
    static constexpr int kChainSteps = 36 / kSChains;
    __device__ __forceinline__ void issue_s0(const Cta<XO> &c, uint32_t kb, float (&s)[32]) const
    {
        if constexpr (!B::kNoS) s_chain(c, s, 0, kChainSteps, kb, false);
    }
    __device__ __forceinline__ void s_phase(const Cta<XO> &c, uint32_t kb, float (&s)[32]) const
    {
        if constexpr (B::kNoS) {
#pragma unroll
            for (int i = 0; i < 32; ++i) s[i] = 0.f;
        } else if constexpr (kSChains == 1) {
            wg_wait0();
            fence_regs(s);
        } else {
            float t[32];
#pragma unroll
            for (int ch = 1; ch < kSChains; ++ch) {
                s_chain(c, t, ch * kChainSteps, (ch + 1) * kChainSteps, kb, false);
                wg_wait0();
                fence_regs(s);
                fence_regs(t);
#pragma unroll
                for (int i = 0; i < 32; ++i) s[i] += t[i];
            }
        }
    }

    // Mask, scale and the tile's row maxima over the 64 tokens of K buffer b (sm90/score_tile.cuh).
    __device__ __forceinline__ void mask_scores(const Cta<XO> &c, int b, float (&s)[32], float (&mx)[2]) const
    {
        sm90::mask_scores(c.sValid + b * kBN, a.scale_log2, t4, m_r, s, mx);
    }

    // P = 2^(s sc + nb[row]) (nb: minus the rows' bases; sc: the scale the FFMA applies, 1 for scaled scores)
    // as the A fragments of the 4 k-steps of P V (hi: bf16_rne(p); lo: the rest, high only), and the row sums.
    __device__ __forceinline__ static void exps(const float (&s)[32], float sc, const float (&nb)[2],
                                                uint32_t (&hi)[16], uint32_t (&lo)[16], float (&rs)[2])
    {
        rs[0] = rs[1] = 0.f;
        // accumulator column block jn (tokens 8 jn + 2 t4, + 1) is half jn & 1 of k-step jn >> 1:
        // A fragment registers 4 (jn >> 1) + 2 (jn & 1) + {0: row r0, 1: row r0 + 8}
#pragma unroll
        for (int jn = 0; jn < 8; ++jn) {
            const float p0 = ex2(fmaf(s[4 * jn + 0], sc, nb[0])), p1 = ex2(fmaf(s[4 * jn + 1], sc, nb[0]));
            const float p2 = ex2(fmaf(s[4 * jn + 2], sc, nb[1])), p3 = ex2(fmaf(s[4 * jn + 3], sc, nb[1]));
            rs[0] += p0 + p1;
            rs[1] += p2 + p3;
            const int f = 4 * (jn >> 1) + 2 * (jn & 1);
            if constexpr (FAST) {
                hi[f] = pack_bf16x2(p0, p1);
                hi[f + 1] = pack_bf16x2(p2, p3);
            } else {
                split_bf16x2(p0, p1, hi[f], lo[f]);
                split_bf16x2(p2, p3, hi[f + 1], lo[f + 1]);
            }
        }
    }
    __device__ __forceinline__ void add_row_sums(const float (&alpha)[2], const float (&rs)[2])
    {
        scale_add_row_sums(l_r, alpha, rs);
    }
    // Row i's new reference max from the tile's max mx (move_ref_max, sm90/score_tile.cuh); true if it moved.
    __device__ __forceinline__ bool new_max(int i, float mx, float (&alpha)[2], float (&nb)[2])
    {
        return move_ref_max(mx, m_r[i], m_t[i], alpha[i], nb[i]);
    }

    // New row maxima, alpha, P = 2^(S - m) (exps), row sums; s: the masked and scaled scores.
    __device__ __forceinline__ void softmax(const float (&s)[32], const float (&mx)[2], float (&alpha)[2],
                                            uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        float nb[2], rs[2];
        new_max(0, mx[0], alpha, nb);
        new_max(1, mx[1], alpha, nb);
        exps(s, 1.f, nb, hi, lo, rs);
        add_row_sums(alpha, rs);
    }

    // kSpecSoftmax (plan.cuh): the same from the raw scores (S, not masked or scaled; full: every row of the
    // tile valid, so no mask), with the exponents taken first, against the reference max the tile keeps unless
    // its max exceeds it by more than kLazySlack, while the maxima are reduced over the quad; a tile that moves
    // it (a row's first, a jump) takes them again. The FFMA applies the scale where mask_fold_thread
    // (sm90/score_tile.cuh) says it may; elsewhere the scores are masked and scaled as for softmax().
    __device__ __forceinline__ void softmax_spec(const Cta<XO> &c, int b, bool full, float (&s)[32],
                                                 float (&alpha)[2], uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        float mx[2];
        const float sc = mask_fold_thread(c.sValid + b * kBN, full, a.scale_log2, t4, m_r, s, mx);
        float nb[2], rs[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) nb[i] = m_r[i] == -INFINITY ? 0.f : -m_r[i];
        exps(s, sc, nb, hi, lo, rs);  // against the reference max as it is
        quad_max(mx);
        const bool moved0 = new_max(0, mx[0], alpha, nb), moved1 = new_max(1, mx[1], alpha, nb);
        if (moved0 || moved1) exps(s, sc, nb, hi, lo, rs);
        add_row_sums(alpha, rs);
    }

    // The rows' sums over the quad (each thread held its columns' share).
    __device__ __forceinline__ void reduce_row_sums() { quad_sum_rows(l_r); }

    __device__ __forceinline__ void item_sync()
    {
        if (item_pending) named_sync(kBarItem, 256);
        item_pending = false;
    }

    // One A fragment set [64 x 64] into a swizzled [64 rows x 128 B] block (WG1's smem A operand).
    __device__ __forceinline__ void store_p(uint32_t blk, const uint32_t (&p)[16]) const
    {
        store_p_frags(blk, r0, B::lane, p);
    }

    // P and alpha for WG1 (P_hi into the RoPE block of K buffer kb, which only S read; P_lo into its
    // block once WG1 is done with the previous one), then kBarP.
    __device__ __forceinline__ void publish(const Cta<XO> &c, int it, int b, uint32_t kb, const float (&alpha)[2],
                                            const uint32_t (&hi)[16], const uint32_t (&lo)[16])
    {
        store_p(kb + 8 * kBlk, hi);
        if constexpr (!FAST) {
            if (it > 0) named_sync(kBarFree, 256);
            else item_sync();  // WG1 is done with the last item's P_lo
            store_p(c.sPlo, lo);
        }
        if (t4 == 0) {
            c.sAlpha[b * kHT + r0] = alpha[0];
            c.sAlpha[b * kHT + r0 + 8] = alpha[1];
        }
        fence_async_smem();
        named_arrive(kBarP + b, 256);
    }

    // O[:, 0:SPLIT] += P V with P from registers, one commit group (pv_issue); pv_phase returns once it
    // completed. (Queuing the next tile's S
    // chain 0 behind it was measured on the H200 and lost: 224 registers spill then, and decode h = 128
    // s_q = 2 b = 128 took 610 instead of 488 us in "fast"; benchmarks/README.md.)
    __device__ __forceinline__ void pv_issue(uint32_t kb, uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        if constexpr (!B::kNoPV) {
            const uint32_t vd = opaque(desc_base(kb, kBlk));
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const auto &ah = reinterpret_cast<const uint32_t(&)[4]>(hi[4 * kk]);
                const auto &al = reinterpret_cast<const uint32_t(&)[4]>(lo[4 * kk]);
                if constexpr (SPLIT == 256) {
                    const uint64_t dv = B::v_desc(vd, kk);
                    wgmma_n256_rs(o, ah, dv);
                    if constexpr (!B::kNoLo) wgmma_n256_rs(o, al, dv);
                } else {
                    static_assert(SPLIT == 128, "WG0 takes 256 or 128 columns");
                    const uint64_t dv = B::v_desc_at(vd, kk, 0);
                    wgmma_n128_rs(o, ah, dv);
                    if constexpr (!B::kNoLo) wgmma_n128_rs(o, al, dv);
                }
            }
            wg_commit();
        }
    }
    // The registers an in-flight P V reads and writes, fenced once it completed.
    __device__ __forceinline__ void pv_fence(uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        fence_regs(o);
        fence_regs(hi);
        if constexpr (!B::kNoLo) fence_regs(lo);
    }
    __device__ __forceinline__ void pv_phase(uint32_t kb, uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        if constexpr (!B::kNoPV) {
            pv_issue(kb, hi, lo);
            wg_wait0();
            pv_fence(hi, lo);
        }
    }

    // Tile it's S (complete, in s) through the mask and softmax to P (hi, lo) published for WG1, and this
    // warpgroup's O rescaled for the tile's P V.
    // full: the producers flagged every row of the tile valid (kFullFlag).
    // ts: the tile's trace step (its place in the K ring).
    __device__ __forceinline__ void softmax_publish(const Cta<XO> &c, int it, int ts, int b, uint32_t kb, bool full,
                                                    float (&s)[32], uint32_t (&hi)[16], uint32_t (&lo)[16])
    {
        float alpha[2];
        if constexpr (kSpecSoftmax) {
            softmax_spec(c, b, full, s, alpha, hi, lo);
        } else {
            float mx[2];
            mask_scores(c, b, s, mx);
            softmax(s, mx, alpha, hi, lo);
        }
        trace(a, ts, 3);
        publish(c, it, b, kb, alpha, hi, lo);
        trace(a, ts, 4);
        B::rescale(alpha);
    }

    // All K tiles; WG1's P V of tile it overlaps this warpgroup's S of tile it + 1. g0: the buffers' uses
    // so far (a persistent CTA, sm90/kernel.cuh); last_s(): once the last tile's S is done (Q is not read again).
    struct NoHook {
        __device__ __forceinline__ void operator()() const {}
    };
    template <class LastS = NoHook>
    __device__ __forceinline__ void run(const Cta<XO> &c, int g0 = 0, LastS last_s = {})
    {
#pragma unroll 1
        for (int it = 0; it < c.nt; ++it) {
            const int b = (g0 + it) & 1;
            const uint32_t kb = c.sK + b * kTileBytes;
            float s[32];
            uint32_t hi[16], lo[16];
            trace(a, g0 + it, 0);
            B::acquire(c, b, (g0 + it) >> 1);
            const bool full = kFullFlag && tile_full(c.smem, b);
            trace(a, g0 + it, 1);
            issue_s0(c, kb, s);
            s_phase(c, kb, s);
            trace(a, g0 + it, 2);
            if (it + 1 == c.nt) last_s();
            softmax_publish(c, it, g0 + it, b, kb, full, s, hi, lo);
            pv_phase(kb, hi, lo);
            trace(a, g0 + it, 5);
            B::release(c, b);
        }
    }

    // The row statistics for both warpgroups, then this warpgroup's columns (SPLITS: B::finish; kEarlyOut: the rows'
    // factors for WG1, then at once its own columns, B::early_out).
    template <bool SPLITS = false>
    __device__ __forceinline__ void epilogue(const Cta<XO> &c)
    {
        reduce_row_sums();
        if (!SPLITS && B::early_out()) {  // the statistics from registers; the factors handed over before the stores
            const auto stat = [&](int hf, int) { return RowStat{m_r[hf], l_r[hf], m_t[hf]}; };
            finish_cols_direct(a, c, c.h0, r0, B::col0(), t4, o, stat, c.sQ, kBarOut + B::wg, [&](const float (&f)[2]) {
                if (t4 == 0) {
                    float *const sf = B::out_factors(c);
                    sf[r0] = f[0];
                    sf[r0 + 8] = f[1];
                }
                named_arrive(kBarL, 256);
                trace_edge(a, kTrStats);
            });
            return;
        }
        if (t4 == 0) {
            c.sL[r0] = l_r[0];
            c.sL[r0 + 8] = l_r[1];
            c.sM[r0] = m_r[0];
            c.sM[r0 + 8] = m_r[1];
        }
        B::template finish<SPLITS>(c, m_t);
    }

    // The persistent kernel's epilogue (sm90/kernel.cuh; no top-k split, so a direct output): as epilogue()'s early
    // output, but Q's region is the next item's, so the columns go out from registers (finish_cols_direct<false>) and
    // the rows' factors go to WG1 through sM's region (free: the statistics stay in registers), once WG1 took the
    // last item's (item_sync).
    __device__ __forceinline__ void epilogue_item(const Cta<XO> &c)
    {
        reduce_row_sums();
        item_sync();
        const auto stat = [&](int hf, int) { return RowStat{m_r[hf], l_r[hf], m_t[hf]}; };
        // the one-item kernel's hand-over (epilogue), into sM's region instead of Q's block 8 (kept apart: written as one
        // helper, the one-item kernels' SASS changed, cuobjdump)
        finish_cols_direct<false>(a, c, c.h0, r0, B::col0(), t4, o, stat, 0u, 0, [&](const float (&f)[2]) {
            if (t4 == 0) {
                c.sM[r0] = f[0];
                c.sM[r0 + 8] = f[1];
            }
            named_arrive(kBarL, 256);
        });
    }
};

// WG1: P V for output columns SPLIT..511 (256 or 384 of them) with P from smem.
template <int ABL, bool XO, bool FAST, int SPLIT = 256>
struct ValueWarpgroup : ConsumerBase<ABL, XO, FAST, 512 - SPLIT, SPLIT> {
    using B = ConsumerBase<ABL, XO, FAST, 512 - SPLIT, SPLIT>;
    using B::r0, B::o;

    __device__ __forceinline__ ValueWarpgroup(const Args &a_, const Cta<XO> &cta, uint32_t peer_base_)
        : B(a_, cta, peer_base_)
    {
    }

    __device__ __forceinline__ void pv_phase(const Cta<XO> &c, uint32_t kb)
    {
        if constexpr (!B::kNoPV) {
            const uint32_t vd = opaque(desc_base(kb, kBlk)), pd = opaque(desc_base(kb + 8 * kBlk, 16));
            const uint32_t ld = desc_base(c.sPlo, 16);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                if constexpr (SPLIT == 256) {
                    const uint64_t dv = B::v_desc(vd, kk);
                    wgmma_n256_tb(o, desc_at(pd, kk * 32), dv);
                    if constexpr (!B::kNoLo) wgmma_n256_tb(o, desc_at(ld, kk * 32), dv);
                } else {  // columns 128..383 (blocks 2..5) into o[0..127], 384..511 (blocks 6, 7) into o[128..191]
                    auto &oa = reinterpret_cast<float(&)[128]>(o[0]);
                    auto &ob = reinterpret_cast<float(&)[64]>(o[128]);
                    const uint64_t da = B::v_desc_at(vd, kk, 2), db = B::v_desc_at(vd, kk, 6);
                    wgmma_n256_tb(oa, desc_at(pd, kk * 32), da);
                    wgmma_n128_tb(ob, desc_at(pd, kk * 32), db);
                    if constexpr (!B::kNoLo) {
                        wgmma_n256_tb(oa, desc_at(ld, kk * 32), da);
                        wgmma_n128_tb(ob, desc_at(ld, kk * 32), db);
                    }
                }
            }
            wg_commit();
            wg_wait0();
            fence_regs(o);
        }
    }

    // K tile it of nt (buffer (g0 + it) & 1, g0 as in ScoreWarpgroup::run). The full barrier's phase for
    // this use is complete once kBarP + b passed (WG0 waited for it); waiting on it here too orders the
    // producer's writes before our wgmma without relying on the named barrier's transitivity.
    __device__ __forceinline__ void tile(const Cta<XO> &c, int it, int nt, int g0 = 0)
    {
        const int b = (g0 + it) & 1, use = (g0 + it) >> 1;
        const uint32_t kb = c.sK + b * kTileBytes;
        trace(B::a, g0 + it, 0);
        named_sync(kBarP + b, 256);
        trace(B::a, g0 + it, 1);
        B::acquire(c, b, use);
        const float alpha[2] = {c.sAlpha[b * kHT + r0], c.sAlpha[b * kHT + r0 + 8]};
        B::rescale(alpha);
        pv_phase(c, kb);
        trace(B::a, g0 + it, 2);
        if constexpr (!FAST) {
            if (it + 1 < nt) named_arrive(kBarFree, 256);  // P_lo may be rewritten
        }
        B::release(c, b);
    }

    template <bool SPLITS = false>
    __device__ __forceinline__ void epilogue(const Cta<XO> &c)
    {
        if (!SPLITS && B::early_out()) {  // WG0 hands over the rows' factors (ScoreWarpgroup::epilogue)
            named_sync(kBarL, 256);
            trace_edge(B::a, kTrStats);
            const float *const sf = B::out_factors(c);
            const float f[2] = {sf[r0], sf[r0 + 8]};
            trace_edge(B::a, kTrStaged);
            stage_out_cols(B::a, c, c.h0, r0, B::col0(), B::t4, o, f, c.sQ, kBarOut + B::wg);
            return;
        }
        const float unused[2] = {-INFINITY, -INFINITY};  // half 1 writes no max_logits
        B::template finish<SPLITS>(c, unused);
    }

    // The persistent kernel's epilogue (ScoreWarpgroup::epilogue_item): the factors from sM's region, then WG0 may
    // write the next item's (kBarItem, where this CTA has a next item), then the columns from registers.
    __device__ __forceinline__ void epilogue_item(const Cta<XO> &c, bool next_item)
    {
        named_sync(kBarL, 256);
        const float f[2] = {c.sM[r0], c.sM[r0 + 8]};
        if (next_item) named_arrive(kBarItem, 256);
        store_out_cols_regs(B::a, c, c.h0, r0, B::col0(), B::t4, o, f);
    }
};

}  // namespace sm90
}  // namespace attn
