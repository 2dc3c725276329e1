/* smla.sparse_mla_prefill -> smla_{cpu,cuda}_sparse_mla_prefill: attention over bf16 kv rows. */
#include <string.h>

#include "attention.h"

enum { Q, KV, INDICES, TOPK_LENGTH, ATTN_SINK, OUT, LSE, MAX_LOGITS, SOFTMAX_SCALE, PRECISION, STREAM, Q_PE, NARGS };
static const smla_kw_spec args_spec[NARGS] = {
    [Q] = {SMLA_N_q, SMLA_KW_OBJ},
    [KV] = {SMLA_N_kv, SMLA_KW_OBJ},
    [INDICES] = {SMLA_N_indices, SMLA_KW_OBJ},
    [TOPK_LENGTH] = {SMLA_N_topk_length, SMLA_KW_OBJ_OPT},
    [ATTN_SINK] = {SMLA_N_attn_sink, SMLA_KW_OBJ_OPT},
    [OUT] = {SMLA_N_out, SMLA_KW_OBJ},
    [LSE] = {SMLA_N_lse, SMLA_KW_OBJ},
    [MAX_LOGITS] = {SMLA_N_max_logits, SMLA_KW_OBJ_OPT},
    [SOFTMAX_SCALE] = {SMLA_N_softmax_scale, SMLA_KW_DOUBLE},
    [PRECISION] = {SMLA_N_precision, SMLA_KW_STR},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
    [Q_PE] = {SMLA_N_q_pe, SMLA_KW_OBJ_OPT},
};
static const smla_kw_fn spec = {"sparse_mla_prefill", NARGS, args_spec};

PyObject *smla_op_sparse_mla_prefill(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, &spec, args, nargs, kwnames, v) < 0) return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_attn_params p;
    memset(&p, 0, sizeof p);
    smla_attn_arrays x;
    smla_arr *kv;
    if (!(x.q = smla_args_in(&A, &v[Q])) || !(x.q_pe = smla_args_in(&A, &v[Q_PE])) ||
        !(kv = smla_args_in(&A, &v[KV])) ||
        !(x.indices = smla_args_in(&A, &v[INDICES])) || !(x.topk_length = smla_args_in(&A, &v[TOPK_LENGTH])) ||
        !(x.attn_sink = smla_args_in(&A, &v[ATTN_SINK])) || !(x.out = smla_args_out(&A, &v[OUT])) ||
        !(x.lse = smla_args_out(&A, &v[LSE])) || !(x.max_logits = smla_args_out(&A, &v[MAX_LOGITS])))
        goto fail;
    /* kv [s_kv, 576] or FlashMLA's [s_kv, 1, 576] */
    if (smla_check_dtype(kv, 2, bf16)) goto fail;
    if (kv->ndim == 3) {
        if (smla_check_dim(kv, 1, 1, "one kv head")) goto fail;
        kv->ndim = 2;
        kv->shape[1] = kv->shape[2];
        kv->strides[1] = kv->strides[2];
    }
    if (smla_check_ndim(kv, 2) || smla_check_dim(kv, 1, SMLA_D_QK, "d_qk") || smla_check_last_contiguous(kv))
        goto fail;
    if (smla_attn_check(&A, &x, 1) || smla_check_outputs(&A, NULL, 0)) goto fail;
    smla_arr *all[] = {x.q, x.q_pe, x.indices, x.topk_length, x.out, x.lse, x.max_logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) smla_attn_unsqueeze(all[i]);
    if (smla_attn_fill(&A, &p, &x, v[SOFTMAX_SCALE].f, v[PRECISION].s)) goto fail;
    /* kv is one block of s_kv rows: slot = row */
    p.kv.data = kv->data;
    p.kv.dtype = SMLA_CACHE_BF16;
    p.kv.num_blocks = 1;
    p.kv.block_size = kv->shape[0];
    p.kv.entry_stride = kv->strides[0] * kv->itemsize;
    p.kv.block_stride = p.kv.entry_stride * kv->shape[0];
    if (SMLA_CHECK(&A, sparse_mla_prefill, &p) < 0) goto fail;
    if (p.s_q > 0 && SMLA_LAUNCH(&A, sparse_mla_prefill, &p) < 0) goto fail;
    smla_arr *const outs[] = {x.out, x.lse, x.max_logits};
    PyObject *const given[] = {v[OUT].obj, v[LSE].obj, v[MAX_LOGITS].obj};
    PyObject *r = smla_args_result(3, outs, given);
    smla_args_release(&A);
    return r;
fail:
    smla_args_release(&A);
    return NULL;
}
