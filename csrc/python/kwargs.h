/* Keyword arguments of the module's functions: every op takes its arguments by name only (METH_FASTCALL |
 * METH_KEYWORDS), described by a static spec table per op. The names are interned once, in the module
 * state (module.c), so the table, the messages and the Python caller use one spelling. */
#ifndef SMLA_KWARGS_H
#define SMLA_KWARGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Every argument name of every op. */
#define SMLA_ARG_NAMES(X)                                                                                     \
    X(q) X(kv) X(kv_cache) X(indices) X(topk_length) X(attn_sink) X(out) X(lse) X(max_logits) X(workspace)   \
    X(softmax_scale) X(kv_cache_dtype) X(stream) X(kv_c) X(k_pe) X(slot_mapping) X(scale_rule) X(slots)       \
    X(block_table) X(seq_lens) X(workspace_starts) X(seq_starts) X(req_id) X(topk_indices) X(block_size)     \
    X(num_blocks) X(prefill_request_ids) X(prefill_workspace_starts) X(valid_counts) X(dcp_size) X(dcp_rank) \
    X(interleave) X(compact) X(out_a) X(lse_a) X(out_b) X(lse_b) X(out_lse) X(b) X(s_q) X(h) X(topk) X(device) \
    X(precision) X(q_pe)

#define SMLA_ARG_ENUM(n) SMLA_N_##n,
enum { SMLA_ARG_NAMES(SMLA_ARG_ENUM) SMLA_N_COUNT };
#undef SMLA_ARG_ENUM

/* What an argument must be. Every kind is required except OBJ_OPT (absent: None) and STREAM (absent:
 * SMLA_STREAM_CURRENT). */
typedef enum {
    SMLA_KW_OBJ,     /* any object (arrays are acquired and checked by the op) */
    SMLA_KW_OBJ_OPT, /* any object or None */
    SMLA_KW_DOUBLE,  /* a real number (float, or anything with __float__ / __index__) */
    SMLA_KW_STR,     /* a str without NUL characters */
    SMLA_KW_INT64,   /* an integer (anything with __index__) in the int64 range */
    SMLA_KW_INT,     /* the same in the range of a C int */
    SMLA_KW_BOOL,    /* True / False, or an integer 0 / 1 */
    SMLA_KW_STREAM   /* a stream handle, 0 .. 2**64 - 1 */
} smla_kw_kind;

typedef struct {
    int name; /* SMLA_N_* */
    int kind; /* smla_kw_kind */
} smla_kw_spec;

typedef struct {
    const char *fn; /* the function's name, for messages */
    int n;
    const smla_kw_spec *args;
} smla_kw_fn;

/* One parsed argument. */
typedef struct {
    PyObject *obj;    /* borrowed: the caller's object, or None for an absent optional one */
    const char *name; /* the keyword, for messages naming the argument */
    int kind;
    union {
        double f;
        const char *s; /* valid while obj lives (the caller holds it for the call) */
        int64_t i;     /* INT64, INT and BOOL */
        unsigned long long stream;
    };
} smla_kwarg;

/* The C spelling of argument name id (SMLA_N_*). */
extern const char *const smla_arg_names[SMLA_N_COUNT];

/* Parse a vectorcall of fn into v[0 .. fn->n): no positional arguments; an unknown, repeated or missing
 * keyword raises TypeError naming the function and the argument, a value of the wrong type TypeError and
 * one out of range ValueError, both starting with the argument's name. 0, or -1 with the exception set. */
int smla_kw_parse(PyObject *module, const smla_kw_fn *fn, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames, smla_kwarg *v);

#endif /* SMLA_KWARGS_H */
