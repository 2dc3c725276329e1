/* Deterministic expf / logf: the same sequence of correctly rounded fp32 operations (fma, mul, add,
 * div, rint, bit moves) in C and in CUDA, so that a CPU kernel and a CUDA kernel that use them agree
 * bit for bit. glibc's expf/logf (<= 0.5x ulp) and CUDA's (<= 2 / 1 ulp) are both accurate but not
 * identical, so ops whose CPU and CUDA results must match (merge_attn_states) use these instead.
 * Accuracy: about 2 ulp. Plain C99 when compiled by a C compiler (fmaf/rintf from <math.h>; every
 * product feeds fmaf or stands alone, so FP contraction cannot change the result). */
#ifndef SMLA_DETMATH_H
#define SMLA_DETMATH_H

#include <stdint.h>

#ifdef __CUDACC__
#define SMLA_DM_FN static __device__ __forceinline__
#define SMLA_DM_MUL(a, b) __fmul_rn((a), (b))
#define SMLA_DM_ADD(a, b) __fadd_rn((a), (b))
#define SMLA_DM_DIV(a, b) __fdiv_rn((a), (b))
#define SMLA_DM_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define SMLA_DM_RINT(a) rintf(a)
#define SMLA_DM_AS_F(u) __uint_as_float(u)
#define SMLA_DM_AS_U(f) __float_as_uint(f)
#else
#include <math.h>
#include <string.h>
#define SMLA_DM_FN static inline
#define SMLA_DM_MUL(a, b) ((a) * (b))
#define SMLA_DM_ADD(a, b) ((a) + (b))
#define SMLA_DM_DIV(a, b) ((a) / (b))
#define SMLA_DM_FMA(a, b, c) fmaf((a), (b), (c))
#define SMLA_DM_RINT(a) rintf(a)
static inline float smla_dm_as_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t smla_dm_as_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#define SMLA_DM_AS_F(u) smla_dm_as_f(u)
#define SMLA_DM_AS_U(f) smla_dm_as_u(f)
#endif

/* 2^e for -126 <= e <= 127. */
SMLA_DM_FN float smla_dm_pow2i(int e) { return SMLA_DM_AS_F((uint32_t)(e + 127) << 23); }

/* e^x. NaN -> x; x > 88.7228394 -> +inf; x < -103.972084 -> +0. */
SMLA_DM_FN float smla_det_expf(float x)
{
    if (x != x) return x;
    if (x > 0x1.62e430p+6f) return SMLA_DM_AS_F(0x7f800000u);
    if (x < -0x1.9fe368p+6f) return 0.0f;
    /* x = k ln2 + r, |r| <= ln2/2 (Cody-Waite: k * ln2_hi is exact) */
    float k = SMLA_DM_RINT(SMLA_DM_MUL(x, 0x1.715476p+0f));
    float r = SMLA_DM_FMA(k, -0x1.62e400p-1f, x);
    r = SMLA_DM_FMA(k, -0x1.7f7d1cp-20f, r);
    /* e^r by its Taylor series to degree 7 (truncation < 0.1 ulp on |r| <= 0.35) */
    float p = 0x1.a01a02p-13f;
    p = SMLA_DM_FMA(p, r, 0x1.6c16c2p-10f);
    p = SMLA_DM_FMA(p, r, 0x1.111112p-7f);
    p = SMLA_DM_FMA(p, r, 0x1.555556p-5f);
    p = SMLA_DM_FMA(p, r, 0x1.555556p-3f);
    p = SMLA_DM_FMA(p, r, 0.5f);
    p = SMLA_DM_FMA(p, r, 1.0f);
    p = SMLA_DM_FMA(p, r, 1.0f);
    /* times 2^k in two exact-range steps (-150 <= k <= 128): the first is exact, the second rounds
     * once, also into the subnormals */
    int ki = (int)k;
    int k1 = ki / 2;
    return SMLA_DM_MUL(SMLA_DM_MUL(p, smla_dm_pow2i(k1)), smla_dm_pow2i(ki - k1));
}

/* Natural log. NaN -> y; y < 0 -> NaN (0x7fc00000); +-0 -> -inf; +inf -> +inf. */
SMLA_DM_FN float smla_det_logf(float y)
{
    if (y != y) return y;
    if (y < 0.0f) return SMLA_DM_AS_F(0x7fc00000u);
    if (y == 0.0f) return SMLA_DM_AS_F(0xff800000u);
    uint32_t u = SMLA_DM_AS_U(y);
    if (u == 0x7f800000u) return y;
    int e = 0;
    if (u < 0x00800000u) { /* subnormal: scale into the normal range (exact) */
        u = SMLA_DM_AS_U(SMLA_DM_MUL(y, 0x1p23f));
        e = -23;
    }
    e += (int)(u >> 23) - 127;
    float m = SMLA_DM_AS_F((u & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
    if (m > 0x1.6a09e6p+0f) { /* into (sqrt(2)/2, sqrt(2)] */
        m = SMLA_DM_MUL(m, 0.5f);
        e += 1;
    }
    /* log(m) = 2 atanh(s), s = (m-1)/(m+1) = f/(2+f): 2s + 2s z (1/3 + z/5 + ... + z^4/11), z = s^2 */
    float f = SMLA_DM_ADD(m, -1.0f);
    float s = SMLA_DM_DIV(f, SMLA_DM_ADD(f, 2.0f));
    float z = SMLA_DM_MUL(s, s);
    float t = 0x1.745d18p-4f;
    t = SMLA_DM_FMA(t, z, 0x1.c71c72p-4f);
    t = SMLA_DM_FMA(t, z, 0x1.24924ap-3f);
    t = SMLA_DM_FMA(t, z, 0x1.99999ap-3f);
    t = SMLA_DM_FMA(t, z, 0x1.555556p-2f);
    float s2 = SMLA_DM_ADD(s, s);
    float lm = SMLA_DM_FMA(SMLA_DM_MUL(s2, z), t, s2);
    float fe = (float)e;
    return SMLA_DM_FMA(fe, 0x1.62e400p-1f, SMLA_DM_FMA(fe, 0x1.7f7d1cp-20f, lm));
}

#endif /* SMLA_DETMATH_H */
