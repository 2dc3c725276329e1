// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows). The rule of one entry is core/index_rules.h's smla_convert_index,
// shared with the CPU; a block id >= num_blocks (when given), an error on the CPU, is -1 here, since
// reporting it would need a sync; the attention kernels then never read past the cache for it.
//
// One block per row. The row is walked in chunks of blockDim.x * 8 entries, 8 consecutive entries per
// thread (two 16-byte accesses when aligned). Counts come from a block-wide scan of the per-thread
// counts; with DCP compaction the same exclusive scan gives each thread its output position, so the
// valid entries land at the front in their original order (deterministic), and the tail gets -1.
// out may alias topk_indices: a chunk is read completely (the scan's barriers) before any of it is
// written, and compacted writes never reach past the chunk being processed.
#include "cache_rows.cuh"
#include "core/index_rules.h"

namespace {

using namespace smla;

constexpr int kPerThread = 8;
constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / kWarp;

// Exclusive scan of v over the block; *total gets the block sum. Every thread must call it.
__device__ __forceinline__ int block_exclusive_scan(int v, int *total)
{
    __shared__ int warp_sums[kMaxWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFullMask, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
        for (int o = 1; o < kMaxWarps; o <<= 1) {
            const int y = __shfl_up_sync(kFullMask, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nwarps) warp_sums[lane] = w;
    }
    __syncthreads();
    const int excl = x - v + (warp > 0 ? warp_sums[warp - 1] : 0);
    *total = warp_sums[nwarps - 1];
    __syncthreads(); // warp_sums is reused by the next call
    return excl;
}

template <bool VEC, bool COMPACT>
__global__ void __launch_bounds__(kMaxThreads) convert_kernel(smla_convert_indices_params p)
{
    const int64_t n = blockIdx.x;
    const int32_t *in = p.topk_indices + n * p.in_stride;
    int32_t *out = p.out + n * p.out_stride;

    const smla_index_row rc = smla_index_row_of(&p, n);

    const int64_t K = p.topk;
    const int64_t chunk = static_cast<int64_t>(blockDim.x) * kPerThread;
    int64_t count = 0;  // COMPACT: entries written so far (block-uniform); else this thread's count
    for (int64_t c0 = 0; c0 < K; c0 += chunk) {
        const int64_t k0 = c0 + static_cast<int64_t>(threadIdx.x) * kPerThread;
        int32_t v[kPerThread];
        const bool full = VEC && k0 + kPerThread <= K;
        if (full) {
            const int4 a = *reinterpret_cast<const int4 *>(in + k0);
            const int4 b = *reinterpret_cast<const int4 *>(in + k0 + 4);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < kPerThread; ++e) v[e] = k0 + e < K ? in[k0 + e] : -1;
        }
        int cnt = 0;
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) {
            int64_t past_col; // a block past the cache: -1 here (the CPU's error)
            v[e] = k0 + e < K ? smla_convert_index(&p, &rc, v[e], &past_col) : -1;
            cnt += v[e] != -1;
        }
        if (COMPACT) {
            int total;
            int64_t pos = count + block_exclusive_scan(cnt, &total);
#pragma unroll
            for (int e = 0; e < kPerThread; ++e)
                if (v[e] != -1) out[pos++] = v[e];
            count += total;
        } else {
            count += cnt;
            if (full) {
                *reinterpret_cast<int4 *>(out + k0) = make_int4(v[0], v[1], v[2], v[3]);
                *reinterpret_cast<int4 *>(out + k0 + 4) = make_int4(v[4], v[5], v[6], v[7]);
            } else {
#pragma unroll
                for (int e = 0; e < kPerThread; ++e)
                    if (k0 + e < K) out[k0 + e] = v[e];
            }
        }
    }
    if (COMPACT) {
        for (int64_t k = count + threadIdx.x; k < K; k += blockDim.x) out[k] = -1;
    } else if (p.valid_counts) {
        int total;
        block_exclusive_scan(static_cast<int>(count), &total);
        count = total;
    }
    if (p.valid_counts && threadIdx.x == 0) p.valid_counts[n] = static_cast<int32_t>(count);
}

} // namespace

// p passed smla_check_convert_topk_indices (csrc/core/checks.c); what is left is this launch's grid
extern "C" int smla_cuda_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st)
{
    if (p->num_tokens == 0) return SMLA_OK;
    if (p->num_tokens > 0x7fffffffLL)
        return smla_fail(st, SMLA_ERR_VALUE, "topk_indices: %lld rows exceed one CUDA grid",
                         static_cast<long long>(p->num_tokens));
    // enough threads for one chunk to cover the row when it is short, whole warps
    int threads = static_cast<int>(smla_ceil_div(p->topk < 1 ? 1 : p->topk, kPerThread));
    threads = threads > kMaxThreads ? kMaxThreads : static_cast<int>(smla_ceil_div(threads, kWarp)) * kWarp;
    const bool vec = aligned16(p->topk_indices, 4 * p->in_stride) && aligned16(p->out, 4 * p->out_stride);
    const bool compact = p->dcp_size >= 1 && p->compact;
    const dim3 g(static_cast<unsigned>(p->num_tokens)), b(threads);
    cudaStream_t s = smla_stream(p->stream);
    if (compact) {
        if (vec) convert_kernel<true, true><<<g, b, 0, s>>>(*p);
        else convert_kernel<false, true><<<g, b, 0, s>>>(*p);
    } else {
        if (vec) convert_kernel<true, false><<<g, b, 0, s>>>(*p);
        else convert_kernel<false, false><<<g, b, 0, s>>>(*p);
    }
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
