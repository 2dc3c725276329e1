/* The float arithmetic of merge_attn_states (docs/design.md section 4), written once for the CPU kernel
 * (csrc/cpu/merge_attn_states.c) and the CUDA twin (cuda/memory/merge_attn_states.cu) so that both give
 * the same bits. libm expf/logf and CUDA expf/logf differ in the last ulp, so this header carries its own
 * exp and log built only from correctly rounded operations (+ - * /, floor, exact power-of-two scaling).
 * Every operation is a separate rounding: number_formats.h's SMLA_*_RN, the _rn intrinsics on the device
 * (never contracted into an FMA) and plain C on the host, compiled without FMA contraction and without
 * -ffast-math (number_formats.h refuses it).
 *
 * Accuracy: smla_exp_f32 / smla_log_f32 are within a few ulp of the exact functions over the whole
 * float range (the merge only needs ~1e-6 relative). */
#ifndef SMLA_CORE_MERGE_MATH_H
#define SMLA_CORE_MERGE_MATH_H

#include <math.h>

#include "number_formats.h"

/* 2^k for -126 <= k <= 127, exactly. */
SMLA_HD float smla_mm_pow2i(int k) { return smla_bits_to_f32((uint32_t)(k + 127) << 23); }

/* e^x. Cody-Waite reduction x = k*ln2 + r, |r| <= ~0.35 (k*LN2_HI is exact: LN2_HI has 15
 * significant bits and |k| < 2^8), degree-7 Taylor polynomial by Horner, then exact scaling by 2^k
 * (two steps when the result is subnormal, so it is rounded once). */
SMLA_HD float smla_exp_f32(float x)
{
    if (x != x) return x;
    if (x > 88.72283935546875f) return smla_bits_to_f32(0x7f800000u);  /* overflows: +inf */
    if (x < -103.972084045410156f) return 0.0f;                         /* below half the least subnormal */
    const float LOG2E = 1.44269502162933349609375f;
    const float LN2_HI = 0.693145751953125f;        /* 0x3f317200 */
    const float LN2_LO = 1.42860676533018704e-06f;  /* 0x35bfbe8e */
    float kf = floorf(SMLA_ADD_RN(SMLA_MUL_RN(x, LOG2E), 0.5f));
    int k = (int)kf;
    float r = SMLA_SUB_RN(SMLA_SUB_RN(x, SMLA_MUL_RN(kf, LN2_HI)), SMLA_MUL_RN(kf, LN2_LO));
    float p = 1.98412698412698413e-04f;                         /* 1/5040 */
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 1.38888888888888889e-03f); /* 1/720 */
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 8.33333333333333333e-03f); /* 1/120 */
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 4.16666666666666667e-02f); /* 1/24 */
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 1.66666666666666667e-01f); /* 1/6 */
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 0.5f);
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 1.0f);
    p = SMLA_ADD_RN(SMLA_MUL_RN(p, r), 1.0f);
    if (k > 127) return SMLA_MUL_RN(SMLA_MUL_RN(p, 2.0f), smla_mm_pow2i(k - 1));
    if (k < -126) return SMLA_MUL_RN(SMLA_MUL_RN(p, smla_mm_pow2i(k + 64)), smla_mm_pow2i(-64));
    return SMLA_MUL_RN(p, smla_mm_pow2i(k));
}

/* Natural log. y = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1),
 * by its odd series to s^11; result = e*LN2_HI + (2s + (2s*R + e*LN2_LO)). m - 1 is exact. */
SMLA_HD float smla_log_f32(float y)
{
    if (y != y) return y;
    if (y < 0.0f) return smla_bits_to_f32(0x7fc00000u);
    if (y == 0.0f) return smla_bits_to_f32(0xff800000u);
    uint32_t u = smla_f32_to_bits(y);
    if (u == 0x7f800000u) return y;
    int e = 0;
    if (u < 0x00800000u) { /* subnormal: scale into the normal range first (exact) */
        u = smla_f32_to_bits(SMLA_MUL_RN(y, 8388608.0f));
        e = -23;
    }
    e += (int)(u >> 23) - 127;
    u = (u & 0x007fffffu) | 0x3f800000u; /* m in [1, 2) */
    if (u > 0x3fb504f3u) {               /* m > sqrt(2): use m/2 */
        u -= 0x00800000u;
        e += 1;
    }
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.42860676533018704e-06f;
    float f = SMLA_SUB_RN(smla_bits_to_f32(u), 1.0f);
    float s = SMLA_DIV_RN(f, SMLA_ADD_RN(2.0f, f));
    float z = SMLA_MUL_RN(s, s);
    float R = 9.09090909090909091e-02f;                          /* 1/11 */
    R = SMLA_ADD_RN(SMLA_MUL_RN(R, z), 1.11111111111111111e-01f); /* 1/9 */
    R = SMLA_ADD_RN(SMLA_MUL_RN(R, z), 1.42857142857142857e-01f); /* 1/7 */
    R = SMLA_ADD_RN(SMLA_MUL_RN(R, z), 2.0e-01f);                 /* 1/5 */
    R = SMLA_ADD_RN(SMLA_MUL_RN(R, z), 3.33333333333333333e-01f); /* 1/3 */
    R = SMLA_MUL_RN(R, z);
    float s2 = SMLA_ADD_RN(s, s);
    float ef = (float)e;
    float lo = SMLA_ADD_RN(SMLA_MUL_RN(s2, R), SMLA_MUL_RN(ef, LN2_LO));
    return SMLA_ADD_RN(SMLA_MUL_RN(ef, LN2_HI), SMLA_ADD_RN(s2, lo));
}

/* Weights and merged lse of one (token, head). Returns 0 when both states are empty
 * (la == lb == -inf): the caller then copies out_a and writes lse = -inf. An lse of +inf is a state
 * whose maximum score overflowed (docs/design.md section 4): it outweighs any finite or -inf one
 * (wa, wb = 1 for a +inf side, 0 for the other; two +inf sides weigh 1 each), and lse = +inf.
 * Otherwise M = fmaxf(la, lb), wa = e^(la-M), wb = e^(lb-M), *lse = M + log(wa + wb). A NaN lse makes
 * out and lse NaN (NaN - M is NaN, so fmaxf dropping a NaN operand changes nothing; NaN with -inf is
 * not "both empty", nor NaN with +inf a saturated merge). */
SMLA_HD int smla_merge_weights(float la, float lb, float *wa, float *wb, float *lse)
{
    const float NEG_INF = smla_bits_to_f32(0xff800000u), POS_INF = smla_bits_to_f32(0x7f800000u);
    if (la == NEG_INF && lb == NEG_INF) {
        *wa = 1.0f;
        *wb = 0.0f;
        *lse = NEG_INF;
        return 0;
    }
    if ((la == POS_INF || lb == POS_INF) && la == la && lb == lb) {
        *wa = la == POS_INF ? 1.0f : 0.0f;
        *wb = lb == POS_INF ? 1.0f : 0.0f;
        *lse = POS_INF;
        return 1;
    }
    float M = fmaxf(la, lb);
    *wa = smla_exp_f32(SMLA_SUB_RN(la, M));
    *wb = smla_exp_f32(SMLA_SUB_RN(lb, M));
    *lse = SMLA_ADD_RN(M, smla_log_f32(SMLA_ADD_RN(*wa, *wb)));
    return 1;
}

/* (wa*oa + wb*ob) / (wa + wb), each operation rounded on its own, in this order. */
SMLA_HD float smla_merge_value(float wa, float oa, float wb, float ob)
{
    return SMLA_DIV_RN(SMLA_ADD_RN(SMLA_MUL_RN(wa, oa), SMLA_MUL_RN(wb, ob)), SMLA_ADD_RN(wa, wb));
}

#endif /* SMLA_CORE_MERGE_MATH_H */
