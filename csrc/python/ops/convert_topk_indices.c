/* smla.convert_topk_indices and smla.filter_convert_dcp_indices -> smla_{cpu,cuda}_convert_topk_indices:
 * request-local top-k positions to global cache slots (or prefill workspace rows). One kernel serves
 * both; the DCP variant sets dcp_size >= 1. */
#include <string.h>

#include "../binding.h"

/* The arguments of both ops; the DCP ones only in filter_convert_dcp_indices's table. */
enum {
    REQ_ID, BLOCK_TABLE, TOPK_INDICES, BLOCK_SIZE, NUM_BLOCKS, PREFILL_REQUEST_IDS, PREFILL_WORKSPACE_STARTS, OUT,
    VALID_COUNTS, STREAM, NARGS_CONVERT, DCP_SIZE = NARGS_CONVERT, DCP_RANK, INTERLEAVE, COMPACT, NARGS
};
static const smla_kw_spec args_spec[NARGS] = {
    [REQ_ID] = {SMLA_N_req_id, SMLA_KW_OBJ},
    [BLOCK_TABLE] = {SMLA_N_block_table, SMLA_KW_OBJ},
    [TOPK_INDICES] = {SMLA_N_topk_indices, SMLA_KW_OBJ},
    [BLOCK_SIZE] = {SMLA_N_block_size, SMLA_KW_INT64},
    [NUM_BLOCKS] = {SMLA_N_num_blocks, SMLA_KW_OBJ_OPT},
    [PREFILL_REQUEST_IDS] = {SMLA_N_prefill_request_ids, SMLA_KW_OBJ_OPT},
    [PREFILL_WORKSPACE_STARTS] = {SMLA_N_prefill_workspace_starts, SMLA_KW_OBJ_OPT},
    [OUT] = {SMLA_N_out, SMLA_KW_OBJ},
    [VALID_COUNTS] = {SMLA_N_valid_counts, SMLA_KW_OBJ_OPT},
    [STREAM] = {SMLA_N_stream, SMLA_KW_STREAM},
    [DCP_SIZE] = {SMLA_N_dcp_size, SMLA_KW_INT},
    [DCP_RANK] = {SMLA_N_dcp_rank, SMLA_KW_INT},
    [INTERLEAVE] = {SMLA_N_interleave, SMLA_KW_INT},
    [COMPACT] = {SMLA_N_compact, SMLA_KW_BOOL},
};
static const smla_kw_fn convert_spec = {"convert_topk_indices", NARGS_CONVERT, args_spec};
static const smla_kw_fn dcp_spec = {"filter_convert_dcp_indices", NARGS, args_spec};

/* num_blocks: None (no check, 0) or the cache's block count, >= 1 (0 would mean "no check" to the
 * kernels). Returns 0 or -1 with an exception. */
static int parse_num_blocks(PyObject *o, int64_t *num_blocks)
{
    *num_blocks = 0;
    if (o == Py_None) return 0;
    PyObject *i = PyNumber_Index(o);
    if (!i) {
        PyErr_Format(PyExc_TypeError, "num_blocks: expected None or an integer, got %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    const long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 1) {
        PyErr_Format(PyExc_ValueError, "num_blocks: expected the cache's block count (1 .. 2^63-1) or None, "
                                       "got %R", o);
        return -1;
    }
    *num_blocks = v;
    return 0;
}

/* Acquires and checks the arrays of both ops (out and valid_counts, made when given as ALLOCATE, are left
 * in outs[2]) and fills p; 0, or -1 with an exception set. */
static int parse_common(smla_args *A, smla_convert_indices_params *p, const smla_kwarg *v, smla_arr **outs)
{
    smla_arr *req = smla_args_in(A, &v[REQ_ID]);
    smla_arr *bt = req ? smla_args_in(A, &v[BLOCK_TABLE]) : NULL;
    smla_arr *idx = bt ? smla_args_in(A, &v[TOPK_INDICES]) : NULL;
    smla_arr *pids = idx ? smla_args_in(A, &v[PREFILL_REQUEST_IDS]) : NULL;
    smla_arr *pstarts = pids ? smla_args_in(A, &v[PREFILL_WORKSPACE_STARTS]) : NULL;
    smla_arr *out = pstarts ? smla_args_out(A, &v[OUT]) : NULL;
    smla_arr *counts = out ? smla_args_out(A, &v[VALID_COUNTS]) : NULL;
    if (!counts) return -1;
    outs[0] = out;
    outs[1] = counts;
    if (smla_check_int_index(req) || smla_check_ndim(req, 1) || smla_check_contiguous(req)) return -1;
    if (smla_check_int_index(bt) || smla_check_ndim(bt, 2) || smla_check_last_contiguous(bt)) return -1;
    if (smla_check_int_index(idx) || smla_check_ndim(idx, 2) || smla_check_last_contiguous(idx)) return -1;
    /* vLLM #47327: a req_id longer than the index rows wrote out of bounds */
    if (smla_check_same_dim(req, 0, idx, 0)) return -1;
    if (pids->present != pstarts->present) {
        PyErr_SetString(PyExc_ValueError, "prefill_request_ids: must be given together with "
                                          "prefill_workspace_starts");
        return -1;
    }
    if (pids->present &&
        (smla_check_int_index(pids) || smla_check_ndim(pids, 1) || smla_check_same_dim(pids, 0, idx, 0) ||
         smla_check_contiguous(pids) || smla_check_int_index(pstarts) || smla_check_ndim(pstarts, 1) ||
         smla_check_contiguous(pstarts)))
        return -1;
    const int64_t shape[2] = {idx->shape[0], idx->shape[1]}; /* out like topk_indices, counts per row */
    A->alloc_like = v[TOPK_INDICES].obj;  /* the Python layer's reference array for these outputs */
    if (smla_args_alloc(A, out, 2, shape, SMLA_DT_I32) || smla_args_alloc(A, counts, 1, shape, SMLA_DT_I32))
        return -1;
    if (smla_check_int_index(out) || smla_check_ndim(out, 2) || smla_check_same_dim(out, 0, idx, 0) ||
        smla_check_same_dim(out, 1, idx, 1) || smla_check_last_contiguous(out) || smla_check_writable(out))
        return -1;
    if (counts->present && (smla_check_int_index(counts) || smla_check_ndim(counts, 1) ||
                            smla_check_same_dim(counts, 0, idx, 0) || smla_check_contiguous(counts) ||
                            smla_check_writable(counts)))
        return -1;
    /* in place (out is topk_indices) is allowed: the kernels read each row's entries before writing them */
    const smla_arr *in_place[] = {out, idx};
    if (smla_check_outputs(A, in_place, 1) || parse_num_blocks(v[NUM_BLOCKS].obj, &p->num_blocks)) return -1;
    p->req_id = req->data;
    p->num_tokens = idx->shape[0];
    p->block_table = bt->data;
    p->bt_stride = bt->strides[0];
    p->num_reqs = bt->shape[0];
    p->max_blocks = bt->shape[1];
    p->topk_indices = idx->data;
    p->in_stride = idx->strides[0];
    p->topk = idx->shape[1];
    p->block_size = v[BLOCK_SIZE].i;
    p->prefill_request_ids = pids->present ? pids->data : NULL;
    p->prefill_workspace_starts = pstarts->present ? pstarts->data : NULL;
    p->num_prefills = pstarts->present ? pstarts->shape[0] : 0;
    p->out = out->data;
    p->out_stride = out->strides[0];
    p->valid_counts = counts->present ? counts->data : NULL;
    p->stream = A->stream;
    p->run = A->run;
    return 0;
}

/* Both ops: parse by the op's table, fill and check the params (the DCP settings only for dcp = 1), run. */
static PyObject *convert(PyObject *module, const smla_kw_fn *spec, int dcp, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    smla_kwarg v[NARGS];
    if (smla_kw_parse(module, spec, args, nargs, kwnames, v) < 0) return NULL;
    smla_args A;
    if (smla_args_init(&A, module, v[STREAM].stream) < 0) return NULL;
    smla_convert_indices_params p;
    memset(&p, 0, sizeof p);
    smla_arr *outs[2];
    if (parse_common(&A, &p, v, outs)) goto fail;
    if (dcp) {
        p.dcp_size = (int)v[DCP_SIZE].i;
        p.dcp_rank = (int)v[DCP_RANK].i;
        p.dcp_interleave = (int)v[INTERLEAVE].i;
        p.compact = (int)v[COMPACT].i;
        if (SMLA_CHECK(&A, filter_convert_dcp_indices, &p) < 0) goto fail;
    } else if (SMLA_CHECK(&A, convert_topk_indices, &p) < 0) {
        goto fail;
    }
    if (p.num_tokens > 0 && SMLA_LAUNCH(&A, convert_topk_indices, &p) < 0) goto fail;
    PyObject *const given[] = {v[OUT].obj, v[VALID_COUNTS].obj};
    PyObject *r = smla_args_result(2, outs, given);
    smla_args_release(&A);
    return r;
fail:
    smla_args_release(&A);
    return NULL;
}

PyObject *smla_op_convert_topk_indices(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    return convert(module, &convert_spec, 0, args, nargs, kwnames);
}

PyObject *smla_op_filter_convert_dcp_indices(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                             PyObject *kwnames)
{
    return convert(module, &dcp_spec, 1, args, nargs, kwnames);
}
