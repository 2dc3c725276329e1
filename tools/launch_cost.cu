// Host cost of the CUDA calls on smla's launch path (issue 18: what is left of an op's host time once the
// Python layer and the binding are cut): an empty kernel launched with <<<>>>, with cudaLaunchKernelEx and
// the programmatic-dependent-launch attribute (smla_launch; also with a 512-byte argument, and as a cooperative
// launch, the fused split decode's), and with the driver's
// cuLaunchKernel (through cudaGetDriverEntryPoint: no libcuda link), plus cudaGetDevice / cudaGetLastError.
// Host time = wall time of a burst of 100 calls / 100, median of 51 bursts, the GPU drained in between; the whole set twice.
//   nvcc -O2 -std=c++17 -o /tmp/launch_cost tools/launch_cost.cu && /tmp/launch_cost
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void empty_kernel(int x, int *p)
{
    if (x == 12345) *p = x; // never true: the kernel does nothing, but takes arguments like a real one
}

// A kernel taking one large argument, as smla's kernels take their params struct (the attention's is a few
// hundred bytes): what the argument's size adds to a launch.
struct Big {
    int v[128]; // 512 bytes
};
__global__ void big_kernel(Big b, int *p)
{
    if (b.v[0] == 12345) *p = b.v[1];
}

template <class F> double host_us(F f)
{
    for (int i = 0; i < 200; ++i) f();
    cudaDeviceSynchronize();
    std::vector<double> v;
    for (int b = 0; b < 51; ++b) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 100; ++i) f();
        auto t1 = std::chrono::steady_clock::now();
        v.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 100);
        cudaDeviceSynchronize();
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main()
{
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int x = 1, *p = nullptr;
    void *args[] = {&x, &p};
    for (int round = 0; round < 2; ++round) { // twice: host speed drifts on a shared machine
    printf("-- round %d\n", round + 1);
    printf("runtime <<<>>>                      %6.2f us\n", host_us([&] { empty_kernel<<<132, 256, 0, s>>>(x, p); }));
    printf("cudaLaunchKernel                    %6.2f us\n",
           host_us([&] { cudaLaunchKernel((const void *)empty_kernel, dim3(132), dim3(256), args, 0, s); }));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(132);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    printf("cudaLaunchKernelEx (PDL attribute)  %6.2f us\n",
           host_us([&] { cudaLaunchKernelEx(&cfg, empty_kernel, x, p); }));
    Big big = {};
    printf("cudaLaunchKernelEx (PDL, 512-byte argument) %6.2f us\n",
           host_us([&] { cudaLaunchKernelEx(&cfg, big_kernel, big, p); }));
    cudaLaunchAttribute coop[2] = {attr[0], {}};
    coop[1].id = cudaLaunchAttributeCooperative;
    coop[1].val.cooperative = 1;
    cudaLaunchConfig_t cc = cfg;
    cc.attrs = coop;
    cc.numAttrs = 2;
    printf("cudaLaunchKernelEx (PDL, cooperative) %6.2f us\n",
           host_us([&] { cudaLaunchKernelEx(&cc, empty_kernel, x, p); }));
    cudaLaunchConfig_t plain = cfg;
    plain.numAttrs = 0;
    printf("cudaLaunchKernelEx (no attribute)   %6.2f us\n",
           host_us([&] { cudaLaunchKernelEx(&plain, empty_kernel, x, p); }));
    printf("<<<>>> then Ex with PDL (decode)    %6.2f us\n", host_us([&] {
               empty_kernel<<<132, 256, 0, s>>>(x, p);
               cudaLaunchKernelEx(&cfg, empty_kernel, x, p);
           }));
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CUfunction f = nullptr;
    if (cudaGetDriverEntryPoint("cuLaunchKernel", &fn, cudaEnableDefault, &q) == cudaSuccess && fn &&
        cudaGetFuncBySymbol(&f, (const void *)empty_kernel) == cudaSuccess) {
        auto launch = reinterpret_cast<decltype(&cuLaunchKernel)>(fn);
        printf("cuLaunchKernel (driver)             %6.2f us\n",
               host_us([&] { launch(f, 132, 1, 1, 256, 1, 1, 0, (CUstream)s, args, nullptr); }));
    }
    int dev = 0;
    printf("cudaGetDevice                       %6.2f us\n", host_us([&] { cudaGetDevice(&dev); }));
    printf("cudaGetLastError                    %6.2f us\n", host_us([&] { (void)cudaGetLastError(); }));
    printf("launch + GetDevice x2 + GetLastError %6.2f us (smla's memory-op launch path)\n", host_us([&] {
               cudaGetDevice(&dev);
               empty_kernel<<<132, 256, 0, s>>>(x, p);
               (void)cudaGetLastError();
               cudaGetDevice(&dev);
           }));
    }
    printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}
