/* Private helpers of the CPU kernels: dequantising one token of a paged smla_cache into a 576-value row
 * (docs/design.md section 3). Shared by unpack_kv, gather_upconvert and the CPU attention kernels so that
 * every reader produces the same bits; slot addressing is core/index_rules.h's (smla_cache_entry, shared
 * with the GPU).
 *
 * Dequant of fp8_ds_mla value i is core/fp8_ds_mla.h's read rule, smla_fp8_dequant(e4m3[i],
 * scale[i / 128]) = bf16_rne(float(e4m3[i]) * scale[i / 128]); the fast paths below are its twins. The
 * k_pe part and the whole bf16 entry are copied bit for bit. Entries are read with memcpy: an entry may
 * sit at any byte offset (entry_stride / block_stride are only byte counts). Scales are little-endian
 * fp32 and bf16 values are stored in host order; smla targets little-endian hosts only (x86-64, aarch64). */
#ifndef SMLA_CPU_CACHE_ROWS_H
#define SMLA_CPU_CACHE_ROWS_H

#include <stdint.h>
#include <string.h>

#include "core/index_rules.h"
#include "numerics.h"

/* The 4 tile scales of an fp8_ds_mla entry. */
static inline void smla_fp8_scales(const uint8_t *entry, float s[SMLA_FP8_NUM_TILES])
{
    memcpy(s, entry + SMLA_FP8_SCALE_OFF, sizeof(float) * SMLA_FP8_NUM_TILES);
}

/* One entry as 576 bf16 bits: the latent part dequantised (fp8) or copied (bf16), then k_pe. */
static inline void smla_dequant_row_bf16(const smla_cache *c, const uint8_t *entry, uint16_t out[SMLA_D_QK])
{
    if (c->dtype != SMLA_CACHE_FP8_DS_MLA) {
        memcpy(out, entry, 2 * SMLA_D_QK);
        return;
    }
    float s[SMLA_FP8_NUM_TILES];
    smla_fp8_scales(entry, s);
    for (int i = 0; i < SMLA_D_NOPE; i++) out[i] = smla_fp8_dequant(entry[i], s[i / SMLA_FP8_TILE]);
    memcpy(out + SMLA_D_NOPE, entry + SMLA_FP8_ROPE_OFF, 2 * SMLA_D_ROPE);
}

/* ---- fast paths (docs/design.md: the same bits as the scalar rule, on every path) ----
 *
 * Portable: float(e4m3) from numerics.h's table of float32 bit patterns.
 * x86 (AVX2 / AVX-512F): the e4m3 byte, sign-extended to 16 bits, shifted left by 7 and with bit 14
 * cleared, is the float16 of x * 2^-8 exactly (the 4-bit exponent lands in the low bits of the 5-bit one, subnormals
 * included), so F16C's vcvtph2ps gives float(x) * 2^-8 and one multiply by s * 256 gives
 * fl(float(x) * s): the same exact product, rounded once. NaN bytes become the half NaN 0x7e00 (float
 * NaN 0x7fc00000, the scalar path's). Then bf16 RNE on the integer bits, as smla_f32_to_bf16 (no NaN
 * reaches it with a finite scale, so its NaN branch is not needed).
 * Per tile, from its scale s: a power of two in [2^-117, 2^119] makes every product an exact bf16
 * (4 significant bits, normal range), so the rounding is skipped; other finite |s| <= 2^119 round;
 * anything else (NaN, Inf, |s| > 2^119 where s * 256 could overflow) takes the scalar path. */
enum { SMLA_TILE_SCALAR = 0, SMLA_TILE_ROUND = 1, SMLA_TILE_EXACT = 2 };

static inline int smla_fp8_tile_kind(float s)
{
    const uint32_t a = smla_f32_to_bits(s) & 0x7fffffffu;
    if (a > 0x7b000000u) return SMLA_TILE_SCALAR;                                /* > 2^119, Inf, NaN */
    if ((a & 0x007fffffu) == 0 && a >= (10u << 23)) return SMLA_TILE_EXACT;      /* 2^k, k >= -117 */
    return SMLA_TILE_ROUND;
}

/* Portable: one entry as bf16 bits and / or floats (either output may be NULL). */
static inline void smla_dequant_row_table(const smla_cache *c, const uint8_t *entry, uint16_t *bf16,
                                          float *f32)
{
    if (c->dtype != SMLA_CACHE_FP8_DS_MLA) {
        const uint16_t *src = (const uint16_t *)(const void *)entry;
        uint16_t tmp[SMLA_D_QK];
        if ((uintptr_t)entry & 1) { /* an entry may sit at any byte offset */
            memcpy(tmp, entry, sizeof tmp);
            src = tmp;
        }
        if (bf16) memcpy(bf16, src, 2 * SMLA_D_QK);
        if (f32)
            for (int i = 0; i < SMLA_D_QK; i++) f32[i] = smla_bf16_to_f32(src[i]);
        return;
    }
    float s[SMLA_FP8_NUM_TILES];
    smla_fp8_scales(entry, s);
    for (int i = 0; i < SMLA_D_NOPE; i++) {
        const uint16_t b = smla_f32_to_bf16(smla_bits_to_f32(smla_e4m3_table[entry[i]]) * s[i / SMLA_FP8_TILE]);
        if (bf16) bf16[i] = b;
        if (f32) f32[i] = smla_bf16_to_f32(b);
    }
    uint16_t pe[SMLA_D_ROPE];
    memcpy(pe, entry + SMLA_FP8_ROPE_OFF, sizeof pe);
    if (bf16) memcpy(bf16 + SMLA_D_NOPE, pe, sizeof pe);
    if (f32)
        for (int i = 0; i < SMLA_D_ROPE; i++) f32[SMLA_D_NOPE + i] = smla_bf16_to_f32(pe[i]);
}

/* Scalar fallback for one tile of a fast path (the rule itself). */
static inline void smla_dequant_tile_scalar(const uint8_t *x, float s, uint16_t *bf16, float *f32)
{
    for (int i = 0; i < SMLA_FP8_TILE; i++) {
        const uint16_t b = smla_fp8_dequant(x[i], s);
        if (bf16) bf16[i] = b;
        if (f32) f32[i] = smla_bf16_to_f32(b);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 8 e4m3 bytes -> fl(float(x) * s) with s256 = s * 256 (see above); exact products need no rounding. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256
smla_e4m3x8_scaled_avx2(const uint8_t *x, __m256 s256, int round)
{
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)x)), 7);
    h = _mm_and_si128(h, _mm_set1_epi16((short)0xbfff)); /* sign extension left bit 14 set */
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80));
    h = _mm_xor_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x3f80 ^ 0x7e00)));
    __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), s256);
    if (round) {
        __m256i u = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
        v = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
    }
    return v;
}

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
smla_store_bf16x8_avx2(uint16_t *dst, __m256 v) /* v holds bf16 values: keep the high halves */
{
    const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    _mm_storeu_si128((__m128i *)(void *)dst,
                     _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
}

/* bf16 bits at any byte address -> floats, 8 at a time. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256
smla_bf16x8_to_f32_avx2(const void *src)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)src);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

/* One entry as bf16 bits and / or floats (either may be NULL); the same bits as smla_dequant_row_bf16. */
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline void
smla_dequant_row_avx2(const smla_cache *c, const uint8_t *entry, uint16_t *bf16, float *f32)
{
    if (c->dtype != SMLA_CACHE_FP8_DS_MLA) {
        if (bf16) memcpy(bf16, entry, 2 * SMLA_D_QK);
        if (f32)
            for (int i = 0; i < SMLA_D_QK; i += 8)
                _mm256_storeu_ps(f32 + i, smla_bf16x8_to_f32_avx2(entry + 2 * i));
        return;
    }
    float s[SMLA_FP8_NUM_TILES];
    smla_fp8_scales(entry, s);
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint8_t *x = entry + t * SMLA_FP8_TILE;
        uint16_t *b = bf16 ? bf16 + t * SMLA_FP8_TILE : NULL;
        float *f = f32 ? f32 + t * SMLA_FP8_TILE : NULL;
        const int kind = smla_fp8_tile_kind(s[t]);
        if (kind == SMLA_TILE_SCALAR) {
            smla_dequant_tile_scalar(x, s[t], b, f);
            continue;
        }
        const __m256 s256 = _mm256_set1_ps(s[t] * 256.0f);
        for (int i = 0; i < SMLA_FP8_TILE; i += 8) {
            const __m256 v = smla_e4m3x8_scaled_avx2(x + i, s256, kind == SMLA_TILE_ROUND);
            if (f) _mm256_storeu_ps(f + i, v);
            if (b) smla_store_bf16x8_avx2(b + i, v);
        }
    }
    if (bf16) memcpy(bf16 + SMLA_D_NOPE, entry + SMLA_FP8_ROPE_OFF, 2 * SMLA_D_ROPE);
    if (f32)
        for (int i = 0; i < SMLA_D_ROPE; i += 8)
            _mm256_storeu_ps(f32 + SMLA_D_NOPE + i, smla_bf16x8_to_f32_avx2(entry + SMLA_FP8_ROPE_OFF + 2 * i));
}

/* AVX-512F: the same, 16 values at a time (vcvtph2ps zmm, vpmovdw for the bf16 halves). */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline __m512
smla_e4m3x16_scaled_avx512(const uint8_t *x, __m512 s256, int round)
{
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)x)), 7);
    h = _mm256_and_si256(h, _mm256_set1_epi16((short)0xbfff));
    const __m256i nan =
        _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x3f80));
    h = _mm256_xor_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x3f80 ^ 0x7e00)));
    __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), s256);
    if (round) {
        __m512i u = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
        v = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
    }
    return v;
}

__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline __m512
smla_bf16x16_to_f32_avx512(const void *src)
{
    const __m256i b = _mm256_loadu_si256((const __m256i *)src);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

/* One fp8 tile (128 values, scale s of the given kind) as bf16 bits and / or floats. */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
smla_dequant_tile_avx512(const uint8_t *x, float s, int kind, uint16_t *b, float *f)
{
    if (kind == SMLA_TILE_SCALAR) {
        smla_dequant_tile_scalar(x, s, b, f);
        return;
    }
    const __m512 s256 = _mm512_set1_ps(s * 256.0f);
    for (int i = 0; i < SMLA_FP8_TILE; i += 16) {
        const __m512 v = smla_e4m3x16_scaled_avx512(x + i, s256, kind == SMLA_TILE_ROUND);
        if (f) _mm512_storeu_ps(f + i, v);
        if (b)
            _mm256_storeu_si256((__m256i *)(void *)(b + i),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
    }
}

/* The k_pe part of an fp8 entry: bits copied, floats widened. */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
smla_rope_avx512(const uint8_t *entry, uint16_t *bf16, float *f32)
{
    if (bf16) memcpy(bf16 + SMLA_D_NOPE, entry + SMLA_FP8_ROPE_OFF, 2 * SMLA_D_ROPE);
    if (f32)
        for (int i = 0; i < SMLA_D_ROPE; i += 16)
            _mm512_storeu_ps(f32 + SMLA_D_NOPE + i, smla_bf16x16_to_f32_avx512(entry + SMLA_FP8_ROPE_OFF + 2 * i));
}

__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
smla_dequant_row_avx512(const smla_cache *c, const uint8_t *entry, uint16_t *bf16, float *f32)
{
    if (c->dtype != SMLA_CACHE_FP8_DS_MLA) {
        if (bf16) memcpy(bf16, entry, 2 * SMLA_D_QK);
        if (f32)
            for (int i = 0; i < SMLA_D_QK; i += 16)
                _mm512_storeu_ps(f32 + i, smla_bf16x16_to_f32_avx512(entry + 2 * i));
        return;
    }
    float s[SMLA_FP8_NUM_TILES];
    smla_fp8_scales(entry, s);
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++)
        smla_dequant_tile_avx512(entry + t * SMLA_FP8_TILE, s[t], smla_fp8_tile_kind(s[t]),
                                 bf16 ? bf16 + t * SMLA_FP8_TILE : NULL, f32 ? f32 + t * SMLA_FP8_TILE : NULL);
    smla_rope_avx512(entry, bf16, f32);
}

/* AVX-512BW, bf16 wanted: a tile with a positive power-of-two scale 2^k (SMLA_TILE_EXACT, the "pow2"
 * writer rule) is built in 16-bit lanes, 32 values at a time, with few instructions: a normal e4m3
 * byte is (mag << 4) + ((120 + k) << 7) in bf16 (exponent rebased, mantissa moved; exact, normal for
 * such k, see above), a subnormal one (exponent 0) is looked up in an 8-entry table of m * 2^(k - 9),
 * zero stays zero, NaN (magnitude 0x7f) becomes the quiet NaN 0x7fc0, and the byte's sign goes to
 * bit 15. The same bits as the rule; floats, when wanted too, are the
 * bf16 widened. Other tiles and rows go through smla_dequant_tile_avx512. */
__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"), always_inline)) static inline void
smla_dequant_row_avx512bw(const smla_cache *c, const uint8_t *entry, uint16_t *bf16, float *f32)
{
    if (c->dtype != SMLA_CACHE_FP8_DS_MLA || !bf16) {
        smla_dequant_row_avx512(c, entry, bf16, f32);
        return;
    }
    float s[SMLA_FP8_NUM_TILES];
    smla_fp8_scales(entry, s);
    __m512i e78 = _mm512_set1_epi16(0x78), m07 = _mm512_set1_epi16(0x07), m7f0 = _mm512_set1_epi16(0x7f0);
    __m512i sgn = _mm512_set1_epi16((short)0x8000), qnan = _mm512_set1_epi16(0x7fc0);
    /* kept in registers: GCC would otherwise rebuild each constant (mov + broadcast) in every iteration */
    __asm__("" : "+v"(e78), "+v"(m07), "+v"(m7f0), "+v"(sgn), "+v"(qnan));
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint8_t *x = entry + t * SMLA_FP8_TILE;
        uint16_t *b = bf16 + t * SMLA_FP8_TILE;
        float *f = f32 ? f32 + t * SMLA_FP8_TILE : NULL;
        const int kind = smla_fp8_tile_kind(s[t]);
        if (kind != SMLA_TILE_EXACT || s[t] < 0.0f) {
            smla_dequant_tile_avx512(x, s[t], kind, b, f);
            continue;
        }
        const int k = (int)(smla_f32_to_bits(s[t]) >> 23) - 127;
        __m512i bias = _mm512_set1_epi16((short)((120 + k) * 128));
        /* m * 2^(k - 9) for m = 0..7: bf16 of m * 2^-9 (0, 2^-9, 2^-8, 1.5 * 2^-8, 2^-7, ...) rebased by k */
        static const uint16_t sub9[32] __attribute__((aligned(64))) = {0, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20,
                                                                        0x3c40, 0x3c60};
        __m512i sub = _mm512_maskz_add_epi16(0xfe, _mm512_load_si512(sub9), _mm512_set1_epi16((short)(k * 128)));
        __asm__("" : "+v"(bias), "+v"(sub));
        for (int i = 0; i < SMLA_FP8_TILE; i += 32) {
            const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const void *)(x + i)));
            const __mmask32 normal = _mm512_test_epi16_mask(w, e78);
            __m512i r = _mm512_and_si512(_mm512_slli_epi16(w, 4), m7f0);
            const __mmask32 nan = _mm512_cmpeq_epi16_mask(r, m7f0); /* magnitude 0x7f */
            r = _mm512_mask_add_epi16(r, normal, r, bias);
            r = _mm512_mask_permutexvar_epi16(r, _mm512_mask_test_epi16_mask((__mmask32)~normal, w, m07), w, sub);
            r = _mm512_mask_mov_epi16(r, nan, qnan);
            r = _mm512_ternarylogic_epi32(r, _mm512_slli_epi16(w, 8), sgn, 0xF8); /* r | (sign & 0x8000) */
            _mm512_storeu_si512(b + i, r);
            if (f) {
                _mm512_storeu_si512(f + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(r)), 16));
                _mm512_storeu_si512(f + i + 16,
                                    _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(r, 1)), 16));
            }
        }
    }
    smla_rope_avx512(entry, bf16, f32);
}
#endif /* x86-64 */

#endif /* SMLA_CPU_CACHE_ROWS_H */
