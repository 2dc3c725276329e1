/* smla.pack_kv -> smla_{cpu,cuda}_pack_kv: write tokens into a bf16 or fp8_ds_mla cache in place. */
#include <string.h>

#include "../binding.h"

enum { KV_C, K_PE, KV_CACHE, SLOT_MAPPING, KV_CACHE_DTYPE, SCALE_RULE, STREAM, NARGS };
static const smla_kw_spec args_spec[NARGS] = {
    [KV_C] = {SMLA_N_kv_c, SMLA_KW_OBJ},
    [K_PE] = {SMLA_N_k_pe, SMLA_KW_OBJ},
    [KV_CACHE] = {SMLA_N_kv_cache, SMLA_KW_OBJ},
    [SLOT_MAPPING] = {SMLA_N_slot_mapping, SMLA_KW_OBJ},
    [KV_CACHE_DTYPE] = {SMLA_N_kv_cache_dtype, SMLA_KW_STR},
    [SCALE_RULE] = {SMLA_N_scale_rule, SMLA_KW_STR},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
};
static const smla_kw_fn spec = {"pack_kv", NARGS, args_spec};

static int parse_scale_rule(const char *s)
{
    if (!strcmp(s, "pow2")) return SMLA_SCALE_POW2;
    if (!strcmp(s, "fp32")) return SMLA_SCALE_FP32;
    PyErr_Format(PyExc_ValueError, "scale_rule: expected \"pow2\" or \"fp32\", got \"%s\"", s);
    return -1;
}

PyObject *smla_op_pack_kv(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, &spec, args, nargs, kwnames, v) < 0) return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_pack_kv_params p;
    memset(&p, 0, sizeof p);
    smla_arr *kv_c = smla_args_in(&A, &v[KV_C]);
    smla_arr *k_pe = kv_c ? smla_args_in(&A, &v[K_PE]) : NULL;
    smla_arr *cache = k_pe ? smla_args_out(&A, &v[KV_CACHE]) : NULL;
    smla_arr *slots = cache ? smla_args_in(&A, &v[SLOT_MAPPING]) : NULL;
    if (!slots) goto fail;
    int cdt = smla_parse_cache_dtype(v[KV_CACHE_DTYPE].s);
    p.scale_rule = parse_scale_rule(v[SCALE_RULE].s);
    if (cdt < 0 || p.scale_rule < 0 || smla_get_cache(cache, cdt, &p.cache)) goto fail;
    if (smla_check_dtype(kv_c, 2, bf16) || smla_check_ndim(kv_c, 2) || smla_check_dim(kv_c, 1, SMLA_D_NOPE, "kv_lora_rank") ||
        smla_check_last_contiguous(kv_c))
        goto fail;
    if (smla_check_dtype(k_pe, 2, bf16) || (k_pe->ndim == 3 && smla_check_dim(k_pe, 1, 1, "one rope head")))
        goto fail;
    if (k_pe->ndim == 3) { /* accept vLLM's [T, 1, 64] */
        k_pe->ndim = 2;
        k_pe->shape[1] = k_pe->shape[2];
        k_pe->strides[1] = k_pe->strides[2];
    }
    if (smla_check_ndim(k_pe, 2) || smla_check_dim(k_pe, 1, SMLA_D_ROPE, "rope_dim") ||
        smla_check_last_contiguous(k_pe))
        goto fail;
    if (smla_check_int_index_64(slots) || smla_check_ndim(slots, 1) || smla_check_contiguous(slots) ||
        smla_check_writable(cache))
        goto fail;
    /* vLLM's rule: the slot mapping sets the token count (inputs may be padded longer) */
    if (kv_c->shape[0] < slots->shape[0] || k_pe->shape[0] < slots->shape[0]) {
        PyErr_Format(PyExc_ValueError, "slot_mapping: has %lld tokens but kv_c has %lld and k_pe %lld",
                     (long long)slots->shape[0], (long long)kv_c->shape[0], (long long)k_pe->shape[0]);
        goto fail;
    }
    if (smla_check_outputs(&A, NULL, 0)) goto fail;
    p.kv_c = kv_c->data;
    p.kv_c_stride = kv_c->strides[0];
    p.k_pe = k_pe->data;
    p.k_pe_stride = k_pe->strides[0];
    p.slot_mapping = slots->data;
    p.slot_is_i64 = slots->dtype == SMLA_DT_I64;
    p.num_tokens = slots->shape[0];
    p.stream = A.stream;
    p.run = A.run;
    if (SMLA_CHECK(&A, pack_kv, &p) < 0) goto fail;
    if (p.num_tokens > 0 && SMLA_LAUNCH(&A, pack_kv, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}
