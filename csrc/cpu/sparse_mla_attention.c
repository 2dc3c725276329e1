/* CPU sparse MLA attention (DESIGN section 4): the oracle the CUDA kernels are compared with.
 * smla_cpu_sparse_mla_decode runs on a paged cache (fp8_ds_mla or bf16); smla_cpu_sparse_mla_prefill
 * is the same computation with b = 1 and kv seen as one block of s_kv bf16 rows.
 *
 * Per query row (bi, si) the valid top-k rows are dequantised once into fp32 (all h heads share
 * them: MQA) in chunks of ATTN_CHUNK tokens, and each head keeps a running max / sum (online
 * softmax), so scratch is O(h * 576 + ATTN_CHUNK * 576) whatever topk is and each chunk of K stays
 * in cache while every head reads it. Scores are fp32 dots; the softmax sum is kept in double. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../params.h"
#include "numerics.h"
#include "cache_rows.h"

/* The hot loops (scores and P*V) are written once with GCC/Clang vector extensions as always-inline
 * bodies and instantiated twice on x86-64: for the baseline ISA and for AVX2, chosen at run time.
 * Each (head, token) dot accumulates in one 8-lane vector in d order and P*V adds tokens in order,
 * whatever the blocking, and nothing is contracted to FMA, so every path gives the same bits. */
#if !defined(__GNUC__)
#error "csrc/cpu/sparse_mla_attention.c needs GCC or Clang vector extensions"
#endif
#define ATTN_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__)
#define ATTN_AVX2 1
#else
#define ATTN_AVX2 0
#endif

#define ATTN_CHUNK 64 /* tokens dequantised at a time: 64 * 576 * 4 B = 144 KiB */
#define ATTN_HG 4     /* heads that share each load of a K row */

typedef float v8f __attribute__((vector_size(32)));
/* Unaligned, aliasing view for loads and stores (the idiom of the compilers' own __m256_u). Helpers
 * below pass vectors by pointer only: a by-value 32-byte vector would change the ABI without AVX. */
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
#define LD8(p) ((v8f)(*(const v8u *)(const void *)(p)))
#define ST8(p, v) (*(v8u *)(void *)(p) = (v))

ATTN_INLINE float hsum8(const v8f *a)
{
    float s = (*a)[0];
    for (int t = 1; t < 8; t++) s += (*a)[t];
    return s;
}

typedef struct {
    float *q;    /* [h, 576] query row in fp32 */
    float *k;    /* [ATTN_CHUNK, 576] dequantised K rows of the current chunk */
    float *s;    /* [h, ATTN_CHUNK] scores, then exp(score - running max) */
    float *acc;  /* [h, 512] unnormalised output, relative to the running max */
    float *m;    /* [h] running max of the scores */
    double *l;   /* [h] running sum of exp(score - m) */
    void *block; /* the one allocation holding all of the above */
} attn_scratch;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static int scratch_alloc(attn_scratch *w, int64_t h, smla_status *st)
{
    const size_t H = (size_t)h;
    const size_t sz_q = align64(H * SMLA_D_QK * sizeof(float));
    const size_t sz_k = align64((size_t)ATTN_CHUNK * SMLA_D_QK * sizeof(float));
    const size_t sz_s = align64(H * ATTN_CHUNK * sizeof(float));
    const size_t sz_acc = align64(H * SMLA_D_V * sizeof(float));
    const size_t sz_m = align64(H * sizeof(float));
    const size_t sz_l = align64(H * sizeof(double));
    char *b = malloc(64 + sz_q + sz_k + sz_s + sz_acc + sz_m + sz_l);
    if (!b)
        return smla_fail(st, SMLA_ERR_NOMEM, "sparse MLA attention: cannot allocate scratch for %lld heads",
                         (long long)h);
    w->block = b;
    b += (64 - ((uintptr_t)b & 63)) & 63;
    w->q = (float *)b;   b += sz_q;
    w->k = (float *)b;   b += sz_k;
    w->s = (float *)b;   b += sz_s;
    w->acc = (float *)b; b += sz_acc;
    w->m = (float *)b;   b += sz_m;
    w->l = (double *)b;
    return SMLA_OK;
}

/* s[g * ATTN_CHUNK + t] = scale * dot(q_g, k_t) for ATTN_HG heads (rows of q, 576 apart) and NT
 * tokens (k_0, k_1). */
ATTN_INLINE void dot_block(const float *restrict q, const float *restrict k0, const float *restrict k1, int nt,
                           float *restrict s, float scale)
{
    v8f a[ATTN_HG][2] = {{{0}}};
    for (int d = 0; d < SMLA_D_QK; d += 8) {
        const v8f x0 = LD8(k0 + d), x1 = nt > 1 ? LD8(k1 + d) : x0;
        for (int g = 0; g < ATTN_HG; g++) {
            const v8f qg = LD8(q + g * SMLA_D_QK + d);
            a[g][0] += qg * x0;
            if (nt > 1) a[g][1] += qg * x1;
        }
    }
    for (int g = 0; g < ATTN_HG; g++)
        for (int t = 0; t < nt; t++) s[g * ATTN_CHUNK + t] = scale * hsum8(&a[g][t]);
}

ATTN_INLINE float dot_1(const float *restrict q, const float *restrict k)
{
    v8f a = {0};
    for (int d = 0; d < SMLA_D_QK; d += 8) a += LD8(q + d) * LD8(k + d);
    return hsum8(&a);
}

/* o_g[:512] += p[g * ATTN_CHUNK + t] * v_t[:512] for ATTN_HG heads (rows of o, 512 apart) and nt <= 2
 * tokens, added in token order. */
ATTN_INLINE void pv_block(const float *restrict v0, const float *restrict v1, int nt, const float *restrict p,
                          float *restrict o)
{
    v8f pb[ATTN_HG][2];
    for (int g = 0; g < ATTN_HG; g++)
        for (int t = 0; t < 2; t++) pb[g][t] = (v8f){0} + p[g * ATTN_CHUNK + (t < nt ? t : 0)];
    for (int d = 0; d < SMLA_D_V; d += 8) {
        const v8f x0 = LD8(v0 + d), x1 = nt > 1 ? LD8(v1 + d) : x0;
        for (int g = 0; g < ATTN_HG; g++) {
            v8f og = LD8(o + g * SMLA_D_V + d);
            og += pb[g][0] * x0;
            if (nt > 1) og += pb[g][1] * x1;
            ST8(o + g * SMLA_D_V + d, og);
        }
    }
}

ATTN_INLINE void pv_1(const float *restrict v, float p, float *restrict o)
{
    const v8f pb = (v8f){0} + p;
    for (int d = 0; d < SMLA_D_V; d += 8) ST8(o + d, LD8(o + d) + pb * LD8(v + d));
}

/* Scores of one chunk of n rows for every head: s[hi, j] = scale * dot(q_hi, k_j). */
ATTN_INLINE void chunk_scores_body(const attn_scratch *w, int64_t h, int n, float scale)
{
    int64_t hi = 0;
    for (; hi + ATTN_HG <= h; hi += ATTN_HG) {
        const float *q = w->q + hi * SMLA_D_QK;
        float *s = w->s + hi * ATTN_CHUNK;
        int j = 0;
        for (; j + 2 <= n; j += 2)
            dot_block(q, w->k + (size_t)j * SMLA_D_QK, w->k + (size_t)(j + 1) * SMLA_D_QK, 2, s + j, scale);
        if (j < n) dot_block(q, w->k + (size_t)j * SMLA_D_QK, NULL, 1, s + j, scale);
    }
    for (; hi < h; hi++)
        for (int j = 0; j < n; j++)
            w->s[hi * ATTN_CHUNK + j] = scale * dot_1(w->q + hi * SMLA_D_QK, w->k + (size_t)j * SMLA_D_QK);
}

/* Online-softmax step: fold the chunk's scores into (m, l), rescale acc when the max grows, and turn
 * the scores into exp(score - m). */
static void chunk_softmax(const attn_scratch *w, int64_t h, int n)
{
    for (int64_t hi = 0; hi < h; hi++) {
        float *s = w->s + hi * ATTN_CHUNK;
        float mx = w->m[hi], cmax = -INFINITY;
        for (int j = 0; j < n; j++) cmax = s[j] > cmax ? s[j] : cmax;
        if (cmax > mx) {
            if (mx != -INFINITY) {
                const float a = expf(mx - cmax);
                float *acc = w->acc + hi * SMLA_D_V;
                for (int d = 0; d < SMLA_D_V; d++) acc[d] *= a;
                w->l[hi] *= a;
            }
            mx = cmax;
            w->m[hi] = mx;
        }
        float sum = 0.0f;
        for (int j = 0; j < n; j++) {
            const float e = expf(s[j] - mx);
            s[j] = e;
            sum += e;
        }
        w->l[hi] += sum;
    }
}

/* acc[hi] += sum_j p[hi, j] * V_j for the chunk (V = the first 512 dims of K). */
ATTN_INLINE void chunk_pv_body(const attn_scratch *w, int64_t h, int n)
{
    int64_t hi = 0;
    for (; hi + ATTN_HG <= h; hi += ATTN_HG) {
        const float *p = w->s + hi * ATTN_CHUNK;
        float *o = w->acc + hi * SMLA_D_V;
        int j = 0;
        for (; j + 2 <= n; j += 2)
            pv_block(w->k + (size_t)j * SMLA_D_QK, w->k + (size_t)(j + 1) * SMLA_D_QK, 2, p + j, o);
        if (j < n) pv_block(w->k + (size_t)j * SMLA_D_QK, NULL, 1, p + j, o);
    }
    for (; hi < h; hi++)
        for (int j = 0; j < n; j++)
            pv_1(w->k + (size_t)j * SMLA_D_QK, w->s[hi * ATTN_CHUNK + j], w->acc + hi * SMLA_D_V);
}

typedef struct {
    void (*scores)(const attn_scratch *w, int64_t h, int n, float scale);
    void (*pv)(const attn_scratch *w, int64_t h, int n);
} attn_kernels;

static void chunk_scores_base(const attn_scratch *w, int64_t h, int n, float scale)
{
    chunk_scores_body(w, h, n, scale);
}

static void chunk_pv_base(const attn_scratch *w, int64_t h, int n) { chunk_pv_body(w, h, n); }

#if ATTN_AVX2
__attribute__((target("avx2"))) static void chunk_scores_avx2(const attn_scratch *w, int64_t h, int n, float scale)
{
    chunk_scores_body(w, h, n, scale);
}

__attribute__((target("avx2"))) static void chunk_pv_avx2(const attn_scratch *w, int64_t h, int n)
{
    chunk_pv_body(w, h, n);
}
#endif

static attn_kernels pick_kernels(void)
{
    attn_kernels k = {chunk_scores_base, chunk_pv_base};
#if ATTN_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        k.scores = chunk_scores_avx2;
        k.pv = chunk_pv_avx2;
    }
#endif
    return k;
}

/* One query row (bi, si), all heads. */
static void attn_row(const smla_attn_params *p, const attn_kernels *kern, int64_t bi, int64_t si,
                     const attn_scratch *w)
{
    const int64_t h = p->h;
    const int64_t limit = p->kv.num_blocks * p->kv.block_size;
    const int32_t *idx = p->indices + bi * p->idx_stride_b + si * p->idx_stride_s;
    int64_t len = p->topk;
    if (p->topk_length) {
        const int64_t t = p->topk_length[bi * p->tl_stride_b + si * p->tl_stride_s];
        len = t < 0 ? 0 : (t > p->topk ? p->topk : t);
    }

    const uint16_t *q = p->q + bi * p->q_stride_b + si * p->q_stride_s;
    for (int64_t hi = 0; hi < h; hi++)
        for (int d = 0; d < SMLA_D_QK; d++) w->q[hi * SMLA_D_QK + d] = smla_bf16_to_f32(q[hi * p->q_stride_h + d]);
    for (int64_t hi = 0; hi < h; hi++) {
        w->m[hi] = -INFINITY;
        w->l[hi] = 0.0;
    }
    for (int64_t i = 0; i < h * SMLA_D_V; i++) w->acc[i] = 0.0f;

    int64_t pos = 0, n_valid = 0;
    while (pos < len) {
        int n = 0;
        while (pos < len && n < ATTN_CHUNK) {
            const int64_t slot = idx[pos++];
            if (slot < 0 || slot >= limit) continue; /* never read an invalid row */
            const uint8_t *row = smla_cache_row(&p->kv, slot);
            if (!row) continue;
            smla_dequant_row_f32(&p->kv, row, w->k + (size_t)n * SMLA_D_QK);
            n++;
        }
        if (n == 0) break;
        kern->scores(w, h, n, p->softmax_scale);
        chunk_softmax(w, h, n);
        kern->pv(w, h, n);
        n_valid += n;
    }

    for (int64_t hi = 0; hi < h; hi++) {
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
        const double l = w->l[hi];
        const double lse_d = (double)w->m[hi] + log(l);
        double f = 1.0 / l;
        if (p->attn_sink) /* sink +inf -> 0, -inf -> 1 */
            f *= 1.0 / (1.0 + exp((double)p->attn_sink[hi * p->sink_stride] - lse_d));
        const float ff = (float)f;
        const float *acc = w->acc + hi * SMLA_D_V;
        for (int d = 0; d < SMLA_D_V; d++) o[d] = smla_f32_to_bf16(acc[d] * ff);
        *lse = (float)lse_d;
        if (ml) *ml = w->m[hi];
    }
}

/* Rows [r0, r1) of the flattened (bi, si) range with one scratch: the unit a thread will own. */
static void attn_rows(const smla_attn_params *p, const attn_kernels *kern, int64_t r0, int64_t r1,
                      const attn_scratch *w)
{
    for (int64_t r = r0; r < r1; r++) attn_row(p, kern, r / p->s_q, r % p->s_q, w);
}

static int attn_check(const smla_attn_params *p, const char *op, smla_status *st)
{
    if (p->b < 0 || p->s_q < 0 || p->h < 0 || p->topk < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: negative shape (b=%lld, s_q=%lld, h=%lld, topk=%lld)", op,
                         (long long)p->b, (long long)p->s_q, (long long)p->h, (long long)p->topk);
    if (p->h > (int64_t)1 << 20)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: h=%lld is too large", op, (long long)p->h);
    if (p->kv.dtype != SMLA_CACHE_BF16 && p->kv.dtype != SMLA_CACHE_FP8_DS_MLA)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: unknown kv cache dtype %d", op, p->kv.dtype);
    if (p->kv.num_blocks < 0 || p->kv.block_size < 0 ||
        (p->kv.block_size > 0 && p->kv.num_blocks > INT64_MAX / p->kv.block_size))
        return smla_fail(st, SMLA_ERR_VALUE, "%s: bad kv cache shape (%lld blocks of %lld)", op,
                         (long long)p->kv.num_blocks, (long long)p->kv.block_size);
    if (p->b * p->s_q * p->h == 0) return SMLA_OK;
    if (!p->q || !p->out || !p->lse || (p->topk > 0 && !p->indices))
        return smla_fail(st, SMLA_ERR_VALUE, "%s: q, indices, out and lse must not be NULL", op);
    if (p->kv.num_blocks * p->kv.block_size > 0 && !p->kv.data)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: kv cache data is NULL", op);
    return SMLA_OK;
}

static int attn_run(const smla_attn_params *p, const char *op, smla_status *st)
{
    int rc = attn_check(p, op, st);
    if (rc != SMLA_OK) return rc;
    const int64_t rows = p->b * p->s_q;
    if (rows == 0 || p->h == 0) return SMLA_OK;
    attn_scratch w = {0};
    rc = scratch_alloc(&w, p->h, st);
    if (rc != SMLA_OK) return rc;
    const attn_kernels kern = pick_kernels();
    attn_rows(p, &kern, 0, rows, &w);
    free(w.block);
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
