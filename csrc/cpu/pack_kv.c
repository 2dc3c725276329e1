/* pack_kv on the CPU: the reference writer of the KV cache (DESIGN section 3); cuda/pack_kv.cu must
 * give the same bytes. Per token t with a slot in [0, num_blocks*block_size) (others are skipped and
 * leave the cache untouched):
 *   bf16:        entry = kv_c[t] (512 bf16) then k_pe[t] (64 bf16), bit for bit.
 *   fp8_ds_mla:  per tile of 128 latent values,
 *                  amax = fmaxf over fabsf(float(x))      (fmaxf drops NaN; any order gives the same)
 *                  pow2: s = pow2_ceil(fmaxf(amax / 448.0f, 1e-4f))   (one fp32 division)
 *                  fp32: s = fmaxf(amax / 448.0f, FLT_MIN)
 *                  byte i = e4m3_satfinite_rne(float(x_i) / s)         (fp32 division, not x * (1/s))
 *                scale t at byte 512 + 4t (fp32), k_pe bf16 bits at byte 528.
 * An Inf element makes s = Inf and itself NaN (Inf/Inf); -0.0 gives 0x80.
 * Duplicate slots: the last token wins here; on the GPU which one wins is unspecified.
 *
 * Paths (cpu_features.h): portable is the scalar code below; AVX2 and up run an 8-lane version of the
 * same arithmetic (IEEE division and max are exact, and the e4m3 rounding is integer code), so every
 * path writes the same bytes. The op is memory-bound, so the AVX-512 levels reuse the AVX2 code.
 * Threads own slots, not tokens: thread i writes the tokens whose slot / 16 is i modulo the team size,
 * in token order, so the last of two tokens with one slot still wins. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "../params.h"
#include "numerics.h"
#include "cache_rows.h"
#include "cpu_features.h"
#include "threads.h"

static inline float tile_scale(float amax, int rule)
{
    const float s = amax / 448.0f;
    return rule == SMLA_SCALE_POW2 ? smla_pow2_ceil(fmaxf(s, 1e-4f)) : fmaxf(s, FLT_MIN);
}

static void pack_fp8_entry(uint8_t *entry, const uint16_t *kv_c, const uint16_t *k_pe, int rule)
{
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint16_t *x = kv_c + t * SMLA_FP8_TILE;
        float v[SMLA_FP8_TILE];
        float amax = 0.0f;
        for (int i = 0; i < SMLA_FP8_TILE; i++) {
            v[i] = smla_bf16_to_f32(x[i]);
            amax = fmaxf(amax, fabsf(v[i]));
        }
        const float s = tile_scale(amax, rule);
        for (int i = 0; i < SMLA_FP8_TILE; i++)
            entry[t * SMLA_FP8_TILE + i] = smla_f32_to_e4m3(v[i] / s);
        memcpy(entry + SMLA_FP8_SCALE_OFF + 4 * t, &s, 4);
    }
    memcpy(entry + SMLA_FP8_ROPE_OFF, k_pe, 2 * SMLA_D_ROPE);
}

#if SMLA_X86
#include <immintrin.h>

#define PACK_AVX2 __attribute__((target(SMLA_TARGET_AVX2)))

/* smla_f32_to_e4m3 on 8 lanes, branch for branch, as 8 bytes. */
PACK_AVX2 static inline __m128i e4m3x8_avx2(__m256 f)
{
    const __m256i u = _mm256_castps_si256(f);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
    const __m256i sat = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43dfffff));  /* >= 448, Inf */
    const __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), a);  /* < 2^-6 */
    /* normal: keep 3 mantissa bits with RNE on the 20 dropped ones; (rounded >> 20) - 960 = e << 3 | m */
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(a, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7ffff)));
    __m256i code = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3));
    code = _mm256_min_epi32(code, _mm256_set1_epi32(0x7e)); /* rounded past 448 */
    /* subnormal: nearbyint(|f| * 512), an exact scaling, in the current rounding mode */
    const __m256 xs = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f));
    const __m256i cs = _mm256_cvttps_epi32(_mm256_round_ps(xs, _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC));
    code = _mm256_blendv_epi8(code, cs, sub);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e), sat);
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), nan);
    code = _mm256_or_si256(code, sign);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    return _mm_packus_epi16(w, w);
}

PACK_AVX2 static inline __m256 bf16x8_avx2(const uint16_t *x)
{
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)x)), 16));
}

PACK_AVX2 static void pack_fp8_entry_avx2(uint8_t *entry, const uint16_t *kv_c, const uint16_t *k_pe, int rule)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint16_t *x = kv_c + t * SMLA_FP8_TILE;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < SMLA_FP8_TILE; i += 8) /* maxps returns its second operand for a NaN: dropped */
            m = _mm256_max_ps(_mm256_and_ps(bf16x8_avx2(x + i), absmask), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        const float s = tile_scale(_mm_cvtss_f32(h), rule);
        uint8_t *dst = entry + t * SMLA_FP8_TILE;
        if ((smla_f32_to_bits(s) & 0x807fffffu) == 0 && smla_f32_to_bits(s) < 0x7f000000u) {
            /* s = 2^k with k <= 126: x / s and x * 2^-k are the same real number (2^-k is a normal
             * float, so no flush-to-zero mode can touch it), rounded once either way; a multiply
             * is several times cheaper than a division */
            const __m256 r = _mm256_set1_ps(1.0f / s);
            for (int i = 0; i < SMLA_FP8_TILE; i += 8)
                _mm_storel_epi64((__m128i *)(void *)(dst + i), e4m3x8_avx2(_mm256_mul_ps(bf16x8_avx2(x + i), r)));
        } else {
            const __m256 sv = _mm256_set1_ps(s);
            for (int i = 0; i < SMLA_FP8_TILE; i += 8)
                _mm_storel_epi64((__m128i *)(void *)(dst + i), e4m3x8_avx2(_mm256_div_ps(bf16x8_avx2(x + i), sv)));
        }
        memcpy(entry + SMLA_FP8_SCALE_OFF + 4 * t, &s, 4);
    }
    memcpy(entry + SMLA_FP8_ROPE_OFF, k_pe, 2 * SMLA_D_ROPE);
}
#endif

int smla_cpu_pack_kv(const smla_pack_kv_params *p, smla_status *st)
{
    const smla_cache *c = &p->cache;
    if (smla_cache_entry_bytes(c->dtype) == 0)
        return smla_fail(st, SMLA_ERR_VALUE, "pack_kv: unknown kv_cache_dtype code %d", c->dtype);
    if (c->dtype == SMLA_CACHE_FP8_DS_MLA && p->scale_rule != SMLA_SCALE_POW2 &&
        p->scale_rule != SMLA_SCALE_FP32)
        return smla_fail(st, SMLA_ERR_VALUE, "pack_kv: unknown scale_rule code %d", p->scale_rule);
    if (p->num_tokens < 0 || c->block_size <= 0 || c->num_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "pack_kv: invalid sizes (num_tokens %lld, block_size %lld)",
                         (long long)p->num_tokens, (long long)c->block_size);

    const int isa = smla_cpu_isa();
    (void)isa;
    const int nt = smla_num_threads(0, p->num_tokens / 64); /* >= 64 tokens per thread */
#pragma omp parallel num_threads(nt)
    {
        const int64_t me = smla_thread_id(), team = smla_team_size();
        for (int64_t t = 0; t < p->num_tokens; t++) {
            const int64_t slot = p->slot_is_i64 ? ((const int64_t *)p->slot_mapping)[t]
                                                : (int64_t)((const int32_t *)p->slot_mapping)[t];
            if (team > 1 && (slot < 0 || (slot >> 4) % team != me)) continue;
            uint8_t *entry = smla_cache_row_mut(c, slot);
            if (!entry) continue;
            const uint16_t *kv_c = p->kv_c + t * p->kv_c_stride;
            const uint16_t *k_pe = p->k_pe + t * p->k_pe_stride;
            if (c->dtype == SMLA_CACHE_FP8_DS_MLA) {
#if SMLA_X86
                if (isa >= SMLA_ISA_AVX2) {
                    pack_fp8_entry_avx2(entry, kv_c, k_pe, p->scale_rule);
                    continue;
                }
#endif
                pack_fp8_entry(entry, kv_c, k_pe, p->scale_rule);
            } else {
                memcpy(entry, kv_c, 2 * SMLA_D_NOPE);
                memcpy(entry + 2 * SMLA_D_NOPE, k_pe, 2 * SMLA_D_ROPE);
            }
        }
    }
    return SMLA_OK;
}
