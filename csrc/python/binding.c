/* Array acquisition (NumPy C API and DLPack capsules) and argument validation for the bindings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"
#include "dlpack.h"
#include "np.h"

smla_state *smla_get_state(PyObject *module) { return (smla_state *)PyModule_GetState(module); }

int smla_args_init(smla_args *A, PyObject *module, unsigned long long stream)
{
    memset(A, 0, sizeof *A);
    A->state = smla_get_state(module);
    A->stream_pending = stream == SMLA_STREAM_CURRENT;
    A->stream = A->stream_pending ? NULL : (void *)(uintptr_t)stream;
    return smla_read_settings(&A->run);
}

const char *smla_dtype_name(int dtype)
{
    switch (dtype) {
    case SMLA_DT_BF16: return "bfloat16";
    case SMLA_DT_F16: return "float16";
    case SMLA_DT_F32: return "float32";
    case SMLA_DT_F64: return "float64";
    case SMLA_DT_I32: return "int32";
    case SMLA_DT_I64: return "int64";
    case SMLA_DT_U8: return "uint8";
    case SMLA_DT_U16: return "uint16";
    case SMLA_DT_I8: return "int8";
    case SMLA_DT_F8E4M3: return "float8_e4m3fn";
    default: return "an unsupported dtype";
    }
}

static int itemsize_of(int dtype)
{
    switch (dtype) {
    case SMLA_DT_F64: case SMLA_DT_I64: return 8;
    case SMLA_DT_F32: case SMLA_DT_I32: return 4;
    case SMLA_DT_BF16: case SMLA_DT_F16: case SMLA_DT_U16: return 2;
    default: return 1;
    }
}

static int dtype_from_numpy(smla_state *S, PyArray_Descr *d)
{
    int t = d->type_num;
    if (t == S->bf16_typenum) return SMLA_DT_BF16;
    if (t == S->e4m3_typenum) return SMLA_DT_F8E4M3;
    switch (t) {
    case NPY_FLOAT16: return SMLA_DT_F16;
    case NPY_FLOAT32: return SMLA_DT_F32;
    case NPY_FLOAT64: return SMLA_DT_F64;
    case NPY_INT8: return SMLA_DT_I8;
    case NPY_UINT8: return SMLA_DT_U8;
    case NPY_UINT16: return SMLA_DT_U16;
    default: break;
    }
    /* int32/int64 have several aliases (long, longlong, intc): decide by kind and size */
    if (d->kind == 'i' && PyDataType_ELSIZE(d) == 4) return SMLA_DT_I32;
    if (d->kind == 'i' && PyDataType_ELSIZE(d) == 8) return SMLA_DT_I64;
    return SMLA_DT_INVALID;
}

static int dtype_from_dlpack(smla_dl_dtype t)
{
    if (t.lanes != 1) return SMLA_DT_INVALID;
    switch (t.code) {
    case SMLA_DL_BFLOAT: return t.bits == 16 ? SMLA_DT_BF16 : SMLA_DT_INVALID;
    case SMLA_DL_FLOAT:
        return t.bits == 16 ? SMLA_DT_F16 : t.bits == 32 ? SMLA_DT_F32 : t.bits == 64 ? SMLA_DT_F64
                                                                                         : SMLA_DT_INVALID;
    case SMLA_DL_INT:
        return t.bits == 32 ? SMLA_DT_I32 : t.bits == 64 ? SMLA_DT_I64 : t.bits == 8 ? SMLA_DT_I8
                                                                                       : SMLA_DT_INVALID;
    case SMLA_DL_UINT: return t.bits == 8 ? SMLA_DT_U8 : t.bits == 16 ? SMLA_DT_U16 : SMLA_DT_INVALID;
    case SMLA_DL_FLOAT8_E4M3FN: return t.bits == 8 ? SMLA_DT_F8E4M3 : SMLA_DT_INVALID;
    default: return SMLA_DT_INVALID;
    }
}

static int from_numpy(smla_args *A, PyObject *obj, smla_arr *a)
{
    PyArrayObject *arr = (PyArrayObject *)obj;
    PyArray_Descr *d = PyArray_DESCR(arr);
    int nd = PyArray_NDIM(arr);
    if (!PyArray_ISNOTSWAPPED(arr)) {
        PyErr_Format(PyExc_ValueError, "%s: byte-swapped arrays are not supported", a->name);
        return -1;
    }
    a->dtype = dtype_from_numpy(A->state, d);
    if (a->dtype == SMLA_DT_INVALID) {
        PyErr_Format(PyExc_TypeError, "%s: unsupported dtype %S", a->name, (PyObject *)d);
        return -1;
    }
    if (nd > SMLA_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s: at most %d dimensions are supported, got %d", a->name,
                     SMLA_MAX_NDIM, nd);
        return -1;
    }
    a->itemsize = (int)PyArray_ITEMSIZE(arr);
    a->ndim = nd;
    for (int i = 0; i < nd; i++) {
        npy_intp s = PyArray_STRIDES(arr)[i];
        a->shape[i] = PyArray_DIMS(arr)[i];
        if (s % a->itemsize != 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: stride %zd bytes of dimension %d is not a multiple of the item size %d",
                         a->name, (Py_ssize_t)s, i, a->itemsize);
            return -1;
        }
        a->strides[i] = s / a->itemsize;
    }
    a->data = PyArray_DATA(arr);
    a->device = SMLA_DEV_CPU;
    a->device_id = 0;
    a->readonly = !PyArray_ISWRITEABLE(arr);
    Py_INCREF(obj);
    a->array = obj;
    return 0;
}

static int fill_from_dltensor(smla_arr *a, const smla_dl_tensor *t)
{
    if (t->device.device_type == SMLA_DL_CUDA || t->device.device_type == SMLA_DL_CUDA_MANAGED)
        a->device = SMLA_DEV_CUDA;
    else if (t->device.device_type == SMLA_DL_CPU || t->device.device_type == SMLA_DL_CUDA_HOST)
        a->device = SMLA_DEV_CPU;
    else {
        PyErr_Format(PyExc_BufferError, "%s: DLPack device type %d is not supported (CPU or CUDA only)",
                     a->name, (int)t->device.device_type);
        return -1;
    }
    a->device_id = t->device.device_id;
    a->dtype = dtype_from_dlpack(t->dtype);
    if (a->dtype == SMLA_DT_INVALID) {
        PyErr_Format(PyExc_TypeError, "%s: unsupported DLPack dtype (code %d, bits %d, lanes %d)", a->name,
                     (int)t->dtype.code, (int)t->dtype.bits, (int)t->dtype.lanes);
        return -1;
    }
    if (t->ndim < 0 || t->ndim > SMLA_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s: at most %d dimensions are supported, got %d", a->name,
                     SMLA_MAX_NDIM, (int)t->ndim);
        return -1;
    }
    a->itemsize = itemsize_of(a->dtype);
    a->ndim = t->ndim;
    int64_t contig = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        a->shape[i] = t->shape[i];
        a->strides[i] = t->strides ? t->strides[i] : contig;
        contig *= t->shape[i];
    }
    a->data = (char *)t->data + t->byte_offset;
    return 0;
}

/* Call obj.__dlpack__(stream=..., max_version=(1, 3)), falling back to the legacy signature: one vectorcall
 * with the names and the version tuple made once (module state), no dict per call. */
static PyObject *export_capsule(smla_state *S, PyObject *obj, PyObject *stream)
{
    PyObject *args[3] = {obj, stream, S->max_version};
    PyObject *cap = PyObject_VectorcallMethod(S->str_dlpack, args, 1, S->kw_stream_version);
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        cap = PyObject_VectorcallMethod(S->str_dlpack, args, 1, S->kw_stream);
    }
    return cap;
}

/* The exchange API table of obj's type, or NULL; one attribute lookup per change of type. The cache owns
 * the type and the capsule that owns the table (module state, see binding.h). *cap gets a new reference
 * to that capsule for the caller to hold while it calls through the table: a callback that runs Python
 * could replace the cache meanwhile. */
static const smla_dl_exchange_api *exchange_api(smla_state *S, PyObject *obj, PyObject **cap)
{
    PyObject *type = (PyObject *)Py_TYPE(obj);
    *cap = NULL;
    if (type == S->api_type) {
        if (!S->api) return NULL;
        *cap = S->api_capsule;
        Py_INCREF(*cap);
        return S->api;
    }
    const smla_dl_exchange_api *api = NULL;
    PyObject *c = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
    if (c && PyCapsule_IsValid(c, "dlpack_exchange_api")) {
        api = PyCapsule_GetPointer(c, "dlpack_exchange_api");
        if (api && (api->header.version.major != 1 || !api->dltensor_from_py_object_no_sync ||
                    !api->current_work_stream))
            api = NULL;
    }
    if (!api) Py_CLEAR(c);
    PyErr_Clear(); /* no attribute (or a broken one): not an exchange-API type */
    PyObject *old_type = S->api_type, *old_cap = S->api_capsule;
    Py_INCREF(type);
    S->api_type = type;
    S->api_capsule = c; /* the reference from the lookup */
    S->api = api;
    if (c) {
        *cap = c;
        Py_INCREF(c);
    }
    /* last: freeing the old entries may run Python code, which may even replace the cache again */
    Py_XDECREF(old_type);
    Py_XDECREF(old_cap);
    return api;
}

/* Non-owning view through the exchange API: valid while obj lives (the caller holds it for the call). */
static int from_exchange_api(smla_args *A, const smla_dl_exchange_api *api, PyObject *obj, smla_arr *a)
{
    smla_dl_tensor t;
    if (api->dltensor_from_py_object_no_sync(obj, &t) != 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_BufferError, "%s: DLPack export failed", a->name);
        return -1;
    }
    if (fill_from_dltensor(a, &t) < 0) return -1;
    if (A->stream_pending && a->device == SMLA_DEV_CUDA) {
        void *s = NULL;
        if (api->current_work_stream(SMLA_DL_CUDA, a->device_id, &s) != 0) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_BufferError, "%s: current stream query failed", a->name);
            return -1;
        }
        A->stream = s;
        A->stream_pending = 0;
        A->stream_api = api;
    }
    return 0;
}

static int from_dlpack(smla_args *A, PyObject *obj, smla_arr *a)
{
    PyObject *dev = PyObject_CallMethodNoArgs(obj, A->state->str_dlpack_device);
    if (!dev) return -1;
    long dev_type = -1;
    if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2) dev_type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
    Py_DECREF(dev);
    if (dev_type == -1 && PyErr_Occurred()) return -1;
    /* CUDA producers order their work before our launch stream; never pass 0 (ambiguous). */
    PyObject *stream;
    if (dev_type == SMLA_DL_CUDA || dev_type == SMLA_DL_CUDA_MANAGED)
        stream = PyLong_FromUnsignedLongLong(A->stream ? (unsigned long long)(uintptr_t)A->stream : 1ull);
    else {
        stream = Py_None;
        Py_INCREF(stream);
    }
    if (!stream) return -1;
    PyObject *cap = export_capsule(A->state, obj, stream);
    Py_DECREF(stream);
    if (!cap) return -1;

    int rc = -1;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        smla_dl_managed_v *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (!m) goto done;
        if (m->version.major != 1) {
            /* left unrenamed: the capsule's destructor releases it */
            PyErr_Format(PyExc_BufferError, "%s: DLPack major version %u is not supported", a->name,
                         (unsigned)m->version.major);
            goto done;
        }
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) goto done;
        a->managed = m;
        a->versioned = 1;
        a->readonly = (m->flags & SMLA_DL_FLAG_READ_ONLY) != 0;
        rc = fill_from_dltensor(a, &m->dl_tensor);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        smla_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        if (!m) goto done;
        if (PyCapsule_SetName(cap, "used_dltensor") < 0) goto done;
        a->managed = m;
        a->versioned = 0;
        rc = fill_from_dltensor(a, &m->dl_tensor);
    } else {
        PyErr_Format(PyExc_BufferError, "%s: __dlpack__ did not return a DLPack capsule", a->name);
    }
done:
    Py_DECREF(cap);
    return rc;
}

static smla_arr *acquire(smla_args *A, PyObject *obj, const char *name, int optional)
{
    if (A->n >= SMLA_MAX_ARGS) {
        PyErr_SetString(PyExc_RuntimeError, "smla: too many array arguments");
        return NULL;
    }
    smla_arr *a = &A->arrs[A->n++];
    memset(a, 0, sizeof *a);
    a->name = name;
    if (optional && obj == Py_None) return a;
    int rc;
    const smla_dl_exchange_api *api;
    PyObject *api_cap;
    if (PyArray_Check(obj))
        rc = from_numpy(A, obj, a);
    else if ((api = exchange_api(A->state, obj, &api_cap)) != NULL) {
        rc = from_exchange_api(A, api, obj, a);
        Py_DECREF(api_cap);
    } else if (PyObject_HasAttr(obj, A->state->str_dlpack)) {
        A->stream_pending = 0; /* no framework stream to ask: the legacy default stream */
        rc = from_dlpack(A, obj, a);
    }
    else {
        PyErr_Format(PyExc_TypeError, "%s: expected a NumPy array or an object with __dlpack__, got %s",
                     name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    if (rc < 0) return NULL;
    a->present = 1;
    if (!A->device) {
        A->device = a->device;
        A->device_id = a->device_id;
        A->first = name;
        A->first_obj = obj;
    } else if (A->device != a->device || A->device_id != a->device_id) {
        PyErr_Format(PyExc_ValueError, "%s: expected an array on %s:%d like %s, got one on %s:%d", name,
                     A->device == SMLA_DEV_CUDA ? "cuda" : "cpu", A->device_id, A->first,
                     a->device == SMLA_DEV_CUDA ? "cuda" : "cpu", a->device_id);
        return NULL;
    }
    return a;
}

smla_arr *smla_args_get(smla_args *A, PyObject *obj, const char *name, int optional, int output)
{
    if (output && obj == A->state->allocate) {  /* made later by the op, once it knows the shape */
        smla_arr *a = acquire(A, Py_None, name, 1);
        if (a) a->output = a->pending = 1;
        return a;
    }
    smla_arr *a = acquire(A, obj, name, optional);
    if (a) a->output = output;
    return a;
}

void smla_args_release(smla_args *A)
{
    /* A DLPack deleter (or the last reference to an array) may run Python code, e.g. a producer written
     * in Python, which must not start with the call's exception pending (it would become SystemError):
     * set it aside and restore it. An error raised by a deleter itself has no caller to go to. */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
#endif
    for (int i = 0; i < A->n; i++) {
        smla_arr *a = &A->arrs[i];
        Py_CLEAR(a->array);
        Py_CLEAR(a->made);
        if (a->managed) {
            if (a->versioned) {
                smla_dl_managed_v *m = a->managed;
                if (m->deleter) m->deleter(m);
            } else {
                smla_dl_managed *m = a->managed;
                if (m->deleter) m->deleter(m);
            }
            a->managed = NULL;
        }
        if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    }
    A->n = 0;
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(exc_type, exc_value, exc_tb);
#endif
}

/* ---- outputs made by the op (smla._C.ALLOCATE) ---- */

static int numpy_typenum(smla_state *S, int dtype)
{
    switch (dtype) {
    case SMLA_DT_BF16: return S->bf16_typenum;
    case SMLA_DT_F16: return NPY_FLOAT16;
    case SMLA_DT_F32: return NPY_FLOAT32;
    case SMLA_DT_I32: return NPY_INT32;
    case SMLA_DT_U8: return NPY_UINT8;
    default: return -1;
    }
}

static smla_dl_dtype dl_dtype_of(int dtype)
{
    smla_dl_dtype t = {0, 0, 1};
    switch (dtype) {
    case SMLA_DT_BF16: t.code = SMLA_DL_BFLOAT; t.bits = 16; break;
    case SMLA_DT_F16: t.code = SMLA_DL_FLOAT; t.bits = 16; break;
    case SMLA_DT_F32: t.code = SMLA_DL_FLOAT; t.bits = 32; break;
    case SMLA_DT_I32: t.code = SMLA_DL_INT; t.bits = 32; break;
    case SMLA_DT_U8: t.code = SMLA_DL_UINT; t.bits = 8; break;
    default: t.lanes = 0; break;
    }
    return t;
}

typedef int (*smla_dl_alloc_fn)(smla_dl_tensor *prototype, smla_dl_managed_v **out, void *error_ctx,
                                void (*set_error)(void *error_ctx, const char *kind, const char *message));
typedef int (*smla_dl_to_py_fn)(smla_dl_managed_v *tensor, void **py_obj_out);

/* The allocator's error report, kept for the exception raised after it returns. */
typedef struct {
    char kind[64], message[256];
} alloc_error;

static void record_alloc_error(void *ctx, const char *kind, const char *message)
{
    alloc_error *e = ctx;
    snprintf(e->kind, sizeof e->kind, "%s", kind ? kind : "Error");
    snprintf(e->message, sizeof e->message, "%s", message ? message : "");
}

/* The exchange API of obj's type when it can make arrays (an allocator and the conversion to a Python
 * object), else NULL; *cap as for exchange_api (NULL when the result is NULL). */
static const smla_dl_exchange_api *allocator_api(smla_state *S, PyObject *obj, PyObject **cap)
{
    const smla_dl_exchange_api *api = exchange_api(S, obj, cap);
    if (api && api->managed_tensor_allocator && api->managed_tensor_to_py_object_no_sync) return api;
    Py_CLEAR(*cap);
    return NULL;
}

int smla_can_allocate(smla_state *S, PyObject *obj)
{
    if (PyArray_Check(obj)) return 1;
    PyObject *cap;
    const smla_dl_exchange_api *api = allocator_api(S, obj, &cap);
    Py_XDECREF(cap);
    return api != NULL;
}

/* After memory was made through api on the call's CUDA device: remember the framework's current stream
 * when the launch goes elsewhere (smla_args_join). 0, or -1 with an exception. */
static int note_alloc_stream(smla_args *A, const smla_dl_exchange_api *api, const char *name)
{
    if (A->device != SMLA_DEV_CUDA || api == A->stream_api) return 0; /* launched on that very stream */
    void *cur = NULL;
    if (api->current_work_stream(SMLA_DL_CUDA, A->device_id, &cur) != 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_BufferError, "%s: current stream query failed", name);
        return -1;
    }
    if (cur != A->stream) {
        A->alloc_stream = cur;
        A->join = 1;
    }
    return 0;
}

/* A new DLPack tensor from api's allocator (shape[ndim] of dtype on the call's device), or NULL with an
 * exception naming `name`. */
static smla_dl_managed_v *alloc_managed(smla_args *A, const smla_dl_exchange_api *api, PyObject *like,
                                        const char *name, int ndim, const int64_t *shape, int dtype)
{
    int64_t shp[SMLA_MAX_NDIM];
    for (int i = 0; i < ndim; i++) shp[i] = shape[i];
    smla_dl_tensor proto;
    memset(&proto, 0, sizeof proto);
    proto.device.device_type = A->device == SMLA_DEV_CUDA ? SMLA_DL_CUDA : SMLA_DL_CPU;
    proto.device.device_id = A->device_id;
    proto.ndim = ndim;
    proto.dtype = dl_dtype_of(dtype);
    proto.shape = shp;
    alloc_error err = {"", ""};
    smla_dl_managed_v *m = NULL;
    if (((smla_dl_alloc_fn)api->managed_tensor_allocator)(&proto, &m, &err, record_alloc_error) != 0 || !m) {
        if (!PyErr_Occurred())
            PyErr_Format(strstr(err.kind, "Memory") ? PyExc_MemoryError : PyExc_RuntimeError,
                         "%s: %.100s could not allocate it (%s%s%s)", name, Py_TYPE(like)->tp_name,
                         err.kind[0] ? err.kind : "no error reported", err.message[0] ? ": " : "", err.message);
        return NULL;
    }
    if (note_alloc_stream(A, api, name) < 0) {
        if (m->deleter) m->deleter(m);
        return NULL;
    }
    return m;
}

/* The allocator of like's framework, or NULL with TypeError naming `name` (*cap as for exchange_api). */
static const smla_dl_exchange_api *allocator_of(smla_args *A, PyObject *like, const char *name, PyObject **cap)
{
    const smla_dl_exchange_api *api = allocator_api(A->state, like, cap);
    if (!api)
        PyErr_Format(PyExc_TypeError, "%s: smla cannot allocate it for a %.100s array (its type has no DLPack "
                     "exchange API allocator): pass it", name, Py_TYPE(like)->tp_name);
    return api;
}

/* A new array of the framework of `like` (see smla_args_alloc), or NULL with an exception. */
static PyObject *make_like(smla_args *A, PyObject *like, const char *name, int ndim, const int64_t *shape, int dtype)
{
    smla_state *S = A->state;
    if (PyArray_Check(like)) {
        npy_intp dims[SMLA_MAX_NDIM];
        for (int i = 0; i < ndim; i++) dims[i] = (npy_intp)shape[i];
        const int typenum = numpy_typenum(S, dtype);
        if (typenum < 0) {
            PyErr_Format(PyExc_TypeError, "%s: NumPy has no %s type here (install ml_dtypes)", name,
                         smla_dtype_name(dtype));
            return NULL;
        }
        return PyArray_SimpleNew(ndim, dims, typenum);
    }
    PyObject *cap;
    const smla_dl_exchange_api *api = allocator_of(A, like, name, &cap);
    if (!api) return NULL;
    smla_dl_managed_v *m = alloc_managed(A, api, like, name, ndim, shape, dtype);
    void *obj = NULL;
    int rc = -1;
    if (m) {
        rc = ((smla_dl_to_py_fn)api->managed_tensor_to_py_object_no_sync)(m, &obj);
        if (rc != 0 && !obj && m->deleter) m->deleter(m); /* not taken over */
    }
    Py_DECREF(cap);
    if (rc != 0 || !obj) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "%s: %.100s could not wrap the memory it made", name,
                         Py_TYPE(like)->tp_name);
        Py_XDECREF((PyObject *)obj);
        return NULL;
    }
    return obj;
}

int smla_args_scratch(smla_args *A, smla_arr *a, int64_t nbytes)
{
    if (!a->pending) return 0;
    PyObject *like = A->alloc_like ? A->alloc_like : A->first_obj;
    if (!like || PyArray_Check(like)) return 0;
    PyObject *cap;
    const smla_dl_exchange_api *api = allocator_of(A, like, a->name, &cap);
    if (!api) return -1;
    smla_dl_managed_v *m = alloc_managed(A, api, like, a->name, 1, &nbytes, SMLA_DT_U8);
    Py_DECREF(cap);
    if (!m) return -1;
    a->managed = m; /* deleted by smla_args_release, after the launch */
    a->versioned = 1;
    if (fill_from_dltensor(a, &m->dl_tensor) < 0) return -1;
    a->present = 1;
    a->pending = 0;
    a->output = 1;
    return 0;
}

#ifdef SMLA_WITH_CUDA
int smla_args_join(const smla_args *A, smla_status *st)
{
    return smla_cuda_stream_wait(A->alloc_stream, A->stream, st);
}
#else
int smla_args_join(const smla_args *A, smla_status *st)
{
    (void)A;
    (void)st;
    return SMLA_OK;
}
#endif

int smla_args_alloc(smla_args *A, smla_arr *a, int ndim, const int64_t *shape, int dtype)
{
    if (!a->pending) return 0;
    PyObject *like = A->alloc_like ? A->alloc_like : A->first_obj;
    if (!like) {
        PyErr_Format(PyExc_TypeError, "%s: no array argument to allocate it like", a->name);
        return -1;
    }
    PyObject *obj = make_like(A, like, a->name, ndim, shape, dtype);
    if (!obj) return -1;
    /* acquire it in a's slot, as if the caller had passed it */
    const int n = A->n;
    A->n = (int)(a - A->arrs);
    smla_arr *b = acquire(A, obj, a->name, 0);
    A->n = n;
    if (!b) {
        Py_DECREF(obj);
        return -1;
    }
    b->output = 1;
    b->made = obj;
    return 0;
}

PyObject *smla_args_result(int n, smla_arr *const *outs, PyObject *const *given)
{
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *o = outs[i]->made ? outs[i]->made : given[i];
        Py_INCREF(o);
        PyTuple_SET_ITEM(t, i, o);
    }
    return t;
}

int smla_check_dtype(const smla_arr *a, int n_allowed, const int *allowed)
{
    for (int i = 0; i < n_allowed; i++)
        if (a->dtype == allowed[i]) return 0;
    char buf[160] = "";
    for (int i = 0; i < n_allowed; i++) {
        strncat(buf, i ? (i == n_allowed - 1 ? " or " : ", ") : "", sizeof buf - strlen(buf) - 1);
        strncat(buf, smla_dtype_name(allowed[i]), sizeof buf - strlen(buf) - 1);
    }
    PyErr_Format(PyExc_TypeError, "%s: expected %s, got %s", a->name, buf, smla_dtype_name(a->dtype));
    return -1;
}

int smla_check_ndim(const smla_arr *a, int ndim)
{
    if (a->ndim == ndim) return 0;
    PyErr_Format(PyExc_ValueError, "%s: expected %d dimensions, got %d", a->name, ndim, a->ndim);
    return -1;
}

int smla_check_dim(const smla_arr *a, int dim, int64_t expected, const char *what)
{
    if (a->shape[dim] == expected) return 0;
    PyErr_Format(PyExc_ValueError, "%s: expected shape[%d] == %lld (%s), got %lld", a->name, dim,
                 (long long)expected, what, (long long)a->shape[dim]);
    return -1;
}

int smla_check_same_dim(const smla_arr *a, int dim, const smla_arr *b, int bdim)
{
    if (a->shape[dim] == b->shape[bdim]) return 0;
    PyErr_Format(PyExc_ValueError, "%s: expected shape[%d] == %lld to match %s.shape[%d], got %lld", a->name,
                 dim, (long long)b->shape[bdim], b->name, bdim, (long long)a->shape[dim]);
    return -1;
}

/* An empty array has nothing to lay out: producers report arbitrary strides for it. */
static int is_empty(const smla_arr *a)
{
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] == 0) return 1;
    return 0;
}

int smla_check_last_contiguous(const smla_arr *a)
{
    if (a->ndim == 0 || is_empty(a) || a->shape[a->ndim - 1] <= 1 || a->strides[a->ndim - 1] == 1) return 0;
    PyErr_Format(PyExc_ValueError, "%s: the last dimension must be contiguous (stride 1), got stride %lld",
                 a->name, (long long)a->strides[a->ndim - 1]);
    return -1;
}

int smla_check_contiguous(const smla_arr *a)
{
    int64_t expect = 1;
    if (is_empty(a)) return 0;
    for (int i = a->ndim - 1; i >= 0; i--) {
        if (a->shape[i] > 1 && a->strides[i] != expect) {
            PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous array (stride of dimension %d is %lld, "
                         "expected %lld)", a->name, i, (long long)a->strides[i], (long long)expect);
            return -1;
        }
        expect *= a->shape[i];
    }
    return 0;
}

int smla_check_writable(const smla_arr *a)
{
    if (!a->readonly) return 0;
    PyErr_Format(PyExc_ValueError, "%s: output array is read-only", a->name);
    return -1;
}

int smla_check_int_index(const smla_arr *a)
{
    static const int ok[] = {SMLA_DT_I32};
    return smla_check_dtype(a, 1, ok);
}

int smla_check_int_index_64(const smla_arr *a)
{
    static const int ok[] = {SMLA_DT_I32, SMLA_DT_I64};
    return smla_check_dtype(a, 2, ok);
}

/* First and last byte an array occupies (negative strides included). 0: no elements; -1: the strides
 * reach outside the address space (ValueError). */
static int extent(const smla_arr *a, uintptr_t *first, uintptr_t *last)
{
    if (!a->present || is_empty(a)) return 0;
    int64_t lo = 0, hi = a->itemsize - 1;
    const uintptr_t p = (uintptr_t)a->data;
    for (int i = 0; i < a->ndim; i++) {
        int64_t d;
        if (a->shape[i] <= 1) continue;
        if (a->strides[i] == INT64_MIN || __builtin_mul_overflow(a->shape[i] - 1, a->strides[i], &d) ||
            __builtin_mul_overflow(d, (int64_t)a->itemsize, &d) ||
            (d < 0 ? __builtin_add_overflow(lo, d, &lo) : __builtin_add_overflow(hi, d, &hi)))
            goto outside;
    }
    const uintptr_t below = (uintptr_t)0 - (uintptr_t)lo; /* |lo| */
    if (p < below || UINTPTR_MAX - p < (uintptr_t)hi) goto outside;
    *first = p - below;
    *last = p + (uintptr_t)hi;
    return 1;
outside:
    PyErr_Format(PyExc_ValueError, "%s: its strides reach outside the address space", a->name);
    return -1;
}

/* An array as rows of bytes from its dimension of largest |stride|: row r covers [start + r * step,
 * start + r * step + width). 0 when its rows are wider than their step (they would not be disjoint). */
static int as_rows(const smla_arr *a, int64_t *start, int64_t *step, int64_t *width, int64_t *rows)
{
    int outer = -1;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] > 1 && (outer < 0 || llabs(a->strides[i]) > llabs(a->strides[outer]))) outer = i;
    int64_t lo = 0, hi = a->itemsize - 1; /* partial sums of extent()'s: no overflow */
    for (int i = 0; i < a->ndim; i++) {
        if (i == outer || a->shape[i] <= 1) continue;
        const int64_t d = (a->shape[i] - 1) * a->strides[i] * a->itemsize;
        if (d < 0) lo += d;
        else hi += d;
    }
    *start = (int64_t)(intptr_t)a->data + lo;
    *width = hi - lo + 1;
    *rows = outer < 0 ? 1 : a->shape[outer];
    *step = 0;
    if (outer < 0) return 1;
    const int64_t s = a->strides[outer] * a->itemsize;
    if (s < 0) *start += (a->shape[outer] - 1) * s;
    *step = llabs(s);
    return *width <= *step;
}

/* Whether two arrays whose extents overlap still share no byte, decided exactly when both are rows of
 * one step (e.g. two column ranges of one buffer); 0 = assume they overlap. */
static int rows_disjoint(const smla_arr *a, const smla_arr *b)
{
    int64_t a0, sa, wa, na, b0, sb, wb, nb;
    if (!as_rows(a, &a0, &sa, &wa, &na) || !as_rows(b, &b0, &sb, &wb, &nb)) return 0;
    if (na == 1) sa = sb;
    if (nb == 1) sb = sa;
    if (sa != sb || sa == 0) return 0;
    /* row i of a and row j of b meet iff delta - wa < (i - j) * s < delta + wb, delta = b0 - a0: try
     * the smallest d = i - j above the lower bound */
    const int64_t s = sa, delta = b0 - a0, x = delta - wa;
    int64_t d = x / s - (x % s != 0 && x < 0) + 1;
    if (d < 1 - nb) d = 1 - nb;
    return !(d <= na - 1 && d * s < delta + wb);
}

/* Every element at its own address: with the dimensions of size > 1 sorted by |stride|, each stride
 * must step over everything the smaller ones reach. This refuses stride 0 and overlapping strides (and
 * the rare interleaved layouts that do not overlap, which no producer makes for an output). */
static int check_distinct_elements(const smla_arr *a)
{
    int dims[SMLA_MAX_NDIM], n = 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] > 1) dims[n++] = i;
    if (is_empty(a)) return 0;
    for (int i = 1; i < n; i++) /* insertion sort by |stride| */
        for (int j = i; j > 0 && llabs(a->strides[dims[j]]) < llabs(a->strides[dims[j - 1]]); j--) {
            int t = dims[j];
            dims[j] = dims[j - 1];
            dims[j - 1] = t;
        }
    int64_t reach = 0; /* largest element offset the dimensions so far can produce */
    for (int k = 0; k < n; k++) {
        const int d = dims[k];
        const int64_t s = llabs(a->strides[d]);
        if (s == 0) {
            PyErr_Format(PyExc_ValueError, "%s: stride 0 over dimension %d (size %lld) makes its elements "
                         "overlap in memory; pass an array whose elements are distinct", a->name, d,
                         (long long)a->shape[d]);
            return -1;
        }
        if (s <= reach) {
            PyErr_Format(PyExc_ValueError, "%s: its elements overlap in memory (stride %lld of dimension %d "
                         "steps inside the span of the smaller strides); pass an array whose elements are "
                         "distinct", a->name, (long long)a->strides[d], d);
            return -1;
        }
        int64_t span;
        if (__builtin_mul_overflow(s, a->shape[d] - 1, &span) || __builtin_add_overflow(reach, span, &reach)) {
            PyErr_Format(PyExc_ValueError, "%s: its strides reach outside the address space", a->name);
            return -1;
        }
    }
    return 0;
}

/* The same view: same first element and element type, same shape, and the same strides over every
 * dimension with more than one element. */
static int same_view(const smla_arr *a, const smla_arr *b)
{
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->strides[i] != b->strides[i])) return 0;
    return 1;
}

int smla_check_outputs(const smla_args *A, const smla_arr *const *same, int n_same)
{
    uintptr_t first[SMLA_MAX_ARGS], last[SMLA_MAX_ARGS];
    int has[SMLA_MAX_ARGS];
    for (int i = 0; i < A->n; i++) {
        const smla_arr *a = &A->arrs[i];
        if ((has[i] = extent(a, &first[i], &last[i])) < 0) return -1;
        if (a->output && has[i] && check_distinct_elements(a)) return -1;
    }
    /* Memory extents [first byte, last byte], refined for arrays that are rows of one step: cheap, no
     * device access (arrays of one device share one address space), and exact for the layouts buffers
     * are cut from (row ranges, column ranges); other interleavings count as overlapping. */
    for (int i = 0; i < A->n; i++) {
        const smla_arr *o = &A->arrs[i];
        if (!o->output || !has[i]) continue;
        for (int j = 0; j < A->n; j++) {
            const smla_arr *x = &A->arrs[j];
            /* two outputs are compared once, named by the later one */
            if (j == i || !has[j] || (x->output && j > i) || last[i] < first[j] || last[j] < first[i] ||
                rows_disjoint(o, x))
                continue;
            int in_place = 0;
            for (int k = 0; k < n_same; k++)
                if (same[2 * k] == o && same[2 * k + 1] == x) in_place = 1;
            if (in_place && same_view(o, x)) continue;
            if (in_place)
                PyErr_Format(PyExc_ValueError, "%s: overlaps %s in memory; pass separate buffers, or %s itself "
                             "(the same view) to work in place", o->name, x->name, x->name);
            else
                PyErr_Format(PyExc_ValueError, "%s: overlaps %s in memory; pass separate buffers", o->name,
                             x->name);
            return -1;
        }
    }
    return 0;
}

int smla_parse_cache_dtype(const char *s)
{
    /* canonical names only: vLLM's aliases are mapped by smla.ops.canonical_cache_dtype */
    if (!strcmp(s, "bf16")) return SMLA_CACHE_BF16;
    if (!strcmp(s, "fp8_ds_mla")) return SMLA_CACHE_FP8_DS_MLA;
    PyErr_Format(PyExc_ValueError, "kv_cache_dtype: expected \"bf16\" or \"fp8_ds_mla\", got \"%s\"", s);
    return -1;
}

const char *const smla_precision_names[SMLA_PRECISION_NAMES] = {[SMLA_PRECISION_HIGH] = "high",
                                                                 [SMLA_PRECISION_FAST] = "fast"};

int smla_parse_precision(const char *s)
{
    for (int i = 0; i < SMLA_PRECISION_NAMES; i++)
        if (!strcmp(s, smla_precision_names[i])) return i;
    PyErr_Format(PyExc_ValueError, "precision: expected \"high\" or \"fast\", got \"%s\"", s);
    return -1;
}

int smla_get_cache(const smla_arr *a, int cache_dtype, smla_cache *c)
{
    static const int fp8_types[] = {SMLA_DT_U8, SMLA_DT_F8E4M3, SMLA_DT_I8};
    static const int bf16_types[] = {SMLA_DT_BF16, SMLA_DT_U16};
    int fp8 = cache_dtype == SMLA_CACHE_FP8_DS_MLA;
    if (fp8 ? smla_check_dtype(a, 3, fp8_types) : smla_check_dtype(a, 2, bf16_types)) return -1;
    if (smla_check_ndim(a, 3)) return -1;
    if (smla_check_dim(a, 2, fp8 ? SMLA_FP8_ENTRY : SMLA_D_QK,
                       fp8 ? "fp8_ds_mla entry bytes" : "bf16 entry of 576 values"))
        return -1;
    if (smla_check_last_contiguous(a)) return -1;
    if (a->strides[0] < 0 || a->strides[1] < 0) {
        PyErr_Format(PyExc_ValueError, "%s: negative strides are not supported", a->name);
        return -1;
    }
    c->data = a->data;
    c->dtype = cache_dtype;
    c->num_blocks = a->shape[0];
    c->block_size = a->shape[1];
    c->block_stride = a->strides[0] * a->itemsize;
    c->entry_stride = a->strides[1] * a->itemsize;
    return 0;
}

PyObject *smla_raise_status(smla_state *S, const smla_status *st)
{
    PyObject *type;
    switch (st->code) {
    case SMLA_ERR_TYPE: type = PyExc_TypeError; break;
    case SMLA_ERR_CUDA: type = S->cuda_error; break;
    case SMLA_ERR_NOMEM: type = PyExc_MemoryError; break;
    case SMLA_ERR_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    case SMLA_ERR_BUFFER: type = PyExc_BufferError; break;
    default: type = PyExc_ValueError; break;
    }
    PyErr_SetString(type, st->msg[0] ? st->msg : "smla: unknown error");
    return NULL;
}

int smla_device_enter(smla_args *A, int *prev)
{
    *prev = -1;
    if (A->device != SMLA_DEV_CUDA) return 0;
#ifdef SMLA_WITH_CUDA
    smla_status st = {0, {0}};
    if (smla_cuda_set_device(A->device_id, prev, &st) != SMLA_OK) {
        smla_raise_status(A->state, &st);
        return -1;
    }
    return 0;
#else
    PyErr_SetString(PyExc_NotImplementedError, "smla was built without CUDA support; pass CPU arrays");
    return -1;
#endif
}

void smla_device_exit(smla_args *A, int prev)
{
#ifdef SMLA_WITH_CUDA
    if (A->device == SMLA_DEV_CUDA) smla_cuda_restore_device(prev);
#else
    (void)A;
    (void)prev;
#endif
}
