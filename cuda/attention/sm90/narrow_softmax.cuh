// The per-head online softmax of the Hopper kernels with tokens on the MMA's M dimension: the narrow
// kernel (sm90/narrow_kernel.cuh) and the register kernel (sm90/reg_kernel.cuh). One consumer
// warpgroup's state: its thread's share of O^T [512 dims x NH heads] (8 m-tiles), each head's running
// maximum and this thread's share of its row sum; per K tile, the heads' maxima over the tile's 64
// tokens (the column of S^T spread over the warpgroup's four warps, so through shared memory) and P^T
// stored as bf16 for the P V MMA's B operand.
//
// Thread (warp w, lane = 4 g + t4) holds, of every [64 x NH] accumulator, rows 16 w + g and + 8 (tokens
// of S^T; dims of an O^T m-tile, in the kernel's own order) and columns 8 jn + 2 t4 + e (heads), element
// 4 jn + 2 hf + e for row + 8 hf. Its heads: hl = 2 jn + e -> head 8 jn + 2 t4 + e.
#pragma once

#include "attention/softmax.cuh"
#include "attention/sm90/ptx.cuh"

namespace attn {
namespace sm90 {

// The lazy maximum (LAZY, the narrow kernel): a tile whose every valid score is within 2^kLazySlack
// (attention/softmax.cuh) of its head's running maximum is taken against that maximum as it is, with no
// exchange of the tile's maxima between the warps and no rescale of O^T (FlashAttention-4's conditional
// rescaling). Only max_logits needs the true maximum, which each thread keeps for its own scores (tmx) and
// the epilogue reduces (publish_tmx).

// NH heads (16 or 32); NO_LO: P goes to the MMA as bf16 only ("fast"), else as P_hi and P_lo (rows
// NH.. of the P region, kPBytes on); NO: accumulator floats per O^T m-tile, NH / 2, or NH when the
// caller stacks P_hi^T and P_lo^T into one n = 2 NH MMA (the second half holds O_lo^T); LAZY: the lazy
// maximum above (lazy_tile, publish_tmx). Two consumer warpgroups that split a tile (NWG = 2, the
// narrow kernel's SplitConsumer; cw, this one, from the thread index: both run the same code): each holds
// NMT = 4 of O^T's m-tiles with every head's columns, but runs the softmax of its own half of the heads
// only (heads cw NH / 2 ..: the accumulator's column blocks jn of that half), so its scores s are NS / 2
// floats and its state NL / 2 heads; an exact tile's alphas go through shared memory to the other
// warpgroup's O^T. Barriers over both warpgroups (kJoint threads): P^T stored, the verdict, publish_tmx;
// exchange_max's stays within one warpgroup.
template <int NH_, bool NO_LO, int NO_, bool LAZY = false, int NMT = 8, int NWG = 1>
struct HeadSoftmax {
    static constexpr int NH = NH_, NS = NH / 2, NL = NH / 4, NO = NO_;
    static constexpr int NSO = NS / NWG, NLO = NL / NWG;  // this warpgroup's scores and heads per thread
    static constexpr int kJoint = 128 * NWG;
    static constexpr int kPBytes = NH * 128;  // one P^T tile: NH rows of 64 bf16
    static_assert(NO == NS || NO == 2 * NS, "an O^T m-tile holds NH / 2 floats, or twice that stacked");
    static_assert((NWG == 1 && NMT == 8) || (NWG == 2 && NMT == 4), "one or two warpgroups");

    const int w, g, t4;
    const int cw;  // NWG = 2: this warpgroup (0 or 1)
    float o[NMT][NO];  // O^T m-tile mt (NWG = 2: m-tile 4 cw + mt)
    float m_r[NLO];    // running maxima (log2 domain), the same in every thread holding the head
    double l_r[NLO];   // this thread's share of the row sums
    float tmx[LAZY ? NLO : 1];  // LAZY: the largest of this thread's scores of each head in lazy tiles

    __device__ __forceinline__ HeadSoftmax(int tid)
        : w((tid >> 5) & 3), g((tid & 31) >> 2), t4(tid & 3), cw(NWG == 1 ? 0 : (tid >> 7) & 1)
    {
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
            for (int i = 0; i < NO; ++i) o[mt][i] = 0.f;
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            m_r[hl] = -INFINITY;
            l_r[hl] = 0.0;
            if constexpr (LAZY) tmx[hl] = -INFINITY;
        }
    }
    // The head of this thread's own head hl (NWG = 2: of its warpgroup's half), and of column hl of all its
    // accumulator's columns (O^T's: every head).
    __device__ __forceinline__ int head(int hl) const
    {
        if constexpr (NWG == 1) return head_all(hl);
        else return head_all(hl) + cw * (NH / NWG);
    }
    __device__ __forceinline__ int head_all(int hl) const { return 8 * (hl >> 1) + 2 * t4 + (hl & 1); }

    // Mask (ok0 / ok1: this thread's tokens 16 w + g and + 8 are valid) and scale (log2 domain) this
    // thread's scores, saturate overflow where it matters (attention/softmax.cuh), and each head's
    // maximum over the tile's 64 tokens, which all 128 threads then agree on. red: [4][NH] floats of this
    // tile's parity (the other parity may still be read by slower warps); bar: a 128-thread barrier.
    __device__ __forceinline__ void tile_max(float (&s)[NSO], float (&mx)[NLO], bool ok0, bool ok1, float scale_log2,
                                             float *red, int bar) const
    {
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            scale_mask_head(s, mx, hl, ok0, ok1, scale_log2);
            saturate_reduce_head(s, mx, hl, ok0, ok1);
        }
        exchange_max_warps(mx, red, bar);
    }
    // tile_max in two halves (the lazy maximum's tiles): masked and scaled scores with each head's maximum
    // over this thread's two; then saturation and the maxima across the warp and the warps.
    __device__ __forceinline__ void scale_mask(float (&s)[NSO], float (&mx)[NLO], bool ok0, bool ok1, float scale_log2) const
    {
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) scale_mask_head(s, mx, hl, ok0, ok1, scale_log2);
    }
    __device__ __forceinline__ void exchange_max(float (&s)[NSO], float (&mx)[NLO], bool ok0, bool ok1, float *red,
                                                 int bar) const
    {
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) saturate_reduce_head(s, mx, hl, ok0, ok1);
        exchange_max_warps(mx, red, bar);
    }
    __device__ __forceinline__ void scale_mask_head(float (&s)[NSO], float (&mx)[NLO], int hl, bool ok0, bool ok1,
                                                    float scale_log2) const
    {
        const int i0 = 4 * (hl >> 1) + (hl & 1), i1 = i0 + 2;
        s[i0] = ok0 ? s[i0] * scale_log2 : -INFINITY;
        s[i1] = ok1 ? s[i1] * scale_log2 : -INFINITY;
        mx[hl] = fmaxf(s[i0], s[i1]);
    }
    __device__ __forceinline__ void saturate_reduce_head(float (&s)[NSO], float (&mx)[NLO], int hl, bool ok0, bool ok1) const
    {
        const int i0 = 4 * (hl >> 1) + (hl & 1), i1 = i0 + 2;
        if (sat_needed(mx[hl], m_r[hl])) {
            if (ok0) s[i0] = sat_score(s[i0]);
            if (ok1) s[i1] = sat_score(s[i1]);
            mx[hl] = fmaxf(s[i0], s[i1]);
        }
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) mx[hl] = fmaxf(mx[hl], __shfl_xor_sync(0xffffffffu, mx[hl], x));
    }
    __device__ __forceinline__ void exchange_max_warps(float (&mx)[NLO], float *red, int bar) const
    {
        if (g == 0) {
#pragma unroll
            for (int hl = 0; hl < NLO; ++hl) red[w * NH + head(hl)] = mx[hl];
        }
        named_sync(bar, 128);
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            const int hd = head(hl);
            mx[hl] = fmaxf(fmaxf(red[hd], red[NH + hd]), fmaxf(red[2 * NH + hd], red[3 * NH + hd]));
        }
    }

    // LAZY: the tile against the running maxima as they are. P = 2^(s - m_r) stored, then one barrier that
    // also tells every thread whether any of the 128 saw a head's maximum above m_r + kLazySlack, or one that
    // saturation may concern (sat_needed: a first tile, m_r = -inf, always does). Then (false) the row sums
    // take the tile and tmx its maxima; or (true) nothing changed but P^T, and the caller redoes the tile
    // exactly (exchange_max, softmax). s, mx: from scale_mask; bar: a barrier of all consumers after which
    // P^T is written and visible to wgmma. NWG = 2: the verdict goes through flags, int [8], one per warp of
    // both warpgroups, and a plain barrier (the first version, a copy of the code per warpgroup, reached one
    // barrier.red from two instructions, which compute-sanitizer synccheck reports as divergent threads; the
    // flags stayed when both warpgroups came to share one code path, and were validated so); the next
    // tile's flags are written after the next partial S hand-over, which needs every warp past this read.
    __device__ __forceinline__ bool lazy_tile(const float (&s)[NSO], const float (&mx)[NLO], uint32_t sP, int bar,
                                              int *flags = nullptr)
    {
        static_assert(LAZY, "lazy_tile: a LAZY HeadSoftmax");
        bool need = false;
        float ps[NLO];
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            need |= !(mx[hl] <= m_r[hl] + kLazySlack) || sat_needed(mx[hl], m_r[hl]);  // NaN: the exact path
            const int i0 = 4 * (hl >> 1) + (hl & 1), i1 = i0 + 2;
            const float p0 = ex2(s[i0] - m_r[hl]), p1 = ex2(s[i1] - m_r[hl]);
            ps[hl] = p0 + p1;
            store_p(sP, hl, p0, p1);
        }
        fence_async_smem();
        if constexpr (NWG == 1) {
            need = named_sync_or(bar, 128, need);
        } else {
            need = __any_sync(0xffffffffu, need);
            if (g == 0 && t4 == 0) flags[4 * cw + w] = need ? 1 : 0;
            named_sync(bar, kJoint);
            const int4 f0 = reinterpret_cast<const int4 *>(flags)[0], f1 = reinterpret_cast<const int4 *>(flags)[1];
            need = (f0.x | f0.y | f0.z | f0.w | f1.x | f1.y | f1.z | f1.w) != 0;
        }
        if (!need) {
#pragma unroll
            for (int hl = 0; hl < NLO; ++hl) {
                l_r[hl] += static_cast<double>(ps[hl]);
                tmx[hl] = fmaxf(tmx[hl], mx[hl]);
            }
        }
        return need;
    }

    // LAZY, in the epilogue: each head's largest score (log2 domain) for max_logits, the larger of its
    // running maximum and every thread's tmx. red: [4][NH] floats no warp reads any more; bar: a barrier of
    // all consumers, after which head hd's is the max of m_r and red[k * NH + hd], k < 4.
    __device__ __forceinline__ void publish_tmx(float *red, int bar)
    {
        static_assert(LAZY, "publish_tmx: a LAZY HeadSoftmax");
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            float v = tmx[hl];
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, x));
            if (g == 0) red[w * NH + head(hl)] = v;
        }
        named_sync(bar, kJoint);
    }

    // P^T[head][tok] of this thread's head hl and tokens tok = 16 w + g and + 8 (K-major with the 128-byte
    // swizzle: chunks tok >> 3 and + 1 of the head's 128-byte row): bf16, or (high) P_hi and P_lo.
    __device__ __forceinline__ void store_p(uint32_t sP, int hl, float p0, float p1) const
    {
        const int tok = 16 * w + g;
        const int hd = head(hl);
        const uint32_t row = sP + hd * 128 + (tok & 7) * 2;
        const uint32_t a0 = row + ((((tok >> 3)) ^ (hd & 7)) << 4), a1 = row + ((((tok >> 3) + 1) ^ (hd & 7)) << 4);
        if constexpr (NO_LO) {
            const uint32_t hi = pack_bf16x2(p0, p1);
            st_shared_u16(a0, static_cast<uint16_t>(hi));
            st_shared_u16(a1, static_cast<uint16_t>(hi >> 16));
        } else {
            uint32_t hi, lo;
            split_bf16x2(p0, p1, hi, lo);
            st_shared_u16(a0, static_cast<uint16_t>(hi));
            st_shared_u16(a1, static_cast<uint16_t>(hi >> 16));
            st_shared_u16(a0 + kPBytes, static_cast<uint16_t>(lo));
            st_shared_u16(a1 + kPBytes, static_cast<uint16_t>(lo >> 16));
        }
    }

    // New maxima, alpha, P = 2^(S - m) into P^T at sP (bf16, K-major, 128-byte swizzle; high: P_hi, and
    // P_lo kPBytes on), row sums; O^T rescaled by alpha. bar: a barrier of all consumers after which P^T is
    // written and visible to wgmma. NWG = 2: sAlpha, float [NH], where each warpgroup's own heads' alphas
    // meet (published before bar, read after it: the next tile's are written after the next partial S
    // hand-over, which needs both warpgroups past this read).
    __device__ __forceinline__ void softmax(const float (&s)[NSO], const float (&mx)[NLO], uint32_t sP, int bar,
                                            float *sAlpha = nullptr)
    {
        float base_[NLO], alpha[NLO];
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            const float mn = fmaxf(m_r[hl], mx[hl]);
            base_[hl] = mn == -INFINITY ? 0.f : mn;
            alpha[hl] = ex2(m_r[hl] - base_[hl]);
            m_r[hl] = mn;
        }
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
            const int i0 = 4 * (hl >> 1) + (hl & 1), i1 = i0 + 2;
            const float p0 = ex2(s[i0] - base_[hl]), p1 = ex2(s[i1] - base_[hl]);
            l_r[hl] = l_r[hl] * static_cast<double>(alpha[hl]) + static_cast<double>(p0 + p1);
            store_p(sP, hl, p0, p1);
        }
        if constexpr (NWG == 2) {
            if (w == 0 && g == 0) {
#pragma unroll
                for (int hl = 0; hl < NLO; ++hl) sAlpha[head(hl)] = alpha[hl];
            }
            fence_async_smem();
            named_sync(bar, kJoint);  // all of P^T written (and visible to wgmma), every alpha published
            float al[NL];
            bool moved = false;
#pragma unroll
            for (int hl = 0; hl < NL; ++hl) {
                al[hl] = sAlpha[head_all(hl)];
                moved |= al[hl] != 1.f;
            }
            if (__any_sync(0xffffffffu, moved)) rescale_o<NL>(al);
            return;
        }
        bool moved = false;
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) moved |= alpha[hl] != 1.f;
        if (__any_sync(0xffffffffu, moved)) rescale_o<NLO>(alpha);
        fence_async_smem();
        named_sync(bar, 128);  // all of P^T written (and visible to wgmma)
    }
    // After the P V group is done: O^T's registers are the MMA's results (no use moves above the wait).
    __device__ __forceinline__ void fence_o()
    {
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt) fence_regs(o[mt]);
    }
    // O^T's columns of the first N of this thread's heads (column hl: head_all(hl)) times alpha.
    template <int N>
    __device__ __forceinline__ void rescale_o(const float (&alpha)[N])
    {
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
            for (int hl = 0; hl < N; ++hl) {
                const int i0 = 4 * (hl >> 1) + (hl & 1);
                o[mt][i0] *= alpha[hl];
                o[mt][i0 + 2] *= alpha[hl];
                if constexpr (NO == 2 * NS) {
                    o[mt][i0 + NS] *= alpha[hl];
                    o[mt][i0 + NS + 2] *= alpha[hl];
                }
            }
    }

    // Tile it's softmax over this thread's scores s (ok0 / ok1: its tokens are valid): LAZY, the lazy tile,
    // redone exactly where a maximum moved too far; else exactly. red: tile_max's [2][4][NH] floats (the
    // tile's parity: the other may still be read by slower warps), bar_red its warpgroup's barrier; bar_p,
    // flags, sAlpha: lazy_tile's and softmax's.
    __device__ __forceinline__ void tile(float (&s)[NSO], bool ok0, bool ok1, float scale_log2, uint32_t sP, float *red,
                                         int it, int bar_red, int bar_p, int *flags = nullptr, float *sAlpha = nullptr)
    {
        float mx[NLO];
        if constexpr (LAZY) {
            scale_mask(s, mx, ok0, ok1, scale_log2);
            if (lazy_tile(s, mx, sP, bar_p, flags)) {  // a maximum moved too far: the tile exactly
                exchange_max(s, mx, ok0, ok1, red + (it & 1) * 4 * NH, bar_red);
                softmax(s, mx, sP, bar_p, sAlpha);
            }
        } else {
            tile_max(s, mx, ok0, ok1, scale_log2, red + (it & 1) * 4 * NH, bar_red);
            softmax(s, mx, sP, bar_p, sAlpha);
        }
    }

    // The epilogue's shared-memory part, after the last P V: each head's row sum per warp (lsum [4][NH]) and
    // running maximum (m [NH]) of this warpgroup's heads, LAZY publish_tmx into red, and O^T's m-tiles
    // (m-tile NMT cw + mt) staged as O [NH][OSTRIDE] floats (stacked: O_hi + O_lo), between two barriers bar
    // of all consumers (the first: every warp's last wgmma is done with the K buffers the output goes to).
    template <int OSTRIDE>
    __device__ __forceinline__ void stage_out(double *lsum, float *m, float *out, float *red, int bar)
    {
        warp_sums();
        named_sync(bar, kJoint);
        if constexpr (LAZY) publish_tmx(red, bar);  // no warp reads red any more
        if (g == 0) {
#pragma unroll
            for (int hl = 0; hl < NLO; ++hl) {
                lsum[w * NH + head(hl)] = l_r[hl];
                if (w == 0) m[head(hl)] = m_r[hl];
            }
        }
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
            for (int i = 0; i < NS; ++i) {
                const int hd = 8 * (i >> 2) + 2 * t4 + (i & 1);
                const int dim = 64 * (NMT * cw + mt) + 16 * w + g + 8 * ((i >> 1) & 1);
                out[hd * OSTRIDE + dim] = NO == 2 * NS ? o[mt][i] + o[mt][i + NS] : o[mt][i];
            }
        named_sync(bar, kJoint);
    }

    // The row sums of this thread's heads over the warp (each then holds the warp's share).
    __device__ __forceinline__ void warp_sums()
    {
#pragma unroll
        for (int hl = 0; hl < NLO; ++hl) {
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) l_r[hl] += __shfl_xor_sync(0xffffffffu, l_r[hl], x);
        }
    }
};

}  // namespace sm90
}  // namespace attn
