/* The float arithmetic of merge_attn_states, written once for the CPU kernel and the CUDA twin so that
 * both give the same bits. libm expf/logf and CUDA expf/logf differ in the last ulp, so this header
 * carries its own exp and log built only from correctly rounded operations (+ - * /, floor, exact
 * power-of-two scaling). Every operation is a separate rounding: on the device through __fadd_rn /
 * __fmul_rn / __fdiv_rn (never contracted into an FMA), on the host as plain C, which must be compiled
 * without FMA contraction (-ffp-contract=off; GCC's default for -std=c11) and without -ffast-math.
 *
 * Accuracy: smla_exp_f32 / smla_log_f32 are within a few ulp of the exact functions over the whole
 * float range (the merge only needs ~1e-6 relative). */
#ifndef SMLA_CORE_MERGE_MATH_H
#define SMLA_CORE_MERGE_MATH_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__FAST_MATH__)
#error "smla's bit-exact float code must not be compiled with -ffast-math"
#endif

#if defined(__clang__) && !defined(__CUDA_ARCH__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__CUDACC__)
#define SMLA_MM_FN static __host__ __device__ __forceinline__
#else
#define SMLA_MM_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define SMLA_MM_ADD(a, b) __fadd_rn((a), (b))
#define SMLA_MM_SUB(a, b) __fsub_rn((a), (b))
#define SMLA_MM_MUL(a, b) __fmul_rn((a), (b))
#define SMLA_MM_DIV(a, b) __fdiv_rn((a), (b))
#else
#define SMLA_MM_ADD(a, b) ((a) + (b))
#define SMLA_MM_SUB(a, b) ((a) - (b))
#define SMLA_MM_MUL(a, b) ((a) * (b))
#define SMLA_MM_DIV(a, b) ((a) / (b))
#endif

SMLA_MM_FN float smla_mm_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

SMLA_MM_FN uint32_t smla_mm_to_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

/* 2^k for -126 <= k <= 127, exactly. */
SMLA_MM_FN float smla_mm_pow2i(int k) { return smla_mm_from_bits((uint32_t)(k + 127) << 23); }

/* e^x. Cody-Waite reduction x = k*ln2 + r, |r| <= ~0.35 (k*LN2_HI is exact: LN2_HI has 15
 * significant bits and |k| < 2^8), degree-7 Taylor polynomial by Horner, then exact scaling by 2^k
 * (two steps when the result is subnormal, so it is rounded once). */
SMLA_MM_FN float smla_exp_f32(float x)
{
    if (x != x) return x;
    if (x > 88.72283935546875f) return smla_mm_from_bits(0x7f800000u);  /* overflows: +inf */
    if (x < -103.972084045410156f) return 0.0f;                         /* below half the least subnormal */
    const float LOG2E = 1.44269502162933349609375f;
    const float LN2_HI = 0.693145751953125f;        /* 0x3f317200 */
    const float LN2_LO = 1.42860676533018704e-06f;  /* 0x35bfbe8e */
    float kf = floorf(SMLA_MM_ADD(SMLA_MM_MUL(x, LOG2E), 0.5f));
    int k = (int)kf;
    float r = SMLA_MM_SUB(SMLA_MM_SUB(x, SMLA_MM_MUL(kf, LN2_HI)), SMLA_MM_MUL(kf, LN2_LO));
    float p = 1.98412698412698413e-04f;                         /* 1/5040 */
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 1.38888888888888889e-03f); /* 1/720 */
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 8.33333333333333333e-03f); /* 1/120 */
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 4.16666666666666667e-02f); /* 1/24 */
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 1.66666666666666667e-01f); /* 1/6 */
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 0.5f);
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 1.0f);
    p = SMLA_MM_ADD(SMLA_MM_MUL(p, r), 1.0f);
    if (k > 127) return SMLA_MM_MUL(SMLA_MM_MUL(p, 2.0f), smla_mm_pow2i(k - 1));
    if (k < -126) return SMLA_MM_MUL(SMLA_MM_MUL(p, smla_mm_pow2i(k + 64)), smla_mm_pow2i(-64));
    return SMLA_MM_MUL(p, smla_mm_pow2i(k));
}

/* Natural log. y = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1),
 * by its odd series to s^11; result = e*LN2_HI + (2s + (2s*R + e*LN2_LO)). m - 1 is exact. */
SMLA_MM_FN float smla_log_f32(float y)
{
    if (y != y) return y;
    if (y < 0.0f) return smla_mm_from_bits(0x7fc00000u);
    if (y == 0.0f) return smla_mm_from_bits(0xff800000u);
    uint32_t u = smla_mm_to_bits(y);
    if (u == 0x7f800000u) return y;
    int e = 0;
    if (u < 0x00800000u) { /* subnormal: scale into the normal range first (exact) */
        u = smla_mm_to_bits(SMLA_MM_MUL(y, 8388608.0f));
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
    float f = SMLA_MM_SUB(smla_mm_from_bits(u), 1.0f);
    float s = SMLA_MM_DIV(f, SMLA_MM_ADD(2.0f, f));
    float z = SMLA_MM_MUL(s, s);
    float R = 9.09090909090909091e-02f;                          /* 1/11 */
    R = SMLA_MM_ADD(SMLA_MM_MUL(R, z), 1.11111111111111111e-01f); /* 1/9 */
    R = SMLA_MM_ADD(SMLA_MM_MUL(R, z), 1.42857142857142857e-01f); /* 1/7 */
    R = SMLA_MM_ADD(SMLA_MM_MUL(R, z), 2.0e-01f);                 /* 1/5 */
    R = SMLA_MM_ADD(SMLA_MM_MUL(R, z), 3.33333333333333333e-01f); /* 1/3 */
    R = SMLA_MM_MUL(R, z);
    float s2 = SMLA_MM_ADD(s, s);
    float ef = (float)e;
    float lo = SMLA_MM_ADD(SMLA_MM_MUL(s2, R), SMLA_MM_MUL(ef, LN2_LO));
    return SMLA_MM_ADD(SMLA_MM_MUL(ef, LN2_HI), SMLA_MM_ADD(s2, lo));
}

/* Weights and merged lse of one (token, head). Returns 0 when both states are empty
 * (la == lb == -inf): the caller then copies out_a and writes lse = -inf. An lse of +inf is a state
 * whose maximum score overflowed (docs/design.md section 4): it outweighs any finite or -inf one
 * (wa, wb = 1 for a +inf side, 0 for the other; two +inf sides weigh 1 each), and lse = +inf.
 * Otherwise M = fmaxf(la, lb), wa = e^(la-M), wb = e^(lb-M), *lse = M + log(wa + wb). A NaN lse makes
 * out and lse NaN (NaN - M is NaN, so fmaxf dropping a NaN operand changes nothing; NaN with -inf is
 * not "both empty", nor NaN with +inf a saturated merge). */
SMLA_MM_FN int smla_merge_weights(float la, float lb, float *wa, float *wb, float *lse)
{
    const float NEG_INF = smla_mm_from_bits(0xff800000u), POS_INF = smla_mm_from_bits(0x7f800000u);
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
    *wa = smla_exp_f32(SMLA_MM_SUB(la, M));
    *wb = smla_exp_f32(SMLA_MM_SUB(lb, M));
    *lse = SMLA_MM_ADD(M, smla_log_f32(SMLA_MM_ADD(*wa, *wb)));
    return 1;
}

/* (wa*oa + wb*ob) / (wa + wb), each operation rounded on its own, in this order. */
SMLA_MM_FN float smla_merge_value(float wa, float oa, float wb, float ob)
{
    return SMLA_MM_DIV(SMLA_MM_ADD(SMLA_MM_MUL(wa, oa), SMLA_MM_MUL(wb, ob)), SMLA_MM_ADD(wa, wb));
}

#endif /* SMLA_CORE_MERGE_MATH_H */
