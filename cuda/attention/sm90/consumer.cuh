// The two consumer warpgroups (WG0, WG1, setmaxnreg 192) of the wgmma kernel. For each 64-token K
// tile, in lockstep (named barriers of the 256 consumer threads):
//   acquire    : wait until the producer filled the buffer (XO: and the peer's half arrived);
//   s_phase    : S = Q K^T for this warpgroup's 32 tokens, wgmma m64n32k16 x 36 as 3 chains of 12
//                summed in fp32 (accuracy, below), Q and K from smem;
//   mask_scores: log2-domain scale, invalid rows -inf, overflow saturated where it matters;
//   softmax    : row maxima exchanged (kBarMax), P = exp2(S - m) written as two bf16 terms P_hi +
//                P_lo (split_bf16x2; P_hi into the tile's dead RoPE block, P_lo into a block of its
//                own; kBarP), row sums in double;
//   rescale, pv_phase: O[:, 256*wg : 256*wg + 256] = O * alpha + P_hi V + P_lo V (wgmma m64n256k16
//                x 8, V = K[:, :512] read N-major from smem), 128 fp32 registers per thread. (A bf16 P
//                alone rounds probabilities by up to 2^-9 relative: ~1e-2 absolute output error when
//                |V| ~ 10, outside docs/design.md's tolerances.);
//   release    : hand the buffer back to the producer(s).
// Then the epilogue: row sums of both warpgroups (kBarL) and finish_row (attention/epilogue.cuh).
// Where the time goes (H200, tools/ablate.py, benchmarks/README.md): the chain S -> softmax -> P V is
// serial and the two warpgroups run it in lockstep, so tensor-core time and the rest add up.
// ABL (profiling builds only, sm90/kernel.cuh): bit 2 leaves out the S = Q K^T wgmma, 4 the P V
// wgmma, 16 the P_lo V wgmma (bf16 P only).
#pragma once

#include "attention/epilogue.cuh"
#include "attention/sm90/plan.cuh"

namespace attn {
namespace sm90 {

// The consumers' wait for Q, which they loaded themselves (the producer is already fetching K).
__device__ __forceinline__ void wait_q()
{
    cp_async_wait_all();  // this thread's part of Q
    fence_async_smem();
    named_sync(kBarQ, 256);  // all of Q landed (and visible to wgmma)
}

// One consumer thread: its place in the two warpgroups and its running state (O, row maxima and
// sums); the CTA's coordinates and buffers (Cta) are passed to each stage rather than held here,
// which keeps the generated code that of the single-body kernel this was split from (held as a
// member, nvcc emits 16 more instructions).
template <int ABL, bool XO>
struct Consumer {
    static constexpr bool kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0, kNoLo = (ABL & 16) != 0;

    const Args &a;
    const uint32_t peer_base;  // XO: the peer's address of our smem base
    const int lane;
    const int wg;              // 0 or 1: tokens 32*wg.. of S, output columns 256*wg..
    const int w;               // warp within the warpgroup: rows 16w..16w+15
    const int g, t4;
    const int r0;              // this thread's rows r0, r0 + 8
    float o[128];
    float m_r[2] = {-INFINITY, -INFINITY};
    double l_r[2] = {0.0, 0.0};  // row sums in double (see sm80/tile.cuh)

    __device__ __forceinline__ Consumer(const Args &a_, const Cta<XO> &cta, uint32_t peer_base_)
        : a(a_), peer_base(peer_base_), lane(cta.lane), wg(cta.tid >> 7), w((cta.tid >> 5) & 3),
          g(cta.lane >> 2), t4(cta.lane & 3), r0(16 * ((cta.tid >> 5) & 3) + (cta.lane >> 2))
    {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.f;
    }

    __device__ __forceinline__ void acquire(const Cta<XO> &c, int b, int use) const
    {
        mbar_wait(c.bar_full + 8 * b, use & 1);
        if constexpr (XO) {
            mbar_wait(c.bar_rr + 8 * b, use & 1);  // the peer's half of the tile
            fence_async_smem();
        }
    }

    // d (+)= Q K^T over dims 192 ch .. 192 ch + 191 (12 wgmma steps), this warpgroup's 32 tokens.
    __device__ __forceinline__ void s_chain(const Cta<XO> &c, float (&d)[16], int ch, uint32_t kb) const
    {
        wg_fence();  // d was read since its last wgmma
#pragma unroll
        for (int kk = 12 * ch; kk < 12 * ch + 12; ++kk) {
            const uint32_t qa = c.sQ + (kk >> 2) * kBlk + (kk & 3) * 32;
            const uint32_t ka = kb + (kk >> 2) * kBlk + (32 * wg) * 128 + (kk & 3) * 32;
            wgmma_n32(d, desc(qa, 16, 1024), desc(ka, 16, 1024), kk > 12 * ch);
        }
        wg_commit();
    }

    // S[64 heads x 32 tokens] for tokens 32*wg .. 32*wg + 31. Accuracy: one 36-step tensor-core
    // chain over 576 dims loses up to ~1e-6 (natural-log units) on a logit, at docs/design.md's lse /
    // max_logits tolerance; so the 576 dims are 3 chains of 192 (12 wgmma steps each), summed
    // in fp32 with round-to-nearest: the first into s, the others into t while s is ready.
    __device__ __forceinline__ void s_phase(const Cta<XO> &c, uint32_t kb, float (&s)[16]) const
    {
        float t[16];
        if constexpr (kNoS) {
#pragma unroll
            for (int i = 0; i < 16; ++i) s[i] = 0.f;
        } else {
            s_chain(c, s, 0, kb);
            s_chain(c, t, 1, kb);
            wg_wait0();
            fence_regs(s);
            fence_regs(t);
#pragma unroll
            for (int i = 0; i < 16; ++i) s[i] += t[i];
            s_chain(c, t, 2, kb);
            wg_wait0();
            fence_regs(t);
#pragma unroll
            for (int i = 0; i < 16; ++i) s[i] += t[i];
        }
    }

    // mask, scale (log2 domain), row max over this warpgroup's 32 tokens of K buffer b
    __device__ __forceinline__ void mask_scores(const Cta<XO> &c, int b, float (&s)[16], float (&mx)[2]) const
    {
        const int *valid = c.sValid + b * kBN;
        mx[0] = mx[1] = -INFINITY;
#pragma unroll
        for (int jn = 0; jn < 4; ++jn) {
            const int tok = 32 * wg + 8 * jn + 2 * t4;
            const bool ok0 = valid[tok] != 0, ok1 = valid[tok + 1] != 0;
            s[4 * jn + 0] = ok0 ? s[4 * jn + 0] * a.scale_log2 : -INFINITY;
            s[4 * jn + 1] = ok1 ? s[4 * jn + 1] * a.scale_log2 : -INFINITY;
            s[4 * jn + 2] = ok0 ? s[4 * jn + 2] * a.scale_log2 : -INFINITY;
            s[4 * jn + 3] = ok1 ? s[4 * jn + 3] * a.scale_log2 : -INFINITY;
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
        }
        // overflow (rare; attention/softmax.cuh): saturate this thread's valid scores when its maxima say so
        if (sat_needed(mx[0], m_r[0]) || sat_needed(mx[1], m_r[1])) {
            mx[0] = mx[1] = -INFINITY;
#pragma unroll
            for (int jn = 0; jn < 4; ++jn) {
                const int tok = 32 * wg + 8 * jn + 2 * t4;
                if (valid[tok] != 0) {
                    s[4 * jn + 0] = sat_score(s[4 * jn + 0]);
                    s[4 * jn + 2] = sat_score(s[4 * jn + 2]);
                }
                if (valid[tok + 1] != 0) {
                    s[4 * jn + 1] = sat_score(s[4 * jn + 1]);
                    s[4 * jn + 3] = sat_score(s[4 * jn + 3]);
                }
                mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
    }

    // New row maxima from both halves, P_hi (into K buffer kb's RoPE block) and P_lo, row sums; alpha:
    // the factor O is rescaled by.
    __device__ __forceinline__ void softmax(const Cta<XO> &c, uint32_t kb, const float (&s)[16], const float (&mx)[2],
                                            float (&alpha)[2])
    {
        if (t4 == 0) {
            c.sMax[wg * kHT + r0] = mx[0];
            c.sMax[wg * kHT + r0 + 8] = mx[1];
        }
        // both halves' maxima; both warpgroups done reading the RoPE block, and done with the previous
        // tile's P V (so P_lo, one buffer for both K buffers, may be rewritten)
        named_sync(kBarMax, 256);
        float base_[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float tm = fmaxf(c.sMax[r0 + 8 * i], c.sMax[kHT + r0 + 8 * i]);
            const float mn = fmaxf(m_r[i], tm);
            base_[i] = mn == -INFINITY ? 0.f : mn;
            alpha[i] = ex2(m_r[i] - base_[i]);
            m_r[i] = mn;
        }
        float rs[2] = {0.f, 0.f};
        const uint32_t pblk = kb + 8 * kBlk;  // P[64 heads][64 tokens] in the RoPE block
#pragma unroll
        for (int jn = 0; jn < 4; ++jn) {
            const float p0 = ex2(s[4 * jn + 0] - base_[0]), p1 = ex2(s[4 * jn + 1] - base_[0]);
            const float p2 = ex2(s[4 * jn + 2] - base_[1]), p3 = ex2(s[4 * jn + 3] - base_[1]);
            rs[0] += p0 + p1;
            rs[1] += p2 + p3;
            const int tok = 32 * wg + 8 * jn + 2 * t4;
            uint32_t hi01, lo01, hi23, lo23;
            split_bf16x2(p0, p1, hi01, lo01);
            split_bf16x2(p2, p3, hi23, lo23);
            st_shared_u32(blk_addr(pblk, r0, tok >> 3) + (tok & 7) * 2, hi01);
            st_shared_u32(blk_addr(pblk, r0 + 8, tok >> 3) + (tok & 7) * 2, hi23);
            st_shared_u32(blk_addr(c.sPlo, r0, tok >> 3) + (tok & 7) * 2, lo01);
            st_shared_u32(blk_addr(c.sPlo, r0 + 8, tok >> 3) + (tok & 7) * 2, lo23);
        }
        l_r[0] = l_r[0] * static_cast<double>(alpha[0]) + static_cast<double>(rs[0]);
        l_r[1] = l_r[1] * static_cast<double>(alpha[1]) + static_cast<double>(rs[1]);
        fence_async_smem();
        named_sync(kBarP, 256);  // P_hi and P_lo complete (both token halves)
    }

    __device__ __forceinline__ void rescale(const float (&alpha)[2])
    {
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // the max moved (rarely, late on)
#pragma unroll
            for (int jn = 0; jn < 32; ++jn) {
                o[4 * jn + 0] *= alpha[0];
                o[4 * jn + 1] *= alpha[0];
                o[4 * jn + 2] *= alpha[1];
                o[4 * jn + 3] *= alpha[1];
            }
        }
    }

    __device__ __forceinline__ void pv_phase(const Cta<XO> &c, uint32_t kb)
    {
        if constexpr (!kNoPV) {
            const uint32_t pblk = kb + 8 * kBlk;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint32_t pa = pblk + kk * 32;
                const uint32_t va = kb + (4 * wg) * kBlk + (16 * kk) * 128;
                const uint64_t dv = desc(va, kBlk, 1024);
                wgmma_n256_tb(o, desc(pa, 16, 1024), dv);
                if constexpr (!kNoLo) wgmma_n256_tb(o, desc(c.sPlo + kk * 32, 16, 1024), dv);
            }
            wg_commit();
            wg_wait0();
            fence_regs(o);
        }
    }

    // This warp is done with K buffer b (XO: tell the peer's producer too).
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

    // K tile it (buffer it & 1).
    __device__ __forceinline__ void tile(const Cta<XO> &c, int it)
    {
        const int b = it & 1, use = it >> 1;
        const uint32_t kb = c.sK + b * kTileBytes;
        acquire(c, b, use);
        float s[16], mx[2], alpha[2];
        s_phase(c, kb, s);
        mask_scores(c, b, s, mx);
        softmax(c, kb, s, mx, alpha);
        rescale(alpha);
        pv_phase(c, kb);
        release(c, b);
    }

    // Row sums of both warpgroups, then this thread's rows r0, r0 + 8 x columns 256*wg + 2*t4 + 8 jn.
    __device__ __forceinline__ void epilogue(const Cta<XO> &c)
    {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 1);
            l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 2);
        }
        if (t4 == 0) {
            c.sL[wg * kHT + r0] = l_r[0];
            c.sL[wg * kHT + r0 + 8] = l_r[1];
        }
        named_sync(kBarL, 256);
        const bool split = a.n_splits > 1;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int rl = r0 + 8 * hf;
            const int hr = c.h0 + rl;
            if (hr >= c.h) continue;
            const double l = c.sL[rl] + c.sL[kHT + rl];
            const int col0 = 256 * wg + 2 * t4;
            finish_row<32>(
                a, c.row, c.bi, c.si, c.sp, c.h, hr, split, m_r[hf], l, [&] { return col0; },
                [&] { return wg == 0 && t4 == 0; },
                [&](int jn) { return make_float2(o[4 * jn + 2 * hf], o[4 * jn + 2 * hf + 1]); });
        }
    }
};

}  // namespace sm90
}  // namespace attn
