// How fast the H200 gathers the small-head decode's cache rows from DRAM (issue 17: the dims kernel with idle
// consumers, tools/ablate.py --dims bit 32, takes ~65 of its ~72 us at h = 16, b = 128: is that gather at the
// memory's rate for random 656-byte rows?). The decode benchmark's case: 128 requests, each its own 32,768
// tokens of an fp8_ds_mla cache (656 B a token, blocks of 64 tokens), each query row reading 2,048 distinct
// random ones of its request: 172 MB of rows, out of a 2.75 GB cache (L2 flushed before every timed call).
// One CTA per request (128 CTAs, one per SM), 64 tiles of 32 rows each. Ways:
//   ring S: the dims kernel's producer (sm90/dims_kernel.cuh): four producer warps, warp p copying rows
//     8 p .. 8 p + 7 of each tile by one cp.async.bulk a row into an S-stage ring of 704-byte-pitch tiles; one
//     consumer warp waits for each tile and frees its stage at once.
//   ldg W: W warps load the rows straight into registers (16-byte loads, 41 a row over the warp's lanes, four
//     rows in flight a warp; the words are xor-folded so that the loads stay), no shared memory.
//   copy: cudaMemcpyAsync of 1 GiB (device to device): the sequential rate, bytes read over time.
// Prints us and TB/s (the rows' bytes over the time) for each; medians of 9 calls after 2 warm-ups.
//   nvcc -O3 -std=c++17 -Icsrc -Icuda -gencode=arch=compute_90a,code=sm_90a -o /tmp/gather_rate tools/gather_rate.cu \
//     && /tmp/gather_rate
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "attention/sm90/ptx.cuh"
#include "core/fp8_ds_mla.h"

#include "cuda_check.h"

constexpr int kEntry = SMLA_FP8_ENTRY, kPitch = kEntry + 48;  // a token's bytes; the dims kernel's row pitch
constexpr int kReqTokens = 32768, kTopk = 2048, kReqs = 128, kTT = 32;
constexpr int kTiles = kTopk / kTT;
constexpr long long kCacheBytes = static_cast<long long>(kReqs) * kReqTokens * kEntry;

using attn::smem_u32;
using namespace attn::sm90;  // mbarriers, bulk_copy_g2s

// ---- ring S: four producer warps (0..3), one consumer warp (4) -------------------------------------------
template <int S>
__global__ void __launch_bounds__(160, 1) gather_ring(const uint8_t *kv, const int *idx)
{
    extern __shared__ uint8_t raw[];
    const uint32_t base = (smem_u32(raw) + 127u) & ~127u;
    const uint32_t bars = base + S * kTT * kPitch;  // full[S], empty[S]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int *my = idx + static_cast<long long>(blockIdx.x) * kTopk;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(bars + 8 * s, 4);
            mbar_init(bars + 8 * (S + s), 1);
        }
        fence_mbarrier_init();
    }
    __syncthreads();
    if (warp == 4) {  // the consumer: each tile waited for and freed at once
        for (int i = 0; i < kTiles; ++i) {
            mbar_wait(bars + 8 * (i % S), (i / S) & 1);
            if (lane == 0) mbar_arrive(bars + 8 * (S + i % S));
        }
        return;
    }
    auto issue = [&](int i, int v) {
        const int st = i % S;
        if (lane == 0) mbar_arrive_expect_tx(bars + 8 * st, 8u * kEntry);
        __syncwarp();
        if (lane < 8)
            bulk_copy_g2s(base + (st * kTT + 8 * warp + lane) * kPitch, kv + static_cast<long long>(v) * kEntry, kEntry,
                          bars + 8 * st);
    };
    auto fetch = [&](int i) { return i < kTiles && lane < 8 ? __ldg(my + kTT * i + 8 * warp + lane) : 0; };
    for (int i = 0; i < S && i < kTiles; ++i) issue(i, fetch(i));
    int nx = fetch(S);
    for (int i = S; i < kTiles; ++i) {
        const int cur = nx;
        nx = fetch(i + 1);
        mbar_wait(bars + 8 * (S + i % S), ((i / S) - 1) & 1);
        issue(i, cur);
    }
}

// ---- ldg W: rows into registers --------------------------------------------------------------------------
template <int W>
__global__ void __launch_bounds__(32 * W, 1) gather_ldg(const uint8_t *kv, const int *idx, uint32_t *sink)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int *my = idx + static_cast<long long>(blockIdx.x) * kTopk;
    uint32_t acc = 0;
    constexpr int kChunks = kEntry / 16;  // 41
    for (int r0 = 4 * warp; r0 < kTopk; r0 += 4 * W) {
        uint4 v[4][2];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const uint8_t *row = kv + static_cast<long long>(__ldg(my + r0 + u)) * kEntry;
            v[u][0] = __ldg(reinterpret_cast<const uint4 *>(row) + lane);
            v[u][1] = lane + 32 < kChunks ? __ldg(reinterpret_cast<const uint4 *>(row) + lane + 32) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            acc ^= v[u][0].x ^ v[u][0].y ^ v[u][0].z ^ v[u][0].w ^ v[u][1].x ^ v[u][1].y ^ v[u][1].z ^ v[u][1].w;
    }
    if (acc == 0x12345678u) sink[0] = acc;  // keeps the loads
}

__global__ void fill(uint8_t *p, long long n)
{
    for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n / 16; i += 256ll * gridDim.x)
        reinterpret_cast<uint4 *>(p)[i] = make_uint4(static_cast<uint32_t>(i), 0x3c3c3c3cu, 0x01020304u, 0x11223344u);
}

template <class F>
static float median_us(F &&f, uint8_t *flush, long long flush_bytes)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    std::vector<float> t;
    for (int k = 0; k < 11; ++k) {
        cudaMemsetAsync(flush, k, flush_bytes);  // the L2 flushed
        cudaEventRecord(a);
        f();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0.f;
        cudaEventElapsedTime(&ms, a, b);
        if (k >= 2) t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return t[t.size() / 2];
}

int main()
{
    uint8_t *kv = nullptr, *flush = nullptr, *dst = nullptr;
    int *idx = nullptr;
    uint32_t *sink = nullptr;
    const long long flush_bytes = 256ll << 20, copy_bytes = 1ll << 30;
    CK(cudaMalloc(&kv, kCacheBytes));
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&dst, copy_bytes));
    CK(cudaMalloc(&idx, sizeof(int) * kReqs * kTopk));
    CK(cudaMalloc(&sink, 4));
    fill<<<1024, 256>>>(kv, kCacheBytes);
    // request r owns tokens [r * 32768, (r + 1) * 32768); its row reads 2048 distinct random ones
    std::vector<int> h(static_cast<size_t>(kReqs) * kTopk), perm(kReqTokens);
    std::mt19937 rng(7);
    for (int r = 0; r < kReqs; ++r) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int i = 0; i < kTopk; ++i) h[static_cast<size_t>(r) * kTopk + i] = r * kReqTokens + perm[i];
    }
    CK(cudaMemcpy(idx, h.data(), sizeof(int) * h.size(), cudaMemcpyHostToDevice));
    const double rows_bytes = static_cast<double>(kReqs) * kTopk * kEntry;
    std::printf("%d requests x %d random rows of %d B (%.1f MB) from a %.2f GB cache, L2 flushed\n", kReqs, kTopk, kEntry,
                rows_bytes / 1e6, kCacheBytes / 1e9);
    std::printf("%-26s %9s %8s\n", "way", "us", "TB/s");
    auto report = [&](const char *name, float us) { std::printf("%-26s %9.1f %8.2f\n", name, us, rows_bytes / us / 1e6); };
    auto ring = [&](auto kern, int stages, const char *name) -> int {
        const int smem = stages * kTT * kPitch + 2 * stages * 8 + 128;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        report(name, median_us([&] { kern<<<kReqs, 160, smem>>>(kv, idx); }, flush, flush_bytes));
        return 0;
    };
    if (ring(gather_ring<8>, 8, "ring 8 (the dims kernel)")) return 1;
    if (ring(gather_ring<4>, 4, "ring 4")) return 1;
    if (ring(gather_ring<10>, 10, "ring 10")) return 1;
    report("ldg 8", median_us([&] { gather_ldg<8><<<kReqs, 256>>>(kv, idx, sink); }, flush, flush_bytes));
    report("ldg 16", median_us([&] { gather_ldg<16><<<kReqs, 512>>>(kv, idx, sink); }, flush, flush_bytes));
    report("ldg 32", median_us([&] { gather_ldg<32><<<kReqs, 1024>>>(kv, idx, sink); }, flush, flush_bytes));
    const float cus = median_us([&] { cudaMemcpyAsync(dst, kv, copy_bytes, cudaMemcpyDeviceToDevice); }, flush, flush_bytes);
    std::printf("%-26s %9.1f %8.2f   (1 GiB read + written; TB/s of the bytes read)\n", "copy", cus, copy_bytes / cus / 1e6);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return 0;
}
