// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows), per params.h and csrc/cpu/convert_topk_indices.c, whose rules
// this file follows entry for entry (int64 arithmetic, so any int32 input is safe), except one: a
// block id >= num_blocks (when given) is an error on the CPU and -1 here, since reporting it would
// need a sync; the attention kernels then never read past the cache for it.
//
// One block per row. The row is walked in chunks of blockDim.x * 8 entries, 8 consecutive entries per
// thread (two 16-byte accesses when aligned). Counts come from a block-wide scan of the per-thread
// counts; with DCP compaction the same exclusive scan gives each thread its output position, so the
// valid entries land at the front in their original order (deterministic), and the tail gets -1.
// out may alias topk_indices: a chunk is read completely (the scan's barriers) before any of it is
// written, and compacted writes never reach past the chunk being processed.
#include "cache_rows.cuh"

namespace {

using namespace smla;

constexpr int kPerThread = 8;
constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / kWarp;

struct RowCtx {
    const int32_t *bt_row; // paged row with a valid request, else nullptr
    int64_t ws_base;       // prefill row: workspace start; INT64_MIN: paged row
    bool dead;             // prefill id past num_prefills: every entry -1
    int bs_shift;          // log2(block_size) when it is a power of two <= 2^31, else -1
};

// Same results as the CPU's int64 arithmetic: a valid tok is in [0, 2^31), so the divisions are done
// in uint32 (a 64-bit division is a long instruction sequence on the GPU, a 32-bit one a short one).
__device__ __forceinline__ int32_t convert_one(const smla_convert_indices_params &p, const RowCtx &rc, int32_t tok)
{
    if (tok < 0 || rc.dead) return -1;
    if (rc.ws_base != INT64_MIN) { // prefill row: no block-table check, no DCP filter
        const int64_t v = rc.ws_base + tok;
        return v > INT32_MAX ? -1 : static_cast<int32_t>(v);
    }
    uint32_t t = static_cast<uint32_t>(tok);
    if (p.dcp_size >= 1) {
        const uint32_t I = static_cast<uint32_t>(p.dcp_interleave), D = static_cast<uint32_t>(p.dcp_size);
        const uint32_t g = I == 1 ? t : t / I;
        if (g % D != static_cast<uint32_t>(p.dcp_rank)) return -1;
        const uint64_t DI = static_cast<uint64_t>(D) * I;
        const uint32_t rounds = DI > t ? 0u : t / static_cast<uint32_t>(DI);
        t = rounds * I + (t - g * I); // (tok / (D*I)) * I + tok % I, <= tok
    }
    if (rc.bt_row == nullptr) return -1;
    int64_t b, off;
    if (rc.bs_shift >= 0) {
        b = t >> rc.bs_shift;
        off = t & ((1u << rc.bs_shift) - 1u);
    } else if (p.block_size <= INT32_MAX) {
        const uint32_t bs = static_cast<uint32_t>(p.block_size), q = t / bs;
        b = q;
        off = t - q * bs;
    } else {
        b = 0;
        off = t;
    }
    if (b >= p.max_blocks) return -1;
    const int64_t blk = rc.bt_row[b];
    if (blk < 0 || (p.num_blocks > 0 && blk >= p.num_blocks)) return -1;
    const int64_t slot = blk * p.block_size + off;
    return slot > INT32_MAX ? -1 : static_cast<int32_t>(slot);
}

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

    const int64_t bs = p.block_size;
    RowCtx rc{nullptr, INT64_MIN, false, (bs & (bs - 1)) == 0 && bs <= (1LL << 31) ? __ffsll(bs) - 1 : -1};
    const int64_t pr = p.prefill_request_ids ? static_cast<int64_t>(p.prefill_request_ids[n]) : -1;
    if (pr >= 0) {
        const int64_t num_prefills = p.prefill_workspace_starts ? p.num_prefills : 0;
        if (pr < num_prefills) rc.ws_base = p.prefill_workspace_starts[pr];
        else rc.dead = true;
    } else {
        const int64_t r = p.req_id[n];
        if (r >= 0 && r < p.num_reqs) rc.bt_row = p.block_table + r * p.bt_stride;
    }

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
            v[e] = k0 + e < K ? convert_one(p, rc, v[e]) : -1;
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
