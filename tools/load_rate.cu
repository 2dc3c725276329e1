// How fast one SM can gather K tiles into shared memory, alone (issue 16: the bf16 wide kernel's producer
// issues a tile's 4,608 sixteen-byte cp.async in ~1,900 cycles, tools/trace_attn.py, and the kernel with no
// MMA and no loads still takes two thirds of its time: is that the loads' ceiling?). A K tile is 64 random
// rows of a [32768 x 576] bf16 array (1,152 B a row) written into the kernels' layout: 9 column blocks of
// [64 rows x 128 B], 128-byte swizzle (sm90/plan.cuh, blk_addr). Each CTA (one per SM, 2 waves) loads 64
// tiles through two buffers, two tiles in flight. Ways:
//   cpasync PW warps: the kernels' producer (Bf16Producer): lanes 8s..8s+7 copy a row, one 16-byte
//     cp.async.cg per lane and column block (also: with the L2 evict_last hint; src-size 0 = zero fill).
//   tma PW warps: lanes 0 .. 64 / PW - 1 of each warp issue their row's nine cp.async.bulk.tensor.2d boxes of
//     {64 values, 1 row} (one 128-byte chunk each) with the 128-byte swizzle into the same layout,
//     completing on the buffer's mbarrier (one expect_tx arrival a warp).
//   mixed: blocks 0 .. NB - 1 by four cp.async warps, the rest by TMA boxes from four more warps; and the cp.async and
//     a mixed way on a half and a quarter of the SMs.
// Prints us, GB/s and SM cycles per tile (mean over CTAs), and checks each way's first tile against the
// cp.async one byte for byte.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/load_rate tools/load_rate.cu && /tmp/load_rate
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"

constexpr int kRows = 32768, kD = 576, kRowBytes = kD * 2, kBN = 64, kTiles = 64;
constexpr int kBlk = 64 * 128, kTileBytes = 9 * kBlk;
constexpr int kSmem = 2 * kTileBytes + 1024 + 64;

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp16(uint32_t dst, const void *src, int nb)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(nb) : "memory");
}
__device__ __forceinline__ void cp16_hint(uint32_t dst, const void *src, int nb, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(nb),
                 "l"(pol)
                 : "memory");
}

// ---- cp.async: the kernels' producer layout --------------------------------------------------------
template <int PW, int MODE>  // MODE 0 plain, 1 evict_last hint, 2 zero fill
__global__ void __launch_bounds__(32 * PW, 1) gather_cpasync(const uint8_t *kv, const int *idx, long long *cyc,
                                                            uint8_t *dump)
{
    extern __shared__ uint8_t raw[];
    const uint32_t base = (smem_u32(raw) + 1023u) & ~1023u;
    const int tid = threadIdx.x, pw = tid >> 5, sub = (tid & 31) >> 3, cl = tid & 7;
    constexpr int kR = kBN / PW, kNi = kR / 4;
    uint64_t pol = 0;
    if (MODE == 1) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    const int *myidx = idx + static_cast<long long>(blockIdx.x) * kTiles * kBN;
    const long long t0 = clock64();
    for (int t = 0; t < kTiles; ++t) {
        const uint32_t kb = base + (t & 1) * kTileBytes;
#pragma unroll
        for (int i = 0; i < kNi; ++i) {
            const int r = kR * pw + 4 * i + sub;
            const uint8_t *src = kv + static_cast<long long>(myidx[t * kBN + r]) * kRowBytes + cl * 16;
            const uint32_t dst = kb + r * 128 + ((cl ^ (r & 7)) << 4);
#pragma unroll
            for (int c8 = 0; c8 < 9; ++c8) {
                if (MODE == 1) cp16_hint(dst + c8 * kBlk, src + c8 * 128, 16, pol);
                else cp16(dst + c8 * kBlk, src + c8 * 128, MODE == 2 ? 0 : 16);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // tile t - 1 landed: its buffer is reusable
        if (t == 0 && dump && blockIdx.x == 0) {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            __syncthreads();
            for (int i = tid; i < kTileBytes; i += blockDim.x) dump[i] = raw[(base - smem_u32(raw)) + i];
            __syncthreads();
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    if (tid == 0) cyc[blockIdx.x] = clock64() - t0;
}

// ---- TMA: {64, 1} boxes, one per 128-byte chunk -----------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(n));
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile(
        "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void tma_row_chunk(uint32_t dst, const CUtensorMap *map, int c0, int row, uint32_t bar)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            dst),
        "l"(map), "r"(c0), "r"(row), "r"(bar)
        : "memory");
}

template <int PW>
__global__ void __launch_bounds__(32 * PW, 1) gather_tma(const __grid_constant__ CUtensorMap map, const int *idx,
                                                        long long *cyc, uint8_t *dump)
{
    extern __shared__ uint8_t raw[];
    const uint32_t base = (smem_u32(raw) + 1023u) & ~1023u;
    const uint32_t bars = base + 2 * kTileBytes;  // two mbarriers
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    constexpr int kR = kBN / PW;  // rows per warp; lane j < kR issues row w kR + j's 9 chunks
    if (tid == 0) {
        mbar_init(bars, PW);
        mbar_init(bars + 8, PW);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int *myidx = idx + static_cast<long long>(blockIdx.x) * kTiles * kBN;
    const long long t0 = clock64();
    for (int t = 0; t < kTiles; ++t) {
        const int b = t & 1;
        const uint32_t kb = base + b * kTileBytes, bar = bars + 8 * b;
        if (t >= 2) mbar_wait(bar, ((t >> 1) - 1) & 1);  // the buffer's previous tile landed
        __syncwarp();
        if (lane == 0) mbar_expect(bar, kR * kRowBytes);
        __syncwarp();
        if (lane < kR) {
            const int r = kR * w + lane, row = myidx[t * kBN + r];
#pragma unroll
            for (int c8 = 0; c8 < 9; ++c8) tma_row_chunk(kb + c8 * kBlk + r * 128, &map, 64 * c8, row, bar);
        }
        if (t == 0 && dump && blockIdx.x == 0) {
            mbar_wait(bar, 0);
            __syncthreads();
            for (int i = tid; i < kTileBytes; i += blockDim.x) dump[i] = raw[(base - smem_u32(raw)) + i];
            __syncthreads();
        }
    }
    mbar_wait(bars + 8 * ((kTiles - 1) & 1), ((kTiles - 1) >> 1) & 1);
    mbar_wait(bars + 8 * ((kTiles - 2) & 1), ((kTiles - 2) >> 1) & 1);
    __syncthreads();
    if (tid == 0) cyc[blockIdx.x] = clock64() - t0;
}

// ---- both paths at once: column blocks 0 .. NB - 1 by the cp.async warps 0..3 (the kernels' producer layout), blocks
// NB .. 8 by TMA boxes from warps 4..7 (lanes 0..15 of warp 4 + w: rows 16 w ..), on the buffer's mbarrier. Does the
// TMA path add to the gather rate the cp.async path reaches alone (issue 16, twenty-seventh session)?
template <int NB>
__global__ void __launch_bounds__(256, 1) gather_mixed(const __grid_constant__ CUtensorMap map, const uint8_t *kv,
                                                       const int *idx, long long *cyc, uint8_t *dump)
{
    extern __shared__ uint8_t raw[];
    const uint32_t base = (smem_u32(raw) + 1023u) & ~1023u;
    const uint32_t bars = base + 2 * kTileBytes;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        mbar_init(bars, 4);
        mbar_init(bars + 8, 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int *myidx = idx + static_cast<long long>(blockIdx.x) * kTiles * kBN;
    const bool dump0 = dump && blockIdx.x == 0;
    const auto dump_tile0 = [&] {  // both paths' tile 0 landed: all 256 threads copy it out
        asm volatile("barrier.sync 1, 256;\n" ::: "memory");
        for (int i = tid; i < kTileBytes; i += 256) dump[i] = raw[(base - smem_u32(raw)) + i];
        asm volatile("barrier.sync 2, 256;\n" ::: "memory");
    };
    const long long t0 = clock64();
    if (w < 4) {  // cp.async: the 16 rows 16 w + 4 i + sub, blocks 0 .. NB - 1
        const int sub = lane >> 3, cl = lane & 7;
        for (int t = 0; t < kTiles; ++t) {
            const uint32_t kb = base + (t & 1) * kTileBytes;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = 16 * w + 4 * i + sub;
                const uint8_t *src = kv + static_cast<long long>(myidx[t * kBN + r]) * kRowBytes + cl * 16;
                const uint32_t dst = kb + r * 128 + ((cl ^ (r & 7)) << 4);
#pragma unroll
                for (int c8 = 0; c8 < NB; ++c8) cp16(dst + c8 * kBlk, src + c8 * 128, 16);
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            if (t == 0 && dump0) {
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
                dump_tile0();
            }
        }
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    } else {  // TMA: lane j < 16 of warp 4 + v issues row 16 v + j's boxes NB .. 8
        const int v = w - 4;
        for (int t = 0; t < kTiles; ++t) {
            const int b = t & 1;
            const uint32_t kb = base + b * kTileBytes, bar = bars + 8 * b;
            if (t >= 2) mbar_wait(bar, ((t >> 1) - 1) & 1);
            __syncwarp();
            if (lane == 0) mbar_expect(bar, 16 * (9 - NB) * 128);
            __syncwarp();
            if (lane < 16) {
                const int r = 16 * v + lane, row = myidx[t * kBN + r];
#pragma unroll
                for (int c8 = NB; c8 < 9; ++c8) tma_row_chunk(kb + c8 * kBlk + r * 128, &map, 64 * c8, row, bar);
            }
            if (t == 0 && dump0) {
                mbar_wait(bar, 0);
                dump_tile0();
            }
        }
        mbar_wait(bars + 8 * ((kTiles - 1) & 1), ((kTiles - 1) >> 1) & 1);
        mbar_wait(bars + 8 * ((kTiles - 2) & 1), ((kTiles - 2) >> 1) & 1);
    }
    __syncthreads();
    if (tid == 0) cyc[blockIdx.x] = clock64() - t0;
}

typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int main()
{
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int ctas = 2 * sms;
    std::vector<uint16_t> hkv(static_cast<size_t>(kRows) * kD);
    std::mt19937 g(1);
    for (auto &v : hkv) v = static_cast<uint16_t>(g());
    std::vector<int> hidx(static_cast<size_t>(ctas) * kTiles * kBN);
    for (auto &v : hidx) v = static_cast<int>(g() % kRows);
    uint8_t *kv, *dump, *ref;
    int *idx;
    long long *cyc;
    CK(cudaMalloc(&kv, hkv.size() * 2));
    CK(cudaMalloc(&idx, hidx.size() * 4));
    CK(cudaMalloc(&cyc, ctas * 8));
    CK(cudaMalloc(&dump, kTileBytes));
    CK(cudaMalloc(&ref, kTileBytes));
    CK(cudaMemcpy(kv, hkv.data(), hkv.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(idx, hidx.data(), hidx.size() * 4, cudaMemcpyHostToDevice));

    EncodeTiled enc = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void **>(&enc), 12000, cudaEnableDefault, &q));
    CUtensorMap map;
    const cuuint64_t dims[2] = {kD, kRows}, strides[1] = {kRowBytes};
    const cuuint32_t box[2] = {64, 1}, es[2] = {1, 1};
    if (!enc || enc(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, kv, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        std::printf("cuTensorMapEncodeTiled failed\n");
        return 1;
    }

    // launch(dump): one call of a way's kernel; the first way's tile 0 is the reference of the others'
    int nctas = ctas;  // the CTAs of the next run (a run on part of the SMs sets it)
    auto run = [&](const char *name, auto kern, auto launch, bool set_ref, bool check) -> int {
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        float best = 1e30f;
        for (int rep = 0; rep < 6; ++rep) {
            CK(cudaEventRecord(e0));
            launch(rep == 0 ? dump : nullptr);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (rep > 0 && ms < best) best = ms;
        }
        std::vector<long long> c(nctas);
        CK(cudaMemcpy(c.data(), cyc, nctas * 8, cudaMemcpyDeviceToHost));
        double mc = 0;
        for (auto v : c) mc += static_cast<double>(v);
        mc /= nctas;
        long long bad = -1;
        if (check) {
            std::vector<uint8_t> x(kTileBytes), y(kTileBytes);
            CK(cudaMemcpy(x.data(), dump, kTileBytes, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(y.data(), ref, kTileBytes, cudaMemcpyDeviceToHost));
            bad = 0;
            for (int i = 0; i < kTileBytes; ++i) bad += x[i] != y[i];
        }
        if (set_ref) CK(cudaMemcpy(ref, dump, kTileBytes, cudaMemcpyDeviceToDevice));
        const double bytes = static_cast<double>(nctas) * kTiles * kBN * kRowBytes;
        std::printf("%-34s %8.1f us %7.0f GB/s %7.0f cycles/tile  %s\n", name, best * 1e3, bytes / (best * 1e-3) / 1e9,
                    mc / kTiles, bad < 0 ? "" : (bad == 0 ? "tile 0 = cp.async's" : "TILE 0 DIFFERS"));
        return 0;
    };
    const auto cpa = [&](auto kern, int threads) {
        return [=, &nctas](uint8_t *d) { kern<<<nctas, threads, kSmem>>>(kv, idx, cyc, d); };
    };
    const auto tma = [&](auto kern, int threads) {
        return [=, &map, &nctas](uint8_t *d) { kern<<<nctas, threads, kSmem>>>(map, idx, cyc, d); };
    };
    const auto mixed = [&](auto kern) {
        return [=, &map, &nctas](uint8_t *d) { kern<<<nctas, 256, kSmem>>>(map, kv, idx, cyc, d); };
    };
    std::printf("# %d CTAs (one per SM at a time, %d B of shared memory each), %d tiles of 64 random rows x 1152 B each\n",
                ctas, kSmem, kTiles);
    for (int round = 0; round < 2; ++round) {
        if (run("cpasync 4 warps", gather_cpasync<4, 0>, cpa(gather_cpasync<4, 0>, 128), true, false)) return 1;
        if (run("cpasync 4 warps, evict_last hint", gather_cpasync<4, 1>, cpa(gather_cpasync<4, 1>, 128), false, true))
            return 1;
        if (run("cpasync 4 warps, zero fill", gather_cpasync<4, 2>, cpa(gather_cpasync<4, 2>, 128), false, false))
            return 1;
        if (run("cpasync 8 warps", gather_cpasync<8, 0>, cpa(gather_cpasync<8, 0>, 256), false, true)) return 1;
        if (run("cpasync 16 warps", gather_cpasync<16, 0>, cpa(gather_cpasync<16, 0>, 512), false, true)) return 1;
        if (run("tma {64,1} boxes, 4 warps", gather_tma<4>, tma(gather_tma<4>, 128), false, true)) return 1;
        if (run("tma {64,1} boxes, 8 warps", gather_tma<8>, tma(gather_tma<8>, 256), false, true)) return 1;
        if (run("cpasync 8 blocks + tma 1 (4+4 warps)", gather_mixed<8>, mixed(gather_mixed<8>), false, true)) return 1;
        if (run("cpasync 7 blocks + tma 2 (4+4 warps)", gather_mixed<7>, mixed(gather_mixed<7>), false, true)) return 1;
        if (run("cpasync 6 blocks + tma 3 (4+4 warps)", gather_mixed<6>, mixed(gather_mixed<6>), false, true)) return 1;
        // the same ways on part of the SMs (one CTA each, one wave): is a tile's time the SM's or the L2's?
        for (int part : {2, 4, 16}) {
            nctas = sms / part;
            char name[64];
            std::snprintf(name, sizeof name, "cpasync 4 warps, 1/%d of the SMs", part);
            if (run(name, gather_cpasync<4, 0>, cpa(gather_cpasync<4, 0>, 128), false, true)) return 1;
            std::snprintf(name, sizeof name, "cpasync 8 warps, 1/%d of the SMs", part);
            if (run(name, gather_cpasync<8, 0>, cpa(gather_cpasync<8, 0>, 256), false, true)) return 1;
            std::snprintf(name, sizeof name, "cpasync 16 warps, 1/%d of the SMs", part);
            if (run(name, gather_cpasync<16, 0>, cpa(gather_cpasync<16, 0>, 512), false, true)) return 1;
            std::snprintf(name, sizeof name, "cpasync 7 + tma 2, 1/%d of the SMs", part);
            if (run(name, gather_mixed<7>, mixed(gather_mixed<7>), false, true)) return 1;
            nctas = ctas;
        }
    }
    return 0;
}
