/* smla._C: module definition, state (ml_dtypes type numbers, smla.CudaError) and build info. */
#define SMLA_MODULE_MAIN
#include "binding.h"
#include "np.h"
#include "cpu/cpu_features.h"

static PyObject *cuda_device_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
#ifdef SMLA_WITH_CUDA
    return PyLong_FromLong(smla_cuda_device_count());
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    smla_run run;
    if (smla_read_settings(&run) < 0) return NULL;
#ifdef SMLA_WITH_CUDA
    const char *rt = smla_cuda_runtime_version();
    int cuda = 1;
#else
    const char *rt = "none";
    int cuda = 0;
#endif
#ifdef SMLA_CUDA_ARCHS
    const char *archs = SMLA_CUDA_ARCHS;
#else
    const char *archs = "";
#endif
#ifdef SMLA_DEBUG_BUILD
    int debug = 1;
#else
    int debug = 0;
#endif
#ifdef SMLA_ATTN_ABLATION
    int ablation = 1;
#else
    int ablation = 0;
#endif
    return Py_BuildValue("{s:O,s:s,s:s,s:O,s:O,s:s,s:s,s:s}", "cuda", cuda ? Py_True : Py_False, "cuda_runtime", rt,
                         "cuda_archs", archs, "debug", debug ? Py_True : Py_False, "ablation",
                         ablation ? Py_True : Py_False, "cpu_isa",
                         run.emulated_bf16 ? "avx2-emulated-bf16" : smla_cpu_isa_name(run.cpu_isa),
                         "cpu_isa_default", smla_cpu_isa_name(smla_cpu_isa_default()), "compiler",
#if defined(__clang__)
                         "clang " __clang_version__
#elif defined(__GNUC__)
                         "gcc " __VERSION__
#else
                         "unknown"
#endif
    );
}

static PyObject *can_allocate(PyObject *module, PyObject *obj)
{
    return PyBool_FromLong(smla_can_allocate(smla_get_state(module), obj));
}

/* Every op takes keyword arguments only (kwargs.h; src/smla/_C.pyi lists them). */
#define SMLA_METHOD(name) {#name, (PyCFunction)(void (*)(void))smla_op_##name, METH_FASTCALL | METH_KEYWORDS, NULL},
static PyMethodDef methods[] = {
    SMLA_OPS(SMLA_METHOD)
    {"cuda_device_count", cuda_device_count, METH_NOARGS, "Number of usable CUDA devices (0 without a driver)."},
    {"build_info", build_info, METH_NOARGS, "How this extension was built."},
    {"can_allocate", can_allocate, METH_O,
     "Whether an op can allocate its outputs (passed as ALLOCATE) like this array: NumPy, or a type whose "
     "DLPack exchange API has an allocator."},
    {NULL, NULL, 0, NULL},
};

/* Type number of an ml_dtypes scalar type, or -1 when ml_dtypes is missing. */
static int ml_dtypes_typenum(PyObject *mod, const char *name)
{
    if (!mod) return -1;
    PyObject *type = PyObject_GetAttrString(mod, name);
    PyArray_Descr *descr = NULL;
    int t = -1;
    if (type && PyArray_DescrConverter(type, &descr)) {
        t = descr->type_num;
        Py_DECREF(descr);
    }
    Py_XDECREF(type);
    PyErr_Clear();
    return t;
}

static int module_exec(PyObject *m)
{
    if (PyArray_ImportNumPyAPI() < 0) return -1;
    smla_state *S = smla_get_state(m);
    S->cuda_error = PyErr_NewExceptionWithDoc("smla.CudaError", "A CUDA call made by smla failed.",
                                              PyExc_RuntimeError, NULL);
    if (!S->cuda_error) return -1;
    Py_INCREF(S->cuda_error);
    if (PyModule_AddObject(m, "CudaError", S->cuda_error) < 0) {
        Py_DECREF(S->cuda_error);
        return -1;
    }
    for (int i = 0; i < SMLA_N_COUNT; i++)
        if (!(S->names[i] = PyUnicode_InternFromString(smla_arg_names[i]))) return -1;
    if (!(S->str_dlpack = PyUnicode_InternFromString("__dlpack__")) ||
        !(S->str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) ||
        !(S->kw_stream_version = Py_BuildValue("(ss)", "stream", "max_version")) ||
        !(S->kw_stream = Py_BuildValue("(s)", "stream")) || !(S->max_version = Py_BuildValue("(ii)", 1, 3)))
        return -1;
    /* an output argument the op allocates itself, with the framework of its first array */
    if (!(S->allocate = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) ||
        PyModule_AddObjectRef(m, "ALLOCATE", S->allocate) < 0)
        return -1;
    /* the limits and sizes the Python layer uses, from their one definition (core/smla.h) */
    if (PyModule_AddIntConstant(m, "MAX_HEADS", SMLA_MAX_HEADS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_TOPK", SMLA_MAX_TOPK) < 0 ||
        PyModule_AddIntConstant(m, "D_NOPE", SMLA_D_NOPE) < 0 || PyModule_AddIntConstant(m, "D_ROPE", SMLA_D_ROPE) < 0 ||
        PyModule_AddIntConstant(m, "D_QK", SMLA_D_QK) < 0 || PyModule_AddIntConstant(m, "D_V", SMLA_D_V) < 0 ||
        PyModule_AddIntConstant(m, "FP8_ENTRY_BYTES", SMLA_FP8_ENTRY) < 0)
        return -1;
    /* the precision= names the binding accepts, for the layer config's check at construction */
    PyObject *prec = Py_BuildValue("(ss)", smla_precision_names[SMLA_PRECISION_HIGH],
                                   smla_precision_names[SMLA_PRECISION_FAST]);
    if (!prec || PyModule_AddObjectRef(m, "PRECISIONS", prec) < 0) {
        Py_XDECREF(prec);
        return -1;
    }
    Py_DECREF(prec);
    PyObject *ml = PyImport_ImportModule("ml_dtypes");
    if (!ml) PyErr_Clear();
    S->bf16_typenum = ml_dtypes_typenum(ml, "bfloat16");
    S->e4m3_typenum = ml_dtypes_typenum(ml, "float8_e4m3fn");
    Py_XDECREF(ml);
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    smla_state *S = smla_get_state(m);
    Py_VISIT(S->cuda_error);
    Py_VISIT(S->api_type);
    Py_VISIT(S->api_capsule);
    Py_VISIT(S->allocate);
    return 0;
}

static int module_clear(PyObject *m)
{
    smla_state *S = smla_get_state(m);
    Py_CLEAR(S->cuda_error);
    S->api = NULL;
    Py_CLEAR(S->api_type);
    Py_CLEAR(S->api_capsule);
    Py_CLEAR(S->allocate);
    for (int i = 0; i < SMLA_N_COUNT; i++) Py_CLEAR(S->names[i]);
    Py_CLEAR(S->str_dlpack);
    Py_CLEAR(S->str_dlpack_device);
    Py_CLEAR(S->kw_stream_version);
    Py_CLEAR(S->kw_stream);
    Py_CLEAR(S->max_version);
    return 0;
}

/* Deallocation without a garbage-collector pass calls m_free, not m_clear. */
static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot slots[] = {{Py_mod_exec, module_exec}, {0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "smla._C", "smla's C extension: sparse MLA kernels for CPU and CUDA.",
    sizeof(smla_state), methods, slots, module_traverse, module_clear, module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&moduledef); }
