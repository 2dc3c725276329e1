// One K tile of the portable kernel, in its three phases (all warps, CTA-wide barriers):
//   s_phase    : warp (wr, wc) computes S[16 heads x TN tokens] = Q K^T over the 576 dims
//                (ldmatrix + mma.sync m16n8k16, fp32 accumulate);
//   mask_scores: scale to the log2 domain, invalid tokens -inf, overflow saturated where it matters
//                (softmax.cuh), this thread's row maxima;
//   softmax    : row maxima exchanged through smem (barrier B1), p = exp2(s - m) split into two bf16
//                terms P_hi + P_lo (split_bf16x2): P_hi is written into the K tile's dead RoPE columns
//                (aliases K[:, 512:576]), P_lo into its own [HT x BN] region; row sums and alpha
//                updated (barrier B2);
//   pv_phase   : every warp owns all HT rows x (512 / NW) output columns in registers and does
//                O = O * alpha + P_hi V + P_lo V with V = K[:, :512] (ldmatrix.trans). A bf16 P alone
//                is NOT accurate enough for docs/design.md's tolerances (it rounds each probability
//                by up to 2^-9 relative; with |V| ~ 10 that is ~1e-2 absolute on the output).
// lse / max_logits accuracy (docs/design.md: 1e-6 absolute near 0): QK^T is summed per 64-dim group
// and the groups added in fp32 (a single 36-step tensor-core chain errs by up to ~1e-6 on a logit),
// and row sums are kept in double.
#pragma once

#include "attention/softmax.cuh"
#include "attention/sm80/plan.cuh"

namespace attn {
namespace sm80 {

// The running softmax state of this thread: the two rows it sees in the S phase (16 wr + g and
// 16 wr + g + 8) and its share of the output, all HT rows x OC columns.
template <class C>
struct RowState {
    float m_r[2] = {-INFINITY, -INFINITY};
    double l_r[2] = {0.0, 0.0};  // row sums in double: thousands of fp32 adds would cost ~1e-7 relative
    float o[C::MT][C::NTO][4];
};

template <class C>
__device__ __forceinline__ void s_phase(const Cta<C> &c, uint32_t kb, float (&acc)[C::NTS][4])
{
    const int lane = c.lane;
#pragma unroll
    for (int i = 0; i < C::NTS; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    // 36 k-steps as 9 groups of 4 (one 128-byte swizzle group of Q / K columns each): the
    // swizzled offsets within a group are per-lane constants, the group adds 128 B.
    const int qrow = c.wr * 16 + (lane & 15), qhi = lane >> 4;
    const int tok0 = c.wc * C::TN;
    const int krow = C::NTS == 1 ? tok0 + (lane & 7) : tok0 + ((lane >> 4) << 3) + (lane & 7);
    const int khi = (lane >> 3) & 1;
    uint32_t qoff[4], koff[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        qoff[u] = row_chunk(c.sQ, qrow, 2 * u + qhi);
        koff[u] = row_chunk(kb, krow, 2 * u + khi);
    }
    // Each 64-dim group accumulates into its own partial (4 mma steps), added to acc in fp32 with
    // round-to-nearest: one 36-step tensor-core chain loses up to ~1e-6 (natural-log units) on a
    // logit, at docs/design.md's lse / max_logits tolerance.
#pragma unroll 1
    for (int kg = 0; kg < kDqk / 64; ++kg) {
        float pt[C::NTS][4];
#pragma unroll
        for (int i = 0; i < C::NTS; ++i) pt[i][0] = pt[i][1] = pt[i][2] = pt[i][3] = 0.f;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            uint32_t af[4];
            ldsm_x4(af, qoff[u] + kg * 128);
            if constexpr (C::NTS == 1) {
                uint32_t bf[2];
                ldsm_x2(bf, koff[u] + kg * 128);
                mma_bf16(pt[0], af, bf[0], bf[1]);
            } else {
#pragma unroll
                for (int np = 0; np < C::NTS / 2; ++np) {
                    uint32_t bf[4];
                    ldsm_x4(bf, koff[u] + kg * 128 + np * 16 * kRowBytes);
                    mma_bf16(pt[2 * np], af, bf[0], bf[1]);
                    mma_bf16(pt[2 * np + 1], af, bf[2], bf[3]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < C::NTS; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][e] += pt[i][e];
    }
}

// Scores of tile j (indices in ring slot `slot`): log2 domain, -inf for tokens that take no part,
// saturated when this thread's maxima show an overflow; mx: the two rows' maxima over this warp's
// tokens (reduced over the 4 lanes of each row).
template <class C>
__device__ __forceinline__ void mask_scores(const Args &a, const Cta<C> &c, int j, int slot,
                                            float (&acc)[C::NTS][4], const float (&m_r)[2], float (&mx)[2])
{
    const int32_t *ring = c.sIdx + slot * C::BN;
    const int tok0 = c.wc * C::TN;
    auto valid2 = [&](int tok, bool &ok0, bool &ok1) {  // tokens tok, tok + 1 of tile j
        const int2 iv = *reinterpret_cast<const int2 *>(ring + tok);
        const int pos = j * C::BN + tok;
        ok0 = pos < c.L && iv.x >= 0 && static_cast<int64_t>(iv.x) < c.limit;
        ok1 = pos + 1 < c.L && iv.y >= 0 && static_cast<int64_t>(iv.y) < c.limit;
    };
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < C::NTS; ++nt) {
        bool ok0, ok1;
        valid2(tok0 + nt * 8 + 2 * c.t4, ok0, ok1);
        acc[nt][0] = ok0 ? acc[nt][0] * a.scale_log2 : -INFINITY;
        acc[nt][1] = ok1 ? acc[nt][1] * a.scale_log2 : -INFINITY;
        acc[nt][2] = ok0 ? acc[nt][2] * a.scale_log2 : -INFINITY;
        acc[nt][3] = ok1 ? acc[nt][3] * a.scale_log2 : -INFINITY;
        mx[0] = fmaxf(mx[0], fmaxf(acc[nt][0], acc[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(acc[nt][2], acc[nt][3]));
    }
    if (sat_needed(mx[0], m_r[0]) || sat_needed(mx[1], m_r[1])) {  // overflow (rare): saturate
        mx[0] = mx[1] = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt) {
            bool ok0, ok1;
            valid2(tok0 + nt * 8 + 2 * c.t4, ok0, ok1);
            if (ok0) {
                acc[nt][0] = sat_score(acc[nt][0]);
                acc[nt][2] = sat_score(acc[nt][2]);
            }
            if (ok1) {
                acc[nt][1] = sat_score(acc[nt][1]);
                acc[nt][3] = sat_score(acc[nt][3]);
            }
            mx[0] = fmaxf(mx[0], fmaxf(acc[nt][0], acc[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(acc[nt][2], acc[nt][3]));
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
}

// The tile's probabilities: new row maxima (B1), p = exp2(s - m) as P_hi (in K tile kb's RoPE
// columns) + P_lo, the row sums and alpha = exp2(m_old - m_new), which the PV phase reads (B2).
template <class C>
__device__ __forceinline__ void softmax(const Cta<C> &c, uint32_t kb, const float (&acc)[C::NTS][4],
                                        const float (&mx)[2], RowState<C> &st)
{
    constexpr int HT = C::HT, BN = C::BN;
    const int r0 = c.wr * 16 + c.g;
    if (c.t4 == 0) {
        c.sRed[c.wc * HT + r0] = mx[0];
        c.sRed[c.wc * HT + r0 + 8] = mx[1];
    }
    __syncthreads();  // B1: row maxima visible; every warp is done reading this tile's RoPE columns
    float base[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float tm = c.sRed[r0 + 8 * i];
#pragma unroll
        for (int w = 1; w < C::WC; ++w) tm = fmaxf(tm, c.sRed[w * HT + r0 + 8 * i]);
        const float mn = fmaxf(st.m_r[i], tm);
        base[i] = mn == -INFINITY ? 0.f : mn;  // all masked so far: exp2(-inf - 0) = 0, no NaN
        alpha[i] = ex2(st.m_r[i] - base[i]);
        st.m_r[i] = mn;
    }
    const uint32_t phi = kb + kRopeOff;
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < C::NTS; ++nt) {
        const float p0 = ex2(acc[nt][0] - base[0]), p1 = ex2(acc[nt][1] - base[0]);
        const float p2 = ex2(acc[nt][2] - base[1]), p3 = ex2(acc[nt][3] - base[1]);
        rs[0] += p0 + p1;
        rs[1] += p2 + p3;
        const int tok = c.wc * C::TN + nt * 8 + 2 * c.t4;
        uint32_t hi01, lo01, hi23, lo23;
        split_bf16x2(p0, p1, hi01, lo01);
        split_bf16x2(p2, p3, hi23, lo23);
        st_shared_u32(p_addr<BN, kRowBytes>(phi, r0, tok), hi01);
        st_shared_u32(p_addr<BN, kRowBytes>(phi, r0 + 8, tok), hi23);
        st_shared_u32(p_addr<BN, 128>(c.sPlo, r0, tok), lo01);
        st_shared_u32(p_addr<BN, 128>(c.sPlo, r0 + 8, tok), lo23);
    }
    st.l_r[0] = st.l_r[0] * static_cast<double>(alpha[0]) + static_cast<double>(rs[0]);
    st.l_r[1] = st.l_r[1] * static_cast<double>(alpha[1]) + static_cast<double>(rs[1]);
    if (c.wc == 0 && c.t4 == 0) {
        c.sAlpha[r0] = alpha[0];
        c.sAlpha[r0 + 8] = alpha[1];
    }
    __syncthreads();  // B2: P (hi and lo) and alpha visible
}

// O = O * alpha + P_hi V + P_lo V for this warp's columns [warp * OC, warp * OC + OC), all HT rows.
template <class C>
__device__ __forceinline__ void pv_phase(const Cta<C> &c, uint32_t kb, float (&o)[C::MT][C::NTO][4])
{
    constexpr int BN = C::BN;
    const int lane = c.lane, g = c.g;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
        const float al0 = c.sAlpha[mt * 16 + g], al1 = c.sAlpha[mt * 16 + g + 8];
        if (!__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) continue;  // max unchanged: O as is
#pragma unroll
        for (int nt = 0; nt < C::NTO; ++nt) {
            o[mt][nt][0] *= al0;
            o[mt][nt][1] *= al0;
            o[mt][nt][2] *= al1;
            o[mt][nt][3] *= al1;
        }
    }
    const uint32_t phi = kb + kRopeOff;
    const int vrow = ((lane >> 3) & 1) * 8 + (lane & 7);
    const int vchunk = (c.warp * C::OC) / 8 + (lane >> 4);
#pragma unroll 1
    for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[C::MT][4], pl[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
            const int hr = mt * 16 + (lane & 15), tk = kk * 16 + (lane >> 4) * 8;
            ldsm_x4(pa[mt], p_addr<BN, kRowBytes>(phi, hr, tk));
            ldsm_x4(pl[mt], p_addr<BN, 128>(c.sPlo, hr, tk));
        }
#pragma unroll
        for (int np = 0; np < C::NTO / 2; ++np) {
            uint32_t bf[4];
            ldsm_x4_t(bf, row_chunk(kb, kk * 16 + vrow, vchunk + np * 2));
#pragma unroll
            for (int mt = 0; mt < C::MT; ++mt) {
                mma_bf16(o[mt][2 * np], pa[mt], bf[0], bf[1]);
                mma_bf16(o[mt][2 * np + 1], pa[mt], bf[2], bf[3]);
                mma_bf16(o[mt][2 * np], pl[mt], bf[0], bf[1]);
                mma_bf16(o[mt][2 * np + 1], pl[mt], bf[2], bf[3]);
            }
        }
    }
}

// One K tile (indices of tile j in ring slot `slot`, bf16 rows at kb): S, softmax, O += P V.
template <class C>
__device__ __forceinline__ void tile(const Args &a, const Cta<C> &c, int j, uint32_t kb, int slot, RowState<C> &st)
{
    float acc[C::NTS][4];
    float mx[2];
    s_phase(c, kb, acc);
    mask_scores(a, c, j, slot, acc, st.m_r, mx);
    softmax(c, kb, acc, mx, st);
    pv_phase(c, kb, st.o);
}

}  // namespace sm80
}  // namespace attn
