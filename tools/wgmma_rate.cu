// How fast the tensor cores run the prefill kernels' wgmma shapes when shared memory feeds them (issue 16:
// is S = Q K^T, m64n64k16 with both operands in shared memory, bound by shared-memory reads rather than by
// the tensor cores?). One CTA per SM, 1 or 2 consumer warpgroups, each running a loop of one shape on
// operands in shared memory (128-byte swizzle, the kernels' descriptors; the values are zeros: timing
// only), optionally beside a producer warpgroup that keeps writing shared memory with cp.async from an
// L2-resident array (the kernels' K gather, 64 random rows of 1,152 B per tile). Shapes:
//   s_ss : m64n64k16, A (Q) and B (K) from smem: the kernels' S, 4 KB per 32 tensor cycles at peak;
//   s_rs : m64n64k16, A from registers: S with Q in registers, 2 KB per 32 cycles;
//   v_rs : m64n256k16, A (P) from registers, B (V) N-major from smem: the local P V, 8 KB per 128 cycles;
//   v_ss : m64n256k16, A (P) from smem: the remote P V, 10 KB per 128 cycles;
//   s32  : m64n32k16, A and B from smem: S of a 32-token tile (a deeper K ring of half-size tiles), 3 KB per
//          16 tensor cycles, 1.5x the 128 B a cycle shared memory delivers, so bound by it unless it overlaps
//          a P V product.
// Prints, per configuration, SM cycles per wgmma of each warpgroup and the tensor pipe's share of its peak
// (m64nNk16 bf16: N / 2 cycles on one SM, the 989 TFLOP/s dense figure at 1.83 GHz).
//   nvcc -O3 -std=c++17 -Icsrc -Icuda -gencode=arch=compute_90a,code=sm_90a -o /tmp/wgmma_rate tools/wgmma_rate.cu && /tmp/wgmma_rate
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attention/sm90/ptx.cuh"

#include "cuda_check.h"

using namespace attn::sm90;

enum Shape { kNone = 0, kSss = 1, kSrs = 2, kVrs = 3, kVss = 4, kS32 = 5 };
static const char *const kNames[] = {"-", "s_ss", "s_rs", "v_rs", "v_ss", "s32"};
__host__ __device__ constexpr bool is_s(int shape) { return shape == kSss || shape == kSrs || shape == kS32; }
constexpr double peak_cycles(int shape) { return shape == kS32 ? 16.0 : (is_s(shape) ? 32.0 : 128.0); }
constexpr int kIters = 2016;  // wgmma per warpgroup: 56 groups of 36 (S) or 504 of 4 (P V)
constexpr int kBlk = 64 * 128, kRowBytes = 1152, kKvRows = 32768;
constexpr int kSmem = 200 * 1024;

struct Cfg {
    int shape[3];  // per consumer warpgroup (kNone: idle)
    int producer;  // 1: a third warpgroup gathers K tiles into shared memory meanwhile
};

// Consumer warpgroup: kIters wgmma of one shape, in commit groups of a tile's S (36 k-steps) or of one P V
// product (4), two groups in flight.
template <int SHAPE>
__device__ void consume(uint32_t base, long long *cycles, float *sink)
{
    float d16[16] = {};
    float d32[32] = {};
    float d128[128] = {};
    constexpr int kA = 4;  // distinct A fragments (values from memory: ptxas serialised opaque constants, C7512)
    uint32_t a[kA][4];
#pragma unroll
    for (int i = 0; i < kA; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) a[i][j] = reinterpret_cast<const volatile uint32_t *>(sink)[0] * (threadIdx.x + i + j);
    const uint32_t qa = opaque(desc_base(base, 16)), kb = opaque(desc_base(base + 72 * 1024, 16));
    const uint32_t vb = opaque(desc_base(base + 72 * 1024, kBlk));
    __syncwarp();
    const long long t0 = clock64();
    constexpr int kG = is_s(SHAPE) ? 36 : 4;
#pragma unroll 1
    for (int it = 0; it < kIters / kG; ++it) {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < kG; ++ks) {
            const uint32_t off = (ks >> 2) * kBlk + (ks & 3) * 32;
            if constexpr (SHAPE == kSss) wgmma_ss<0>(d32, desc_at(qa, off), desc_at(kb, off), 1);
            if constexpr (SHAPE == kS32) wgmma_ss<0>(d16, desc_at(qa, off), desc_at(kb, off), 1);
            if constexpr (SHAPE == kSrs) wgmma_rs(d32, a[ks % kA], desc_at(kb, off), 1);
            if constexpr (SHAPE == kVrs) wgmma_n256_rs(d128, a[ks % kA], desc_at(vb, (ks & 3) * 16 * 128));
            if constexpr (SHAPE == kVss) wgmma_n256_tb(d128, desc_at(qa, (ks & 3) * 32), desc_at(vb, (ks & 3) * 16 * 128));
        }
        wg_commit();
        wg_wait1();
    }
    wg_wait0();
    const long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s += d16[i];
#pragma unroll
    for (int i = 0; i < 32; ++i) s += d32[i];
#pragma unroll
    for (int i = 0; i < 128; ++i) s += d128[i];
    if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 4 + threadIdx.x / 128] = t1 - t0;
    if (s == 12345.f) sink[0] = s;  // keeps the loop
}

// Producer warpgroup: gathers 64-row tiles of kv into the upper half of shared memory until the consumers
// are done (flag in shared memory), cp.async 16 B per lane (8 lanes a row, as the kernels' producer).
__device__ void produce(uint32_t base, const uint8_t *kv, const int *idx, volatile int *done, long long *tiles)
{
    const int t = threadIdx.x % 128, rg = t >> 3, cl = t & 7;
    long long n = 0;
    const uint32_t dst0 = base + 72 * 1024;  // the K / V operand region: the consumers read it meanwhile
    while (!*done) {
        for (int i = 0; i < 4; ++i) {
            const int row = idx[(n * 64 + 16 * i + rg) & (kKvRows - 1)];
            const uint8_t *src = kv + static_cast<size_t>(row) * kRowBytes + cl * 16;
            const uint32_t dst = dst0 + (16 * i + rg) * 128 + ((cl ^ (rg & 7)) << 4);
#pragma unroll
            for (int c8 = 0; c8 < 9; ++c8)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + c8 * kBlk), "l"(src + c8 * 128)
                             : "memory");
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 1;\n" ::: "memory");
        ++n;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    if (t == 0) tiles[blockIdx.x] = n;
}

template <int S0, int S1>
__global__ void __launch_bounds__(384, 1) rate_kernel(int producer, const uint8_t *kv, const int *idx,
                                                      long long *cycles, long long *tiles, float *sink)
{
    extern __shared__ __align__(1024) uint8_t smem[];
    __shared__ int done;
    const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + 1023) & ~1023u;
    for (int i = threadIdx.x; i < (kSmem - 1024) / 4; i += blockDim.x)
        reinterpret_cast<uint32_t *>(smem + (base - static_cast<uint32_t>(__cvta_generic_to_shared(smem))))[i] = 0u;
    if (threadIdx.x == 0) done = 0;
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 2) {
        setmaxnreg_dec<40>();
        if (producer) produce(base, kv, idx, &done, tiles);
        return;
    }
    setmaxnreg_inc<232>();
    if (wg == 0 && S0 != kNone) consume<S0>(base, cycles, sink);
    if (wg == 1 && S1 != kNone) consume<S1>(base, cycles, sink);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (threadIdx.x == 0) done = 1;
}


template <int S0, int S1>
int run(int producer, int sms, const uint8_t *kv, const int *idx, long long *cyc, long long *tiles, float *sink)
{
    auto k = rate_kernel<S0, S1>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    for (int rep = 0; rep < 2; ++rep) {
        CK(cudaMemset(cyc, 0, sms * 4 * sizeof(long long)));
        CK(cudaMemset(tiles, 0, sms * sizeof(long long)));
        k<<<sms, 384, kSmem>>>(producer, kv, idx, cyc, tiles, sink);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    }
    std::vector<long long> hc(sms * 4), ht(sms);
    CK(cudaMemcpy(hc.data(), cyc, hc.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ht.data(), tiles, ht.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    const int shapes[2] = {S0, S1};
    std::printf("%-5s %-5s prod %d |", kNames[S0], kNames[S1], producer);
    double busy = 0.0, maxc = 0.0;
    for (int w = 0; w < 2; ++w) {
        if (shapes[w] == kNone) continue;
        double c = 0.0;
        for (int b = 0; b < sms; ++b) c += static_cast<double>(hc[b * 4 + w]);
        c /= sms;
        const double per = c / kIters, peak = peak_cycles(shapes[w]);
        busy += peak * kIters;
        maxc = c > maxc ? c : maxc;
        std::printf(" wg%d %s %6.1f cyc/wgmma (%5.1f%% of peak alone)", w, kNames[shapes[w]], per, 100.0 * peak / per);
    }
    double tl = 0.0;
    for (int b = 0; b < sms; ++b) tl += static_cast<double>(ht[b]);
    tl /= sms;
    std::printf(" | tensor busy %5.1f%%", 100.0 * busy / maxc);
    if (producer) std::printf(" | gather %.0f cyc/tile", maxc / (tl > 0 ? tl : 1));
    std::printf("\n");
    return 0;
}

int main()
{
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint8_t *kv;
    int *idx;
    long long *cyc, *tiles;
    float *sink;
    CK(cudaMalloc(&kv, static_cast<size_t>(kKvRows) * kRowBytes));
    CK(cudaMemset(kv, 0, static_cast<size_t>(kKvRows) * kRowBytes));
    std::vector<int> hi(kKvRows);
    std::mt19937 rng(1);
    for (auto &v : hi) v = static_cast<int>(rng() % kKvRows);
    CK(cudaMalloc(&idx, kKvRows * sizeof(int)));
    CK(cudaMemcpy(idx, hi.data(), kKvRows * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&cyc, sms * 4 * sizeof(long long)));
    CK(cudaMalloc(&tiles, sms * sizeof(long long)));
    CK(cudaMalloc(&sink, 4));
    std::printf("# %d SMs, %d wgmma a warpgroup; cyc/wgmma per warpgroup; peak: m64n32k16 16, m64n64k16 32, m64n256k16 128 cycles\n", sms,
                kIters);
    for (int p = 0; p < 2; ++p) {
        if (run<kSss, kNone>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSrs, kNone>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kVrs, kNone>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kVss, kNone>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSss, kSss>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSrs, kSrs>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSss, kVss>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSrs, kVss>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSss, kVrs>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kSrs, kVrs>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kS32, kNone>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kS32, kS32>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kS32, kVrs>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
        if (run<kS32, kVss>(p, sms, kv, idx, cyc, tiles, sink)) return 1;
    }
    return 0;
}
