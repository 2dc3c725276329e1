/* The params rules of every op, one owner each (checks.h). Messages start with the name of the Python
 * argument the value came from. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "checks.h"

/* The CUDA attention kernels hold a token's offset in its block in 32 bits. */
#define ATTN_MAX_BLOCK_SIZE INT64_C(4294967295)

typedef struct {
    int64_t n;      /* elements along a dimension */
    int64_t stride; /* bytes between them */
} span;

/* An array the kernels read or write with align-byte vectors: its first element and its stride over
 * every dimension of more than one element. Called only for arrays with elements. */
static int check_aligned(const char *name, const void *data, int align, int nd, const span *d, smla_status *st)
{
    if ((uintptr_t)data % (uintptr_t)align)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: data pointer must be %d-byte aligned", name, align);
    for (int i = 0; i < nd; i++)
        if (d[i].n > 1 && d[i].stride % align)
            return smla_fail(st, SMLA_ERR_VALUE, "%s: row strides must be multiples of %d bytes for vector access, "
                             "got %lld bytes", name, align, (long long)d[i].stride);
    return SMLA_OK;
}

/* A cache [num_blocks, block_size, entry] (docs/design.md section 3). need_tokens: the call reads or
 * writes slots (slot / block_size then needs block_size >= 1); aligned: its rows are read with 16-byte
 * vectors. */
static int check_cache(const smla_cache *c, const char *name, int need_tokens, int aligned, smla_status *st)
{
    if (c->dtype != SMLA_CACHE_BF16 && c->dtype != SMLA_CACHE_FP8_DS_MLA)
        return smla_fail(st, SMLA_ERR_VALUE, "kv_cache_dtype: unknown cache layout code %d", c->dtype);
    if (c->num_blocks < 0 || c->block_size < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: expected a non-negative shape, got %lld blocks of %lld tokens", name,
                         (long long)c->num_blocks, (long long)c->block_size);
    if (c->block_size > 0 && c->num_blocks > INT64_MAX / c->block_size)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: %lld blocks of %lld tokens overflow a 64-bit slot number", name,
                         (long long)c->num_blocks, (long long)c->block_size);
    if (need_tokens && c->block_size == 0)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: expected at least one token per block (shape[1] >= 1), got 0",
                         name);
    if (c->num_blocks * c->block_size == 0) return SMLA_OK;
    if (!c->data) return smla_fail(st, SMLA_ERR_VALUE, "%s: data pointer is NULL", name);
    const span d[] = {{c->num_blocks, c->block_stride}, {c->block_size, c->entry_stride}};
    return aligned ? check_aligned(name, c->data, 16, 2, d, st) : SMLA_OK;
}

int smla_check_pack_kv(const smla_pack_kv_params *p, int on_cuda, smla_status *st)
{
    const int64_t t = p->num_tokens;
    if (t < 0) return smla_fail(st, SMLA_ERR_VALUE, "slot_mapping: expected a non-negative length, got %lld", (long long)t);
    if (check_cache(&p->cache, "kv_cache", t > 0, 1, st)) return st->code;
    if (p->scale_rule != SMLA_SCALE_POW2 && p->scale_rule != SMLA_SCALE_FP32)
        return smla_fail(st, SMLA_ERR_VALUE, "scale_rule: unknown rule code %d", p->scale_rule);
    if (!on_cuda || t == 0) return SMLA_OK;
    /* the CUDA kernel reads kv_c rows as 16-byte vectors and k_pe rows as bf16 pairs */
    const span kv_c = {t, 2 * p->kv_c_stride}, k_pe = {t, 2 * p->k_pe_stride};
    if (check_aligned("kv_c", p->kv_c, 16, 1, &kv_c, st)) return st->code;
    return check_aligned("k_pe", p->k_pe, 4, 1, &k_pe, st);
}

int smla_check_unpack_kv(const smla_unpack_kv_params *p, int on_cuda, smla_status *st)
{
    if (p->n < 0) return smla_fail(st, SMLA_ERR_VALUE, "slots: expected a non-negative length, got %lld", (long long)p->n);
    if (check_cache(&p->cache, "kv_cache", p->n > 0, 1, st)) return st->code;
    const span out = {p->n, 2 * p->out_stride};
    return on_cuda && p->n > 0 ? check_aligned("out", p->out, 16, 1, &out, st) : SMLA_OK;
}

int smla_check_gather_upconvert(const smla_gather_upconvert_params *p, int on_cuda, smla_status *st)
{
    if (p->num_reqs < 0 || p->max_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "block_table: expected a non-negative shape, got [%lld, %lld]",
                         (long long)p->num_reqs, (long long)p->max_blocks);
    if (p->ws_rows < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "workspace: expected a non-negative row count, got %lld",
                         (long long)p->ws_rows);
    if (check_cache(&p->cache, "kv_cache", p->num_reqs > 0, 1, st)) return st->code;
    const span ws = {p->ws_rows, 2 * p->ws_stride};
    return on_cuda && p->ws_rows > 0 ? check_aligned("workspace", p->workspace, 16, 1, &ws, st) : SMLA_OK;
}

int smla_check_convert_topk_indices(const smla_convert_indices_params *p, int on_cuda, smla_status *st)
{
    (void)on_cuda;
    if (p->num_tokens < 0 || p->topk < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "topk_indices: expected a non-negative shape, got [%lld, %lld]",
                         (long long)p->num_tokens, (long long)p->topk);
    if (p->topk > INT32_MAX) /* valid_counts are int32 */
        return smla_fail(st, SMLA_ERR_VALUE, "topk_indices: expected at most %d entries per row, got %lld",
                         INT32_MAX, (long long)p->topk);
    if (p->num_reqs < 0 || p->max_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "block_table: expected a non-negative shape, got [%lld, %lld]",
                         (long long)p->num_reqs, (long long)p->max_blocks);
    if (p->num_prefills < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "prefill_workspace_starts: expected a non-negative length, got %lld",
                         (long long)p->num_prefills);
    if (p->block_size <= 0)
        return smla_fail(st, SMLA_ERR_VALUE, "block_size: expected a positive integer, got %lld",
                         (long long)p->block_size);
    if (p->num_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "num_blocks: expected the cache's block count, or 0 for no check, got "
                         "%lld", (long long)p->num_blocks);
    if (p->dcp_size < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "dcp_size: expected 0 (no DCP filter) or >= 1, got %d", p->dcp_size);
    if (p->dcp_size == 0) return SMLA_OK;
    if (p->dcp_rank < 0 || p->dcp_rank >= p->dcp_size)
        return smla_fail(st, SMLA_ERR_VALUE, "dcp_rank: expected 0 <= dcp_rank < dcp_size = %d, got %d", p->dcp_size,
                         p->dcp_rank);
    if (p->dcp_interleave < 1)
        return smla_fail(st, SMLA_ERR_VALUE, "interleave: expected >= 1, got %d", p->dcp_interleave);
    return SMLA_OK;
}

int smla_check_filter_convert_dcp_indices(const smla_convert_indices_params *p, int on_cuda, smla_status *st)
{
    if (p->dcp_size < 1) return smla_fail(st, SMLA_ERR_VALUE, "dcp_size: expected >= 1, got %d", p->dcp_size);
    return smla_check_convert_topk_indices(p, on_cuda, st);
}

int smla_check_merge_attn_states(const smla_merge_attn_states_params *p, int on_cuda, smla_status *st)
{
    (void)on_cuda;
    if (p->dtype != SMLA_DT_BF16 && p->dtype != SMLA_DT_F16 && p->dtype != SMLA_DT_F32)
        return smla_fail(st, SMLA_ERR_TYPE, "out_a: expected bfloat16, float16 or float32, got dtype code %d",
                         p->dtype);
    if (p->n < 0 || p->h < 0 || p->d < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "out_a: expected a non-negative shape, got [%lld, %lld, %lld]",
                         (long long)p->n, (long long)p->h, (long long)p->d);
    return SMLA_OK;
}

int smla_check_attn_shape(int64_t b, int64_t s_q, int64_t h, int64_t topk, int scalars, smla_status *st)
{
    if (b < 0 || s_q < 0) {
        if (scalars)
            return smla_fail(st, SMLA_ERR_VALUE, "%s: expected an integer >= 0, got %lld", b < 0 ? "b" : "s_q",
                             (long long)(b < 0 ? b : s_q));
        return smla_fail(st, SMLA_ERR_VALUE, "q: expected a non-negative shape, got b=%lld s_q=%lld", (long long)b,
                         (long long)s_q);
    }
    if (h < 1 || h > SMLA_MAX_HEADS)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: expected 1 to %d heads, got %lld", scalars ? "h" : "q",
                         SMLA_MAX_HEADS, (long long)h);
    const char *idx = scalars ? "topk" : "indices";
    if (topk < 1)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: expected topk >= 1 entries per query token, got %lld", idx,
                         (long long)topk);
    if (topk > SMLA_MAX_TOPK)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: expected at most %d entries per query token, got %lld", idx,
                         SMLA_MAX_TOPK, (long long)topk);
    return SMLA_OK;
}

/* What decode and prefill share, after their own cache rules. */
static int check_attn(const smla_attn_params *p, int on_cuda, const char *kv, smla_status *st)
{
    if (p->precision != SMLA_PRECISION_HIGH && p->precision != SMLA_PRECISION_FAST)
        return smla_fail(st, SMLA_ERR_VALUE, "precision: unknown precision code %d", p->precision);
    if (p->kv.block_size > ATTN_MAX_BLOCK_SIZE)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: expected at most %lld tokens per block, got %lld", kv,
                         (long long)ATTN_MAX_BLOCK_SIZE, (long long)p->kv.block_size);
    if (p->b == 0 || p->s_q == 0) return SMLA_OK; /* nothing is read or written */
    const char *null = !p->q ? "q" : !p->indices ? "indices" : !p->out ? "out" : !p->lse ? "lse" : NULL;
    if (null) return smla_fail(st, SMLA_ERR_VALUE, "%s: data pointer is NULL", null);
    if (!on_cuda) return SMLA_OK;
    /* the CUDA kernels move q and out rows (2-byte elements) with 16-byte vectors */
    const span q[] = {{p->b, 2 * p->q_stride_b}, {p->s_q, 2 * p->q_stride_s}, {p->h, 2 * p->q_stride_h}};
    const span out[] = {{p->b, 2 * p->out_stride_b}, {p->s_q, 2 * p->out_stride_s}, {p->h, 2 * p->out_stride_h}};
    if (check_aligned("q", p->q, 16, 3, q, st)) return st->code;
    if (p->q_pe) {
        const span qpe[] = {{p->b, 2 * p->q_pe_stride_b}, {p->s_q, 2 * p->q_pe_stride_s}, {p->h, 2 * p->q_pe_stride_h}};
        if (check_aligned("q_pe", p->q_pe, 16, 3, qpe, st)) return st->code;
    }
    return check_aligned("out", p->out, 16, 3, out, st);
}

int smla_check_sparse_mla_decode(const smla_attn_params *p, int on_cuda, smla_status *st)
{
    if (smla_check_attn_shape(p->b, p->s_q, p->h, p->topk, 0, st)) return st->code;
    if (check_cache(&p->kv, "kv_cache", 0, 1, st) || check_attn(p, on_cuda, "kv_cache", st)) return st->code;
    if (p->workspace_bytes < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "workspace: expected a non-negative size, got %lld bytes",
                         (long long)p->workspace_bytes);
    if (p->workspace && p->workspace_bytes > 0 && (uintptr_t)p->workspace % 16)
        return smla_fail(st, SMLA_ERR_VALUE, "workspace: data pointer must be 16-byte aligned");
    return SMLA_OK;
}

int smla_check_sparse_mla_prefill(const smla_attn_params *p, int on_cuda, smla_status *st)
{
    if (smla_check_attn_shape(p->b, p->s_q, p->h, p->topk, 0, st)) return st->code;
    if (p->kv.dtype != SMLA_CACHE_BF16) /* kv: bf16 rows, one block of s_kv */
        return smla_fail(st, SMLA_ERR_VALUE, "kv: expected bf16 rows (cache layout code %d), got code %d",
                         SMLA_CACHE_BF16, p->kv.dtype);
    if (check_cache(&p->kv, "kv", 0, on_cuda, st)) return st->code;
    return check_attn(p, on_cuda, "kv", st);
}

/* The shortest %g text that reads back as v (what Python's repr prints for the values in question). */
static void shortest(double v, char *buf, size_t n)
{
    if (isnan(v)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, n, v > 0 ? "inf" : "-inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

int smla_check_softmax_scale(double scale, smla_status *st)
{
    if (isfinite(scale) && fabs(scale) * 1.4426950408889634 <= (double)FLT_MAX) return SMLA_OK;
    char txt[40];
    shortest(scale, txt, sizeof txt);
    return smla_fail(st, SMLA_ERR_VALUE, "softmax_scale: expected a finite number of magnitude at most 2.35e38 "
                     "(FLT_MAX / log2(e)), got %s", txt);
}
