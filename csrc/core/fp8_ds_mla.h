/* The fp8_ds_mla cache entry (docs/design.md section 3), written once for every backend: its layout, the
 * writer's scale rule, the write rule of one value and the read rule of one value. Users: the CPU pack_kv
 * (csrc/cpu/pack_kv.c) and readers (csrc/cpu/cache_rows.h: unpack_kv, gather_upconvert, attention), the
 * GPU pack_kv (cuda/memory/pack_kv.cu) and readers (cuda/common.cuh's dequant_e4m3x2, cuda/attention),
 * and the bindings (the entry size). core/params.h includes it, so every kernel sees these names.
 *
 * The scalar functions here are the rules. The fast paths compute the same bits in vector form and are
 * tested against them (tests/test_pack_kv.py, test_unpack_kv.py, test_cpu_paths.py, and on the GPU
 * test_cuda_memory_ops.py):
 *   write: csrc/cpu/pack_kv.c pack_fp8_entry_avx2 (quant_tile_bf16_avx2, e4m3x8_avx2), cuda/memory/pack_kv.cu
 *          quant8;
 *   read:  csrc/cpu/cache_rows.h smla_dequant_row_table / _avx2 / _avx512, cuda/common.cuh dequant_e4m3x2.
 * For a power-of-two s whose inverse is a normal float, x / s and x * (1/s) are the same real number,
 * rounded once: the fast write paths multiply. The CPU's bf16-lane encoder goes further for tiles with
 * no value in the e4m3 subnormal range: there x / s is x with its exponent lowered by log2(s), exactly. */
#ifndef SMLA_CORE_FP8_DS_MLA_H
#define SMLA_CORE_FP8_DS_MLA_H

#include <float.h>

#include "number_formats.h"

/* One entry: 512 e4m3 latent values (value i in tile i / 128), 4 little-endian fp32 tile scales at
 * byte 512 + 4t, 64 bf16 k_pe values at byte 528. */
#define SMLA_FP8_ENTRY 656  /* bytes per token */
#define SMLA_FP8_SCALE_OFF 512
#define SMLA_FP8_ROPE_OFF 528
#define SMLA_FP8_TILE 128   /* latent values per fp32 scale */
#define SMLA_FP8_NUM_TILES 4

/* The writer's scale rules. */
typedef enum { SMLA_SCALE_POW2 = 0, SMLA_SCALE_FP32 = 1 } smla_scale_rule;

/* Smallest power of two >= x for finite positive x (exponent plus one when the mantissa is non-zero; a
 * subnormal gives FLT_MIN); Inf stays Inf. */
SMLA_HD float smla_pow2_ceil(float x)
{
    uint32_t u = smla_f32_to_bits(x);
    if (u >= 0x7f800000u) return x;
    if (u & 0x007fffffu) {
        if (u < 0x00800000u) return smla_bits_to_f32(0x00800000u);
        u = (u & 0x7f800000u) + 0x00800000u;
    }
    return smla_bits_to_f32(u);
}

/* The scale of a tile whose largest magnitude is amax (fmaxf over |x|, so NaN values do not count and an
 * infinite one makes the scale infinite): amax / 448 is one fp32 division, then
 *   pow2: the smallest power of two >= max(amax / 448, 1e-4)   (an all-zero tile gets 2^-13)
 *   fp32: max(amax / 448, FLT_MIN). */
SMLA_HD float smla_fp8_scale(float amax, int rule)
{
    const float r = SMLA_DIV_RN(amax, 448.0f);
    return rule == SMLA_SCALE_POW2 ? smla_pow2_ceil(fmaxf(r, 1e-4f)) : fmaxf(r, FLT_MIN);
}

/* The stored byte of value x in a tile of scale s: e4m3_satfinite_rne(x / s), one fp32 division (an
 * Inf x over an Inf s is NaN; -0.0 gives 0x80). */
SMLA_HD uint8_t smla_fp8_quant(float x, float s) { return smla_f32_to_e4m3(SMLA_DIV_RN(x, s)); }

/* The bf16 read back from byte b of a tile of scale s: bf16_rne(float(e4m3) * s), one fp32 multiply and
 * one rounding (exact for power-of-two scales). */
SMLA_HD uint16_t smla_fp8_dequant(uint8_t b, float s) { return smla_f32_to_bf16(SMLA_MUL_RN(smla_e4m3_to_f32(b), s)); }

#endif /* SMLA_CORE_FP8_DS_MLA_H */
