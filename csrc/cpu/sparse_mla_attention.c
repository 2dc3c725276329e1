/* CPU sparse MLA attention (docs/design.md section 4). smla_cpu_sparse_mla_decode runs on a paged cache
 * (fp8_ds_mla or bf16); smla_cpu_sparse_mla_prefill is the same computation with b = 1 and kv seen as
 * one block of s_kv bf16 rows.
 *
 * Work is cut into units: one query row (bi, si), all h heads, a range of its top-k positions. A unit
 * streams its valid K rows once for all heads (MQA) in chunks of ATTN_CH rows (prefetched one chunk
 * ahead): dequantise the chunk into fp32 (fp8 -> bf16_rne(e4m3 * s), exactly as unpack_kv), scores
 * S[t][h] for all heads as one small GEMM (q^T is stored transposed, so heads are the vector lanes and
 * K values are broadcast; register tiles of rows x head vectors, d in L1-sized blocks), online
 * softmax in the log2 domain per head (running max m, sum l in double, exp2 by a polynomial), then
 * acc[h][:512] += P^T V as a second small GEMM (V = the first 512 dims of K; tiles of heads x columns,
 * P broadcast). Scratch per thread is O(h * 576 + ATTN_CH * 576) whatever topk is.
 *
 * Threads (OpenMP): rows are spread over threads; when there are too few rows for the threads, each
 * row's top-k list is split into parts run by different threads and merged by lse weights (as a
 * split-KV GPU decode does). Only tolerance is promised here (not bits): FMA, the blocking and the
 * split change the rounding.
 *
 * Instruction sets (cpu_features.h): the per-unit code below ATTN_ISA_BODY is compiled once per level
 * by including this file again with the vector width, tile shapes and a few primitives defined (a
 * #pragma GCC target region per level), and the op picks one level per call. The avx512bf16 level
 * computes the scores with vdpbf16ps on bf16 pairs of q and K (both are exact bf16 values, and the
 * pair products are exact in fp32). P * V is fp32 ("high", and every level without bf16 dot
 * products), or, at precision "fast" on the avx512bf16 level (docs/design.md, Precision), vdpbf16ps
 * over pairs of rows: P rounded to bf16 (RNE) and V (exact bf16 values) interleaved row pair by row
 * pair, vp[i][c] = (V[2i][c], V[2i+1][c]), so one instruction does two rows' products: half the
 * instructions of the fp32 form. The running sum l adds the unrounded fp32 P.
 *
 * The running max is lazy (as FlashAttention-3 and FlashMLA do): a head keeps its max until a chunk
 * raises it by more than ATTN_RESCALE (log2 units), so exp2(score - m) <= 2^ATTN_RESCALE and the
 * accumulator is rescaled only on real jumps, not on every small rise of the max.
 *
 * Profiling builds (SMLA_PROFILE_BUILD=1 -> SMLA_ATTN_ABLATION) take run.attn_ablate (SMLA_ATTN_ABLATE)
 * as bits of stages to leave out (ATTN_ABL_*), so that benchmarks/bench_cpu.py --stages can time the
 * others; the results are then wrong by design. Other builds compile the checks away.
 *
 * Overflow (docs/design.md section 4): a score (log2 domain) beyond the fp32 range saturates at
 * +-FLT_MAX as it is stored, so the online softmax never meets inf - inf. A row whose maximum
 * saturated at +FLT_MAX gives the mean of its saturated tokens' values (the others weigh 0) and
 * lse = max_logits = +inf; a row whose every valid score saturated at -FLT_MAX gives the mean of them
 * all and lse = max_logits = -inf. */
#ifndef ATTN_ISA_BODY

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/attention_math.h"
#include "core/params.h"
#include "numerics.h"
#include "cache_rows.h"
#include "cpu_features.h"
#include "threads.h"

#if !defined(__GNUC__)
#error "csrc/cpu/sparse_mla_attention.c needs GCC or Clang vector extensions"
#endif

#define ATTN_INLINE static inline __attribute__((always_inline))
#define ATTN_CH 96                    /* valid K rows per chunk */
#define ATTN_DB 192                   /* d block of a score tile: its slice of q^T stays in L1 */
#define ATTN_PF_ROWS 4                /* rows between the L1 prefetch and the dequantisation of a row */
#define ATTN_MT_MAX 16                /* largest score tile (rows): a last tile reads up to 15 rows past n */
#define ATTN_CH_PAD (ATTN_CH + ATTN_MT_MAX)
#define ATTN_HV_MAX 16                /* widest vector (floats) */
#define ATTN_RESCALE 8.0f             /* the lazy max: exp2(score - m) stays <= 2^8 */
/* stages a profiling build can leave out (SMLA_ATTN_ABLATE bits): dequantisation after a unit's first
 * chunk (its rows are reused), the scores, the softmax, P * V, the "fast" row pairs of V */
enum { ATTN_ABL_DEQUANT = 1, ATTN_ABL_SCORES = 2, ATTN_ABL_SOFTMAX = 4, ATTN_ABL_PV = 8, ATTN_ABL_VPAIRS = 16 };
#ifdef SMLA_ATTN_ABLATION
#define ATTN_DO(x, stage) (!((x)->ablate & (stage)))
#else
#define ATTN_DO(x, stage) 1
#endif
#define ATTN_PRAGMA_(x) _Pragma(#x)
#define ATTN_PRAGMA(x) ATTN_PRAGMA_(x)
#define ATTN_CAT2(a, b) a##_##b
#define ATTN_CAT(a, b) ATTN_CAT2(a, b)
/* Keeps p in one register across an unrolled tile (GCC otherwise may give each of a tile's rows its
 * own pointer and run out of registers); the rows are then constant offsets from it. */
#define ATTN_ONE_REGISTER(p) __asm__("" : "+r"(p))

typedef struct {
    float *q;           /* [576][hp] fp32 q^T, or [288][hp] bf16 pairs (avx512bf16), in head blocks */
    float *k;           /* [ATTN_CH_PAD][576] fp32 K rows of the chunk, then rows a last tile may read */
    uint16_t *kb;       /* [ATTN_CH_PAD][576] bf16 K rows (avx512bf16), then rows a last tile may read */
    const uint8_t **rows;   /* [2][ATTN_CH] cache entries of this chunk and of the next */
    uint32_t *vp;       /* [ATTN_CH / 2][512] V as bf16 row pairs ("fast" on bf16 levels) */
    uint32_t *pp;       /* [ATTN_CH / 2][hp] P as bf16 row pairs, in head blocks ("fast") */
    float *s;           /* [ATTN_CH_PAD][hp] scores (log2 domain), then exp2(score - m), in head blocks */
    float *acc;         /* [hp][512] unnormalised output, relative to m */
    float *m;           /* [hp] running (lazy) max (log2 domain) */
    float *mt;          /* [hp] the scores' true max, for max_logits */
    double *l;          /* [hp] running sum of exp2(score - m) */
    int64_t n_valid;    /* valid rows seen by the unit */
} attn_scratch;

/* What a unit reads: the op's params plus values derived once per call. */
typedef struct {
    const smla_attn_params *p;
    int64_t hp;         /* heads padded to a multiple of the level's vector width */
    int64_t limit;      /* num_blocks * block_size */
    int bs_shift;       /* block_size = 1 << bs_shift, or -1 */
    float c2;           /* softmax_scale * log2(e): scores in the log2 domain */
    int fast;           /* precision "fast": P * V from bf16 P on the levels with bf16 dot products */
    int ablate;         /* ATTN_ABL_* bits (profiling builds) */
} attn_ctx;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t scratch_bytes(int64_t hp)
{
    const size_t H = (size_t)hp;
    return align64(H * SMLA_D_QK * sizeof(float)) + align64((size_t)ATTN_CH_PAD * SMLA_D_QK * sizeof(float)) +
           align64((size_t)ATTN_CH_PAD * SMLA_D_QK * sizeof(uint16_t)) + align64(2 * ATTN_CH * sizeof(void *)) +
           align64((size_t)ATTN_CH / 2 * SMLA_D_V * sizeof(uint32_t)) +
           align64((size_t)ATTN_CH / 2 * H * sizeof(uint32_t)) +
           align64((size_t)ATTN_CH_PAD * H * sizeof(float)) + align64(H * SMLA_D_V * sizeof(float)) +
           2 * align64(H * sizeof(float)) + align64(H * sizeof(double));
}

static void scratch_carve(attn_scratch *w, char *b, int64_t hp)
{
    const size_t H = (size_t)hp;
    w->q = (float *)b;            b += align64(H * SMLA_D_QK * sizeof(float));
    w->k = (float *)b;            b += align64((size_t)ATTN_CH_PAD * SMLA_D_QK * sizeof(float));
    w->kb = (uint16_t *)b;        b += align64((size_t)ATTN_CH_PAD * SMLA_D_QK * sizeof(uint16_t));
    w->rows = (const uint8_t **)b; b += align64(2 * ATTN_CH * sizeof(void *));
    w->vp = (uint32_t *)b;        b += align64((size_t)ATTN_CH / 2 * SMLA_D_V * sizeof(uint32_t));
    w->pp = (uint32_t *)b;        b += align64((size_t)ATTN_CH / 2 * H * sizeof(uint32_t));
    w->s = (float *)b;            b += align64((size_t)ATTN_CH_PAD * H * sizeof(float));
    w->acc = (float *)b;          b += align64(H * SMLA_D_V * sizeof(float));
    w->m = (float *)b;            b += align64(H * sizeof(float));
    w->mt = (float *)b;           b += align64(H * sizeof(float));
    w->l = (double *)b;
    /* the rows past a full chunk that a last tile reads (their scores are never used, but keep them
     * finite); attn_pad_rows does the same past a partial chunk */
    memset(w->k + (size_t)ATTN_CH * SMLA_D_QK, 0, (size_t)ATTN_MT_MAX * SMLA_D_QK * sizeof(float));
    memset(w->kb + (size_t)ATTN_CH * SMLA_D_QK, 0, (size_t)ATTN_MT_MAX * SMLA_D_QK * sizeof(uint16_t));
}

static void attn_pad_rows(attn_scratch *w, int n)
{
    if (n >= ATTN_CH) return;
    const int e = n + ATTN_MT_MAX < ATTN_CH ? n + ATTN_MT_MAX : ATTN_CH;
    memset(w->k + (size_t)n * SMLA_D_QK, 0, (size_t)(e - n) * SMLA_D_QK * sizeof(float));
    memset(w->kb + (size_t)n * SMLA_D_QK, 0, (size_t)(e - n) * SMLA_D_QK * sizeof(uint16_t));
}

/* Entry of a valid slot (0 <= slot < limit is checked by the caller). */
ATTN_INLINE const uint8_t *attn_entry(const smla_cache *c, int64_t slot, int bs_shift)
{
    int64_t blk, off;
    if (bs_shift >= 0) {
        blk = slot >> bs_shift;
        off = slot & ((INT64_C(1) << bs_shift) - 1);
    } else {
        blk = slot / c->block_size;
        off = slot % c->block_size;
    }
    return (const uint8_t *)c->data + blk * c->block_stride + off * c->entry_stride;
}

/* The next <= ATTN_CH valid entries of idx[*pos, end) into rows[]; their lines are prefetched to L2
 * while the previous chunk computes, and to L1 a few rows ahead of the dequantisation. Returns the
 * count. */
static int attn_next_rows(const attn_ctx *x, const int32_t *idx, int64_t *pos, int64_t end, const uint8_t **rows)
{
    const smla_cache *c = &x->p->kv;
    const int64_t entry = c->dtype == SMLA_CACHE_FP8_DS_MLA ? SMLA_FP8_ENTRY : 2 * SMLA_D_QK;
    int n = 0;
    int64_t i = *pos;
    while (i < end && n < ATTN_CH) {
        const int64_t slot = idx[i++];
        if (slot < 0 || slot >= x->limit) continue; /* never read an invalid row */
        const uint8_t *e = attn_entry(c, slot, x->bs_shift);
        for (int64_t o = 0; o < entry; o += 64) __builtin_prefetch(e + o, 0, 2); /* to L2 */
        __builtin_prefetch(e + entry - 1, 0, 2);
        rows[n++] = e;
    }
    *pos = i;
    return n;
}

/* ---- the per-level code ---- */

#define ATTN_ISA_BODY 1

/* portable: GCC vector extensions at the baseline ISA, no FMA */
#define ATTN_SFX portable
#define VW 4
#define SC_MT2 6  /* score tile: rows x 2 head vectors */
#define SC_MT1 12 /* score tile: rows x 1 head vector */
#define PV_MH 4   /* P*V tile: heads x PV_NC vectors of d */
#define PV_NC 3
#define VFMA(a, b, c) ((a) + (b) * (c))
#define VBCAST(x) ((x) - (vf){0})
#define DEQUANT(c, e, bf, f) smla_dequant_row_table(c, e, bf, f)
#include "sparse_mla_attention.c"

#if SMLA_X86
ATTN_PRAGMA(GCC push_options)
ATTN_PRAGMA(GCC target(SMLA_TARGET_AVX2))
#define ATTN_SFX avx2
#define VW 8
#define SC_MT2 6
#define SC_MT1 12
#define PV_MH 4
#define PV_NC 3
#define VFMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(b), (__m256)(c), (__m256)(a)))
#define VBCAST(x) ((vf)_mm256_set1_ps(x))
#define DEQUANT(c, e, bf, f) smla_dequant_row_avx2(c, e, bf, f)
#include "sparse_mla_attention.c"
ATTN_PRAGMA(GCC pop_options)

ATTN_PRAGMA(GCC push_options)
ATTN_PRAGMA(GCC target(SMLA_TARGET_AVX512))
#define ATTN_SFX avx512
#define VW 16
#define SC_MT2 12
#define SC_MT1 16
#define PV_MH 8
#define PV_NC 3
#define VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(b), (__m512)(c), (__m512)(a)))
#define VBCAST(x) ((vf)_mm512_set1_ps(x))
#define DEQUANT(c, e, bf, f) smla_dequant_row_avx512(c, e, bf, f)
#include "sparse_mla_attention.c"
ATTN_PRAGMA(GCC pop_options)

ATTN_PRAGMA(GCC push_options)
ATTN_PRAGMA(GCC target(SMLA_TARGET_AVX512BF16))
/* "fast" P * V operands: dst[c] = (r0[c], r1[c]) for the 512 V columns of two bf16 rows ... */
static inline void attn_pair_rows_avx512bf16(uint32_t *dst, const uint16_t *r0, const uint16_t *r1)
{
    /* vpermt2w word selectors: 0..31 from r0's 32 columns, 32..63 from r1's */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                        6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int c = 0; c < SMLA_D_V; c += 32) {
        const __m512i a = _mm512_loadu_si512(r0 + c), b = _mm512_loadu_si512(r1 + c);
        _mm512_storeu_si512(dst + c, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(dst + c + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
}
/* ... and 16 heads' (bf16_rne(p0[h]), bf16_rne(p1[h])) */
static inline __m512 attn_pair_bf16_avx512bf16(__m512 p0, __m512 p1)
{
    const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                        21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_castsi512_ps(_mm512_permutexvar_epi16(il, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
}
#define ATTN_SFX avx512bf16
#define VW 16
#define SC_MT2 12
#define SC_MT1 16
#define PV_MH 8
#define PV_NC 3
#define VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(b), (__m512)(c), (__m512)(a)))
#define VBCAST(x) ((vf)_mm512_set1_ps(x))
#define DEQUANT(c, e, bf, f) smla_dequant_row_avx512bw(c, e, bf, f)
/* acc += sum over the bf16 pair of a (16 heads' pairs) * b (one broadcast pair) */
#define VDPBF16(acc, a, b) ((vf)_mm512_dpbf16_ps((__m512)(acc), (__m512bh)(a), (__m512bh)(b)))
#define VBCAST_U32(x) ((vf)_mm512_set1_epi32((int)(x)))
#define VPAIR_ROWS(dst, r0, r1) attn_pair_rows_avx512bf16(dst, r0, r1)
#define VPAIR_BF16(p0, p1) ((vf)attn_pair_bf16_avx512bf16((__m512)(p0), (__m512)(p1)))
#define ATTN_DPBF16 1
#include "sparse_mla_attention.c"
ATTN_PRAGMA(GCC pop_options)

/* Test hook (SMLA_CPU_ISA=avx2-emulated-bf16): the avx512bf16 level's code at AVX2 width with
 * vdpbf16ps emulated (the two bf16 products are exact, so two FMAs give its result), so that its
 * bf16-pair logic runs on machines without AVX512_BF16. */
ATTN_PRAGMA(GCC push_options)
ATTN_PRAGMA(GCC target(SMLA_TARGET_AVX2))
#define ATTN_SFX avx2_emulated_bf16
#define VW 8
#define SC_MT2 6
#define SC_MT1 12
#define PV_MH 4
#define PV_NC 3
#define VFMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(b), (__m256)(c), (__m256)(a)))
#define VBCAST(x) ((vf)_mm256_set1_ps(x))
#define DEQUANT(c, e, bf, f) smla_dequant_row_avx2(c, e, bf, f)
#define VDPBF16(acc, a, b)                                                                                   \
    VFMA(VFMA(acc, (vf)((vu)(a) & 0xffff0000u), (vf)((vu)(b) & 0xffff0000u)), (vf)((vu)(a) << 16),          \
         (vf)((vu)(b) << 16))
#define VBCAST_U32(x) ((vf)_mm256_set1_epi32((int)(x)))
#define ATTN_DPBF16 1
#include "sparse_mla_attention.c"
ATTN_PRAGMA(GCC pop_options)
#endif

#undef ATTN_ISA_BODY

/* ---- outputs: merge the parts of a row (ks >= 1 scratches) for heads [h0, h1) and write them ---- */

static void attn_finish(const smla_attn_params *p, int64_t r, attn_scratch *const *parts, int ks, int64_t h0,
                        int64_t h1)
{
    const int64_t bi = r / p->s_q, si = r % p->s_q;
    const double to_ln = smla_attn_to_ln(p->softmax_scale, smla_attn_scale_log2(p->softmax_scale));
    int64_t n_valid = 0;
    for (int k = 0; k < ks; k++) n_valid += parts[k]->n_valid;
    for (int64_t hi = h0; hi < h1; hi++) {
        uint16_t *o = p->out + bi * p->out_stride_b + si * p->out_stride_s + hi * p->out_stride_h;
        float *lse = p->lse + bi * p->lse_stride_b + si * p->lse_stride_s + hi * p->lse_stride_h;
        float *ml = p->max_logits
                        ? p->max_logits + bi * p->ml_stride_b + si * p->ml_stride_s + hi * p->ml_stride_h
                        : NULL;
        if (n_valid == 0) { /* the identity of a merge; the sink does not apply */
            for (int d = 0; d < SMLA_D_V; d++) o[d] = 0;
            *lse = -INFINITY;
            if (ml) *ml = -INFINITY;
            continue;
        }
        /* log2-domain max over the parts that saw rows; NaN in a part's m propagates via l */
        double mx = -INFINITY, mt = -INFINITY; /* of the lazy maxima; of the true ones */
        for (int k = 0; k < ks; k++) {
            if (parts[k]->n_valid > 0 && parts[k]->m[hi] > mx) mx = parts[k]->m[hi];
            if (parts[k]->n_valid > 0 && parts[k]->mt[hi] > mt) mt = parts[k]->mt[hi];
        }
        double wk[64], L = 0.0;
        for (int k = 0; k < ks; k++) {
            wk[k] = parts[k]->n_valid > 0 ? exp2((double)parts[k]->m[hi] - mx) : 0.0;
            if (ks == 1) wk[k] = 1.0; /* a NaN max must still reach the output */
            L += parts[k]->l[hi] * wk[k];
        }
        const double ml_d = smla_row_max_logit(mt, to_ln);
        const double lse_d = smla_row_lse(mx, L, to_ln);
        double f = 1.0 / L;
        if (p->attn_sink) f *= smla_sink_factor((double)p->attn_sink[hi * p->sink_stride], lse_d);
        if (ks == 1) {
            const float ff = (float)f;
            const float *acc = parts[0]->acc + hi * SMLA_D_V;
            for (int d = 0; d < SMLA_D_V; d++) o[d] = smla_f32_to_bf16(acc[d] * ff);
        } else {
            float fk[64];
            for (int k = 0; k < ks; k++) fk[k] = (float)(wk[k] * f);
            for (int d = 0; d < SMLA_D_V; d++) {
                float v = 0.0f;
                for (int k = 0; k < ks; k++)
                    if (fk[k] != 0.0f) v += parts[k]->acc[hi * SMLA_D_V + d] * fk[k];
                o[d] = smla_f32_to_bf16(v);
            }
        }
        *lse = (float)lse_d;
        if (ml) *ml = (float)ml_d;
    }
}

/* ---- the op: checks, level, threads ---- */

typedef void (*attn_unit_fn)(const attn_ctx *x, int64_t r, int64_t p0, int64_t p1, attn_scratch *w);

/* The unit function of a level and its vector width (heads are padded to a multiple of it). */
static attn_unit_fn attn_pick(int isa, int emulated_bf16, int *vw)
{
#if SMLA_X86
    *vw = 8;
    if (isa == SMLA_ISA_AVX2 && emulated_bf16) return attn_unit_avx2_emulated_bf16;
    *vw = 16;
    if (isa >= SMLA_ISA_AVX512BF16) return attn_unit_avx512bf16;
    if (isa >= SMLA_ISA_AVX512) return attn_unit_avx512;
    *vw = 8;
    if (isa >= SMLA_ISA_AVX2) return attn_unit_avx2;
#endif
    (void)isa;
    (void)emulated_bf16;
    *vw = 4;
    return attn_unit_portable;
}

static int64_t attn_len(const smla_attn_params *p, int64_t r)
{
    if (!p->topk_length) return p->topk;
    const int64_t t = p->topk_length[(r / p->s_q) * p->tl_stride_b + (r % p->s_q) * p->tl_stride_s];
    return t < 0 ? 0 : (t > p->topk ? p->topk : t);
}

/* Parts per row: rows run in rounds of nt / ks rows, each row split into ks parts of its top-k list.
 * Time ~ rounds / ks; ks = 1 (no merge) unless splitting is faster, and each part keeps >= 256
 * positions. */
static int attn_split(int64_t rows, int nt, int64_t topk)
{
    int best = 1;
    double best_t = (double)((rows + nt - 1) / nt);
    for (int ks = 2; ks <= nt && ks <= 64 && topk / ks >= 256; ks++) {
        if (nt % ks) continue;
        const int64_t R = nt / ks;
        const double t = (double)((rows + R - 1) / R) / ks * 1.05; /* 5%: merge and extra passes */
        if (t < best_t) {
            best_t = t;
            best = ks;
        }
    }
    return best;
}

/* p passed smla_check_sparse_mla_decode / _prefill (core/checks.c) */
static int attn_run(const smla_attn_params *p, const char *op, smla_status *st)
{
    const int64_t rows = p->b * p->s_q;
    if (rows == 0 || p->h == 0) return SMLA_OK;

    int vw;
    const attn_unit_fn unit = attn_pick(p->run.cpu_isa, p->run.emulated_bf16, &vw);
    attn_ctx x;
    x.p = p;
    x.fast = p->precision == SMLA_PRECISION_FAST; /* read only by the levels with bf16 dot products */
#ifdef SMLA_ATTN_ABLATION
    x.ablate = p->run.attn_ablate;
#else
    x.ablate = 0;
#endif
    x.hp = (p->h + vw - 1) / vw * vw;
    x.limit = p->kv.num_blocks * p->kv.block_size;
    x.bs_shift = -1;
    for (int s = 0; s < 62; s++)
        if (p->kv.block_size == INT64_C(1) << s) x.bs_shift = s;
    x.c2 = smla_attn_scale_log2(p->softmax_scale);

    /* under ~20 us of work (a (position, head) pair is ~2200 flops) one thread does it all */
    const double work = (double)rows * (double)p->topk * (double)p->h;
    int nt = smla_num_threads(p->run.num_threads, work < 512 ? 1 : rows * 64);
    const int ks = attn_split(rows, nt, p->topk);
    if ((int64_t)nt > rows * ks) nt = (int)(rows * ks); /* one round of split rows, or one row each */

    /* one allocation: the threads' scratch, their attn_scratch views, and pointers to those */
    const size_t per = scratch_bytes(x.hp);
    const size_t views = align64(sizeof(attn_scratch) * (size_t)nt + sizeof(attn_scratch *) * (size_t)nt);
    char *block = malloc(64 + views + per * (size_t)nt);
    if (!block)
        return smla_fail(st, SMLA_ERR_NOMEM, "%s: cannot allocate %d thread scratch buffers for %lld heads", op,
                         nt, (long long)p->h);
    char *base = block + ((64 - ((uintptr_t)block & 63)) & 63);
    attn_scratch *ws = (attn_scratch *)(void *)base;
    attn_scratch **parts = (attn_scratch **)(void *)(ws + nt);
    base += views;

#pragma omp parallel num_threads(nt)
    {
        const int tid = smla_thread_id(), team = smla_team_size();
        scratch_carve(&ws[tid], base + per * (size_t)tid, x.hp);
        parts[tid] = &ws[tid];
        if (ks == 1 || team < nt) { /* whole rows (also when the team came out smaller than asked) */
#pragma omp for schedule(dynamic, 1)
            for (int64_t r = 0; r < rows; r++) {
                unit(&x, r, 0, attn_len(p, r), &ws[tid]);
                attn_finish(p, r, parts + tid, 1, 0, p->h);
            }
        } else { /* rounds of nt / ks rows, each split into ks parts; a part's threads merge it */
            const int k = tid % ks;
            const int64_t R = nt / ks;
#pragma omp barrier
            for (int64_t r0 = 0; r0 < rows; r0 += R) {
                const int64_t r = r0 + tid / ks;
                if (r < rows) {
                    const int64_t len = attn_len(p, r);
                    unit(&x, r, len * k / ks, len * (k + 1) / ks, &ws[tid]);
                }
#pragma omp barrier
                if (r < rows) attn_finish(p, r, parts + (tid - k), ks, p->h * k / ks, p->h * (k + 1) / ks);
#pragma omp barrier
            }
        }
    }
    free(block);
    return SMLA_OK;
}

int smla_cpu_sparse_mla_decode(const smla_attn_params *p, smla_status *st)
{
    return attn_run(p, "sparse_mla_decode", st);
}

int smla_cpu_sparse_mla_prefill(const smla_attn_params *p, smla_status *st)
{
    return attn_run(p, "sparse_mla_prefill", st);
}

#else /* ================= ATTN_ISA_BODY: one level (macros from the including section) ================= */

#define FN(name) ATTN_CAT(name, ATTN_SFX)
#define vf FN(vf)
#define vfu FN(vfu)
#define vi FN(vi)
#define vu FN(vu)
typedef float vf __attribute__((vector_size(4 * VW)));
typedef float vfu __attribute__((vector_size(4 * VW), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(4 * VW)));
typedef uint32_t vu __attribute__((vector_size(4 * VW)));
#define LDV(ptr) ((vf)(*(const vfu *)(const void *)(ptr)))
#define STV(ptr, v) (*(vfu *)(void *)(ptr) = (v))
#define VSEL(mask, a, b) ((vf)(((vi)(a) & (mask)) | ((vi)(b) & ~(mask))))

/* q^T and S are stored in head blocks of 2 * VW heads (the last block may hold VW): a block is a
 * contiguous [rows][width] array, so a score tile streams q^T and a P*V tile streams P row by row.
 * Width of the block holding head hi, and the address of (row 0, head hi) in such an array. */
ATTN_INLINE int64_t FN(block_width)(int64_t hp, int64_t hi)
{
    const int64_t h0 = hi / (2 * VW) * (2 * VW);
    return hp - h0 < 2 * VW ? hp - h0 : 2 * VW;
}

ATTN_INLINE int64_t FN(block_off)(int64_t rows, int64_t hi)
{
    const int64_t h0 = hi / (2 * VW) * (2 * VW);
    return h0 * rows + (hi - h0);
}

ATTN_INLINE float *FN(block_at)(float *base, int64_t rows, int64_t hi) { return base + FN(block_off)(rows, hi); }

/* max(a, b) that keeps b when a is NaN */
ATTN_INLINE vf FN(vmax)(vf a, vf b) { return VSEL(a > b, a, b); }

/* x clamped to [-FLT_MAX, FLT_MAX]; NaN stays NaN (overflowed scores saturate, see the top) */
ATTN_INLINE vf FN(vsat)(vf x)
{
    const vf hi = VBCAST(FLT_MAX), lo = VBCAST(-FLT_MAX);
    x = VSEL(x > hi, hi, x);
    return VSEL(x < lo, lo, x);
}

/* 2^x for x <= 0 (or NaN): x = n + f, |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (truncation
 * < 6e-9 relative), times 2^n built from the exponent bits. x < -126 gives 2^-126, which is as good as
 * 0 next to the running max's exp2(0) = 1; NaN stays NaN (it reaches the product). */
ATTN_INLINE vf FN(vexp2)(vf x)
{
    const vf lo = VBCAST(-126.0f);
    x = VSEL(x < lo, lo, x);
    const vf magic = VBCAST(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const vf n = (x + magic) - magic;
    const vf f = x - n;
    vf y = VBCAST(1.525273380405984e-05f);
    y = VFMA(VBCAST(1.5403530393381606e-04f), y, f);
    y = VFMA(VBCAST(1.3333558146428443e-03f), y, f);
    y = VFMA(VBCAST(9.618129107628477e-03f), y, f);
    y = VFMA(VBCAST(5.550410866482158e-02f), y, f);
    y = VFMA(VBCAST(2.402265069591007e-01f), y, f);
    y = VFMA(VBCAST(6.931471805599453e-01f), y, f);
    y = VFMA(VBCAST(1.0f), y, f);
    const vu e = ((vu)__builtin_convertvector(n, vi) + 127u) << 23;
    return y * (vf)e;
}

/* S[t][..] (+)= dot(K_t, q) over d in [d0, d0 + ATTN_DB) for MT rows (576 floats apart) and the NH head
 * vectors of one head block (q^T and S rows are hw floats apart); the first d block starts from 0,
 * the last one scales by c2 and saturates. */
ATTN_INLINE void FN(score_tile)(const float *restrict qt, int64_t hw, const float *restrict k, float *restrict s,
                                float c2, int MT, int NH, int d0)
{
    vf a[SC_MT1][2];
    for (int t = 0; t < MT; t++)
        for (int j = 0; j < NH; j++) a[t][j] = d0 == 0 ? (vf){0} : LDV(s + t * hw + j * VW);
    const float *kd = k + d0;
    for (int d = d0; d < d0 + ATTN_DB; d++, kd++) {
        ATTN_ONE_REGISTER(kd);
        vf q[2];
        for (int j = 0; j < NH; j++) q[j] = LDV(qt + d * hw + j * VW);
        for (int t = 0; t < MT; t++) {
            const vf kb = VBCAST(kd[t * SMLA_D_QK]);
            for (int j = 0; j < NH; j++) a[t][j] = VFMA(a[t][j], q[j], kb);
        }
    }
    if (d0 + ATTN_DB < SMLA_D_QK) { /* a partial sum */
        for (int t = 0; t < MT; t++)
            for (int j = 0; j < NH; j++) STV(s + t * hw + j * VW, a[t][j]);
        return;
    }
    const vf c = VBCAST(c2);
    for (int t = 0; t < MT; t++)
        for (int j = 0; j < NH; j++) STV(s + t * hw + j * VW, FN(vsat)(a[t][j] * c));
}

#ifdef ATTN_DPBF16
/* The same from bf16 pairs: qt2[i][h] = (q[h][2i], q[h][2i+1]), K rows as bf16 (576 apart). */
ATTN_INLINE void FN(score_tile_bf16)(const float *restrict qt2, int64_t hw, const uint16_t *restrict k,
                                     float *restrict s, float c2, int MT, int NH, int d0)
{
    vf a[SC_MT1][2];
    for (int t = 0; t < MT; t++)
        for (int j = 0; j < NH; j++) a[t][j] = d0 == 0 ? (vf){0} : LDV(s + t * hw + j * VW);
    const uint16_t *kd = k + d0;
    for (int i = d0 / 2; i < (d0 + ATTN_DB) / 2; i++, kd += 2) {
        ATTN_ONE_REGISTER(kd);
        vf q[2];
        for (int j = 0; j < NH; j++) q[j] = LDV(qt2 + i * hw + j * VW);
        for (int t = 0; t < MT; t++) {
            uint32_t pair;
            memcpy(&pair, kd + t * SMLA_D_QK, 4);
            const vf kb = VBCAST_U32(pair);
            for (int j = 0; j < NH; j++) a[t][j] = VDPBF16(a[t][j], q[j], kb);
        }
    }
    if (d0 + ATTN_DB < SMLA_D_QK) { /* a partial sum */
        for (int t = 0; t < MT; t++)
            for (int j = 0; j < NH; j++) STV(s + t * hw + j * VW, a[t][j]);
        return;
    }
    const vf c = VBCAST(c2);
    for (int t = 0; t < MT; t++)
        for (int j = 0; j < NH; j++) STV(s + t * hw + j * VW, FN(vsat)(a[t][j] * c));
}
#endif

/* acc[h][c..] += sum_t P[t][h] * V_t[c..] for MH heads and NC vectors of columns. */
ATTN_INLINE void FN(pv_tile)(const float *restrict pm, int64_t hw, const float *restrict v, int n,
                             float *restrict o, int MH, int NC)
{
    vf a[PV_MH][PV_NC];
    for (int i = 0; i < MH; i++)
        for (int j = 0; j < NC; j++) a[i][j] = LDV(o + i * SMLA_D_V + j * VW);
    const float *vt = v, *pt = pm;
    for (int t = 0; t < n; t++, vt += SMLA_D_QK, pt += hw) {
        ATTN_ONE_REGISTER(vt);
        vf x[PV_NC];
        for (int j = 0; j < NC; j++) x[j] = LDV(vt + j * VW);
        for (int i = 0; i < MH; i++) {
            const vf pb = VBCAST(pt[i]);
            for (int j = 0; j < NC; j++) a[i][j] = VFMA(a[i][j], pb, x[j]);
        }
    }
    for (int i = 0; i < MH; i++)
        for (int j = 0; j < NC; j++) STV(o + i * SMLA_D_V + j * VW, a[i][j]);
}

#ifdef ATTN_DPBF16
#ifndef VPAIR_ROWS /* the emulated level: the "fast" operands in plain C */
ATTN_INLINE void FN(pair_rows)(uint32_t *dst, const uint16_t *r0, const uint16_t *r1)
{
    for (int c = 0; c < SMLA_D_V; c++) dst[c] = r0[c] | (uint32_t)r1[c] << 16;
}

/* bf16_rne(x) in the high half, the low half zero (NaN stays a quiet NaN, as smla_f32_to_bf16) */
ATTN_INLINE vu FN(bf16_hi)(vf x)
{
    const vu u = (vu)x;
    const vi nan = x != x;
    const vu r = u + 0x7fffu + ((u >> 16) & 1u);
    return (vu)(((vi)(u | 0x00400000u) & nan) | ((vi)r & ~nan)) & 0xffff0000u;
}
#define VPAIR_ROWS(dst, r0, r1) FN(pair_rows)(dst, r0, r1)
#define VPAIR_BF16(p0, p1) ((vf)((FN(bf16_hi)(p0) >> 16) | FN(bf16_hi)(p1)))
#endif

/* "fast": acc[h][c..] += sum over row pairs i of (P[2i][h], P[2i+1][h]) . (V[2i][c], V[2i+1][c]) */
ATTN_INLINE void FN(pv_tile_bf16)(const uint32_t *restrict pp, int64_t hw, const uint32_t *restrict vp, int np,
                                  float *restrict o, int MH, int NC)
{
    vf a[PV_MH][PV_NC];
    for (int i = 0; i < MH; i++)
        for (int j = 0; j < NC; j++) a[i][j] = LDV(o + i * SMLA_D_V + j * VW);
    const uint32_t *vt = vp, *pt = pp;
    for (int t = 0; t < np; t++, vt += SMLA_D_V, pt += hw) {
        ATTN_ONE_REGISTER(vt);
        vf x[PV_NC];
        for (int j = 0; j < NC; j++) x[j] = LDV(vt + j * VW);
        for (int i = 0; i < MH; i++) {
            const vf pb = VBCAST_U32(pt[i]);
            for (int j = 0; j < NC; j++) a[i][j] = VDPBF16(a[i][j], x[j], pb);
        }
    }
    for (int i = 0; i < MH; i++)
        for (int j = 0; j < NC; j++) STV(o + i * SMLA_D_V + j * VW, a[i][j]);
}
#endif

/* One P * V tile of the chunk's n rows: heads [h0, h0 + MH), column vectors [c, c + NC * VW). */
ATTN_INLINE void FN(pv_any)(const attn_ctx *x, attn_scratch *w, int n, int64_t h0, int c, int MH, int NC)
{
    const int64_t hw = FN(block_width)(x->hp, h0);
    float *o = w->acc + h0 * SMLA_D_V + c;
#ifdef ATTN_DPBF16
    if (x->fast) {
        FN(pv_tile_bf16)(w->pp + FN(block_off)(ATTN_CH / 2, h0), hw, w->vp + c, (n + 1) / 2, o, MH, NC);
        return;
    }
#endif
    FN(pv_tile)(FN(block_at)(w->s, ATTN_CH_PAD, h0), hw, w->k + c, n, o, MH, NC);
}

#ifndef ATTN_DPBF16
/* Scores of the chunk's n rows for all heads. The last tile may run past n (up to ATTN_MT_MAX - 1
 * rows): those rows hold finite leftovers and their scores are never read. */
static void FN(chunk_scores)(const attn_ctx *x, attn_scratch *w, int n)
{
    const int64_t hp = x->hp;
    int64_t hv = 0;
    for (; hv + 2 * VW <= hp; hv += 2 * VW) {
        const float *qt = w->q + hv * SMLA_D_QK;
        float *s = w->s + hv * ATTN_CH_PAD;
        for (int d0 = 0; d0 < SMLA_D_QK; d0 += ATTN_DB)
            for (int t = 0; t < n; t += SC_MT2)
                FN(score_tile)(qt, 2 * VW, w->k + (size_t)t * SMLA_D_QK, s + t * 2 * VW, x->c2, SC_MT2, 2, d0);
    }
    if (hv < hp) {
        const float *qt = w->q + hv * SMLA_D_QK;
        float *s = w->s + hv * ATTN_CH_PAD;
        for (int d0 = 0; d0 < SMLA_D_QK; d0 += ATTN_DB)
            for (int t = 0; t < n; t += SC_MT1)
                FN(score_tile)(qt, VW, w->k + (size_t)t * SMLA_D_QK, s + t * VW, x->c2, SC_MT1, 1, d0);
    }
}
#else
static void FN(chunk_scores_bf16)(const attn_ctx *x, attn_scratch *w, int n)
{
    const int64_t hp = x->hp;
    int64_t hv = 0;
    for (; hv + 2 * VW <= hp; hv += 2 * VW) {
        const float *qt2 = w->q + hv * (SMLA_D_QK / 2);
        float *s = w->s + hv * ATTN_CH_PAD;
        for (int d0 = 0; d0 < SMLA_D_QK; d0 += ATTN_DB)
            for (int t = 0; t < n; t += SC_MT2)
                FN(score_tile_bf16)(qt2, 2 * VW, w->kb + (size_t)t * SMLA_D_QK, s + t * 2 * VW, x->c2, SC_MT2, 2,
                                    d0);
    }
    if (hv < hp) {
        const float *qt2 = w->q + hv * (SMLA_D_QK / 2);
        float *s = w->s + hv * ATTN_CH_PAD;
        for (int d0 = 0; d0 < SMLA_D_QK; d0 += ATTN_DB)
            for (int t = 0; t < n; t += SC_MT1)
                FN(score_tile_bf16)(qt2, VW, w->kb + (size_t)t * SMLA_D_QK, s + t * VW, x->c2, SC_MT1, 1, d0);
    }
}
#endif

ATTN_INLINE void FN(prefetch_l1)(const smla_cache *c, const uint8_t *e)
{
    const int entry = c->dtype == SMLA_CACHE_FP8_DS_MLA ? SMLA_FP8_ENTRY : 2 * SMLA_D_QK;
    for (int o = 0; o < entry; o += 64) __builtin_prefetch(e + o, 0, 3);
    __builtin_prefetch(e + entry - 1, 0, 3);
}

/* Online softmax over the chunk, head vector by head vector: new max, rescale of l and acc, and the
 * scores turned into exp2(score - m). */
static void FN(chunk_softmax)(const attn_ctx *x, attn_scratch *w, int n)
{
    const int64_t hp = x->hp;
    for (int64_t hv = 0; hv < hp; hv += VW) {
        const int64_t hw = FN(block_width)(hp, hv);
        float *s = FN(block_at)(w->s, ATTN_CH_PAD, hv);
        vf cm = LDV(s);
        for (int t = 1; t < n; t++) cm = FN(vmax)(LDV(s + t * hw), cm);
        const vf mold = LDV(w->m + hv);
        /* the lazy max (see the top): a lane moves when the chunk passes it by more than ATTN_RESCALE; a
         * NaN chunk max keeps the old one, as vmax */
        const vf mnew = VSEL(cm > mold + VBCAST(ATTN_RESCALE), cm, mold);
        const vf alpha = FN(vexp2)(mold - mnew);
        vf sum = (vf){0};
#ifdef ATTN_DPBF16
        if (x->fast) { /* P as bf16 row pairs, for pv_tile_bf16 */
            uint32_t *pp = w->pp + FN(block_off)(ATTN_CH / 2, hv);
            for (int t = 0; t < n; t += 2) {
                const vf e0 = FN(vexp2)(LDV(s + t * hw) - mnew);
                const vf e1 = t + 1 < n ? FN(vexp2)(LDV(s + (t + 1) * hw) - mnew) : (vf){0};
                STV(pp + t / 2 * hw, VPAIR_BF16(e0, e1));
                sum += e0; /* in high's order: l, lse and max_logits keep high's bits */
                sum += e1;
            }
        } else
#endif
        for (int t = 0; t < n; t++) {
            const vf e = FN(vexp2)(LDV(s + t * hw) - mnew);
            STV(s + t * hw, e);
            sum += e;
        }
        STV(w->m + hv, mnew);
        STV(w->mt + hv, FN(vmax)(cm, LDV(w->mt + hv)));
        for (int j = 0; j < VW; j++) {
            w->l[hv + j] = w->l[hv + j] * alpha[j] + sum[j];
            if (alpha[j] != 1.0f) {
                float *a = w->acc + (hv + j) * SMLA_D_V;
                const vf al = VBCAST(alpha[j]);
                for (int d = 0; d < SMLA_D_V; d += VW) STV(a + d, LDV(a + d) * al);
            }
        }
    }
}

static void FN(chunk_pv)(const attn_ctx *x, attn_scratch *w, int n)
{
    const int64_t hp = x->hp;
    /* columns outside, heads inside: a column slice of V stays in L1 while every head reads it; a
     * tile's PV_MH heads never straddle two head blocks (PV_MH divides VW) */
    int c = 0;
    for (; c + PV_NC * VW <= SMLA_D_V; c += PV_NC * VW)
        for (int64_t h0 = 0; h0 < hp; h0 += PV_MH) FN(pv_any)(x, w, n, h0, c, PV_MH, PV_NC);
    const int rest = (SMLA_D_V - c) / VW; /* fewer than PV_NC vectors of columns are left */
    for (int64_t h0 = 0; h0 < hp && rest > 0; h0 += PV_MH) {
        if (rest == 1) FN(pv_any)(x, w, n, h0, c, PV_MH, 1);
        else FN(pv_any)(x, w, n, h0, c, PV_MH, 2);
    }
}

/* One unit: row r, top-k positions [p0, p1), all heads; leaves m, l, acc, n_valid in w. */
static void FN(attn_unit)(const attn_ctx *x, int64_t r, int64_t p0, int64_t p1, attn_scratch *w)
{
    const smla_attn_params *p = x->p;
    const int64_t bi = r / p->s_q, si = r % p->s_q, h = p->h, hp = x->hp;
    const int32_t *idx = p->indices + bi * p->idx_stride_b + si * p->idx_stride_s;

    /* q's latent part and RoPE part of head hi (one row of 576, or the q / q_pe pair: smla_q_at) */
#ifdef ATTN_DPBF16
    for (int64_t hi = 0; hi < hp; hi++) { /* head blocks of [288][hw] bf16 pairs */
        uint32_t *qt2 = (uint32_t *)(void *)FN(block_at)(w->q, SMLA_D_QK / 2, hi);
        const int64_t hw = FN(block_width)(hp, hi);
        const uint16_t *qn = hi < h ? smla_q_at(p, bi, si, hi, 0) : NULL;
        const uint16_t *qr = hi < h ? smla_q_at(p, bi, si, hi, SMLA_D_V) : NULL;
        for (int i = 0; i < SMLA_D_QK / 2; i++) {
            uint32_t pair = 0;
            if (hi < h) memcpy(&pair, 2 * i < SMLA_D_V ? qn + 2 * i : qr + (2 * i - SMLA_D_V), 4);
            qt2[i * hw] = pair;
        }
    }
#else
    for (int64_t hi = 0; hi < hp; hi++) { /* head blocks of [576][hw] */
        float *qt = FN(block_at)(w->q, SMLA_D_QK, hi);
        const int64_t hw = FN(block_width)(hp, hi);
        if (hi >= h) {
            for (int d = 0; d < SMLA_D_QK; d++) qt[d * hw] = 0.0f;
            continue;
        }
        const uint16_t *qn = smla_q_at(p, bi, si, hi, 0), *qr = smla_q_at(p, bi, si, hi, SMLA_D_V);
        for (int d = 0; d < SMLA_D_V; d++) qt[d * hw] = smla_bf16_to_f32(qn[d]);
        for (int d = SMLA_D_V; d < SMLA_D_QK; d++) qt[d * hw] = smla_bf16_to_f32(qr[d - SMLA_D_V]);
    }
#endif
    for (int64_t hi = 0; hi < hp; hi++) {
        w->m[hi] = w->mt[hi] = -INFINITY;
        w->l[hi] = 0.0;
    }
    memset(w->acc, 0, sizeof(float) * (size_t)hp * SMLA_D_V);
    w->n_valid = 0;

    int64_t pos = p0;
    int cur = 0;
    int n = attn_next_rows(x, idx, &pos, p1, w->rows);
    while (n > 0) {
        const uint8_t **rows = w->rows + cur * ATTN_CH;
        const int n_next = attn_next_rows(x, idx, &pos, p1, w->rows + (1 - cur) * ATTN_CH);
#ifdef ATTN_DPBF16
        /* bf16 rows for the scores; for P*V fp32 rows, or ("fast") bf16 row pairs made while two rows are
         * still in L1 (an odd last row pairs with the zero row attn_pad_rows puts after it) */
        uint16_t *kb = w->kb;
        const int dq = w->n_valid == 0 || ATTN_DO(x, ATTN_ABL_DEQUANT), vpairs = x->fast && ATTN_DO(x, ATTN_ABL_VPAIRS);
        for (int t = 0; t < n && dq; t++) {
            if (t + ATTN_PF_ROWS < n) FN(prefetch_l1)(&p->kv, rows[t + ATTN_PF_ROWS]);
            DEQUANT(&p->kv, rows[t], kb + (size_t)t * SMLA_D_QK, x->fast ? NULL : w->k + (size_t)t * SMLA_D_QK);
            if (vpairs && (t & 1))
                VPAIR_ROWS(w->vp + (size_t)(t / 2) * SMLA_D_V, kb + (size_t)(t - 1) * SMLA_D_QK, kb + (size_t)t * SMLA_D_QK);
        }
        attn_pad_rows(w, n);
        if (vpairs && (n & 1))
            VPAIR_ROWS(w->vp + (size_t)(n / 2) * SMLA_D_V, kb + (size_t)(n - 1) * SMLA_D_QK, kb + (size_t)n * SMLA_D_QK);
        if (ATTN_DO(x, ATTN_ABL_SCORES)) FN(chunk_scores_bf16)(x, w, n);
#else
        const int dq = w->n_valid == 0 || ATTN_DO(x, ATTN_ABL_DEQUANT);
        for (int t = 0; t < n && dq; t++) {
            if (t + ATTN_PF_ROWS < n) FN(prefetch_l1)(&p->kv, rows[t + ATTN_PF_ROWS]);
            DEQUANT(&p->kv, rows[t], NULL, w->k + (size_t)t * SMLA_D_QK);
        }
        attn_pad_rows(w, n);
        if (ATTN_DO(x, ATTN_ABL_SCORES)) FN(chunk_scores)(x, w, n);
#endif
        if (ATTN_DO(x, ATTN_ABL_SOFTMAX)) FN(chunk_softmax)(x, w, n);
        if (ATTN_DO(x, ATTN_ABL_PV)) FN(chunk_pv)(x, w, n);
        w->n_valid += n;
        n = n_next;
        cur = 1 - cur;
    }
}

#undef vf
#undef vfu
#undef vi
#undef vu
#undef LDV
#undef STV
#undef VSEL
#undef FN
#undef ATTN_SFX
#undef VW
#undef SC_MT2
#undef SC_MT1
#undef PV_MH
#undef PV_NC
#undef VFMA
#undef VBCAST
#undef DEQUANT
#undef VDPBF16
#undef VBCAST_U32
#undef VPAIR_ROWS
#undef VPAIR_BF16
#undef ATTN_DPBF16

#endif /* ATTN_ISA_BODY */
