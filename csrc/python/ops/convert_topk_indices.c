/* smla.convert_topk_indices and smla.filter_convert_dcp_indices -> smla_{cpu,cuda}_convert_topk_indices:
 * request-local top-k positions to global cache slots (or prefill workspace rows). One kernel serves
 * both; the DCP variant sets dcp_size >= 1. */
#include <string.h>

#include "../binding.h"

/* num_blocks: None (no check, 0) or the cache's block count, >= 1. Returns 0 or -1 with an exception. */
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

/* Shared argument handling; fills p, returns 0 or -1 with an exception set. */
static int parse_common(smla_args *A, smla_convert_indices_params *p, PyObject *o_req, PyObject *o_bt,
                        PyObject *o_idx, long long block_size, PyObject *o_pids, PyObject *o_pstarts,
                        PyObject *o_out, PyObject *o_counts)
{
    smla_arr *req = smla_args_get(A, o_req, "req_id");
    smla_arr *bt = req ? smla_args_get(A, o_bt, "block_table") : NULL;
    smla_arr *idx = bt ? smla_args_get(A, o_idx, "topk_indices") : NULL;
    smla_arr *pids = idx ? smla_args_get_opt(A, o_pids, "prefill_request_ids") : NULL;
    smla_arr *pstarts = pids ? smla_args_get_opt(A, o_pstarts, "prefill_workspace_starts") : NULL;
    smla_arr *out = pstarts ? smla_args_get_out(A, o_out, "out") : NULL;
    smla_arr *counts = out ? smla_args_get_out_opt(A, o_counts, "valid_counts") : NULL;
    if (!counts) return -1;
    if (block_size <= 0) {
        PyErr_Format(PyExc_ValueError, "block_size: expected a positive integer, got %lld", block_size);
        return -1;
    }
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
    if (smla_check_int_index(out) || smla_check_ndim(out, 2) || smla_check_same_dim(out, 0, idx, 0) ||
        smla_check_same_dim(out, 1, idx, 1) || smla_check_last_contiguous(out) || smla_check_writable(out))
        return -1;
    if (counts->present && (smla_check_int_index(counts) || smla_check_ndim(counts, 1) ||
                            smla_check_same_dim(counts, 0, idx, 0) || smla_check_contiguous(counts) ||
                            smla_check_writable(counts)))
        return -1;
    /* in place (out is topk_indices) is allowed: the kernels read each row's entries before writing them */
    const smla_arr *in_place[] = {out, idx};
    if (smla_check_outputs(A, in_place, 1)) return -1;
    p->req_id = req->data;
    p->num_tokens = idx->shape[0];
    p->block_table = bt->data;
    p->bt_stride = bt->strides[0];
    p->num_reqs = bt->shape[0];
    p->max_blocks = bt->shape[1];
    p->topk_indices = idx->data;
    p->in_stride = idx->strides[0];
    p->topk = idx->shape[1];
    p->block_size = block_size;
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

PyObject *smla_op_convert_topk_indices(PyObject *module, PyObject *args)
{
    PyObject *o_req, *o_bt, *o_idx, *o_nb, *o_pids, *o_pstarts, *o_out, *o_counts;
    long long block_size;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOLOOOOOK:convert_topk_indices", &o_req, &o_bt, &o_idx, &block_size, &o_nb,
                          &o_pids, &o_pstarts, &o_out, &o_counts, &stream))
        return NULL;
    smla_args A;
    if (smla_args_init(&A, module, stream) < 0) return NULL;
    smla_convert_indices_params p;
    memset(&p, 0, sizeof p);
    if (parse_common(&A, &p, o_req, o_bt, o_idx, block_size, o_pids, o_pstarts, o_out, o_counts) ||
        parse_num_blocks(o_nb, &p.num_blocks))
        goto fail;
    if (p.num_tokens > 0 && SMLA_LAUNCH(&A, convert_topk_indices, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}

PyObject *smla_op_filter_convert_dcp_indices(PyObject *module, PyObject *args)
{
    PyObject *o_req, *o_bt, *o_idx, *o_nb, *o_pids, *o_pstarts, *o_out, *o_counts;
    long long block_size;
    int dcp_size, dcp_rank, interleave, compact;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOLOOOOOiiipK:filter_convert_dcp_indices", &o_req, &o_bt, &o_idx, &block_size,
                          &o_nb, &o_pids, &o_pstarts, &o_out, &o_counts, &dcp_size, &dcp_rank, &interleave,
                          &compact, &stream))
        return NULL;
    if (dcp_size < 1) return PyErr_Format(PyExc_ValueError, "dcp_size: expected >= 1, got %d", dcp_size);
    if (dcp_rank < 0 || dcp_rank >= dcp_size)
        return PyErr_Format(PyExc_ValueError, "dcp_rank: expected 0 <= dcp_rank < dcp_size = %d, got %d",
                            dcp_size, dcp_rank);
    if (interleave < 1) return PyErr_Format(PyExc_ValueError, "interleave: expected >= 1, got %d", interleave);
    smla_args A;
    if (smla_args_init(&A, module, stream) < 0) return NULL;
    smla_convert_indices_params p;
    memset(&p, 0, sizeof p);
    if (parse_common(&A, &p, o_req, o_bt, o_idx, block_size, o_pids, o_pstarts, o_out, o_counts) ||
        parse_num_blocks(o_nb, &p.num_blocks))
        goto fail;
    p.dcp_size = dcp_size;
    p.dcp_rank = dcp_rank;
    p.dcp_interleave = interleave;
    p.compact = compact;
    if (p.num_tokens > 0 && SMLA_LAUNCH(&A, convert_topk_indices, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}
