/* smla.sparse_mla_decode -> smla_{cpu,cuda}_sparse_mla_decode: attention over a paged cache. */
#include <string.h>

#include "attention.h"

enum {
    Q, KV_CACHE, INDICES, TOPK_LENGTH, ATTN_SINK, OUT, LSE, WORKSPACE, SOFTMAX_SCALE, KV_CACHE_DTYPE, PRECISION, STREAM,
    Q_PE, NARGS
};
static const smla_kw_spec args_spec[NARGS] = {
    [Q] = {SMLA_N_q, SMLA_KW_OBJ},
    [KV_CACHE] = {SMLA_N_kv_cache, SMLA_KW_OBJ},
    [INDICES] = {SMLA_N_indices, SMLA_KW_OBJ},
    [TOPK_LENGTH] = {SMLA_N_topk_length, SMLA_KW_OBJ_OPT},
    [ATTN_SINK] = {SMLA_N_attn_sink, SMLA_KW_OBJ_OPT},
    [OUT] = {SMLA_N_out, SMLA_KW_OBJ},
    [LSE] = {SMLA_N_lse, SMLA_KW_OBJ},
    [WORKSPACE] = {SMLA_N_workspace, SMLA_KW_OBJ_OPT},
    [SOFTMAX_SCALE] = {SMLA_N_softmax_scale, SMLA_KW_DOUBLE},
    [KV_CACHE_DTYPE] = {SMLA_N_kv_cache_dtype, SMLA_KW_STR},
    [PRECISION] = {SMLA_N_precision, SMLA_KW_STR},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
    [Q_PE] = {SMLA_N_q_pe, SMLA_KW_OBJ_OPT},
};
static const smla_kw_fn spec = {"sparse_mla_decode", NARGS, args_spec};

PyObject *smla_op_sparse_mla_decode(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, &spec, args, nargs, kwnames, v) < 0) return NULL;
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_attn_params p;
    memset(&p, 0, sizeof p);
    smla_attn_arrays x;
    smla_arr *cache, *ws;
    if (!(x.q = smla_args_in(&A, &v[Q])) || !(x.q_pe = smla_args_in(&A, &v[Q_PE])) ||
        !(cache = smla_args_in(&A, &v[KV_CACHE])) ||
        !(x.indices = smla_args_in(&A, &v[INDICES])) || !(x.topk_length = smla_args_in(&A, &v[TOPK_LENGTH])) ||
        !(x.attn_sink = smla_args_in(&A, &v[ATTN_SINK])) || !(x.out = smla_args_out(&A, &v[OUT])) ||
        !(x.lse = smla_args_out(&A, &v[LSE])) || !(x.max_logits = smla_args_get(&A, Py_None, "max_logits", 1, 1)) ||
        !(ws = smla_args_out(&A, &v[WORKSPACE])))
        goto fail;
    int cdt = smla_parse_cache_dtype(v[KV_CACHE_DTYPE].s);
    if (cdt < 0 || smla_get_cache(cache, cdt, &p.kv) || smla_attn_check(&A, &x, 2)) goto fail;
    if (ws->present && (smla_check_contiguous(ws) || smla_check_writable(ws))) goto fail;
    if (smla_check_outputs(&A, NULL, 0) || smla_attn_fill(&A, &p, &x, v[SOFTMAX_SCALE].f, v[PRECISION].s))
        goto fail;
#ifdef SMLA_WITH_CUDA
    if (ws->pending && A.device == SMLA_DEV_CUDA && p.b > 0 && p.s_q > 0) {  /* the launcher's split plan */
        int prev = -1;
        if (smla_device_enter(&A, &prev) < 0) goto fail;
        const int64_t n = smla_cuda_sparse_mla_decode_workspace_size(p.b, p.s_q, p.h, p.topk, cdt, A.run.attn_kernel);
        smla_device_exit(&A, prev);
        if (n > 0 && smla_args_scratch(&A, ws, n)) goto fail;
    }
#endif
    if (ws->present) {
        p.workspace = ws->data;
        p.workspace_bytes = ws->itemsize;
        for (int i = 0; i < ws->ndim; i++) p.workspace_bytes *= ws->shape[i];
    }
    if (SMLA_CHECK(&A, sparse_mla_decode, &p) < 0) goto fail;
    if (p.b > 0 && p.s_q > 0 && SMLA_LAUNCH(&A, sparse_mla_decode, &p) < 0) goto fail;
    smla_arr *const outs[] = {x.out, x.lse};
    PyObject *const given[] = {v[OUT].obj, v[LSE].obj};
    PyObject *r = smla_args_result(2, outs, given);
    smla_args_release(&A);
    return r;
fail:
    smla_args_release(&A);
    return NULL;
}

enum { WS_B, WS_S_Q, WS_H, WS_TOPK, WS_KV_CACHE_DTYPE, WS_DEVICE, WS_NARGS };
static const smla_kw_spec ws_args_spec[WS_NARGS] = {
    [WS_B] = {SMLA_N_b, SMLA_KW_INT64},
    [WS_S_Q] = {SMLA_N_s_q, SMLA_KW_INT64},
    [WS_H] = {SMLA_N_h, SMLA_KW_INT64},
    [WS_TOPK] = {SMLA_N_topk, SMLA_KW_INT64},
    [WS_KV_CACHE_DTYPE] = {SMLA_N_kv_cache_dtype, SMLA_KW_STR},
    [WS_DEVICE] = {SMLA_N_device, SMLA_KW_INT},
};
static const smla_kw_fn ws_spec = {"sparse_mla_decode_workspace_size", WS_NARGS, ws_args_spec};

PyObject *smla_op_sparse_mla_decode_workspace_size(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                                   PyObject *kwnames)
{
    smla_kwarg v[WS_NARGS];
    if (smla_kw_parse(module, &ws_spec, args, nargs, kwnames, v) < 0) return NULL;
    const int64_t b = v[WS_B].i, s_q = v[WS_S_Q].i, h = v[WS_H].i, topk = v[WS_TOPK].i;
    int cdt = smla_parse_cache_dtype(v[WS_KV_CACHE_DTYPE].s);
    if (cdt < 0) return NULL;
    smla_status st = {0, {0}};
    if (smla_check_attn_shape(b, s_q, h, topk, /*scalars=*/1, &st) != SMLA_OK)
        return smla_raise_status(smla_get_state(module), &st);
#ifdef SMLA_WITH_CUDA
    /* no usable GPU (no driver): no CUDA decode can run, as in a build without CUDA */
    if (v[WS_DEVICE].i >= 0 && smla_cuda_device_count() > 0) {
        smla_run run;
        int prev = -1;
        if (smla_read_settings(&run) < 0) return NULL;
        if (smla_cuda_set_device((int)v[WS_DEVICE].i, &prev, &st) != SMLA_OK)
            return smla_raise_status(smla_get_state(module), &st);
        int64_t n = smla_cuda_sparse_mla_decode_workspace_size(b, s_q, h, topk, cdt, run.attn_kernel);
        smla_cuda_restore_device(prev);
        return PyLong_FromLongLong(n);
    }
#endif
    return PyLong_FromLong(0); /* the CPU kernel needs no caller workspace */
}
