/* smla.gather_upconvert -> smla_{cpu,cuda}_gather_upconvert: paged tokens into a bf16 workspace. */
#include <string.h>

#include "../binding.h"

enum { KV_CACHE, WORKSPACE, BLOCK_TABLE, SEQ_LENS, WORKSPACE_STARTS, SEQ_STARTS, KV_CACHE_DTYPE, STREAM, NARGS };
static const smla_kw_spec args_spec[NARGS] = {
    [KV_CACHE] = {SMLA_N_kv_cache, SMLA_KW_OBJ},
    [WORKSPACE] = {SMLA_N_workspace, SMLA_KW_OBJ},
    [BLOCK_TABLE] = {SMLA_N_block_table, SMLA_KW_OBJ},
    [SEQ_LENS] = {SMLA_N_seq_lens, SMLA_KW_OBJ},
    [WORKSPACE_STARTS] = {SMLA_N_workspace_starts, SMLA_KW_OBJ},
    [SEQ_STARTS] = {SMLA_N_seq_starts, SMLA_KW_OBJ_OPT},
    [KV_CACHE_DTYPE] = {SMLA_N_kv_cache_dtype, SMLA_KW_STR},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
};
static const smla_kw_fn spec = {"gather_upconvert", NARGS, args_spec};

/* A [num_reqs] int32 vector per request, like seq_lens. */
static int check_per_request(const smla_arr *a, const smla_arr *bt)
{
    return smla_check_int_index(a) || smla_check_ndim(a, 1) || smla_check_same_dim(a, 0, bt, 0) ||
           smla_check_contiguous(a);
}

PyObject *smla_op_gather_upconvert(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, &spec, args, nargs, kwnames, v) < 0) return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_gather_upconvert_params p;
    memset(&p, 0, sizeof p);
    smla_arr *cache = smla_args_in(&A, &v[KV_CACHE]);
    smla_arr *ws = cache ? smla_args_out(&A, &v[WORKSPACE]) : NULL;
    smla_arr *bt = ws ? smla_args_in(&A, &v[BLOCK_TABLE]) : NULL;
    smla_arr *lens = bt ? smla_args_in(&A, &v[SEQ_LENS]) : NULL;
    smla_arr *starts = lens ? smla_args_in(&A, &v[WORKSPACE_STARTS]) : NULL;
    smla_arr *seq_starts = starts ? smla_args_in(&A, &v[SEQ_STARTS]) : NULL;
    if (!seq_starts) goto fail;
    int cdt = smla_parse_cache_dtype(v[KV_CACHE_DTYPE].s);
    if (cdt < 0 || smla_get_cache(cache, cdt, &p.cache)) goto fail;
    if (smla_check_dtype(ws, 2, bf16) || smla_check_ndim(ws, 2) || smla_check_dim(ws, 1, SMLA_D_QK, "d_qk") ||
        smla_check_last_contiguous(ws) || smla_check_writable(ws))
        goto fail;
    if (smla_check_int_index(bt) || smla_check_ndim(bt, 2) || smla_check_last_contiguous(bt)) goto fail;
    if (check_per_request(lens, bt) || check_per_request(starts, bt) ||
        (seq_starts->present && check_per_request(seq_starts, bt)))
        goto fail;
    if (smla_check_outputs(&A, NULL, 0)) goto fail;
    p.workspace = ws->data;
    p.ws_stride = ws->strides[0];
    p.ws_rows = ws->shape[0];
    p.block_table = bt->data;
    p.bt_stride = bt->strides[0];
    p.num_reqs = bt->shape[0];
    p.max_blocks = bt->shape[1];
    p.seq_lens = lens->data;
    p.workspace_starts = starts->data;
    p.seq_starts = seq_starts->present ? seq_starts->data : NULL;
    p.stream = A.stream;
    p.run = A.run;
    if (SMLA_CHECK(&A, gather_upconvert, &p) < 0) goto fail;
    /* launched with ws_rows = 0 too: the CPU kernel rejects requests that need rows */
    if (p.num_reqs > 0 && SMLA_LAUNCH(&A, gather_upconvert, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}
