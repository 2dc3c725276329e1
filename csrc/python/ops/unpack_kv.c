/* smla.unpack_kv -> smla_{cpu,cuda}_unpack_kv: dequantised [n, 576] bf16 rows of the given slots. */
#include <string.h>

#include "../binding.h"

enum { KV_CACHE, SLOTS, OUT, KV_CACHE_DTYPE, STREAM, NARGS };
static const smla_kw_spec args_spec[NARGS] = {
    [KV_CACHE] = {SMLA_N_kv_cache, SMLA_KW_OBJ},
    [SLOTS] = {SMLA_N_slots, SMLA_KW_OBJ},
    [OUT] = {SMLA_N_out, SMLA_KW_OBJ},
    [KV_CACHE_DTYPE] = {SMLA_N_kv_cache_dtype, SMLA_KW_STR},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
};
static const smla_kw_fn spec = {"unpack_kv", NARGS, args_spec};

PyObject *smla_op_unpack_kv(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, &spec, args, nargs, kwnames, v) < 0) return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_unpack_kv_params p;
    memset(&p, 0, sizeof p);
    smla_arr *cache = smla_args_in(&A, &v[KV_CACHE]);
    smla_arr *slots = cache ? smla_args_in(&A, &v[SLOTS]) : NULL;
    smla_arr *out = slots ? smla_args_out(&A, &v[OUT]) : NULL;
    if (!out) goto fail;
    int cdt = smla_parse_cache_dtype(v[KV_CACHE_DTYPE].s);
    if (cdt < 0 || smla_get_cache(cache, cdt, &p.cache)) goto fail;
    if (smla_check_int_index_64(slots) || smla_check_ndim(slots, 1) || smla_check_contiguous(slots)) goto fail;
    const int64_t shape[2] = {slots->shape[0], SMLA_D_QK};
    if (smla_args_alloc(&A, out, 2, shape, SMLA_DT_BF16)) goto fail;
    if (smla_check_dtype(out, 2, bf16) || smla_check_ndim(out, 2) || smla_check_same_dim(out, 0, slots, 0) ||
        smla_check_dim(out, 1, SMLA_D_QK, "d_qk") || smla_check_last_contiguous(out) || smla_check_writable(out))
        goto fail;
    if (smla_check_outputs(&A, NULL, 0)) goto fail;
    p.slots = slots->data;
    p.slots_is_i64 = slots->dtype == SMLA_DT_I64;
    p.n = slots->shape[0];
    p.out = out->data;
    p.out_stride = out->strides[0];
    p.stream = A.stream;
    p.run = A.run;
    if (SMLA_CHECK(&A, unpack_kv, &p) < 0) goto fail;
    if (p.n > 0 && SMLA_LAUNCH(&A, unpack_kv, &p) < 0) goto fail;
    PyObject *r = smla_args_result(1, &out, &v[OUT].obj);
    smla_args_release(&A);
    return r;
fail:
    smla_args_release(&A);
    return NULL;
}
