// What the two head-on-M wgmma kernels (the wide kernel's score warpgroup, sm90/consumer.cuh, and the
// pair kernel, sm90/pair_kernel.cuh) do alike to a thread's share of a [64 heads x 64 tokens] S
// accumulator (m64n64: rows r0, r0 + 8; s[4 jn + {0, 1}] row r0 at tokens 8 jn + 2 t4 + {0, 1},
// s[4 jn + {2, 3}] row r0 + 8) and of a [64 x 256] O half (o[4 jn + ..] likewise, 32 column pairs).
#pragma once

#include "attention/epilogue.cuh"
#include "attention/softmax.cuh"
#include "attention/sm90/plan.cuh"
#include "attention/sm90/trace.cuh"

namespace attn {
namespace sm90 {

// S's accuracy rule: one tensor-core chain of 36 k-steps over the 576 dims loses up to ~1e-6 (natural-log
// units) on a logit, at docs/design.md's lse / max_logits tolerance, so S is kSChains chains, each into
// its own fp32 accumulator, summed with round-to-nearest. 2 chains pass every test on the H200 (1 fails an
// lse by 1.3e-6 near 0) and save the wide kernel one tensor-pipe drain a tile (~2% of a prefill with the
// stmatrix publication of P, benchmarks/README.md); SMLA_S_CHAINS (1..3) is an experiment knob.
#ifndef SMLA_S_CHAINS
#define SMLA_S_CHAINS 2
#endif
constexpr int kSChains = SMLA_S_CHAINS;
static_assert(kSChains >= 1 && kSChains <= 3, "S as 1, 2 or 3 chains");

// Mask, scale to the log2 domain, saturate overflow where the thread's maxima and the rows' running maxima m say it
// matters (attention/softmax.cuh), over a thread's JN accumulator column blocks (s[4 jn + {0, 1}] row r0, {2, 3} row
// r0 + 8, at tokens 8 jn + 2 t4 + {0, 1}); ok(jn, e): token 8 jn + 2 t4 + e is valid; mx: this thread's row maxima.
template <int JN, class Ok>
__device__ __forceinline__ void mask_scale_cols(Ok ok, float scale_log2, const float (&m)[2], float (&s)[4 * JN],
                                                float (&mx)[2])
{
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int jn = 0; jn < JN; ++jn) {
        const bool ok0 = ok(jn, 0), ok1 = ok(jn, 1);
        s[4 * jn + 0] = ok0 ? s[4 * jn + 0] * scale_log2 : -INFINITY;
        s[4 * jn + 1] = ok1 ? s[4 * jn + 1] * scale_log2 : -INFINITY;
        s[4 * jn + 2] = ok0 ? s[4 * jn + 2] * scale_log2 : -INFINITY;
        s[4 * jn + 3] = ok1 ? s[4 * jn + 3] * scale_log2 : -INFINITY;
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
    }
    // overflow (rare): saturate this thread's valid scores when its maxima say so
    if (sat_needed(mx[0], m[0]) || sat_needed(mx[1], m[1])) {
        mx[0] = mx[1] = -INFINITY;
#pragma unroll
        for (int jn = 0; jn < JN; ++jn) {
            if (ok(jn, 0)) {
                s[4 * jn + 0] = sat_score(s[4 * jn + 0]);
                s[4 * jn + 2] = sat_score(s[4 * jn + 2]);
            }
            if (ok(jn, 1)) {
                s[4 * jn + 1] = sat_score(s[4 * jn + 1]);
                s[4 * jn + 3] = sat_score(s[4 * jn + 3]);
            }
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
        }
    }
}
// The same over a [64 heads x 64 tokens] tile (valid: its 64 row flags); then reduced over the quad, which holds
// all 64 tokens of rows r0, r0 + 8 (mask_scores).
__device__ __forceinline__ void mask_scale_thread(const int *valid, float scale_log2, int t4, const float (&m)[2],
                                                  float (&s)[32], float (&mx)[2])
{
    mask_scale_cols<8>([&](int jn, int e) { return valid[8 * jn + 2 * t4 + e] != 0; }, scale_log2, m, s, mx);
}
// The wide kernel's speculative softmax (kSpecSoftmax, plan.cuh) keeps the scores raw: mask_raw sets the invalid
// tokens' to -inf (valid as above), thread_max takes this thread's raw row maxima.
__device__ __forceinline__ void mask_raw(const int *valid, int t4, float (&s)[32])
{
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
        const int tok = 8 * jn + 2 * t4;
        const bool ok0 = valid[tok] != 0, ok1 = valid[tok + 1] != 0;
        if (!ok0) s[4 * jn + 0] = s[4 * jn + 2] = -INFINITY;
        if (!ok1) s[4 * jn + 1] = s[4 * jn + 3] = -INFINITY;
    }
}
__device__ __forceinline__ void thread_max(const float (&s)[32], float (&mx)[2])
{
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
    }
}
__device__ __forceinline__ void quad_max(float (&mx)[2])
{
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    }
}
__device__ __forceinline__ void mask_scores(const int *valid, float scale_log2, int t4, const float (&m)[2],
                                            float (&s)[32], float (&mx)[2])
{
    mask_scale_thread(valid, scale_log2, t4, m, s, mx);
    quad_max(mx);
}

// The folded scale (the wide kernel's speculative softmax; in the pair kernel 1-2% slower, issue 16, forty-fourth
// session): the scores stay raw (S, masked to -inf where invalid unless full: every token of the tile valid) and the
// exponents' FFMA applies the scale, 2^(s scale - m) with one rounding instead of two; for scale > 0 the raw maxima
// times the scale are exactly the scaled scores' maxima (rounding is monotonic). Where a thread's scores may saturate
// (sat_needed), or where its maxima exceed kFoldLimit in magnitude (the FFMA's exact s scale - m then differs from the
// rounded scores' difference by up to half an ulp of s scale, which the exponent would turn into 0 or inf where the
// rounded difference is 0), or for scale <= 0, they are masked and scaled in place as by mask_scale_thread. Returns the
// factor the exponents apply to s (scale, or 1 where scaled in place); mx: this thread's scaled row maxima (not yet
// reduced over the quad).
constexpr float kFoldLimit = 65536.f;  // half an ulp is 2^-8 here: P within 0.3% of the rounded scores'
__device__ __forceinline__ bool foldable(float mx) { return mx == -INFINITY || fabsf(mx) <= kFoldLimit; }
__device__ __forceinline__ float mask_fold_thread(const int *valid, bool full, float scale, int t4, const float (&m)[2],
                                                  float (&s)[32], float (&mx)[2])
{
    bool slow = !(scale > 0.f);
    if (!slow) {
        if (!full) mask_raw(valid, t4, s);
        thread_max(s, mx);
        mx[0] *= scale;
        mx[1] *= scale;
        slow = sat_needed(mx[0], m[0]) || sat_needed(mx[1], m[1]) || !foldable(mx[0]) || !foldable(mx[1]);
    }
    if (slow) {
        mask_scale_thread(valid, scale, t4, m, s, mx);
        return 1.f;
    }
    return scale;
}

// A row's reference max after a tile (the wide and the three-buffer kernels' score warpgroups): from the tile's max
// mx, the new reference m_r (LAZY, kLazyMax in plan.cuh: it moves only when mx exceeds it by more than kLazySlack,
// attention/softmax.cuh, so P <= 2^8 and O is rescaled rarely; NaN keeps it; otherwise the running max), the true
// max m_t (max_logits), O's factor alpha and nb, minus the base P is taken against. lse = m_r + log2(l) holds for
// any reference. True if the reference moved.
// next_ref_max: the rule alone (also the pair kernel's, agreed once per pair of tiles).
template <bool LAZY>
__device__ __forceinline__ float next_ref_max(float m_r, float mx)
{
    return LAZY ? (mx > m_r + kLazySlack ? mx : m_r) : fmaxf(m_r, mx);
}
template <bool LAZY = kLazyMax>
__device__ __forceinline__ bool move_ref_max(float mx, float &m_r, float &m_t, float &alpha, float &nb)
{
    m_t = fmaxf(m_t, mx);
    const float mn = next_ref_max<LAZY>(m_r, mx);
    const float base = mn == -INFINITY ? 0.f : mn;
    alpha = ex2(m_r - base);
    nb = -base;
    const bool moved = mn != m_r;
    m_r = mn;
    return moved;
}
// The rows' sums in double (see sm80/tile.cuh): rescaled by alpha, plus this thread's tile sums rs; quad_sum_rows: over
// the quad, whose four threads hold a row's columns.
__device__ __forceinline__ void scale_add_row_sums(double (&l)[2], const float (&alpha)[2], const float (&rs)[2])
{
    l[0] = l[0] * static_cast<double>(alpha[0]) + static_cast<double>(rs[0]);
    l[1] = l[1] * static_cast<double>(alpha[1]) + static_cast<double>(rs[1]);
}
__device__ __forceinline__ void quad_sum_rows(double (&l)[2])
{
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
}

// A [64 heads x 64 tokens] bf16 A-fragment set (p[4 kk + 2 hf + rr]: row r0 + 8 rr, tokens 16 kk + 8 hf +
// 2 t4, + 1) into a swizzled [64 rows x 128 B] block (blk_addr), the A operand of a wgmma from shared
// memory: per k-step kk one stmatrix x4 whose matrix m holds rows + 8 (m & 1) and tokens 16 kk + 8 (m >> 1)
// of the warp's 16 rows, the fragment registers' own order.
__device__ __forceinline__ void store_p_frags(uint32_t blk, int r0, int lane, const uint32_t (&p)[16])
{
    const int m = lane >> 3, row = (r0 & ~15) + 8 * (m & 1) + (lane & 7);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        stsm_x4(blk_addr(blk, row, 2 * kk + (m >> 1)), p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]);
}

// O's rows r0 / r0 + 8 times f[0] / f[1] (an accumulator of N floats: N / 4 column blocks of 8), skipped
// when no lane of the warp has a factor other than 1 (the running max moved: rarely, late in a row).
template <int N>
__device__ __forceinline__ void rescale_rows(float (&o)[N], const float (&f)[2])
{
    if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) {
#pragma unroll
        for (int jn = 0; jn < N / 4; ++jn) {
            o[4 * jn + 0] *= f[0];
            o[4 * jn + 1] *= f[0];
            o[4 * jn + 2] *= f[1];
            o[4 * jn + 3] *= f[1];
        }
    }
}

// The epilogue of a warpgroup's O columns col0 .. col0 + 2 N - 1 (o: N floats, the m64n(2N) accumulator
// layout, o[4 jn + ..] at columns col0 + 8 jn + 2 t4, + 1) of heads h0 + r0, h0 + r0 + 8, with
// stat(hf, rl) -> {m, l, mt} (rl = r0 + 8 hf): the row's log2-domain reference max m, its sum l of
// 2^(s - m) and its true max mt (max_logits; with kLazyMax the wide kernel moves m lazily, so mt >= m).
// The quad lead of the warpgroup that holds column 0 writes the row's lse (and max_logits).
// finish_cols: each row through finish_row (attention/epilogue.cuh), split partials or direct stores
// (max_logits from m: not for the lazy max, plan.cuh); TOPK_SPLIT = 1: the caller knows it is a top-k split.
struct RowStat {
    float m;
    double l;
    float mt;
};
template <int TOPK_SPLIT = -1, int N, class Stat>
__device__ __forceinline__ void finish_cols(const Args &a, const CtaCommon &c, int h0, int r0, int col0, int t4,
                                            const float (&o)[N], Stat stat)
{
    const bool split = TOPK_SPLIT < 0 ? a.n_splits > 1 : TOPK_SPLIT != 0;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int rl = r0 + 8 * hf;
        const int hr = h0 + rl;
        if (hr >= c.h) continue;
        const int cc = col0 + 2 * t4;
        const RowStat rs = stat(hf, rl);
        finish_row<N / 4>(
            a, c.row, c.bi, c.si, c.sp, c.h, hr, split, rs.m, rs.l, [&] { return cc; },
            [&] { return col0 == 0 && t4 == 0; },
            [&](int jn) { return make_float2(o[4 * jn + 2 * hf], o[4 * jn + 2 * hf + 1]); });
    }
}

// A direct output (no top-k split), written through shared memory: each thread puts its rows' scaled bf16
// pairs into stage as column blocks of [64 rows x 128 B] in the 128-byte swizzle of the kernels' Q / K blocks
// (blk_addr; block j: columns 64 j ..; 16-byte chunk k of a row's block at k ^ (row & 7), so a quarter warp's eight
// rows hit distinct banks), the warpgroup meets at named barrier bar, and each 16-byte chunk goes out in one store
// (a warp writes whole 128-byte lines, where the direct stores wrote 16 bytes per row and instruction). (The layout
// is a TMA box's: storing the blocks by TMA instead measured no faster, issue 16, twenty-fifth session.)
//
// row_factor: the factor of row hr's output (finish_row's arithmetic: out_factor, 1 / l, 0 for an empty row); the lse
// (a double log) only for attn_sink's factor. row_stats_out: by the row's lead (the quad lead of the warpgroup of
// column 0), its lse and max_logits (row_lse, row_max_logit), after its stores: the log's latency then overlaps them.
__device__ __forceinline__ float row_factor(const Args &a, int hr, const RowStat &rs)
{
    const smla_attn_params &p = a.p;
    const bool none = rs.m == -INFINITY;
    const double lse_d = p.attn_sink ? row_lse(rs.m, rs.l, a.ml_factor) : 0.0;
    return out_factor(p, hr, none ? 0.f : static_cast<float>(1.0 / rs.l), none, lse_d);
}
__device__ __forceinline__ void row_stats_out(const Args &a, const CtaCommon &c, int hr, const RowStat &rs)
{
    const smla_attn_params &p = a.p;
    p.lse[c.bi * p.lse_stride_b + c.si * p.lse_stride_s + hr * p.lse_stride_h] =
        static_cast<float>(row_lse(rs.m, rs.l, a.ml_factor));
    if (p.max_logits)
        p.max_logits[c.bi * p.ml_stride_b + c.si * p.ml_stride_s + hr * p.ml_stride_h] = row_max_logit(rs.mt, a.ml_factor);
}

// stage_out_cols: this thread's rows r0, r0 + 8 (times f[0], f[1]) into the stage and the warpgroup's columns col0 ..
// col0 + 2 N - 1 out. kOutPipe (plan.cuh): one 64-column block at a time, staged, met at bar, stored, so that the
// next block's staging runs while the SM drains this one's stores (an SM writes ~32 B a cycle: 64 KB take ~2,000
// cycles, issue 16, twenty-sixth session); else all blocks staged, one meeting, all stored.
template <bool STSM = kOutStsm, int N>
__device__ __forceinline__ void stage_out_cols(const Args &a, const CtaCommon &c, int h0, int r0, int col0, int t4,
                                               const float (&o)[N], const float (&f)[2], uint32_t stage, int bar)
{
    constexpr int kChunks = N / 4;  // 16-byte chunks (8 columns) of a row
    static_assert(kChunks % 8 == 0, "whole 64-column blocks");
    const smla_attn_params &p = a.p;
    const int k0 = col0 >> 3;  // col0 is a multiple of 64
    // chunks [j0, j1) of this thread's rows into the stage (STSM: whole 64-column blocks by stmatrix, rows past h
    // included: their factor is 0 and the stores below skip them)
    const auto put = [&](int j0, int j1) {
        if constexpr (STSM) {
#pragma unroll
            for (int jb = j0; jb < j1; jb += 8) {
                uint32_t pk[16];  // the A-fragment order of store_p_frags: k-step kk = chunks jb + 2 kk, + 1
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    const float *q = o + 4 * (jb + 2 * kk);
                    pk[4 * kk + 0] = pack_bf16x2(q[0] * f[0], q[1] * f[0]);
                    pk[4 * kk + 1] = pack_bf16x2(q[2] * f[1], q[3] * f[1]);
                    pk[4 * kk + 2] = pack_bf16x2(q[4] * f[0], q[5] * f[0]);
                    pk[4 * kk + 3] = pack_bf16x2(q[6] * f[1], q[7] * f[1]);
                }
                store_p_frags(stage + ((k0 + jb) >> 3) * kBlk, r0, c.lane, pk);
            }
        } else {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int rl = r0 + 8 * hf;
                if (h0 + rl >= c.h) continue;
#pragma unroll
                for (int jn = j0; jn < j1; ++jn)
                    st_shared_u32(blk_addr(stage, rl, k0 + jn) + 4 * t4,
                                  pack_bf16x2(o[4 * jn + 2 * hf] * f[hf], o[4 * jn + 2 * hf + 1] * f[hf]));
            }
        }
    };
    const int tw = c.tid & 127;
    uint16_t *const out_row = p.out + c.bi * p.out_stride_b + c.si * p.out_stride_s + col0;
    if constexpr (kOutPipe) {
        // 64 rows x 8 chunks of a block over 128 threads: this thread's rows 16 k + tw / 8 (k < 4), chunk tw % 8 of
        // every block; kOutHoist: their stage and output addresses taken once (block j: + j kBlk, + 64 j columns)
        uint32_t sa[4];
        uint16_t *op[4];
        bool ok[4];
        if constexpr (kOutHoist) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int row = 16 * k + (tw >> 3);
                ok[k] = h0 + row < c.h;
                sa[k] = blk_addr(stage, row, k0 + (tw & 7));
                op[k] = out_row + (h0 + row) * p.out_stride_h + 8 * (tw & 7);
            }
        }
#pragma unroll
        for (int j = 0; j < kChunks / 8; ++j) {
            put(8 * j, 8 * j + 8);
            named_sync(bar, 128);
            if (j == 0) trace_edge(a, kTrStageMet);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                if constexpr (kOutHoist) {
                    if (ok[k]) st_global_cs_v4(op[k] + 64 * j, ld_shared_v4(sa[k] + j * kBlk));  // streaming
                } else {
                    const int row = 16 * k + (tw >> 3), cc = 8 * j + (tw & 7);
                    if (h0 + row >= c.h) break;  // rows ascend with k
                    const uint4 v = ld_shared_v4(blk_addr(stage, row, k0 + cc));
                    st_global_cs_v4(out_row + (h0 + row) * p.out_stride_h + 8 * cc, v);  // streaming: not read again
                }
            }
        }
    } else {
        put(0, kChunks);
        named_sync(bar, 128);
        trace_edge(a, kTrStageMet);
#pragma unroll 4
        for (int k = 0; k < kChunks / 2; ++k) {  // 64 rows x kChunks chunks over 128 threads
            const unsigned q = 128u * k + tw;  // unsigned: the division by a constant is a shift or a multiply
            const int row = static_cast<int>(q / kChunks), cc = static_cast<int>(q % kChunks);
            if (h0 + row >= c.h) break;  // rows ascend with k
            const uint4 v = ld_shared_v4(blk_addr(stage, row, k0 + cc));
            st_global_cs_v4(out_row + (h0 + row) * p.out_stride_h + 8 * cc, v);
        }
    }
}

// The same columns straight from registers (the persistent kernel's output, which leaves Q's region to the next item's
// Q): per row and four 8-column groups 4 m .. 4 m + 3, the quad transposes its bf16 pairs (quad_transpose) so that
// thread t4 holds group 4 m + t4 whole and writes it in one 16-byte store (a warp: 8 rows x 64 B).
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4], int t4)
{
    // stage d (1, 2): position j takes the partner's (t4 ^ d) position j ^ d where bit d of j ^ t4 is set
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
        const bool hi = (t4 & d) != 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j & d) continue;  // pairs (j, j + d): the lane keeps one, sends the other
            const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? x[j] : x[j + d], d);
            if (hi) x[j] = got;
            else x[j + d] = got;
        }
    }
}
template <int N>
__device__ __forceinline__ void store_out_cols_regs(const Args &a, const CtaCommon &c, int h0, int r0, int col0,
                                                    int t4, const float (&o)[N], const float (&f)[2])
{
    static_assert(N % 16 == 0, "whole quads of 8-column groups");
    const smla_attn_params &p = a.p;
    uint16_t *const out_row = p.out + c.bi * p.out_stride_b + c.si * p.out_stride_s + col0;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int hr = h0 + r0 + 8 * hf;
#pragma unroll
        for (int m = 0; m < N / 16; ++m) {
            uint32_t x[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float *q = o + 4 * (4 * m + j) + 2 * hf;
                x[j] = pack_bf16x2(q[0] * f[hf], q[1] * f[hf]);
            }
            quad_transpose(x, t4);  // every lane takes part: rows past h only skip the store
            if (hr < c.h) st_global_cs_v4(out_row + hr * p.out_stride_h + 8 * (4 * m + t4), make_uint4(x[0], x[1], x[2], x[3]));
        }
    }
}

// Both: both rows' factors first (their double divisions side by side), then hand(f) (the wide kernel's WG0 hands them
// to WG1 there: ConsumerBase::early_out), stage_out_cols, then the rows' lse.
struct NoHandOver {
    __device__ __forceinline__ void operator()(const float (&)[2]) const {}
};
// STAGE = false: from registers (store_out_cols_regs; stage and bar unused); STSM: stage_out_cols's.
template <bool STAGE = true, bool STSM = kOutStsm, int N, class Stat, class Hand = NoHandOver>
__device__ __forceinline__ void finish_cols_direct(const Args &a, const CtaCommon &c, int h0, int r0, int col0, int t4,
                                                   const float (&o)[N], Stat stat, uint32_t stage, int bar,
                                                   Hand hand = {})
{
    float f[2] = {0.f, 0.f};
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int hr = h0 + r0 + 8 * hf;
        if (hr < c.h) f[hf] = row_factor(a, hr, stat(hf, r0 + 8 * hf));
    }
    hand(f);
    trace_edge(a, kTrStaged);
    if constexpr (STAGE) stage_out_cols<STSM>(a, c, h0, r0, col0, t4, o, f, stage, bar);
    else store_out_cols_regs(a, c, h0, r0, col0, t4, o, f);
    trace_edge(a, kTrOut);
    if (col0 == 0 && t4 == 0) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int hr = h0 + r0 + 8 * hf;
            if (hr < c.h) row_stats_out(a, c, hr, stat(hf, r0 + 8 * hf));
        }
    }
}

// The rule: a call's output goes through shared memory (finish_cols_direct) where it is direct (no top-k split) and
// kStagedOut (plan.cuh).
__device__ __forceinline__ bool staged_direct(const Args &a) { return kStagedOut && !(a.n_splits > 1); }

// The writer of a warpgroup's O columns: finish_cols_direct where staged_direct, else finish_cols. stage: Q's region
// (dead once every S is done), bar: the warpgroup's named barrier. SPLITS: a kernel that always writes split
// partials (no direct output's code). STSM: stage_out_cols's.
template <bool SPLITS = false, bool STSM = kOutStsm, int N, class Stat>
__device__ __forceinline__ void finish_o_cols(const Args &a, const CtaCommon &c, int h0, int r0, int col0, int t4,
                                              const float (&o)[N], Stat stat, uint32_t stage, int bar)
{
    if constexpr (SPLITS) {
        finish_cols<1>(a, c, h0, r0, col0, t4, o, stat);
    } else if constexpr (kStagedOut) {
        if (!staged_direct(a)) finish_cols<1>(a, c, h0, r0, col0, t4, o, stat);  // staged: not direct, so a split
        else finish_cols_direct<true, STSM>(a, c, h0, r0, col0, t4, o, stat, stage, bar);
    } else {
        finish_cols(a, c, h0, r0, col0, t4, o, stat);
    }
}

}  // namespace sm90
}  // namespace attn
