/* Scalar number formats for the CPU kernels: bf16 and float8 e4m3fn (OCP FP8), written from the
 * format definitions. Static inline so each kernel file gets its own copy without a link step. */
#ifndef SMLA_CPU_NUMERICS_H
#define SMLA_CPU_NUMERICS_H

#include <stdint.h>
#include <string.h>
#include <math.h>

static inline float smla_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t smla_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float smla_bf16_to_f32(uint16_t h) { return smla_bits_to_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN with its sign. */
static inline uint16_t smla_f32_to_bf16(float f)
{
    uint32_t u = smla_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities; 0x7f/0xff are NaN; max 448. */
static inline float smla_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80) << 24;
    uint32_t e = (b >> 3) & 0xf, m = b & 7;
    if (e == 0xf && m == 7) return smla_bits_to_f32(sign | 0x7fc00000u);
    if (e == 0) /* subnormal: m * 2^-9, exact in float */
        return smla_bits_to_f32(sign) + (sign ? -1.0f : 1.0f) * (float)m * 0.001953125f;
    return smla_bits_to_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* Saturating round-to-nearest-even conversion (cvt.rn.satfinite.e4m3x2.f32): finite overflow and
 * +-Inf go to +-448, NaN to 0x7f (sign kept), -0.0 to 0x80. */
static inline uint8_t smla_f32_to_e4m3(float f)
{
    uint32_t u = smla_f32_to_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (incl. Inf) saturates */
    if (a < 0x3c800000u) {                                /* below 2^-6: subnormal range, step 2^-9 */
        float x = smla_bits_to_f32(a) * 512.0f;            /* exact scaling */
        float r = nearbyintf(x);                           /* default rounding mode: ties to even */
        return (uint8_t)(sign | (uint8_t)r);               /* r == 8 lands on the smallest normal */
    }
    /* normal: keep 3 mantissa bits, RNE on the 20 dropped bits */
    uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u);
    uint32_t e = (rounded >> 23) - 120u, m = (rounded >> 20) & 7u;
    if (e > 15 || (e == 15 && m == 7)) return (uint8_t)(sign | 0x7e); /* rounded past 448 */
    return (uint8_t)(sign | (e << 3) | m);
}

/* Smallest power of two >= x for finite positive x (exponent plus one when the mantissa is
 * non-zero); Inf stays Inf. */
static inline float smla_pow2_ceil(float x)
{
    uint32_t u = smla_f32_to_bits(x);
    if (u >= 0x7f800000u) return x;
    if (u & 0x007fffffu) {
        if (u < 0x00800000u) return smla_bits_to_f32(0x00800000u); /* subnormal -> FLT_MIN */
        u = (u & 0x7f800000u) + 0x00800000u;
    }
    return smla_bits_to_f32(u);
}

#endif /* SMLA_CPU_NUMERICS_H */
