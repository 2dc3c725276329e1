/* smla core definitions shared by the bindings (csrc/), the CPU kernels (csrc/cpu/) and the CUDA
 * kernels (cuda/). Plain C, no Python: kernels include this and params.h only. */
#ifndef SMLA_H
#define SMLA_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Model dims of DeepSeek-V3.2 MLA (docs/design.md section 3). */
#define SMLA_D_NOPE 512     /* kv_lora_rank: latent part, also d_v */
#define SMLA_D_ROPE 64      /* rope_dim */
#define SMLA_D_QK 576       /* d_qk = 512 + 64 */
#define SMLA_D_V 512
/* The fp8_ds_mla entry layout (SMLA_FP8_*) and scale rules (SMLA_SCALE_*): core/fp8_ds_mla.h. */

/* Limits, one owner each: the checks at the edge (csrc/python) and the kernels use these names, and the
 * Python layer reads them from the extension (smla._C.MAX_HEADS). */
#define SMLA_MAX_HEADS 128  /* query heads per call: 1..128 (no padding; the model has 128) */
#define SMLA_MAX_TOPK (INT32_MAX / 2) /* indices per query token: 1..2^30 - 1 (int32 positions, with room) */

/* A function the CPU code and the CUDA kernels share (rules written once: csrc/core/). */
#if defined(__CUDACC__)
#define SMLA_HD static __host__ __device__ __forceinline__
#else
#define SMLA_HD static inline
#endif

/* Status codes: C never exits or prints; it fills a status and the binding raises. */
typedef enum {
    SMLA_OK = 0,
    SMLA_ERR_VALUE = 1,       /* -> ValueError */
    SMLA_ERR_TYPE = 2,        /* -> TypeError */
    SMLA_ERR_CUDA = 3,        /* -> smla.CudaError */
    SMLA_ERR_NOMEM = 4,       /* -> MemoryError */
    SMLA_ERR_UNSUPPORTED = 5, /* -> NotImplementedError */
    SMLA_ERR_BUFFER = 6       /* -> BufferError */
} smla_code;

#define SMLA_MSG_LEN 512
typedef struct {
    int code;
    char msg[SMLA_MSG_LEN];
} smla_status;

/* Fills st (code + printf-style message) and returns code. Defined in csrc/core/status.c. */
int smla_fail(smla_status *st, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Element types as seen by smla (from NumPy dtypes or DLPack codes). */
typedef enum {
    SMLA_DT_INVALID = 0,
    SMLA_DT_BF16,
    SMLA_DT_F16,
    SMLA_DT_F32,
    SMLA_DT_F64,
    SMLA_DT_I32,
    SMLA_DT_I64,
    SMLA_DT_U8,
    SMLA_DT_U16,
    SMLA_DT_I8,
    SMLA_DT_F8E4M3,
    SMLA_DT_COUNT
} smla_dtype;

typedef enum { SMLA_DEV_CPU = 1, SMLA_DEV_CUDA = 2 } smla_device;

/* KV cache layouts (docs/design.md section 3). */
typedef enum { SMLA_CACHE_BF16 = 0, SMLA_CACHE_FP8_DS_MLA = 1 } smla_cache_dtype;

/* precision= of the attention ops (docs/design.md section 4): high keeps the probabilities at ~16 bits
 * in P V, fast may round them to bf16 (one MMA). A kernel without a fast variant runs high. */
typedef enum { SMLA_PRECISION_HIGH = 0, SMLA_PRECISION_FAST = 1 } smla_precision;

#ifdef __cplusplus
}
#endif

#endif /* SMLA_H */
