/* The DLPack ABI (v1.x), restated from the DLPack specification: only what smla consumes. */
#ifndef SMLA_DLPACK_H
#define SMLA_DLPACK_H

#include <stdint.h>

enum { SMLA_DL_CPU = 1, SMLA_DL_CUDA = 2, SMLA_DL_CUDA_HOST = 3, SMLA_DL_CUDA_MANAGED = 13 };
enum {
    SMLA_DL_INT = 0, SMLA_DL_UINT = 1, SMLA_DL_FLOAT = 2, SMLA_DL_BFLOAT = 4,
    SMLA_DL_FLOAT8_E4M3FN = 10
};
#define SMLA_DL_FLAG_READ_ONLY 1ull

typedef struct { uint32_t major, minor; } smla_dl_version;
typedef struct { int32_t device_type, device_id; } smla_dl_device;
typedef struct { uint8_t code, bits; uint16_t lanes; } smla_dl_dtype;

typedef struct {
    void *data;
    smla_dl_device device;
    int32_t ndim;
    smla_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL = C-contiguous (before v1.2) */
    uint64_t byte_offset;
} smla_dl_tensor;

typedef struct smla_dl_managed {
    smla_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct smla_dl_managed *self);
} smla_dl_managed;

typedef struct smla_dl_managed_v {
    smla_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct smla_dl_managed_v *self);
    uint64_t flags;
    smla_dl_tensor dl_tensor;
} smla_dl_managed_v;

/* The C exchange API (DLPack 1.3): a function table a framework publishes on its tensor type as
 * `__dlpack_c_exchange_api__` (capsule "dlpack_exchange_api"). smla uses the non-owning view and the
 * current-stream query, which skip the Python-level __dlpack__ call on hot paths. */
typedef struct smla_dl_exchange_header {
    smla_dl_version version;
    struct smla_dl_exchange_header *prev_api;
} smla_dl_exchange_header;

typedef struct {
    smla_dl_exchange_header header;
    void *managed_tensor_allocator;
    void *managed_tensor_from_py_object_no_sync;
    void *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *py_object, smla_dl_tensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} smla_dl_exchange_api;

#endif /* SMLA_DLPACK_H */
