// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows). The rule of one entry is core/index_rules.h's, shared with the CPU,
// in its two stages (smla_convert_locate, smla_convert_slot); a block id >= num_blocks (when given), an
// error on the CPU, is -1 here, since reporting it would need a sync; the attention kernels then never
// read past the cache for it.
//
// One block per row, walked in chunks of blockDim.x * 8 entries, 8 consecutive entries per thread. The
// call's cases are template parameters, so that the entry loop tests none of them per entry: DCP (none, any
// interleave and world size, both powers of two: shifts and masks), compaction, power-of-two block size,
// 16-byte alignment. 32 registers (8 blocks of 256 threads an SM): these kernels are bound by issued
// instructions and latency, not by bytes (benchmarks/README.md, issue 18).
// Stages of a chunk:
//   load    the thread's 8 entries (two 16-byte loads when aligned), before the row's request is read
//   locate  each entry's block-table column (or its final value), divisions by per-call constants
//   lookup  the 8 block ids read at once (one memory latency a chunk, not one per entry)
//   store   in place (two 16-byte stores), or, with DCP compaction, through shared memory: a warp scan
//           of the per-thread counts and the warp totals give each thread its place among the chunk's
//           valid entries, which it writes there; then
//           - a row of one chunk (top-k <= 2048 with 16-byte alignment, the usual case): each thread
//             writes back its own 8 positions of the row, the compacted entry or -1 past the count, with
//             two 16-byte stores (two barriers a row, no tail pass);
//           - a longer row: the block writes the chunk's entries after the previous chunks' ones, and
//             the row's tail gets -1 at the end.
//           Order is kept (deterministic).
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
// Blocks an SM must hold (the register bound it implies: 32 per thread): a block is one short row, so the
// latency of its loads is hidden by the other rows in flight. SMLA_CONVERT_MIN_BLOCKS overrides (A/B).
#ifndef SMLA_CONVERT_MIN_BLOCKS
#define SMLA_CONVERT_MIN_BLOCKS 8
#endif
constexpr int kMinBlocks = SMLA_CONVERT_MIN_BLOCKS;

// Sum of the first `upto` warp totals and of all of them (warp_sums: kMaxWarps ints, two 16-byte reads).
__device__ __forceinline__ void warp_prefix(const int *warp_sums, int upto, int nwarps, int *before, int *total)
{
    static_assert(kMaxWarps == 8, "two int4 reads");
    const int4 a = reinterpret_cast<const int4 *>(warp_sums)[0], b = reinterpret_cast<const int4 *>(warp_sums)[1];
    const int w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    int s = 0, t = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int x = i < nwarps ? w[i] : 0;  // the slots of absent warps are never written
        s += i < upto ? x : 0;
        t += x;
    }
    *before = s;
    *total = t;
}

// The chunk's valid entries v[] (-1: none) of this thread, packed in order into the shared array at
// `packed` (a shared-space address; the chunk's first valid entry first). Returns the chunk's count. One
// barrier before the packed writes (so the whole chunk has been read first, and warp_sums is filled); the
// caller syncs before reading packed.
__device__ __forceinline__ int pack_chunk(const int32_t (&v)[kPerThread], int cnt, int *warp_sums, uint32_t packed)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    int x = cnt; // inclusive scan over the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFullMask, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    int before, total;
    warp_prefix(warp_sums, warp, nwarps, &before, &total);
    uint32_t addr = packed + 4u * static_cast<uint32_t>(before + x - cnt);
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) {
        if (v[e] != -1) asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v[e]) : "memory");
        addr += v[e] != -1 ? 4u : 0u;
    }
    return total;
}

// The call's cases are fixed at compile time, so that the entry loop carries no test of them: VEC 16-byte
// aligned rows, DCP the DCP argument of smla_convert_locate_as (0 none, 1 any interleave and world size,
// 2 both powers of two), COMPACT valid entries moved to the front, POW2 a power-of-two block size.
template <bool VEC, int DCP, bool COMPACT, bool POW2>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) convert_kernel(smla_convert_indices_params p, smla_convert_consts kc)
{
    __shared__ __align__(16) int warp_sums[kMaxWarps];
    __shared__ __align__(16) int32_t packed[COMPACT ? kMaxThreads * kPerThread : 4];
    pdl_wait();
    const int64_t n = blockIdx.x;
    const int32_t *in = p.topk_indices + n * p.in_stride;
    int32_t *out = p.out + n * p.out_stride;

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
        for (int e = 0; e < kPerThread; ++e)
            col[e] = smla_convert_locate_as(&p, &kc, &rc, v[e], &off[e], DCP, POW2);
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
        if constexpr (COMPACT) {
            const int total = pack_chunk(v, cnt, warp_sums, static_cast<uint32_t>(__cvta_generic_to_shared(packed)));
            __syncthreads();
            if (VEC && K <= chunk) {  // the row is this chunk: own positions, compacted entry or -1
                if (full) {
                    const int4 a = *reinterpret_cast<const int4 *>(packed + k0);
                    const int4 b = *reinterpret_cast<const int4 *>(packed + k0 + 4);
                    const int r = total - static_cast<int>(k0);  // entries of the 8 that are valid
                    *reinterpret_cast<int4 *>(out + k0) =
                        make_int4(r > 0 ? a.x : -1, r > 1 ? a.y : -1, r > 2 ? a.z : -1, r > 3 ? a.w : -1);
                    *reinterpret_cast<int4 *>(out + k0 + 4) =
                        make_int4(r > 4 ? b.x : -1, r > 5 ? b.y : -1, r > 6 ? b.z : -1, r > 7 ? b.w : -1);
                } else {
#pragma unroll
                    for (int e = 0; e < kPerThread; ++e)
                        if (k0 + e < K) out[k0 + e] = k0 + e < total ? packed[k0 + e] : -1;
                }
                count = total;
                break;
            }
            for (int j = threadIdx.x; j < total; j += blockDim.x) out[count + j] = packed[j];
            count += total;
            __syncthreads(); // packed and warp_sums are reused by the next chunk
            if (c0 + chunk >= K)
                for (int64_t k = count + threadIdx.x; k < K; k += blockDim.x) out[k] = -1;
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
    if (!COMPACT && p.valid_counts) {  // the block's sum of the thread counts
        const int c = __reduce_add_sync(kFullMask, static_cast<int>(count));
        if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = c;
        __syncthreads();
        int unused, total;
        warp_prefix(warp_sums, 0, (blockDim.x + 31) >> 5, &unused, &total);
        count = total;
    }
    if (p.valid_counts && threadIdx.x == 0) p.valid_counts[n] = static_cast<int32_t>(count);
}

// The kernel of one call's cases.
using ConvertFn = void (*)(smla_convert_indices_params, smla_convert_consts);
template <bool VEC, int DCP, bool COMPACT>
ConvertFn pick_pow2(bool pow2)
{
    return pow2 ? convert_kernel<VEC, DCP, COMPACT, true> : convert_kernel<VEC, DCP, COMPACT, false>;
}
template <bool VEC>
ConvertFn pick(int dcp, bool compact, bool pow2)
{
    if (dcp == 0) return pick_pow2<VEC, 0, false>(pow2);
    if (dcp == 1) return compact ? pick_pow2<VEC, 1, true>(pow2) : pick_pow2<VEC, 1, false>(pow2);
    return compact ? pick_pow2<VEC, 2, true>(pow2) : pick_pow2<VEC, 2, false>(pow2);
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
    const int dcp = p->dcp_size >= 1 ? 1 + kc.dcp_pow2 : 0;
    const bool pow2 = kc.bs_shift >= 0;
    smla_launch(vec ? pick<true>(dcp, compact, pow2) : pick<false>(dcp, compact, pow2), g, b, 0, s, 1, *p, kc);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
