/* Scalar number formats, one definition each for the CPU and the GPU: fp32 bit views, fp32 operations
 * rounded on their own, bf16, IEEE f16 and float8 e4m3fn (OCP FP8), each conversion round-to-nearest-even
 * (e4m3 saturating to +-448). Users: the other csrc/core rules (fp8_ds_mla.h, merge_math.h), the CPU
 * kernels (csrc/cpu/numerics.h adds their table forms) and cuda/ (through core/params.h).
 *
 * The host side is written from the format definitions; on the device (__CUDA_ARCH__) the same functions
 * use the hardware conversion of the same rounding, so both give the same bits for every value but NaN
 * (a NaN stays a NaN; its payload and sign are no contract). Vector forms elsewhere (AVX code in
 * csrc/cpu, pack_bf16x2 in cuda/common.cuh) are the fast twins of these scalar rules.
 *
 * Host code must be compiled without FMA contraction (-ffp-contract=off, setup.py) and without
 * -ffast-math, so that every operation is one IEEE rounding. */
#ifndef SMLA_CORE_NUMBER_FORMATS_H
#define SMLA_CORE_NUMBER_FORMATS_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#include "smla.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

#if defined(__FAST_MATH__)
#error "smla's bit-exact float code must not be compiled with -ffast-math"
#endif

#if defined(__clang__) && !defined(__CUDA_ARCH__)
#pragma STDC FP_CONTRACT OFF
#endif

/* One IEEE rounding per operation: the _rn intrinsics on the device (never contracted into an FMA),
 * plain C on the host. */
#if defined(__CUDA_ARCH__)
#define SMLA_ADD_RN(a, b) __fadd_rn((a), (b))
#define SMLA_SUB_RN(a, b) __fsub_rn((a), (b))
#define SMLA_MUL_RN(a, b) __fmul_rn((a), (b))
#define SMLA_DIV_RN(a, b) __fdiv_rn((a), (b))
#else
#define SMLA_ADD_RN(a, b) ((a) + (b))
#define SMLA_SUB_RN(a, b) ((a) - (b))
#define SMLA_MUL_RN(a, b) ((a) * (b))
#define SMLA_DIV_RN(a, b) ((a) / (b))
#endif

SMLA_HD float smla_bits_to_f32(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

SMLA_HD uint32_t smla_f32_to_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

/* ---- bf16: the top half of an fp32 ---- */
SMLA_HD float smla_bf16_to_f32(uint16_t h) { return smla_bits_to_f32((uint32_t)h << 16); }

SMLA_HD uint16_t smla_f32_to_bf16(float f)
{
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t u = smla_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
#endif
}

/* ---- IEEE binary16 ---- */
SMLA_HD float smla_f16_to_f32(uint16_t h)
{
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return smla_bits_to_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) /* subnormal: m * 2^-24, exact in float */
        return smla_bits_to_f32(sign | smla_f32_to_bits((float)m * 5.9604644775390625e-08f));
    return smla_bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

SMLA_HD uint16_t smla_f32_to_f16(float f)
{
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    const uint32_t u = smla_f32_to_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (incl. Inf) rounds to Inf */
    if (a >= 0x38800000u) {                                   /* normal: RNE on the 13 dropped bits */
        const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    /* below 2^-14: subnormal step 2^-24; scaling by 2^24 is exact, nearbyintf rounds to even and 1024
     * lands on the smallest normal */
    return (uint16_t)(sign | (uint16_t)nearbyintf(smla_bits_to_f32(a) * 16777216.0f));
#endif
}

/* ---- float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7f / 0xff are NaN;
 * largest finite 448 ---- */

/* The fp32 bits of an e4m3 byte, as a constant expression (the CPU's lookup table is built from it).
 * Subnormals are m * 2^-9: 2^-9, then 2^-8 * (1 + m/2), then 2^-7 * (1 + m/4). */
#define SMLA_E4M3_SUBN(m) ((m) == 0 ? 0u : (m) == 1 ? 0x3b000000u : (m) < 4 ? 0x3b800000u | (((m) & 1u) << 22) \
                                                                    : 0x3c000000u | (((m) & 3u) << 21))
#define SMLA_E4M3_BITS(b)                                                                                  \
    ((((b) & 0x80u) << 24) | (((b) & 0x7fu) == 0x7fu ? 0x7fc00000u                                           \
                              : ((b) & 0x78u) ? ((((b) >> 3 & 15u) + 120u) << 23) | (((b) & 7u) << 20)     \
                                              : SMLA_E4M3_SUBN((b) & 7u)))

SMLA_HD float smla_e4m3_to_f32(uint8_t b)
{
#if defined(__CUDA_ARCH__)
    __nv_fp8_e4m3 v;
    v.__x = b;
    return static_cast<float>(v);
#else
    return smla_bits_to_f32(SMLA_E4M3_BITS((uint32_t)b));
#endif
}

/* Saturating conversion (cvt.rn.satfinite.e4m3x2.f32): finite overflow and +-Inf go to +-448, NaN to a
 * NaN byte, -0.0 to 0x80. */
SMLA_HD uint8_t smla_f32_to_e4m3(float f)
{
#if defined(__CUDA_ARCH__)
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
#else
    const uint32_t u = smla_f32_to_bits(f);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (incl. Inf) saturates */
    if (a < 0x3c800000u) {                                /* below 2^-6: subnormal range, step 2^-9 */
        const float r = nearbyintf(smla_bits_to_f32(a) * 512.0f); /* exact scaling; ties to even */
        return (uint8_t)(sign | (uint8_t)r);                       /* r == 8 lands on the smallest normal */
    }
    /* normal: keep 3 mantissa bits, RNE on the 20 dropped bits */
    const uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u);
    const uint32_t e = (rounded >> 23) - 120u, m = (rounded >> 20) & 7u;
    if (e > 15 || (e == 15 && m == 7)) return (uint8_t)(sign | 0x7e); /* rounded past 448 */
    return (uint8_t)(sign | (e << 3) | m);
#endif
}

#endif /* SMLA_CORE_NUMBER_FORMATS_H */
