/* smla.sparse_mla_prefill -> smla_{cpu,cuda}_sparse_mla_prefill: attention over bf16 kv rows. */
#include <string.h>

#include "attention.h"

PyObject *smla_op_sparse_mla_prefill(PyObject *module, PyObject *args)
{
    PyObject *o_q, *o_kv, *o_idx, *o_tl, *o_sink, *o_out, *o_lse, *o_ml;
    double scale;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOOOOOOdK:sparse_mla_prefill", &o_q, &o_kv, &o_idx, &o_tl, &o_sink, &o_out,
                          &o_lse, &o_ml, &scale, &stream))
        return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, stream) < 0) return NULL;
    smla_attn_params p;
    memset(&p, 0, sizeof p);
    smla_attn_arrays x;
    smla_arr *kv;
    if (!(x.q = smla_args_get(&A, o_q, "q")) || !(kv = smla_args_get(&A, o_kv, "kv")) ||
        !(x.indices = smla_args_get(&A, o_idx, "indices")) ||
        !(x.topk_length = smla_args_get_opt(&A, o_tl, "topk_length")) ||
        !(x.attn_sink = smla_args_get_opt(&A, o_sink, "attn_sink")) || !(x.out = smla_args_get_out(&A, o_out, "out")) ||
        !(x.lse = smla_args_get_out(&A, o_lse, "lse")) || !(x.max_logits = smla_args_get_out_opt(&A, o_ml, "max_logits")))
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
    if (A.device == SMLA_DEV_CUDA && smla_check_aligned(kv, 16)) goto fail;
    if (smla_attn_check(&A, &x, 1) || smla_check_outputs(&A, NULL, 0) ||
        smla_check_softmax_scale(scale))
        goto fail;
    smla_arr *all[] = {x.q, x.indices, x.topk_length, x.out, x.lse, x.max_logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) smla_attn_unsqueeze(all[i]);
    smla_attn_fill(&p, &x, scale, &A.run, A.stream);
    /* kv is one block of s_kv rows: slot = row */
    p.kv.data = kv->data;
    p.kv.dtype = SMLA_CACHE_BF16;
    p.kv.num_blocks = 1;
    p.kv.block_size = kv->shape[0];
    p.kv.entry_stride = kv->strides[0] * kv->itemsize;
    p.kv.block_stride = p.kv.entry_stride * kv->shape[0];
    if (p.s_q > 0 && SMLA_LAUNCH(&A, sparse_mla_prefill, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}
