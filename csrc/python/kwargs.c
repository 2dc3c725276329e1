/* The keyword parser of the module's functions (kwargs.h): names matched by identity with the interned
 * names of the module state (what a call written in Python passes), by value otherwise. */
#include <string.h>

#include "binding.h"

#define SMLA_ARG_STRING(n) #n,
const char *const smla_arg_names[SMLA_N_COUNT] = {SMLA_ARG_NAMES(SMLA_ARG_STRING)};
#undef SMLA_ARG_STRING

/* Index in fn of the keyword key, or -1; callers usually pass the arguments in table order, so the
 * search starts at hint. */
static int find(const smla_state *S, const smla_kw_fn *fn, PyObject *key, int hint)
{
    for (int k = 0; k < fn->n; k++) {
        const int i = (hint + k) % fn->n;
        if (S->names[fn->args[i].name] == key) return i;
    }
    for (int i = 0; i < fn->n; i++)
        if (PyUnicode_Compare(key, S->names[fn->args[i].name]) == 0) return i;
    return -1;
}

/* An integer in [lo, hi] from anything with __index__. */
static int to_int64(smla_kwarg *a, int64_t lo, int64_t hi)
{
    PyObject *o = a->obj;
    if (!PyLong_Check(o) && !(o = PyNumber_Index(o))) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected an integer, got %.100s", a->name, Py_TYPE(a->obj)->tp_name);
        return -1;
    }
    int overflow;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (o != a->obj) Py_DECREF(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s: expected an integer from %lld to %lld, got one outside the 64-bit range",
                     a->name, (long long)lo, (long long)hi);
        return -1;
    }
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: expected an integer from %lld to %lld, got %lld", a->name, (long long)lo,
                     (long long)hi, v);
        return -1;
    }
    a->i = v;
    return 0;
}

static int convert(smla_kwarg *a)
{
    PyObject *o = a->obj;
    switch (a->kind) {
    case SMLA_KW_OBJ:
    case SMLA_KW_OBJ_OPT:
        return 0;
    case SMLA_KW_DOUBLE:
        if (PyFloat_CheckExact(o)) {
            a->f = PyFloat_AS_DOUBLE(o);
            return 0;
        }
        if (PyUnicode_Check(o) || PyBytes_Check(o) || o == Py_None) goto type; /* no parsing of text */
        a->f = PyFloat_AsDouble(o);
        if (a->f == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) goto type;
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: expected a finite number, got an integer beyond the float range",
                         a->name);
            return -1;
        }
        return 0;
    case SMLA_KW_STR: {
        if (!PyUnicode_Check(o)) goto type;
        Py_ssize_t n;
        if (!(a->s = PyUnicode_AsUTF8AndSize(o, &n))) return -1;
        if ((size_t)n == strlen(a->s)) return 0;
        PyErr_Format(PyExc_ValueError, "%s: expected a str without NUL characters", a->name);
        return -1;
    }
    case SMLA_KW_INT64:
        return to_int64(a, INT64_MIN, INT64_MAX);
    case SMLA_KW_INT:
        return to_int64(a, INT_MIN, INT_MAX);
    case SMLA_KW_BOOL:
        if (o == Py_True || o == Py_False) {
            a->i = o == Py_True;
            return 0;
        }
        return to_int64(a, 0, 1);
    case SMLA_KW_STREAM:
        if (!PyLong_Check(o)) {
            if (!(o = PyNumber_Index(a->obj))) {
                if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s: expected an integer stream handle, got %.100s", a->name,
                             Py_TYPE(a->obj)->tp_name);
                return -1;
            }
        }
        a->stream = PyLong_AsUnsignedLongLong(o);
        if (o != a->obj) Py_DECREF(o);
        if (a->stream == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: expected a stream handle from 0 to 2**64 - 1", a->name);
            return -1;
        }
        return 0;
    default:
        PyErr_Format(PyExc_SystemError, "%s: unknown argument kind %d", a->name, a->kind);
        return -1;
    }
type:
    PyErr_Format(PyExc_TypeError, "%s: expected %s, got %.100s", a->name,
                 a->kind == SMLA_KW_DOUBLE ? "a real number" : "a str", Py_TYPE(o)->tp_name);
    return -1;
}

int smla_kw_parse(PyObject *module, const smla_kw_fn *fn, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames, smla_kwarg *v)
{
    const smla_state *S = smla_get_state(module);
    if (nargs > 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only (%zd positional given)", fn->fn, nargs);
        return -1;
    }
    for (int i = 0; i < fn->n; i++) {
        v[i].obj = NULL;
        v[i].name = smla_arg_names[fn->args[i].name];
        v[i].kind = fn->args[i].kind;
    }
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        const int i = find(S, fn, key, (int)(j % fn->n));
        if (i < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn->fn, key);
            return -1;
        }
        if (v[i].obj) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn->fn, v[i].name);
            return -1;
        }
        v[i].obj = args[j];
    }
    for (int i = 0; i < fn->n; i++)
        if (!v[i].obj && v[i].kind != SMLA_KW_OBJ_OPT && v[i].kind != SMLA_KW_STREAM) {
            PyErr_Format(PyExc_TypeError, "%s() missing required keyword argument '%s'", fn->fn, v[i].name);
            return -1;
        }
    for (int i = 0; i < fn->n; i++) {
        smla_kwarg *a = &v[i];
        if (!a->obj) {
            if (a->kind == SMLA_KW_STREAM) {
                a->stream = SMLA_STREAM_CURRENT;
                continue;
            }
            a->obj = Py_None;
        }
        if (convert(a) < 0) return -1;
    }
    return 0;
}
