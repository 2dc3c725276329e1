/* smla.pack_kv -> smla_{cpu,cuda}_pack_kv: write tokens into a bf16 or fp8_ds_mla cache in place. */
#include <string.h>

#include "../binding.h"

static int parse_scale_rule(const char *s)
{
    if (!strcmp(s, "pow2")) return SMLA_SCALE_POW2;
    if (!strcmp(s, "fp32")) return SMLA_SCALE_FP32;
    PyErr_Format(PyExc_ValueError, "scale_rule: expected \"pow2\" or \"fp32\", got \"%s\"", s);
    return -1;
}

PyObject *smla_op_pack_kv(PyObject *module, PyObject *args)
{
    PyObject *o_kv_c, *o_k_pe, *o_cache, *o_slots;
    const char *cache_dtype, *scale_rule;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOOssK:pack_kv", &o_kv_c, &o_k_pe, &o_cache, &o_slots, &cache_dtype,
                          &scale_rule, &stream))
        return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, stream) < 0) return NULL;
    smla_pack_kv_params p;
    memset(&p, 0, sizeof p);
    smla_arr *kv_c = smla_args_get(&A, o_kv_c, "kv_c");
    smla_arr *k_pe = kv_c ? smla_args_get(&A, o_k_pe, "k_pe") : NULL;
    smla_arr *cache = k_pe ? smla_args_get_out(&A, o_cache, "kv_cache") : NULL;
    smla_arr *slots = cache ? smla_args_get(&A, o_slots, "slot_mapping") : NULL;
    if (!slots) goto fail;
    int cdt = smla_parse_cache_dtype(cache_dtype);
    p.scale_rule = parse_scale_rule(scale_rule);
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
    if (A.device == SMLA_DEV_CUDA && (smla_check_aligned(kv_c, 16) || smla_check_aligned(k_pe, 4))) goto fail;
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
    if (p.num_tokens > 0 && SMLA_LAUNCH(&A, pack_kv, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}
