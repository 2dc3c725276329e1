/* pack_kv on the CPU: the reference writer of the KV cache (docs/design.md section 3); cuda/memory/pack_kv.cu
 * must give the same bytes. A negative slot is skipped (padding); a slot >= num_blocks*block_size is an
 * error, reported before anything is written (the GPU skips it: checking there would need a sync).
 * Per token t with a slot in [0, num_blocks*block_size):
 *   bf16:        entry = kv_c[t] (512 bf16) then k_pe[t] (64 bf16), bit for bit.
 *   fp8_ds_mla:  per tile of 128 latent values, with core/fp8_ds_mla.h's rules (shared with the GPU):
 *                  amax = max over fabsf(float(x))         (NaN dropped, signalling ones too; any order)
 *                  s = smla_fp8_scale(amax, rule)          (pow2 or fp32, one fp32 division)
 *                  byte i = smla_fp8_quant(x_i, s) = e4m3_satfinite_rne(float(x_i) / s)
 *                scale t at byte 512 + 4t (fp32), k_pe bf16 bits at byte 528.
 * An Inf element makes s = Inf and itself NaN (Inf/Inf); -0.0 gives 0x80.
 * Duplicate slots: the last token wins here; on the GPU which one wins is unspecified.
 *
 * Paths (cpu_features.h): portable is the scalar rule below; AVX2 and up compute the same bits in vector
 * form: a tile whose scale is a power of two 2^k and which holds no value in the e4m3 subnormal range
 * (the usual tile) is encoded in bf16 lanes, 16 at a time, x / 2^k being an exact exponent shift there;
 * any other tile (fp32 rule, NaN / Inf, tiny values) in fp32 lanes, an 8-lane twin of the scalar rule
 * (IEEE division and max are exact, and the e4m3 rounding is integer code). The AVX-512 levels reuse
 * the AVX2 code (measured no faster, below).
 * Threads own slots, not tokens: slots fall into classes (slot / 16 modulo a power of two), each class
 * written by one thread in token order, so the last of two tokens with one slot still wins. */
#include <math.h>
#include <string.h>

#include "core/index_rules.h"
#include "cache_rows.h"
#include "cpu_features.h"
#include "threads.h"

static void pack_fp8_entry(uint8_t *entry, const uint16_t *kv_c, const uint16_t *k_pe, int rule)
{
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint16_t *x = kv_c + t * SMLA_FP8_TILE;
        float v[SMLA_FP8_TILE];
        float amax = 0.0f;
        for (int i = 0; i < SMLA_FP8_TILE; i++) {
            v[i] = smla_bf16_to_f32(x[i]);
            /* a compare, not fmaxf: glibc's fmaxf returns NaN for a signalling NaN (IEEE 754-2008
             * maxNum), which would make the scale NaN's; the comparison drops every NaN */
            const float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        const float s = smla_fp8_scale(amax, rule);
        for (int i = 0; i < SMLA_FP8_TILE; i++)
            entry[t * SMLA_FP8_TILE + i] = smla_fp8_quant(v[i], s);
        memcpy(entry + SMLA_FP8_SCALE_OFF + 4 * t, &s, 4);
    }
    memcpy(entry + SMLA_FP8_ROPE_OFF, k_pe, 2 * SMLA_D_ROPE);
}

#if SMLA_X86
#include <immintrin.h>

#define PACK_AVX2 __attribute__((target(SMLA_TARGET_AVX2)))

/* smla_f32_to_e4m3 on 8 lanes, branch for branch; the codes in 32-bit lanes. */
PACK_AVX2 static inline __m256i e4m3x8_avx2(__m256 f)
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
    return _mm256_or_si256(code, sign);
}

/* 32 codes (4 x 8 lanes, each < 256) as 32 bytes in order: the packs work within 128-bit lanes, so the
 * dwords come out as c0lo c1lo c2lo c3lo | c0hi c1hi c2hi c3hi and one permute fixes that. */
PACK_AVX2 static inline __m256i bytes32_avx2(__m256i c0, __m256i c1, __m256i c2, __m256i c3)
{
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One tile of scale s in fp32 lanes: x / s, 8 at a time (any scale, any input). */
PACK_AVX2 static void quant_tile_f32_avx2(uint8_t *dst, const uint16_t *x, float s)
{
    /* s = 2^k with k <= 126: x / s and x * 2^-k are the same real number (2^-k is a normal float,
     * so no flush-to-zero mode can touch it), rounded once either way, and a multiply is several
     * times cheaper than a division */
    const int pow2 = (smla_f32_to_bits(s) & 0x807fffffu) == 0 && smla_f32_to_bits(s) < 0x7f000000u;
    const __m256 sv = _mm256_set1_ps(pow2 ? 1.0f / s : s);
    for (int i = 0; i < SMLA_FP8_TILE; i += 32) {
        __m256i c[4];
        for (int j = 0; j < 4; j++) {
            const __m256 v = smla_bf16x8_to_f32_avx2(x + i + 8 * j);
            c[j] = e4m3x8_avx2(pow2 ? _mm256_mul_ps(v, sv) : _mm256_div_ps(v, sv));
        }
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), bytes32_avx2(c[0], c[1], c[2], c[3]));
    }
}

/* One tile of scale 2^k in bf16 lanes, 16 at a time, for a tile with no NaN or Inf and no nonzero
 * magnitude below 2^(k-6) (no e4m3 subnormal but 0). x / 2^k is exact: its bf16 bits are a - (k << 7)
 * for magnitude bits a, so smla_f32_to_e4m3's normal branch becomes, with the 4 dropped bits rounded
 * to nearest even and the exponent rebiased,
 *     code = (a + 7 + lsb - ((120 + k) << 7)) >> 4,   lsb = bit 4 of a,
 * in int16 without overflow (a <= amax bits). A zero gives code < 0, which the unsigned-saturating
 * pack turns into 0; no code exceeds 0x7E: s >= amax / 448 (a power of two can only fall below amax / 448
 * when amax is not a bf16 value), so |x| / s <= 448. The sign bytes come from a signed-saturating pack
 * of x itself (negative -> top bit set). */
PACK_AVX2 static void quant_tile_bf16_avx2(uint8_t *dst, const uint16_t *x, int k)
{
    const __m256i mag = _mm256_set1_epi16(0x7fff), one = _mm256_set1_epi16(1), top = _mm256_set1_epi8((char)0x80);
    const __m256i bias = _mm256_set1_epi16((short)(7 - ((120 + k) << 7)));
    for (int i = 0; i < SMLA_FP8_TILE; i += 32) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 16));
        const __m256i a0 = _mm256_and_si256(x0, mag), a1 = _mm256_and_si256(x1, mag);
        const __m256i l0 = _mm256_and_si256(_mm256_srli_epi16(a0, 4), one);
        const __m256i l1 = _mm256_and_si256(_mm256_srli_epi16(a1, 4), one);
        const __m256i c0 = _mm256_srai_epi16(_mm256_add_epi16(_mm256_add_epi16(a0, l0), bias), 4);
        const __m256i c1 = _mm256_srai_epi16(_mm256_add_epi16(_mm256_add_epi16(a1, l1), bias), 4);
        const __m256i b = _mm256_or_si256(_mm256_packus_epi16(c0, c1),
                                          _mm256_and_si256(_mm256_packs_epi16(x0, x1), top));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm256_permute4x64_epi64(b, 0xd8));
    }
}

/* The scale of a tile with a NaN or Inf (magnitude bits >= 0x7F80): amax in fp32 lanes, where maxps
 * drops every NaN as the scalar compare does. */
PACK_AVX2 static float nonfinite_tile_scale_avx2(const uint16_t *x, int rule)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < SMLA_FP8_TILE; i += 8) /* maxps returns its second operand for a NaN: dropped */
        m = _mm256_max_ps(_mm256_and_ps(smla_bf16x8_to_f32_avx2(x + i), absmask), m);
    __m128 f = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    f = _mm_max_ps(f, _mm_movehl_ps(f, f));
    f = _mm_max_ss(f, _mm_shuffle_ps(f, f, 1));
    return smla_fp8_scale(_mm_cvtss_f32(f), rule);
}

/* One tile from the bf16 bits of its largest magnitude (hi, < 0x7F80: no NaN or Inf) and smallest
 * nonzero one (lo; 0x10000 when all are zero): its scale, and the exponent k of a power-of-two scale
 * that the bf16-lane encoder takes (no nonzero magnitude below 2^(k-6)), else INT32_MIN (fp32 lanes). */
static inline float finite_tile_scale(uint32_t hi, uint32_t lo, int rule, int *k)
{
    const float s = smla_fp8_scale(smla_bf16_to_f32((uint16_t)hi), rule);
    const uint32_t sb = smla_f32_to_bits(s);
    const int e = (int)(sb >> 23) - 127;
    *k = (sb & 0x807fffffu) == 0 && e >= -100 && e <= 126 && lo >= (uint32_t)(121 + e) << 7 ? e : INT32_MIN;
    return s;
}

/* Per tile: the largest magnitude's bf16 bits and the smallest nonzero one's (from the same loads the
 * encoder makes again, out of L1), which pick the encoder: bf16 lanes for a power-of-two scale when no
 * value needs the e4m3 subnormal rounding, fp32 lanes otherwise. All four tiles' statistics and scales
 * come before any encoding, so that their reduction + division chains (about 50 cycles a tile) overlap
 * instead of each holding up its tile (89 -> 54 ns a token in L1, measured). A 32-lane AVX512BW encoder
 * measured no faster on Zen 4 (25 ns a token either way), hence the AVX-512 levels run this. */
PACK_AVX2 static void pack_fp8_entry_avx2(uint8_t *entry, const uint16_t *kv_c, const uint16_t *k_pe, int rule)
{
    const __m256i mag = _mm256_set1_epi16(0x7fff), one = _mm256_set1_epi16(1);
    float s[SMLA_FP8_NUM_TILES];
    int k[SMLA_FP8_NUM_TILES];
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint16_t *x = kv_c + t * SMLA_FP8_TILE;
        __m256i hi = _mm256_setzero_si256(), lo = _mm256_set1_epi16(-1);
        for (int i = 0; i < SMLA_FP8_TILE; i += 16) {
            const __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), mag);
            hi = _mm256_max_epu16(hi, a);
            lo = _mm256_min_epu16(lo, _mm256_sub_epi16(a, one)); /* a zero wraps to 0xFFFF: ignored */
        }
        const __m128i h = _mm_max_epu16(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
        const __m128i l = _mm_min_epu16(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
        const __m128i not_h = _mm_xor_si128(h, _mm_set1_epi32(-1)); /* max = ~min of ~x (phminposuw) */
        const uint32_t amax = 0xffffu - (uint32_t)_mm_extract_epi16(_mm_minpos_epu16(not_h), 0);
        const uint32_t amin = (uint32_t)_mm_extract_epi16(_mm_minpos_epu16(l), 0) + 1u;
        k[t] = INT32_MIN;
        s[t] = amax < 0x7f80u ? finite_tile_scale(amax, amin, rule, &k[t]) : nonfinite_tile_scale_avx2(x, rule);
    }
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        if (k[t] != INT32_MIN) quant_tile_bf16_avx2(entry + t * SMLA_FP8_TILE, kv_c + t * SMLA_FP8_TILE, k[t]);
        else quant_tile_f32_avx2(entry + t * SMLA_FP8_TILE, kv_c + t * SMLA_FP8_TILE, s[t]);
    }
    memcpy(entry + SMLA_FP8_SCALE_OFF, s, sizeof s);
    memcpy(entry + SMLA_FP8_ROPE_OFF, k_pe, 2 * SMLA_D_ROPE);
}

#endif

#define PACK_PF_TOKENS 4 /* tokens between the prefetch of a token's rows and entry and its write */

static inline int64_t slot_at(const smla_pack_kv_params *p, int64_t t)
{
    return p->slot_is_i64 ? ((const int64_t *)p->slot_mapping)[t] : (int64_t)((const int32_t *)p->slot_mapping)[t];
}

/* The first token whose slot is past the cache, or -1. The maximum is a branch-free loop (it
 * vectorises); only a bad call walks the slots a second time. */
static int64_t first_slot_past(const smla_pack_kv_params *p, int64_t capacity)
{
    int64_t mx = -1;
    if (p->slot_is_i64) {
        const int64_t *s = p->slot_mapping;
        for (int64_t t = 0; t < p->num_tokens; t++) mx = s[t] > mx ? s[t] : mx;
    } else {
        const int32_t *s = p->slot_mapping;
        for (int64_t t = 0; t < p->num_tokens; t++) mx = s[t] > mx ? s[t] : mx;
    }
    if (mx < capacity) return -1;
    for (int64_t t = 0;; t++)
        if (slot_at(p, t) >= capacity) return t;
}

/* Token t into its entry, on the call's path. */
static inline void pack_token(const smla_pack_kv_params *p, int64_t t, uint8_t *entry, int isa)
{
    const uint16_t *kv_c = p->kv_c + t * p->kv_c_stride;
    const uint16_t *k_pe = p->k_pe + t * p->k_pe_stride;
    if (p->cache.dtype == SMLA_CACHE_FP8_DS_MLA) {
#if SMLA_X86
        if (isa >= SMLA_ISA_AVX2) {
            pack_fp8_entry_avx2(entry, kv_c, k_pe, p->scale_rule);
            return;
        }
#endif
        (void)isa;
        pack_fp8_entry(entry, kv_c, k_pe, p->scale_rule);
    } else {
        memcpy(entry, kv_c, 2 * SMLA_D_NOPE);
        memcpy(entry + 2 * SMLA_D_NOPE, k_pe, 2 * SMLA_D_ROPE);
    }
}

/* The tokens whose slot lies in class cls of n (slot / 16 modulo n, n a power of two), in token order,
 * so that of two tokens with one slot the last still wins. The input rows and entries of the class's
 * next PACK_PF_TOKENS tokens are prefetched (they are not adjacent in memory, so the hardware's stream
 * prefetch does not cover them). */
static void pack_class(const smla_pack_kv_params *p, int64_t cls, int64_t n, int isa)
{
    const smla_cache *c = &p->cache;
    const int64_t entry_bytes = smla_cache_entry_bytes(c->dtype);
    int64_t ring[PACK_PF_TOKENS];
    uint8_t *ring_entry[PACK_PF_TOKENS];
    int head = 0, held = 0;
    int64_t scan = 0;
    for (;;) {
        for (; held < PACK_PF_TOKENS && scan < p->num_tokens; scan++) {
            const int64_t slot = slot_at(p, scan);
            if (slot < 0 || ((slot >> 4) & (n - 1)) != cls) continue;
            uint8_t *entry = smla_cache_entry(c, slot);
            if (!entry) continue;
            const uint8_t *kv_c = (const uint8_t *)(p->kv_c + scan * p->kv_c_stride);
            for (int64_t o = 0; o < 2 * SMLA_D_NOPE; o += 64) __builtin_prefetch(kv_c + o, 0, 3);
            __builtin_prefetch(p->k_pe + scan * p->k_pe_stride, 0, 3);
            __builtin_prefetch((const uint8_t *)(p->k_pe + scan * p->k_pe_stride) + 64, 0, 3);
            for (int64_t o = 0; o < entry_bytes; o += 64) __builtin_prefetch(entry + o, 1, 3);
            __builtin_prefetch(entry + entry_bytes - 1, 1, 3);
            const int at = (head + held) % PACK_PF_TOKENS;
            ring[at] = scan;
            ring_entry[at] = entry;
            held++;
        }
        if (!held) return;
        pack_token(p, ring[head], ring_entry[head], isa);
        head = (head + 1) % PACK_PF_TOKENS;
        held--;
    }
}

/* p passed smla_check_pack_kv (core/checks.c); slots past the cache are checked here, before any write */
int smla_cpu_pack_kv(const smla_pack_kv_params *p, smla_status *st)
{
    const smla_cache *c = &p->cache;
    const int64_t capacity = c->num_blocks > INT64_MAX / c->block_size ? INT64_MAX : c->num_blocks * c->block_size;
    const int64_t bad = first_slot_past(p, capacity);
    if (bad >= 0)
        return smla_fail(st, SMLA_ERR_VALUE, "slot_mapping: slot %lld (token %lld) is outside the cache of %lld slots",
                         (long long)slot_at(p, bad), (long long)bad, (long long)capacity);

    const int nt = smla_num_threads(p->run.num_threads, p->num_tokens / 64); /* >= 64 tokens per thread */
    /* Two slot classes per thread, handed out as threads ask: a thread that starts late (its core busy
     * with another process, or a vCPU to wake) leaves its classes to the others, instead of holding
     * the call for a fixed share. Each class scans all slots (about 1 ns a token), hence only about two. */
    int64_t classes = 1; /* a power of two (a mask, not a division, picks the class) */
    while (nt > 1 && classes < 2 * nt) classes *= 2;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t cls = 0; cls < classes; cls++) pack_class(p, cls, classes, p->run.cpu_isa);
    return SMLA_OK;
}
