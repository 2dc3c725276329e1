/* The softmax arithmetic that every attention backend shares (docs/design.md section 4), written once for
 * the CPU kernels (csrc/cpu/sparse_mla_attention.c) and the CUDA kernels (cuda/attention/epilogue.cuh):
 * the log2-domain score scale, and how a finished row's maximum m and sum l become lse, max_logits and
 * the attn_sink factor, including the overflow rules of design.md section 8.
 *
 * Scores are kept in the log2 domain: s2 = dot(q, k) * scale_log2 with scale_log2 = fl32(scale * log2 e),
 * so that p = 2^(s2 - m) is one ex2. A valid score beyond the fp32 range is saturated at +-FLT_MAX by the
 * kernels; a row maximum at +FLT_MAX therefore stands for an overflowed one (lse = max_logits = +inf), one
 * at -FLT_MAX for a row whose every valid score overflowed downward (-inf). */
#ifndef SMLA_CORE_ATTENTION_MATH_H
#define SMLA_CORE_ATTENTION_MATH_H

#include <float.h>
#include <math.h>

#include "smla.h"

#define SMLA_LOG2E 1.4426950408889634
#define SMLA_LN2 0.6931471805599453

/* softmax_scale * log2(e), rounded once to fp32 (the product is formed in double). */
SMLA_HD float smla_attn_scale_log2(float scale) { return (float)((double)scale * SMLA_LOG2E); }

/* The factor that turns a log2-domain logit back into a natural one: scale / scale_log2, which is ln 2
 * up to scale_log2's own rounding and so undoes it (lse accuracy near 0 is 1e-6 absolute); plain ln 2
 * when scale_log2 is 0 or not finite. */
SMLA_HD double smla_attn_to_ln(float scale, float scale_log2)
{
    return (scale_log2 != 0.0f && isfinite(scale_log2)) ? (double)scale / (double)scale_log2 : SMLA_LN2;
}

/* Natural-log lse of a finished row: m is its log2-domain maximum (-inf when no index took part), l its
 * sum of 2^(s2 - m). A NaN score (NaN l) gives NaN; a saturated maximum gives an infinite lse. */
SMLA_HD double smla_row_lse(double m, double l, double to_ln)
{
    if (l != l) return l;
    if (m == -INFINITY) return -INFINITY;
    if (m == (double)FLT_MAX) return INFINITY;
    if (m == -(double)FLT_MAX) return -INFINITY;
    return m * to_ln + log(l);
}

/* Natural-log max logit of a row whose log2-domain maximum is m (-inf stays -inf). */
SMLA_HD double smla_row_max_logit(double m, double to_ln)
{
    if (m == (double)FLT_MAX) return INFINITY;
    if (m == -(double)FLT_MAX) return -INFINITY;
    return m * to_ln;
}

/* attn_sink's factor on the output, 1 / (1 + exp(sink - lse)). A sink of +inf gives 0 and -inf gives 1
 * whatever lse (also the infinite lse of a saturated row, where sink - lse would be inf - inf); a NaN
 * sink stays NaN. */
SMLA_HD double smla_sink_factor(double sink, double lse)
{
    if (sink == INFINITY) return 0.0;
    if (sink == -INFINITY) return 1.0;
    return 1.0 / (1.0 + exp(sink - lse));
}

#endif /* SMLA_CORE_ATTENTION_MATH_H */
