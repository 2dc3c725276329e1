/* smla.gather_upconvert -> smla_{cpu,cuda}_gather_upconvert: paged tokens into a bf16 workspace. */
#include <string.h>

#include "../binding.h"

PyObject *smla_op_gather_upconvert(PyObject *module, PyObject *args)
{
    PyObject *o_cache, *o_ws, *o_bt, *o_lens, *o_starts, *o_seq_starts;
    const char *cache_dtype;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOOOOsK:gather_upconvert", &o_cache, &o_ws, &o_bt, &o_lens, &o_starts,
                          &o_seq_starts, &cache_dtype, &stream))
        return NULL;
    static const int bf16[] = {SMLA_DT_BF16, SMLA_DT_U16};
    smla_args A;
    if (smla_args_init(&A, module, stream) < 0) return NULL;
    smla_gather_upconvert_params p;
    memset(&p, 0, sizeof p);
    smla_arr *cache = smla_args_get(&A, o_cache, "kv_cache");
    smla_arr *ws = cache ? smla_args_get_out(&A, o_ws, "workspace") : NULL;
    smla_arr *bt = ws ? smla_args_get(&A, o_bt, "block_table") : NULL;
    smla_arr *lens = bt ? smla_args_get(&A, o_lens, "seq_lens") : NULL;
    smla_arr *starts = lens ? smla_args_get(&A, o_starts, "workspace_starts") : NULL;
    smla_arr *seq_starts = starts ? smla_args_get_opt(&A, o_seq_starts, "seq_starts") : NULL;
    if (!seq_starts) goto fail;
    int cdt = smla_parse_cache_dtype(cache_dtype);
    if (cdt < 0 || smla_get_cache(cache, cdt, &p.cache)) goto fail;
    if (smla_check_dtype(ws, 2, bf16) || smla_check_ndim(ws, 2) || smla_check_dim(ws, 1, SMLA_D_QK, "d_qk") ||
        smla_check_last_contiguous(ws) || smla_check_writable(ws))
        goto fail;
    if (A.device == SMLA_DEV_CUDA && smla_check_aligned(ws, 16)) goto fail;
    if (smla_check_int_index(bt) || smla_check_ndim(bt, 2) || smla_check_last_contiguous(bt)) goto fail;
    if (smla_check_int_index(lens) || smla_check_ndim(lens, 1) || smla_check_same_dim(lens, 0, bt, 0) ||
        smla_check_contiguous(lens))
        goto fail;
    if (smla_check_int_index(starts) || smla_check_ndim(starts, 1) || smla_check_same_dim(starts, 0, bt, 0) ||
        smla_check_contiguous(starts))
        goto fail;
    if (seq_starts->present &&
        (smla_check_int_index(seq_starts) || smla_check_ndim(seq_starts, 1) ||
         smla_check_same_dim(seq_starts, 0, bt, 0) || smla_check_contiguous(seq_starts)))
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
    /* launched with ws_rows = 0 too: the CPU kernel rejects requests that need rows */
    if (p.num_reqs > 0 && SMLA_LAUNCH(&A, gather_upconvert, &p) < 0) goto fail;
    smla_args_release(&A);
    Py_RETURN_NONE;
fail:
    smla_args_release(&A);
    return NULL;
}
