/* One NumPy C-API table for the whole extension: module.c imports it, other files refer to it. */
#ifndef SMLA_NP_H
#define SMLA_NP_H
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL smla_ARRAY_API
#ifndef SMLA_MODULE_MAIN
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
#endif
