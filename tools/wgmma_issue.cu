// Does a warpgroup's wgmma issue wait for the tensor pipe? (issue 16: in sm90t's trace the softmax of tile k, placed
// after the 36 wgmma of S(k + 1), did not overlap them.) One CTA on one SM; warpgroup 0 issues N wgmma of S's shape
// (m64n48k16, A and B from shared memory, zeros: timing only) as one commit group and reads the SM clock right after
// the last issue, then after wgmma.wait_group 0; optionally warpgroup 1 keeps the tensor pipe busy meanwhile with
// m64n256k16 products (the value warpgroup's P V). Then the overlap test: 36 wgmma, then X independent ex2 chains
// (the softmax's MUFU work, 24 a thread as one 48-token tile), then the wait, against the wgmma alone and the ex2
// alone, and the same work woven (4 groups of 9 wgmma, a quarter of the ex2 after each).
// Prints SM cycles (median of 15 repetitions after a warm-up):
//   nvcc -O3 -std=c++17 -Icsrc -Icuda -gencode=arch=compute_90a,code=sm_90a -o /tmp/wgmma_issue tools/wgmma_issue.cu && /tmp/wgmma_issue
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "attention/ptx.cuh"
#include "attention/sm90/ptx.cuh"

#include "cuda_check.h"

using namespace attn;
using namespace attn::sm90;

constexpr int kBlk = 64 * 128, kSmem = 160 * 1024, kReps = 16;
enum Mode { kIssue = 0, kExpAfter = 1, kExpOnly = 2, kWoven = 3 };

__device__ __forceinline__ uint32_t clk()
{
    uint32_t t;
    asm volatile("mov.u32 %0, %%clock;\n" : "=r"(t)::"memory");
    return t;
}

// n wgmma m64n48k16 of S's k-step order (A: Q blocks, B: K blocks), accumulating into d.
__device__ __forceinline__ void s_steps(float (&d)[24], uint32_t qa, uint32_t kb, int k0, int n)
{
#pragma unroll
    for (int kk = 0; kk < 36; ++kk)
        if (kk >= k0 && kk < k0 + n) {
            const uint32_t off = (kk >> 2) * kBlk + (kk & 3) * 32;
            wgmma_ss<0>(d, desc_at(qa, off), desc_at(kb, off), 1);
        }
}

// x ex2 a thread in 8 independent chains (the softmax's exponents have no chain; 8 keep MUFU fed).
template <int X>
__device__ __forceinline__ void exps(float (&e)[8])
{
#pragma unroll
    for (int i = 0; i < X; ++i) e[i & 7] = ex2(e[i & 7] * 0.5f - 1.0f);
}

template <int N, int MODE>
__device__ void score_wg(uint32_t base, const volatile float *zero, uint32_t *out, float *sink)
{
    float d[24] = {};
    float e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = sink[1] + i;
    const uint32_t qa = opaque(desc_base(base, 16)), kb = opaque(desc_base(base + 72 * 1024, 16));
    uint32_t ti[kReps], td[kReps];
#pragma unroll 1
    for (int r = 0; r < kReps; ++r) {
        __syncwarp();
        const uint32_t t0 = clk();
        if constexpr (MODE == kWoven) {
            uint32_t dep = 0u;  // 0, from the exponents before: the next group's issue follows them
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                wg_fence();
                s_steps(d, qa, kb + dep, 9 * g, 9);
                exps<N / 4>(e);
                dep = __float_as_uint(e[0]) >> 31;
            }
            wg_commit();
        } else {
            if constexpr (MODE != kExpOnly) {
                wg_fence();
                s_steps(d, qa, kb, 0, MODE == kIssue ? N : 36);
                wg_commit();
            }
            if constexpr (MODE == kExpAfter) {  // a load after the commit keeps the exponents after the issue
                const float z = *zero;
#pragma unroll
                for (int i = 0; i < 8; ++i) e[i] += z;
            }
            if constexpr (MODE == kExpAfter || MODE == kExpOnly) exps<N>(e);
        }
        const uint32_t t1 = clk();
        wg_wait0();
        fence_regs(d);
        fence_regs(e);
        const uint32_t t2 = clk();
        ti[r] = t1 - t0;
        td[r] = t2 - t0;
    }
    if (threadIdx.x == 0)
        for (int r = 0; r < kReps; ++r) out[2 * r] = ti[r], out[2 * r + 1] = td[r];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 24; ++i) s += d[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) s += e[i];
    if (s == 12345.f) sink[0] = s;
}

// Warpgroup 1: m64n256k16 products back to back (A and B from shared memory) until warpgroup 0 is done.
__device__ void busy_wg(uint32_t base, volatile int *done, float *sink)
{
    float d[128] = {};
    const uint32_t qa = opaque(desc_base(base, 16)), vb = opaque(desc_base(base + 72 * 1024, kBlk));
#pragma unroll 1
    for (int it = 0; it < 100000; ++it) {  // ~50 M cycles at most; warpgroup 0 is done far sooner
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_n256_tb(d, desc_at(qa, kk * 32), desc_at(vb, kk * 16 * 128));
        wg_commit();
        wg_wait1();
        if (*done) break;
    }
    wg_wait0();
    fence_regs(d);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 128; ++i) s += d[i];
    if (s == 12345.f) sink[0] = s;
}

template <int N, int MODE>
__global__ void __launch_bounds__(256, 1) issue_kernel(int busy, uint32_t *out, float *sink)
{
    extern __shared__ __align__(1024) uint8_t smem[];
    __shared__ int done;
    const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint32_t base = (sbase + 1023) & ~1023u;
    for (int i = threadIdx.x; i < (kSmem - 1024) / 4; i += blockDim.x) reinterpret_cast<uint32_t *>(smem)[i] = 0u;
    if (threadIdx.x == 0) done = 0;
    __syncthreads();
    if (threadIdx.x >= 128) {
        if (busy) busy_wg(base, &done, sink);
        return;
    }
    if (busy) {  // let the busy warpgroup fill the pipe first
        const uint32_t t = clk();
        while (clk() - t < 4000u) {
        }
    }
    score_wg<N, MODE>(base, reinterpret_cast<const volatile float *>(smem), out, sink);
    __syncwarp();
    if (threadIdx.x == 0) *reinterpret_cast<volatile int *>(&done) = 1;
}

template <int N, int MODE>
static int run(const char *what, int busy, uint32_t *d_out, float *d_sink)
{
    auto k = issue_kernel<N, MODE>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    k<<<1, 256, kSmem>>>(busy, d_out, d_sink);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    uint32_t h[2 * kReps];
    CK(cudaMemcpy(h, d_out, sizeof h, cudaMemcpyDeviceToHost));
    uint32_t ti[kReps - 1], td[kReps - 1];
    for (int r = 1; r < kReps; ++r) ti[r - 1] = h[2 * r], td[r - 1] = h[2 * r + 1];
    std::sort(ti, ti + (kReps - 1));
    std::sort(td, td + (kReps - 1));
    std::printf("%-44s %-5s issue %6u  done %6u\n", what, busy ? "busy" : "alone", ti[(kReps - 1) / 2],
                td[(kReps - 1) / 2]);
    return 0;
}

int main()
{
    uint32_t *d_out;
    float *d_sink;
    CK(cudaMalloc(&d_out, 2 * kReps * sizeof(uint32_t)));
    CK(cudaMalloc(&d_sink, 16 * sizeof(float)));
    CK(cudaMemset(d_sink, 0, 16 * sizeof(float)));
    std::printf("SM cycles, median of %d (N wgmma m64n48k16 ss; ex2 per thread)\n", kReps - 1);
    for (int busy = 0; busy < 2; ++busy) {
        if (run<1, kIssue>("wgmma N=1", busy, d_out, d_sink)) return 1;
        if (run<2, kIssue>("wgmma N=2", busy, d_out, d_sink)) return 1;
        if (run<4, kIssue>("wgmma N=4", busy, d_out, d_sink)) return 1;
        if (run<8, kIssue>("wgmma N=8", busy, d_out, d_sink)) return 1;
        if (run<12, kIssue>("wgmma N=12", busy, d_out, d_sink)) return 1;
        if (run<18, kIssue>("wgmma N=18", busy, d_out, d_sink)) return 1;
        if (run<36, kIssue>("wgmma N=36", busy, d_out, d_sink)) return 1;
        if (run<96, kExpOnly>("ex2 x96 alone", busy, d_out, d_sink)) return 1;
        if (run<96, kExpAfter>("wgmma 36 then ex2 x96", busy, d_out, d_sink)) return 1;
        if (run<96, kWoven>("4 x (wgmma 9, ex2 x24)", busy, d_out, d_sink)) return 1;
        if (run<384, kExpOnly>("ex2 x384 alone", busy, d_out, d_sink)) return 1;
        if (run<384, kExpAfter>("wgmma 36 then ex2 x384", busy, d_out, d_sink)) return 1;
        if (run<384, kWoven>("4 x (wgmma 9, ex2 x96)", busy, d_out, d_sink)) return 1;
    }
    return 0;
}
