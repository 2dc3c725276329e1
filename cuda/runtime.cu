// Device discovery and selection for the bindings: the only CUDA runtime calls outside the launchers.
#include <stdio.h>

#include "common.cuh"

extern "C" int smla_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // no driver / no GPU: clear the sticky error, report none
        return 0;
    }
    return n;
}

extern "C" int smla_cuda_set_device(int device, int *prev, smla_status *st)
{
    *prev = -1;
    SMLA_CUDA_CHECK(st, cudaGetDevice(prev));
    if (*prev != device) SMLA_CUDA_CHECK(st, cudaSetDevice(device));
    return SMLA_OK;
}

extern "C" int smla_cuda_restore_device(int prev)
{
    int cur = -1;
    if (prev < 0 || cudaGetDevice(&cur) != cudaSuccess || cur == prev) return SMLA_OK;
    return cudaSetDevice(prev) == cudaSuccess ? SMLA_OK : SMLA_ERR_CUDA;
}

extern "C" int smla_cuda_stream_wait(void *waiter, void *on, smla_status *st)
{
    cudaEvent_t ev;
    SMLA_CUDA_CHECK(st, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    const char *call = "cudaEventRecord(ev, on)";
    cudaError_t err = cudaEventRecord(ev, smla_stream(on));
    if (err == cudaSuccess) {
        call = "cudaStreamWaitEvent(waiter, ev, 0)";
        err = cudaStreamWaitEvent(smla_stream(waiter), ev, 0);
    }
    cudaEventDestroy(ev); // its resources go once the wait is satisfied
    if (err != cudaSuccess) {
        int dev = -1;
        cudaGetDevice(&dev);
        return smla_fail(st, SMLA_ERR_CUDA, "%s failed: %s (%s) at %s:%d on device %d", call, cudaGetErrorString(err),
                         cudaGetErrorName(err), __FILE__, __LINE__, dev);
    }
    return SMLA_OK;
}

extern "C" const char *smla_cuda_runtime_version(void)
{
    static char buf[64];
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(buf, sizeof buf, "runtime %d.%d, driver %d.%d", rt / 1000, (rt % 1000) / 10, drv / 1000,
             (drv % 1000) / 10);
    return buf;
}

// common.cuh's smla_pdl_supported: compute capability >= 9.0 of the current device, read once per device
// (a race between threads only repeats the read). A failed query: no PDL.
bool smla_pdl_supported()
{
    static bool pdl[kMaxDevices];
    static OncePerDevice have;
    int dev = -1, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (!have.needed(dev)) return pdl[dev];
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (dev >= 0 && dev < kMaxDevices) {
        pdl[dev] = major >= 9;
        have.mark(dev);
    }
    return major >= 9;
}
