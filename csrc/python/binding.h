/* Binding helpers: parse keyword arguments (kwargs.h), turn Python arrays (NumPy, or any DLPack producer
 * on CPU or CUDA) into plain views, validate each view one property at a time (dtype, shape, strides,
 * writability, overlap; each message names the argument), check the filled params with the op's rules
 * (core/checks.h) and run a kernel with the GIL released. Used by csrc/python/ops/; no arithmetic on
 * data here. */
#ifndef SMLA_BINDING_H
#define SMLA_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/checks.h"
#include "core/params.h"
#include "kwargs.h"

#define SMLA_MAX_NDIM 8
#define SMLA_MAX_ARGS 16

/* Module state (see module.c). */
typedef struct {
    PyObject *cuda_error; /* smla.CudaError */
    int bf16_typenum;     /* NumPy type numbers of ml_dtypes types, -1 when unavailable */
    int e4m3_typenum;
    /* The last type asked for __dlpack_c_exchange_api__, with the capsule that owns its table. Both are
     * strong references: a borrowed type pointer could be freed and reused by a new type, which would
     * then be sent through the dead type's table. */
    PyObject *api_type;
    PyObject *api_capsule; /* NULL when the type has no usable table */
    const void *api;       /* the table inside api_capsule, or NULL */
    PyObject *names[SMLA_N_COUNT]; /* the interned argument names (kwargs.h) */
    /* the plain DLPack protocol's call, made once (binding.c: export_capsule) */
    PyObject *str_dlpack, *str_dlpack_device; /* "__dlpack__", "__dlpack_device__" */
    PyObject *kw_stream_version, *kw_stream;   /* ("stream", "max_version"), ("stream",) */
    PyObject *max_version;                     /* (1, 3) */
    PyObject *allocate;   /* smla._C.ALLOCATE: an output argument the op allocates (smla_args_alloc) */
} smla_state;

/* stream value meaning "the current stream of the framework that owns the first CUDA array" */
#define SMLA_STREAM_CURRENT 0xffffffffffffffffull

/* One array argument as the kernels will see it. */
typedef struct {
    const char *name;      /* argument name used in every message */
    int present;           /* 0 for an optional argument given as None */
    void *data;            /* first element (byte_offset applied) */
    int device;            /* smla_device */
    int device_id;
    int dtype;             /* smla_dtype */
    int itemsize;
    int ndim;
    int64_t shape[SMLA_MAX_NDIM];
    int64_t strides[SMLA_MAX_NDIM]; /* in elements */
    int readonly;
    int output;            /* acquired with smla_args_get_out*: written by the op (smla_check_outputs) */
    int pending;           /* an output given as smla._C.ALLOCATE, not allocated yet (present == 0) */
    PyObject *made;        /* the array smla_args_alloc made for it (owned), or NULL */
    /* ownership: a NumPy array reference, or a consumed DLPack managed tensor */
    PyObject *array;
    void *managed;
    int versioned;
} smla_arr;

/* All array arguments of one call: device agreement, stream, and release in one place. */
typedef struct {
    smla_state *state;
    void *stream;        /* launch stream (cudaStream_t), 0 = legacy default */
    int stream_pending;  /* SMLA_STREAM_CURRENT was given and is not resolved yet */
    const void *stream_api; /* the exchange API whose current stream A->stream is, else NULL */
    int device;          /* device of the first present array, 0 until known */
    int device_id;
    const char *first;   /* name of the array that fixed the device */
    PyObject *first_obj; /* that array (borrowed: the caller holds it for the call) */
    PyObject *alloc_like; /* the array outputs are made like (smla_args_alloc): first_obj unless the op sets it */
    smla_run run;        /* the environment switches of this call (csrc/python/settings.c) */
    /* The framework stream the call's allocations were made on, when that is not the launch stream:
     * memory freed there may be reused by its next work, so after the launch that stream waits for it. */
    void *alloc_stream;
    int join;
    int n;
    smla_arr arrs[SMLA_MAX_ARGS];
} smla_args;

smla_state *smla_get_state(PyObject *module);

/* Start a call: stream and the environment switches; -1 with ValueError for a malformed switch. */
int smla_args_init(smla_args *A, PyObject *module, unsigned long long stream);
/* Read the environment switches (csrc/python/settings.c); -1 with ValueError naming a malformed one. */
int smla_read_settings(smla_run *r);
/* Acquire obj as argument `name`; with optional, None gives a view with present == 0; output: the op
 * writes it (checked by smla_check_outputs). NULL with an exception set on failure. */
smla_arr *smla_args_get(smla_args *A, PyObject *obj, const char *name, int optional, int output);
/* The same for a parsed argument (optional when its kind is SMLA_KW_OBJ_OPT): one the op reads, or writes. */
static inline smla_arr *smla_args_in(smla_args *A, const smla_kwarg *v)
{
    return smla_args_get(A, v->obj, v->name, v->kind == SMLA_KW_OBJ_OPT, 0);
}
static inline smla_arr *smla_args_out(smla_args *A, const smla_kwarg *v)
{
    return smla_args_get(A, v->obj, v->name, v->kind == SMLA_KW_OBJ_OPT, 1);
}
/* Allocate the output a when the caller passed smla._C.ALLOCATE for it (else nothing): shape[ndim] of
 * dtype, C-contiguous, by the framework of the call's first array on its device (NumPy: PyArray_Empty;
 * others: the allocator of their DLPack exchange API, on the framework's current stream), then acquired
 * as if the caller had passed it. 0, or -1 with TypeError (a framework that cannot allocate: pass the
 * output) or the allocator's error (MemoryError / RuntimeError) naming the argument. */
int smla_args_alloc(smla_args *A, smla_arr *a, int ndim, const int64_t *shape, int dtype);
/* Scratch memory for this call only (the decode's split partials): nbytes of uint8, made like
 * smla_args_alloc's outputs where the framework's exchange API can allocate, but never turned into a
 * Python object; the memory is handed back in smla_args_release, after the launch (stream-ordered: the
 * framework reuses it only for work queued after ours). Like a NumPy array nothing is made (a->pending
 * stays set: the CPU kernels need no scratch); like a type without an exchange-API allocator (CuPy) it
 * raises TypeError as smla_args_alloc does (the Python layer passes such a workspace itself). 0, or -1
 * with the exception naming the argument. */
int smla_args_scratch(smla_args *A, smla_arr *a, int64_t nbytes);
/* Whether smla_args_alloc can allocate like obj (a NumPy array, or a type whose exchange API has an
 * allocator); smla._C.can_allocate. */
int smla_can_allocate(smla_state *S, PyObject *obj);
/* The op's result: a tuple of its outputs, each the array smla_args_alloc made, else the caller's object
 * (None for an absent optional one). NULL with an exception on failure. */
PyObject *smla_args_result(int n, smla_arr *const *outs, PyObject *const *given);

/* Release every array (DLPack deleters run here); keeps a pending exception intact. */
void smla_args_release(smla_args *A);

/* The memory rule for outputs, called by every op once its arrays are acquired and checked: an output's
 * elements must not overlap each other (no stride 0 over a dimension of size > 1), and its memory extent
 * must not overlap any other array of the call. `same` lists n_same (output, input) pairs, flattened,
 * where the output may be EXACTLY the same view as the input (kernels that read each element before
 * writing it, i.e. in place). 0, or -1 with ValueError naming both arrays. */
int smla_check_outputs(const smla_args *A, const smla_arr *const *same, int n_same);

/* Property checks: return 0, or -1 with TypeError/ValueError set naming the argument. */
int smla_check_dtype(const smla_arr *a, int n_allowed, const int *allowed);
int smla_check_ndim(const smla_arr *a, int ndim);
int smla_check_dim(const smla_arr *a, int dim, int64_t expected, const char *what);
int smla_check_same_dim(const smla_arr *a, int dim, const smla_arr *b, int bdim);
int smla_check_last_contiguous(const smla_arr *a);
int smla_check_contiguous(const smla_arr *a);
int smla_check_writable(const smla_arr *a);
int smla_check_int_index(const smla_arr *a);        /* int32 */
int smla_check_int_index_64(const smla_arr *a);     /* int32 or int64 */

/* Parse "bf16" / "fp8_ds_mla" into smla_cache_dtype; -1 with ValueError. */
int smla_parse_cache_dtype(const char *s);
/* precision= of the attention ops: "high" / "fast" into smla_precision; -1 with ValueError. The names,
 * indexed by smla_precision, are exported to Python as smla._C.PRECISIONS. */
#define SMLA_PRECISION_NAMES 2
extern const char *const smla_precision_names[SMLA_PRECISION_NAMES];
int smla_parse_precision(const char *s);
/* Validate the array kv_cache [num_blocks, block_size, entry] for that layout and describe it (its
 * params rules, alignment included, are core/checks.c's). */
int smla_get_cache(const smla_arr *a, int cache_dtype, smla_cache *c);

/* Raise the exception that matches st->code. Always returns NULL. */
PyObject *smla_raise_status(smla_state *S, const smla_status *st);
const char *smla_dtype_name(int dtype);

/* Device guard around a launch: make the arrays' CUDA device current, and restore it. */
int smla_device_enter(smla_args *A, int *prev);
void smla_device_exit(smla_args *A, int prev);

#ifdef SMLA_WITH_CUDA
#define SMLA_CUDA_CALL(op, p, st) smla_cuda_##op((p), (st))
#else
#define SMLA_CUDA_CALL(op, p, st) \
    smla_fail((st), SMLA_ERR_UNSUPPORTED, "%s: smla was built without CUDA support", #op)
#endif

/* The params rules of op (core/checks.h) for the device of the arguments; 0, or -1 with the exception
 * of the status (ValueError, TypeError, ...) set. */
#define SMLA_CHECK(A, op, p)                                                                   \
    __extension__({                                                                            \
        smla_status st_ = {0, {0}};                                                            \
        int rc_ = smla_check_##op((p), (A)->device == SMLA_DEV_CUDA, &st_) != SMLA_OK;          \
        if (rc_) smla_raise_status((A)->state, &st_);                                          \
        -rc_;                                                                                  \
    })

/* After a launch on a stream other than the one the call allocated on (A->join): that stream waits for
 * the launch, so the memory the call made is not reused before the kernel is done. GIL not needed. */
int smla_args_join(const smla_args *A, smla_status *st);

/* Run op on the device of the arguments with the GIL released; evaluates to 0 or -1 (exception set). */
#define SMLA_LAUNCH(A, op, p)                                                          \
    __extension__({                                                                    \
        smla_status st_ = {0, {0}};                                                    \
        int prev_ = -1, rc_ = 0;                                                       \
        if (smla_device_enter((A), &prev_) < 0) {                                      \
            rc_ = -1;                                                                  \
        } else {                                                                       \
            Py_BEGIN_ALLOW_THREADS                                                     \
            rc_ = (A)->device == SMLA_DEV_CUDA ? SMLA_CUDA_CALL(op, (p), &st_)         \
                                               : smla_cpu_##op((p), &st_);             \
            if (rc_ == SMLA_OK && (A)->join) rc_ = smla_args_join(A, &st_);            \
            Py_END_ALLOW_THREADS                                                       \
            smla_device_exit((A), prev_);                                              \
            if (rc_ != SMLA_OK) {                                                      \
                smla_raise_status((A)->state, &st_);                                   \
                rc_ = -1;                                                              \
            }                                                                          \
        }                                                                              \
        rc_;                                                                           \
    })

/* The module's functions (csrc/python/ops/<op>.c). */
#define SMLA_OPS(X)                   \
    X(pack_kv)                        \
    X(unpack_kv)                      \
    X(gather_upconvert)               \
    X(convert_topk_indices)           \
    X(filter_convert_dcp_indices)     \
    X(merge_attn_states)              \
    X(sparse_mla_decode)              \
    X(sparse_mla_decode_workspace_size) \
    X(sparse_mla_prefill)

#define SMLA_DECLARE_OP(name) \
    PyObject *smla_op_##name(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
SMLA_OPS(SMLA_DECLARE_OP)

#endif /* SMLA_BINDING_H */
