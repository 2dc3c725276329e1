// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows). The rule of one entry is core/index_rules.h's, shared with the CPU,
// in its two stages (smla_convert_locate, smla_convert_slot); a block id >= num_blocks (when given), an
// error on the CPU, is -1 here, since reporting it would need a sync; the attention kernels then never
// read past the cache for it.
//
// One block per row, walked in chunks of blockDim.x * 8 entries, 8 consecutive entries per thread.
// Stages of a chunk:
//   load    the thread's 8 entries (two 16-byte loads when aligned), before the row's request is read
//   locate  each entry's block-table column (or its final value), divisions by per-call constants
//   lookup  the 8 block ids read at once (one memory latency a chunk, not one per entry)
//   store   in place (two 16-byte stores), or, with DCP compaction, through shared memory: a warp scan
//           of the per-thread counts gives each thread its place among the chunk's valid entries, which
//           the block then writes out contiguously after the previous chunks' ones; the row's tail
//           gets -1. Order is kept (deterministic).
// Shared memory: the warp totals (kMaxWarps ints) and, when compacting, the chunk's packed entries
// (kMaxThreads * 8 ints = 8 KB).
// out may alias topk_indices: a chunk is read completely (a barrier) before any of it is written, and
// compacted writes never reach past the chunk being processed.
#include "cache_rows.cuh"
#include "core/index_rules.h"

namespace {

using namespace smla;

constexpr int kPerThread = 8;
constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / kWarp;

// Sum of v over the block, in every thread (warp_sums: kMaxWarps ints; two barriers).
__device__ __forceinline__ int block_sum(int v, int *warp_sums)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = __reduce_add_sync(kFullMask, v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    int total = 0;
    for (int w = 0; w < nwarps; ++w) total += warp_sums[w];
    __syncthreads(); // warp_sums is reused
    return total;
}

template <bool VEC, bool COMPACT>
__global__ void __launch_bounds__(kMaxThreads) convert_kernel(smla_convert_indices_params p, smla_convert_consts kc)
{
    __shared__ int warp_sums[kMaxWarps];
    __shared__ int32_t packed[COMPACT ? kMaxThreads * kPerThread : 1];
    const int64_t n = blockIdx.x;
    const int32_t *in = p.topk_indices + n * p.in_stride;
    int32_t *out = p.out + n * p.out_stride;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    const int64_t K = p.topk;
    const int64_t chunk = static_cast<int64_t>(blockDim.x) * kPerThread;
    int64_t count = 0;  // COMPACT: entries written so far (block-uniform); else this thread's count
    for (int64_t c0 = 0; c0 < K; c0 += chunk) {
        // load
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
        // locate
        const smla_index_row rc = smla_index_row_of(&p, n);
        int32_t col[kPerThread], off[kPerThread];
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) col[e] = smla_convert_locate(&p, &kc, &rc, v[e], &off[e]);
        // lookup
        int32_t blk[kPerThread];
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) blk[e] = col[e] >= 0 ? __ldg(rc.bt_row + col[e]) : -1;
        int cnt = 0;
#pragma unroll
        for (int e = 0; e < kPerThread; ++e) {
            int64_t past_col; // a block past the cache: -1 here (the CPU's error)
            v[e] = col[e] >= 0 ? smla_convert_slot(&p, &kc, blk[e], off[e], col[e], &past_col) : off[e];
            cnt += v[e] != -1;
        }
        // store
        if (COMPACT) {
            int x = cnt; // inclusive scan over the warp
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(kFullMask, x, o);
                if (lane >= o) x += y;
            }
            if (lane == 31) warp_sums[warp] = x;
            __syncthreads(); // also: the whole chunk is read before any of it is written
            int pos = x - cnt, total = 0;
            const int nwarps = (blockDim.x + 31) >> 5;
            for (int w = 0; w < nwarps; ++w) {
                const int s = warp_sums[w];
                pos += w < warp ? s : 0;
                total += s;
            }
#pragma unroll
            for (int e = 0; e < kPerThread; ++e)
                if (v[e] != -1) packed[pos++] = v[e];
            __syncthreads();
            for (int j = threadIdx.x; j < total; j += blockDim.x) out[count + j] = packed[j];
            count += total;
            __syncthreads(); // packed and warp_sums are reused by the next chunk
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
        count = block_sum(static_cast<int>(count), warp_sums);
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
    const smla_convert_consts kc = smla_convert_consts_of(p);
    cudaStream_t s = smla_stream(p->stream);
    if (compact) {
        if (vec) convert_kernel<true, true><<<g, b, 0, s>>>(*p, kc);
        else convert_kernel<false, true><<<g, b, 0, s>>>(*p, kc);
    } else {
        if (vec) convert_kernel<true, false><<<g, b, 0, s>>>(*p, kc);
        else convert_kernel<false, false><<<g, b, 0, s>>>(*p, kc);
    }
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
