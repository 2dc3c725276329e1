// How a finished attention row is written, one rule for both kernel families and the combine
// (docs/design.md sections 4 and 8): the natural-log lse and max logit of a row (row_lse,
// row_max_logit), attn_sink's factor (sink_factor), the encoding of a split partial's lse (part_lse,
// box_sign, box_count), and the writers: finish_row (a kernel's row, split or direct) and
// store_out_row (the bf16 output, lse and max_logits, also used by the combine).
//
// Accuracy: row sums are kept in double by the kernels and lse = m * ml_factor + ln(l) is formed in
// double (an fp32 m + log2f(l) loses ~1e-6 when lse is near 0; ml_factor = scale / fl(scale * log2 e)
// also undoes the fp32 rounding of the log2-domain scale).
#pragma once

#include "attention/ptx.cuh"
#include "attention/softmax.cuh"
#include "core/attention_math.h"

namespace attn {

// The finished-row rules are csrc/core/attention_math.h's, shared with the CPU kernels; these wrappers
// give them the kernels' types (m is the fp32 log2-domain row max, -inf when no index took part).
__device__ __forceinline__ double row_lse(float m, double l, double ml_factor)
{
    return smla_row_lse(static_cast<double>(m), l, ml_factor);
}
__device__ __forceinline__ float row_max_logit(float m, double ml_factor)
{
    return static_cast<float>(smla_row_max_logit(static_cast<double>(m), ml_factor));
}
__device__ __forceinline__ double sink_factor(float sink, double lse)
{
    return smla_sink_factor(static_cast<double>(sink), lse);
}

// Split partials. A saturated split has no finite lse, and the combine needs its sign and its count
// of saturated tokens (its row sum l: each of them weighs exactly ex2(0) = 1, any other token 0) to
// weight all saturated tokens of the row equally across splits. Its lse_part is a "box": the bits of
// an infinity of that sign with the count in the 22 low mantissa bits, a signalling-NaN pattern that
// no arithmetic produces (the GPU's NaNs are quiet); counts from 2^22 - 1 on are stored as 2^22 - 1.
// Any other non-empty split stores its lse * log2(e) clamped to the finite range (NaN stays NaN),
// as -inf means an empty split.
constexpr uint32_t kSatCountMax = 0x3fffffu;
__device__ __forceinline__ float part_lse(float m, double l, double lse_d)
{
    if (m == -INFINITY) return -INFINITY;
    if (l == l && (m == kFltMax || m == -kFltMax)) {
        const uint32_t c = l < static_cast<double>(kSatCountMax) ? static_cast<uint32_t>(l) : kSatCountMax;
        return __uint_as_float((m > 0.f ? 0x7f800000u : 0xff800000u) | c);  // l >= 1: c >= 1
    }
    const float v = static_cast<float>(lse_d * SMLA_LOG2E);
    return v > kFltMax ? kFltMax : (v < -kFltMax ? -kFltMax : v);
}
// +1 / -1: a box of that sign; 0: any other value
__device__ __forceinline__ int box_sign(float x)
{
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fc00000u) != 0x7f800000u || (u & kSatCountMax) == 0) return 0;
    return (u >> 31) ? -1 : 1;
}
__device__ __forceinline__ float box_count(float x) { return static_cast<float>(__float_as_uint(x) & kSatCountMax); }

// One thread's share of a row's unnormalised output: NG groups of NV consecutive columns (NV = 2:
// get(i) is a float2, NV = 4: a float4), group i at columns col0 + STEP * i.
template <int NV>
struct ColGroup;
template <>
struct ColGroup<2> {
    using V = float2;
    __device__ __forceinline__ static void store_bf16(uint16_t *dst, V v, float f)
    {
        *reinterpret_cast<uint32_t *>(dst) = pack_bf16x2(v.x * f, v.y * f);
    }
};
template <>
struct ColGroup<4> {
    using V = float4;
    __device__ __forceinline__ static void store_bf16(uint16_t *dst, V v, float f)
    {
        uint2 w;
        w.x = pack_bf16x2(v.x * f, v.y * f);
        w.y = pack_bf16x2(v.z * f, v.w * f);
        *reinterpret_cast<uint2 *>(dst) = w;
    }
};

// The factor of a direct output row: f (1 / the row sum, 0 for an empty row) times attn_sink's factor.
__device__ __forceinline__ float out_factor(const smla_attn_params &p, int hr, float f, bool none, double lse_d)
{
    if (p.attn_sink && !none) f *= static_cast<float>(sink_factor(p.attn_sink[hr * p.sink_stride], lse_d));
    return f;
}

// The direct output of a finished row of query row (bi, si), head hr: out = acc * f in bf16, with f
// (1 / the row sum, 0 for an empty row) times attn_sink's factor, and, by the row's lead thread, the
// natural-log lse and whatever `extra` writes next to it (a kernel's max_logits). col(), lead() and
// get(i) describe this thread's share (see finish_row); they are evaluated where they are needed.
template <int NV, int NG, int STEP, class Col, class Lead, class Get, class Extra>
__device__ __forceinline__ void store_out_row(const smla_attn_params &p, int64_t bi, int64_t si, int hr, float f,
                                              bool none, double lse_d, Col col, Lead lead, Get get, Extra extra)
{
    const float lse = static_cast<float>(lse_d);
    f = out_factor(p, hr, f, none, lse_d);
    uint16_t *op = p.out + bi * p.out_stride_b + si * p.out_stride_s + hr * p.out_stride_h + col();
#pragma unroll
    for (int i = 0; i < NG; ++i) ColGroup<NV>::store_bf16(op + STEP * i, get(i), f);
    if (lead()) {
        p.lse[bi * p.lse_stride_b + si * p.lse_stride_s + hr * p.lse_stride_h] = lse;
        extra();
    }
}

// A kernel's finished row: query row `row` = (bi, si), top-k split sp, head hr of h, its log2-domain
// max m (-inf: no valid index in this range) and its sum l of 2^(s - m); split: a.n_splits > 1 (read
// once by the caller). This thread's share of the row: NP column pairs, pair i at columns col() + 8 i
// with unnormalised values get(i) (a float2); lead() is true for the one thread that writes the
// row's lse. Split: the fp32 partial O and part_lse go into the workspace for the combine; otherwise
// out, lse and max_logits. col() and lead() are evaluated in each branch, where the kernels computed
// them before the epilogue was shared (so the generated code stayed the same).
// ml: the row's largest score (log2 domain) for max_logits, where it is not m (a kernel whose sums were
// taken against a maximum that lags behind: the narrow kernel's lazy maximum, sm90/narrow_softmax.cuh).
template <int NP, class Col, class Lead, class Get>
__device__ __forceinline__ void finish_row(const Args &a, int64_t row, int64_t bi, int64_t si, int sp, int h, int hr,
                                           bool split, float m, double l, float ml, Col col, Lead lead, Get get)
{
    const smla_attn_params &p = a.p;
    const bool none = m == -INFINITY;  // no valid index in this range
    const double lse_d = row_lse(m, l, a.ml_factor);
    float f = none ? 0.f : static_cast<float>(1.0 / l);
    if (split) {
        const int64_t prow = (static_cast<int64_t>(sp) * a.rows + row) * h + hr;
        if (!none) {
            float *op = a.o_part + prow * kDv + col();
#pragma unroll
            for (int i = 0; i < NP; ++i) {
                const float2 v = get(i);
                *reinterpret_cast<float2 *>(op + 8 * i) = make_float2(v.x * f, v.y * f);
            }
        }
        if (lead()) a.lse_part[prow] = part_lse(m, l, lse_d);
    } else {
        store_out_row<2, NP, 8>(p, bi, si, hr, f, none, lse_d, col, lead, get, [&] {
            if (p.max_logits)
                p.max_logits[bi * p.ml_stride_b + si * p.ml_stride_s + hr * p.ml_stride_h] =
                    row_max_logit(ml, a.ml_factor);
        });
    }
}
template <int NP, class Col, class Lead, class Get>
__device__ __forceinline__ void finish_row(const Args &a, int64_t row, int64_t bi, int64_t si, int sp, int h, int hr,
                                           bool split, float m, double l, Col col, Lead lead, Get get)
{
    finish_row<NP>(a, row, bi, si, sp, h, hr, split, m, l, m, col, lead, get);
}

// A row whose online softmax ran as two states (two groups of warps on alternate K tiles: the register
// kernel, sm90/reg_kernel.cuh, and the dims kernel, sm90/dims_kernel.cuh), each with its maximum m_i, row
// sum l_i and unnormalised fp32 O row r_i (512 floats, staged in smem): merged with m = max(m0, m1) and
// weights 2^(m_i - m), and finished by one warp (lane: columns 64 (lane >> 2) + 2 (lane & 3) + 8 i).
__device__ __forceinline__ void finish_merged_row(const Args &a, int64_t row, int64_t bi, int64_t si, int sp, int h,
                                                  int hd, int lane, float m0, float m1, double l0, double l1,
                                                  const float *r0, const float *r1)
{
    const float m = fmaxf(m0, m1);
    const bool none = m == -INFINITY;
    const float w0 = none ? 0.f : ex2(m0 - m), w1 = none ? 0.f : ex2(m1 - m);
    const double l = static_cast<double>(w0) * l0 + static_cast<double>(w1) * l1;
    const int col0 = 64 * (lane >> 2) + 2 * (lane & 3);
    r0 += col0, r1 += col0;
    finish_row<8>(
        a, row, bi, si, sp, h, hd, a.n_splits > 1, m, l, [&] { return col0; }, [&] { return lane == 0; },
        [&](int i) {
            const float2 u = *reinterpret_cast<const float2 *>(r0 + 8 * i);
            const float2 z = *reinterpret_cast<const float2 *>(r1 + 8 * i);
            return make_float2(w0 * u.x + w1 * z.x, w0 * u.y + w1 * z.y);
        });
}

}  // namespace attn
