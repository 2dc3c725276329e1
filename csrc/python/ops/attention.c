/* Shared validation and params fill for smla.sparse_mla_decode and smla.sparse_mla_prefill. */
#include <string.h>

#include "attention.h"

static int check_out(const smla_arr *a, const smla_arr *q, int nd, int dtype, int last, const char *what)
{
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    static const int f32[] = {SMLA_DT_F32};
    if (dtype == SMLA_DT_BF16 ? smla_check_dtype(a, 2, bf16) : smla_check_dtype(a, 1, f32)) return -1;
    if (smla_check_ndim(a, nd)) return -1;
    for (int i = 0; i < nd && i < q->ndim - 1; i++)
        if (smla_check_same_dim(a, i, q, i)) return -1;
    if (last && (smla_check_dim(a, nd - 1, last, what) || smla_check_last_contiguous(a))) return -1;
    return smla_check_writable(a); /* lse / max_logits: any strides (FlashMLA's lse is [b, h, s_q]) */
}

int smla_attn_check(smla_args *A, const smla_attn_arrays *x, int batch_dims)
{
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    static const int f32[] = {SMLA_DT_F32};
    const smla_arr *q = x->q, *qpe = x->q_pe, *idx = x->indices;
    int hd = batch_dims; /* dimension of q that holds the heads */
    if (smla_check_dtype(q, 2, bf16) || smla_check_ndim(q, batch_dims + 2) ||
        smla_check_dim(q, hd + 1, qpe->present ? SMLA_D_V : SMLA_D_QK, qpe->present ? "d_nope" : "d_qk") ||
        smla_check_last_contiguous(q))
        return -1;
    if (qpe->present) { /* the RoPE part beside q: same rows, 64 values */
        if (smla_check_dtype(qpe, 2, bf16) || smla_check_ndim(qpe, batch_dims + 2) ||
            smla_check_dim(qpe, hd + 1, SMLA_D_QK - SMLA_D_V, "d_rope") || smla_check_last_contiguous(qpe))
            return -1;
        for (int i = 0; i <= hd; i++)
            if (smla_check_same_dim(qpe, i, q, i)) return -1;
    }
    if (smla_check_int_index(idx) || smla_check_ndim(idx, batch_dims + 1) || smla_check_last_contiguous(idx))
        return -1;
    for (int i = 0; i < batch_dims; i++)
        if (smla_check_same_dim(idx, i, q, i)) return -1;
    if (x->topk_length->present) {
        if (smla_check_int_index(x->topk_length) || smla_check_ndim(x->topk_length, batch_dims)) return -1;
        for (int i = 0; i < batch_dims; i++)
            if (smla_check_same_dim(x->topk_length, i, q, i)) return -1;
    }
    if (x->attn_sink->present && (smla_check_dtype(x->attn_sink, 1, f32) || smla_check_ndim(x->attn_sink, 1) ||
                                  smla_check_same_dim(x->attn_sink, 0, q, hd)))
        return -1;
    int64_t shape[SMLA_MAX_NDIM]; /* out [batch dims of q, h, 512]; lse and max_logits without the 512 */
    for (int i = 0; i <= hd; i++) shape[i] = q->shape[i];
    shape[hd + 1] = SMLA_D_V;
    if (smla_args_alloc(A, x->out, batch_dims + 2, shape, SMLA_DT_BF16) ||
        smla_args_alloc(A, x->lse, batch_dims + 1, shape, SMLA_DT_F32) ||
        smla_args_alloc(A, x->max_logits, batch_dims + 1, shape, SMLA_DT_F32))
        return -1;
    if (check_out(x->out, q, batch_dims + 2, SMLA_DT_BF16, SMLA_D_V, "d_v") ||
        check_out(x->lse, q, batch_dims + 1, SMLA_DT_F32, 0, NULL))
        return -1;
    return x->max_logits->present && check_out(x->max_logits, q, batch_dims + 1, SMLA_DT_F32, 0, NULL) ? -1 : 0;
}

void smla_attn_unsqueeze(smla_arr *a)
{
    if (!a->present) return;
    memmove(a->shape + 1, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    memmove(a->strides + 1, a->strides, sizeof(int64_t) * (size_t)a->ndim);
    a->shape[0] = 1;
    a->strides[0] = 0;
    a->ndim++;
}

int smla_attn_fill(smla_args *A, smla_attn_params *p, const smla_attn_arrays *x, double softmax_scale,
                   const char *precision)
{
    if ((p->precision = smla_parse_precision(precision)) < 0) return -1;
    smla_status st = {0, {0}};
    if (smla_check_softmax_scale(softmax_scale, &st) != SMLA_OK) {
        smla_raise_status(A->state, &st);
        return -1;
    }
    const smla_arr *q = x->q, *idx = x->indices, *tl = x->topk_length, *out = x->out, *lse = x->lse,
                   *ml = x->max_logits;
    p->q = q->data;
    p->q_stride_b = q->strides[0];
    p->q_stride_s = q->strides[1];
    p->q_stride_h = q->strides[2];
    if (x->q_pe->present) {
        p->q_pe = x->q_pe->data;
        p->q_pe_stride_b = x->q_pe->strides[0];
        p->q_pe_stride_s = x->q_pe->strides[1];
        p->q_pe_stride_h = x->q_pe->strides[2];
    }
    p->indices = idx->data;
    p->idx_stride_b = idx->strides[0];
    p->idx_stride_s = idx->strides[1];
    if (tl->present) {
        p->topk_length = tl->data;
        p->tl_stride_b = tl->strides[0];
        p->tl_stride_s = tl->strides[1];
    }
    if (x->attn_sink->present) {
        p->attn_sink = x->attn_sink->data;
        p->sink_stride = x->attn_sink->strides[0];
    }
    p->out = out->data;
    p->out_stride_b = out->strides[0];
    p->out_stride_s = out->strides[1];
    p->out_stride_h = out->strides[2];
    p->lse = lse->data;
    p->lse_stride_b = lse->strides[0];
    p->lse_stride_s = lse->strides[1];
    p->lse_stride_h = lse->strides[2];
    if (ml->present) {
        p->max_logits = ml->data;
        p->ml_stride_b = ml->strides[0];
        p->ml_stride_s = ml->strides[1];
        p->ml_stride_h = ml->strides[2];
    }
    p->b = q->shape[0];
    p->s_q = q->shape[1];
    p->h = q->shape[2];
    p->topk = idx->shape[2];
    p->softmax_scale = (float)softmax_scale;
    p->run = A->run;
    p->stream = A->stream;
    return 0;
}
