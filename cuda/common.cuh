// Shared by every cuda/*.cu file: the params header, error plumbing and number formats on the device.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "../csrc/params.h"

// Records the failing call, file:line and device in st and returns from the launcher.
#define SMLA_CUDA_CHECK(st, call)                                                             \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            int dev_ = -1;                                                                    \
            cudaGetDevice(&dev_);                                                             \
            return smla_fail((st), SMLA_ERR_CUDA, "%s failed: %s (%s) at %s:%d on device %d", \
                             #call, cudaGetErrorString(err_), cudaGetErrorName(err_),         \
                             __FILE__, __LINE__, dev_);                                       \
        }                                                                                     \
    } while (0)

// After a launch: configuration errors surface here (not the kernel's own faults, which are
// asynchronous and reported by a later call, as with every CUDA library).
#define SMLA_CUDA_LAUNCH_CHECK(st) SMLA_CUDA_CHECK(st, cudaGetLastError())

static inline cudaStream_t smla_stream(void *s) { return reinterpret_cast<cudaStream_t>(s); }

static inline int64_t smla_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- number formats on the device (bit-exact with csrc/cpu/numerics.h) ----
__device__ __forceinline__ float smla_dev_bf16_to_f32(uint16_t h)
{
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ uint16_t smla_dev_f32_to_bf16(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

__device__ __forceinline__ float smla_dev_e4m3_to_f32(uint8_t b)
{
    __nv_fp8_e4m3 v;
    v.__x = b;
    return static_cast<float>(v);
}

__device__ __forceinline__ uint8_t smla_dev_f32_to_e4m3(float f)
{
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

// Smallest power of two >= x for finite positive x; Inf stays Inf (matches smla_pow2_ceil).
__device__ __forceinline__ float smla_dev_pow2_ceil(float x)
{
    uint32_t u = __float_as_uint(x);
    if (u >= 0x7f800000u) return x;
    if (u & 0x007fffffu) {
        if (u < 0x00800000u) return __uint_as_float(0x00800000u);
        u = (u & 0x7f800000u) + 0x00800000u;
    }
    return __uint_as_float(u);
}
