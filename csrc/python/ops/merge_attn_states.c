/* smla.merge_attn_states -> smla_{cpu,cuda}_merge_attn_states: lse-weighted merge of two partials. */
#include <string.h>

#include "../binding.h"

enum { OUT_A, LSE_A, OUT_B, LSE_B, OUT, OUT_LSE, STREAM, NARGS };
static const smla_kw_spec args_spec[NARGS] = {
    [OUT_A] = {SMLA_N_out_a, SMLA_KW_OBJ},
    [LSE_A] = {SMLA_N_lse_a, SMLA_KW_OBJ},
    [OUT_B] = {SMLA_N_out_b, SMLA_KW_OBJ},
    [LSE_B] = {SMLA_N_lse_b, SMLA_KW_OBJ},
    [OUT] = {SMLA_N_out, SMLA_KW_OBJ},
    [OUT_LSE] = {SMLA_N_out_lse, SMLA_KW_OBJ_OPT},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
};
static const smla_kw_fn spec = {"merge_attn_states", NARGS, args_spec};

PyObject *smla_op_merge_attn_states(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, &spec, args, nargs, kwnames, v) < 0) return NULL;
    static const int out_types[] = {SMLA_DT_BF16, SMLA_DT_F16, SMLA_DT_F32};
    static const int f32[] = {SMLA_DT_F32};
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_merge_attn_states_params p;
    memset(&p, 0, sizeof p);
    smla_arr *oa = smla_args_in(&A, &v[OUT_A]);
    smla_arr *la = oa ? smla_args_in(&A, &v[LSE_A]) : NULL;
    smla_arr *ob = la ? smla_args_in(&A, &v[OUT_B]) : NULL;
    smla_arr *lb = ob ? smla_args_in(&A, &v[LSE_B]) : NULL;
    smla_arr *out = lb ? smla_args_out(&A, &v[OUT]) : NULL;
    smla_arr *lse = out ? smla_args_out(&A, &v[OUT_LSE]) : NULL;
    if (!lse) goto fail;
    if (smla_check_dtype(oa, 3, out_types) || smla_check_ndim(oa, 3) || smla_check_last_contiguous(oa)) goto fail;
    if (smla_args_alloc(&A, out, 3, oa->shape, oa->dtype) || smla_args_alloc(&A, lse, 2, oa->shape, SMLA_DT_F32))
        goto fail;
    smla_arr *outs[] = {ob, out};
    for (int i = 0; i < 2; i++) {
        smla_arr *o = outs[i];
        if (o->dtype != oa->dtype) {
            PyErr_Format(PyExc_TypeError, "%s: expected %s like out_a, got %s", o->name, smla_dtype_name(oa->dtype),
                         smla_dtype_name(o->dtype));
            goto fail;
        }
        if (smla_check_ndim(o, 3) || smla_check_same_dim(o, 0, oa, 0) || smla_check_same_dim(o, 1, oa, 1) ||
            smla_check_same_dim(o, 2, oa, 2) || smla_check_last_contiguous(o))
            goto fail;
    }
    if (smla_check_writable(out)) goto fail;
    smla_arr *lses[] = {la, lb, lse};
    for (int i = 0; i < 3; i++) {
        smla_arr *l = lses[i];
        if (!l->present) continue;
        if (smla_check_dtype(l, 1, f32) || smla_check_ndim(l, 2) || smla_check_same_dim(l, 0, oa, 0) ||
            smla_check_same_dim(l, 1, oa, 1))
            goto fail;
    }
    if (lse->present && smla_check_writable(lse)) goto fail;
    /* out may be out_a or out_b, out_lse may be lse_a or lse_b: both kernels read each (token, head)
     * pair's inputs before writing its outputs */
    const smla_arr *in_place[] = {out, oa, out, ob, lse, la, lse, lb};
    if (smla_check_outputs(&A, in_place, 4)) goto fail;
    p.dtype = oa->dtype;
    p.n = oa->shape[0];
    p.h = oa->shape[1];
    p.d = oa->shape[2];
    p.out_a = oa->data;
    p.oa_stride_n = oa->strides[0];
    p.oa_stride_h = oa->strides[1];
    p.out_b = ob->data;
    p.ob_stride_n = ob->strides[0];
    p.ob_stride_h = ob->strides[1];
    p.out = out->data;
    p.o_stride_n = out->strides[0];
    p.o_stride_h = out->strides[1];
    p.lse_a = la->data;
    p.la_stride_n = la->strides[0];
    p.la_stride_h = la->strides[1];
    p.lse_b = lb->data;
    p.lb_stride_n = lb->strides[0];
    p.lb_stride_h = lb->strides[1];
    p.out_lse = lse->present ? lse->data : NULL;
    p.lo_stride_n = lse->present ? lse->strides[0] : 0;
    p.lo_stride_h = lse->present ? lse->strides[1] : 0;
    p.stream = A.stream;
    p.run = A.run;
    if (SMLA_CHECK(&A, merge_attn_states, &p) < 0) goto fail;
    if (p.n > 0 && p.h > 0 && SMLA_LAUNCH(&A, merge_attn_states, &p) < 0) goto fail;
    smla_arr *const made[] = {out, lse};
    PyObject *const given[] = {v[OUT].obj, v[OUT_LSE].obj};
    PyObject *r = smla_args_result(2, made, given);
    smla_args_release(&A);
    return r;
fail:
    smla_args_release(&A);
    return NULL;
}
