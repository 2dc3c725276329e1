// Shared by every cuda/*.cu file: the params header, error plumbing and number formats on the device.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "core/params.h"

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

// ---- programmatic dependent launch (PDL, sm_90+; the device code is a no-op before) ----
// Every smla kernel is launched with the programmatic-stream-serialization attribute where the device
// supports it (smla_launch). It lets a kernel be scheduled before the one it follows has finished, and the
// launch itself is cheaper on the host: tools/launch_cost.cu measured an empty kernel at 3.8-4.1 us of host
// time with it against 4.8-5.0 us with <<<>>> (H200 host; the per-op times of tools/host_overhead.py did
// not show the difference above that host's drift). So every kernel calls pdl_wait() before its first
// global-memory access: it
// returns once the previous kernel of the stream has completed and its writes are visible (at once when
// there is none, or when the kernel was launched without the attribute). A kernel that calls
// pdl_launch_dependents() lets the next one be scheduled from then on (the attention kernels, for the
// split combine).
__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Per-device "done once" flags (a kernel's shared-memory attribute set, a device's properties read);
// a device past kMaxDevices is never marked, so its work is redone on every call.
constexpr int kMaxDevices = 64;
struct OncePerDevice {
    bool done[kMaxDevices];
    bool needed(int dev) const { return dev < 0 || dev >= kMaxDevices || !done[dev]; }
    void mark(int dev)
    {
        if (dev >= 0 && dev < kMaxDevices) done[dev] = true;
    }
};

// Whether the current device takes the PDL attribute (compute capability >= 9.0); one cudaGetDevice per
// call, the attribute read once per device (runtime.cu).
bool smla_pdl_supported();

// kern<<<grid, block, smem, s>>>(args...) through cudaLaunchKernelEx, with the PDL attribute where the
// device supports it, a cluster of `cluster` CTAs along x when > 1, and as a cooperative launch (every CTA
// resident at once, so the kernel may use a grid-wide barrier) when `cooperative`. Returns the launch's
// error, which is also the runtime's last error (SMLA_CUDA_LAUNCH_CHECK after it reports it).
template <typename... KArgs, typename... Args>
cudaError_t smla_launch_ex(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int cluster,
                           bool cooperative, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[3];
    int n = 0;
    if (smla_pdl_supported()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    if (cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = static_cast<unsigned>(cluster);
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        ++n;
    }
    if (cooperative) {
        attr[n].id = cudaLaunchAttributeCooperative;
        attr[n].val.cooperative = 1;
        ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = static_cast<unsigned>(n);
    return cudaLaunchKernelEx(&cfg, kern, static_cast<Args &&>(args)...);
}

template <typename... KArgs, typename... Args>
cudaError_t smla_launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, int cluster,
                        Args &&...args)
{
    return smla_launch_ex(kern, grid, block, smem, s, cluster, false, static_cast<Args &&>(args)...);
}

// How many CTAs of kern (`threads` per CTA, `smem` dynamic bytes, clusters of `cluster`) the current device
// holds at once: the largest grid a cooperative launch may have (0 when the query fails). Call it after the
// kernel's shared-memory attribute is set; it costs a driver query, so callers keep the result per device.
template <typename... KArgs>
int64_t smla_resident_ctas(void (*kern)(KArgs...), int threads, size_t smem, int cluster, int sms)
{
    int n = 0;
    if (cluster > 1) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(cluster));
        cfg.blockDim = dim3(static_cast<unsigned>(threads));
        cfg.dynamicSmemBytes = smem;
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = static_cast<unsigned>(cluster);
        at.val.clusterDim.y = 1;
        at.val.clusterDim.z = 1;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return static_cast<int64_t>(n) * cluster;
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, threads, smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return static_cast<int64_t>(n) * sms;
}

// smla_resident_ctas of one kernel per device, found once by its launcher: fits(dev, grid) says whether a
// cooperative launch of `grid` CTAs can run (false past kMaxDevices or before set).
struct ResidentCtas {
    int64_t n[kMaxDevices] = {};
    void set(int dev, int64_t v)
    {
        if (dev >= 0 && dev < kMaxDevices) n[dev] = v;
    }
    bool fits(int dev, int64_t grid) const { return dev >= 0 && dev < kMaxDevices && grid <= n[dev]; }
};

static inline int64_t smla_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- number formats on the device: the scalar conversions and the fp8_ds_mla rules are csrc/core's
// (number_formats.h, fp8_ds_mla.h, host+device, through core/params.h); these are their vector twins ----

// Two bf16 (low half first) from two floats, each RNE (smla_f32_to_bf16 twice), in one
// cvt.rn.bf16x2.f32 (NaN -> 0x7fff). The only GPU packer: the memory ops and both attention kernels use it.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// The fp8_ds_mla read rule on the GPU (docs/design.md section 3; core/fp8_ds_mla.h's smla_fp8_dequant on
// two values), the form every kernel but the register kernel uses: two e4m3 bytes (low byte first) times the tile scale -> two
// bf16 (low first), bf16_rne(float(e4m3) * s).
// e4m3 -> f16 -> f32 is exact, the product is one fp32 rounding, the bf16 conversion one RNE.
__device__ __forceinline__ uint32_t dequant_e4m3x2(uint32_t two, float s)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
    float2 f = __half22float2(*reinterpret_cast<__half2 *>(&h));
    return pack_bf16x2(__fmul_rn(f.x, s), __fmul_rn(f.y, s));
}

// 4 e4m3 values (one word, low byte first) times s -> 4 bf16: lo (bytes 0, 1) and hi (bytes 2, 3), the same
// rule as dequant_e4m3x2; the conversion reads the word's upper half in place (no shift). Used by the
// register kernel (sm90/reg_kernel.cuh). Written out rather than as two dequant_e4m3x2 on a shared f16
// helper: that form reorders the register kernel's schedule (cuobjdump) away from the one measured.
__device__ __forceinline__ void dequant_e4m3x4(uint32_t four, float s, uint32_t &lo, uint32_t &hi)
{
    uint32_t h0, h1;
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(h0), "=r"(h1)
        : "r"(four));
    const float2 f0 = __half22float2(*reinterpret_cast<const __half2 *>(&h0));
    const float2 f1 = __half22float2(*reinterpret_cast<const __half2 *>(&h1));
    lo = pack_bf16x2(__fmul_rn(f0.x, s), __fmul_rn(f0.y, s));
    hi = pack_bf16x2(__fmul_rn(f1.x, s), __fmul_rn(f1.y, s));
}

// 8 e4m3 values (two words, low byte first) times s -> 8 bf16.
__device__ __forceinline__ uint4 dequant8(uint2 e, float s)
{
    return make_uint4(dequant_e4m3x2(e.x, s), dequant_e4m3x2(e.x >> 16, s), dequant_e4m3x2(e.y, s),
                      dequant_e4m3x2(e.y >> 16, s));
}
