/* smla.sparse_mla_decode -> smla_{cpu,cuda}_sparse_mla_decode: attention over a paged cache. */
#include <string.h>

#include "attention.h"

PyObject *smla_op_sparse_mla_decode(PyObject *module, PyObject *args)
{
    PyObject *o_q, *o_cache, *o_idx, *o_tl, *o_sink, *o_out, *o_lse, *o_ws;
    double scale;
    const char *cache_dtype;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOOOOOOdsK:sparse_mla_decode", &o_q, &o_cache, &o_idx, &o_tl, &o_sink, &o_out,
                          &o_lse, &o_ws, &scale, &cache_dtype, &stream))
        return NULL;
    smla_args A;
    if (smla_args_init(&A, module, stream) < 0) return NULL;
    smla_attn_params p;
    memset(&p, 0, sizeof p);
    smla_attn_arrays x;
    smla_arr *cache, *ws;
    if (!(x.q = smla_args_get(&A, o_q, "q")) || !(cache = smla_args_get(&A, o_cache, "kv_cache")) ||
        !(x.indices = smla_args_get(&A, o_idx, "indices")) ||
        !(x.topk_length = smla_args_get_opt(&A, o_tl, "topk_length")) ||
        !(x.attn_sink = smla_args_get_opt(&A, o_sink, "attn_sink")) || !(x.out = smla_args_get_out(&A, o_out, "out")) ||
        !(x.lse = smla_args_get_out(&A, o_lse, "lse")) || !(x.max_logits = smla_args_get_opt(&A, Py_None, "max_logits")) ||
        !(ws = smla_args_get_out_opt(&A, o_ws, "workspace")))
        goto fail;
    int cdt = smla_parse_cache_dtype(cache_dtype);
    if (cdt < 0 || smla_get_cache(cache, cdt, &p.kv) || smla_attn_check(&A, &x, 2)) goto fail;
    if (ws->present && (smla_check_contiguous(ws) || smla_check_writable(ws) || smla_check_aligned(ws, 16)))
        goto fail;
    if (smla_check_outputs(&A, NULL, 0) || smla_check_softmax_scale(scale)) goto fail;
    smla_attn_fill(&p, &x, scale, &A.run, A.stream);
    if (ws->present) {
        p.workspace = ws->data;
        p.workspace_bytes = ws->itemsize;
        for (int i = 0; i < ws->ndim; i++) p.workspace_bytes *= ws->shape[i];
    }
    if (p.b > 0 && p.s_q > 0 && SMLA_LAUNCH(&A, sparse_mla_decode, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}

PyObject *smla_op_sparse_mla_decode_workspace_size(PyObject *module, PyObject *args)
{
    long long b, s_q, h, topk;
    const char *cache_dtype;
    int device;
    (void)module;
    if (!PyArg_ParseTuple(args, "LLLLsi:sparse_mla_decode_workspace_size", &b, &s_q, &h, &topk, &cache_dtype,
                          &device))
        return NULL;
    int cdt = smla_parse_cache_dtype(cache_dtype);
    if (cdt < 0) return NULL;
    if (b < 0 || s_q < 0 || h < 1 || h > 128 || topk < 1)
        return PyErr_Format(PyExc_ValueError, "sparse_mla_decode_workspace_size: invalid shape b=%lld s_q=%lld "
                            "h=%lld topk=%lld", b, s_q, h, topk);
#ifdef SMLA_WITH_CUDA
    /* no usable GPU (no driver): no CUDA decode can run, as in a build without CUDA */
    if (device >= 0 && smla_cuda_device_count() > 0) {
        smla_status st = {0, {0}};
        smla_run run;
        int prev = -1;
        if (smla_read_settings(&run) < 0) return NULL;
        if (smla_cuda_set_device(device, &prev, &st) != SMLA_OK) return smla_raise_status(smla_get_state(module), &st);
        int64_t n = smla_cuda_sparse_mla_decode_workspace_size(b, s_q, h, topk, cdt, run.attn_kernel);
        smla_cuda_restore_device(prev);
        return PyLong_FromLongLong(n);
    }
#endif
    (void)device;
    return PyLong_FromLong(0); /* the CPU kernel needs no caller workspace */
}
