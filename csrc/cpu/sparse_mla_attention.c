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

#define ATTN_CHUNK 64 /* tokens dequantised at a time: 64 * 576 * 4 B = 144 KiB */
#define ATTN_HG 4     /* heads that share one pass over a K row */
#define ATTN_W 8      /* independent partial sums per dot (lets the compiler vectorise) */

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

/* out[g] = dot(k, q_g) over 576 dims for ATTN_HG query heads; fp32 accumulation in ATTN_W lanes. */
static void dot_hg(const float *restrict k, const float *restrict q0, const float *restrict q1,
                   const float *restrict q2, const float *restrict q3, float out[ATTN_HG])
{
    float a0[ATTN_W] = {0}, a1[ATTN_W] = {0}, a2[ATTN_W] = {0}, a3[ATTN_W] = {0};
    for (int d = 0; d < SMLA_D_QK; d += ATTN_W)
        for (int t = 0; t < ATTN_W; t++) {
            const float kv = k[d + t];
            a0[t] += q0[d + t] * kv;
            a1[t] += q1[d + t] * kv;
            a2[t] += q2[d + t] * kv;
            a3[t] += q3[d + t] * kv;
        }
    for (int t = 1; t < ATTN_W; t++) { a0[0] += a0[t]; a1[0] += a1[t]; a2[0] += a2[t]; a3[0] += a3[t]; }
    out[0] = a0[0]; out[1] = a1[0]; out[2] = a2[0]; out[3] = a3[0];
}

static float dot_1(const float *restrict k, const float *restrict q)
{
    float a[ATTN_W] = {0};
    for (int d = 0; d < SMLA_D_QK; d += ATTN_W)
        for (int t = 0; t < ATTN_W; t++) a[t] += q[d + t] * k[d + t];
    for (int t = 1; t < ATTN_W; t++) a[0] += a[t];
    return a[0];
}

/* acc_g[:512] += p_g * v[:512] for ATTN_HG heads. */
static void axpy_hg(const float *restrict v, float p0, float p1, float p2, float p3, float *restrict o0,
                    float *restrict o1, float *restrict o2, float *restrict o3)
{
    for (int d = 0; d < SMLA_D_V; d++) {
        const float x = v[d];
        o0[d] += p0 * x;
        o1[d] += p1 * x;
        o2[d] += p2 * x;
        o3[d] += p3 * x;
    }
}

static void axpy_1(const float *restrict v, float p, float *restrict o)
{
    for (int d = 0; d < SMLA_D_V; d++) o[d] += p * v[d];
}

/* Scores of one chunk of n rows for every head: s[hi, j] = scale * dot(q_hi, k_j). */
static void chunk_scores(const attn_scratch *w, int64_t h, int n, float scale)
{
    int64_t hi = 0;
    for (; hi + ATTN_HG <= h; hi += ATTN_HG) {
        const float *q = w->q + hi * SMLA_D_QK;
        float *s = w->s + hi * ATTN_CHUNK;
        for (int j = 0; j < n; j++) {
            float d[ATTN_HG];
            dot_hg(w->k + (size_t)j * SMLA_D_QK, q, q + SMLA_D_QK, q + 2 * SMLA_D_QK, q + 3 * SMLA_D_QK, d);
            for (int g = 0; g < ATTN_HG; g++) s[g * ATTN_CHUNK + j] = scale * d[g];
        }
    }
    for (; hi < h; hi++)
        for (int j = 0; j < n; j++)
            w->s[hi * ATTN_CHUNK + j] = scale * dot_1(w->k + (size_t)j * SMLA_D_QK, w->q + hi * SMLA_D_QK);
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
static void chunk_pv(const attn_scratch *w, int64_t h, int n)
{
    int64_t hi = 0;
    for (; hi + ATTN_HG <= h; hi += ATTN_HG) {
        const float *s = w->s + hi * ATTN_CHUNK;
        float *o = w->acc + hi * SMLA_D_V;
        for (int j = 0; j < n; j++)
            axpy_hg(w->k + (size_t)j * SMLA_D_QK, s[j], s[ATTN_CHUNK + j], s[2 * ATTN_CHUNK + j],
                    s[3 * ATTN_CHUNK + j], o, o + SMLA_D_V, o + 2 * SMLA_D_V, o + 3 * SMLA_D_V);
    }
    for (; hi < h; hi++)
        for (int j = 0; j < n; j++)
            axpy_1(w->k + (size_t)j * SMLA_D_QK, w->s[hi * ATTN_CHUNK + j], w->acc + hi * SMLA_D_V);
}

/* One query row (bi, si), all heads. */
static void attn_row(const smla_attn_params *p, int64_t bi, int64_t si, const attn_scratch *w)
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
        chunk_scores(w, h, n, p->softmax_scale);
        chunk_softmax(w, h, n);
        chunk_pv(w, h, n);
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
static void attn_rows(const smla_attn_params *p, int64_t r0, int64_t r1, const attn_scratch *w)
{
    for (int64_t r = r0; r < r1; r++) attn_row(p, r / p->s_q, r % p->s_q, w);
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
    attn_rows(p, 0, rows, &w);
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
