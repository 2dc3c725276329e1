// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows). The rule of one entry is core/index_rules.h's smla_convert_index,
// shared with the CPU; a block id >= num_blocks (when given), an error on the CPU, is -1 here, since
// reporting it would need a sync; the attention kernels then never read past the cache for it.
//
// One CTA of T threads (256, fewer for short rows) per row, one pass. The row is walked in chunks of 8T
// entries, 2 groups of 4T: thread t reads and writes entries 4t..4t+3 of each group, so every warp access
// is 512 contiguous bytes (one 16-byte access per lane when rows are 16-byte aligned). The first chunk is
// loaded before anything that depends on the row's request.
// The block-table row is copied to shared memory (one coalesced load, L2 hits) when it is no longer than
// the row of indices and at most kSmemBt entries: each entry's block lookup is then a shared-memory read,
// not a global gather whose 32 lanes touch up to 32 different lines.
// Counts are ballots: the valid entries of a warp's group are popc of 4 ballots. With DCP compaction a
// lane's output position is the row's count so far + the valid entries of the earlier groups of the chunk
// and of the earlier warps of its group (per-warp counts in a double-buffered shared array, one barrier
// per chunk) + the popc of the ballots below its lane: the valid entries land at the front in their
// original order (deterministic), the tail gets -1.
// out may alias topk_indices: a chunk is read completely (before its barrier, or by the same thread)
// before any of it is written, and compacted writes never reach past the chunk being processed.
//
// DCP ownership (smla_dcp_owns) divides by dcp_size, interleave and their product, which are fixed for the
// launch: here each division is a 32x32->64-bit multiply and a shift by a magic number made on the host
// (Div31 below; exact for every dividend < 2^31, i.e. every valid position), the rest of the rule is
// smla_convert_index itself on the local position. Tested against the CPU (which runs smla_dcp_owns) over
// dcp sizes 1-7, interleaves 1 to 2^30 and positions up to 2^31 - 1 (tests/test_convert_topk_indices.py).
#include "cache_rows.cuh"
#include "core/index_rules.h"

namespace {

using namespace smla;

constexpr int kGroups = 2;     // groups of 4 entries per thread per chunk
constexpr int kMaxThreads = 256;
constexpr int kMaxWarps = kMaxThreads / kWarp;
constexpr int kSmemBt = 4096;  // block-table entries cached per CTA at most (16 KB, under the 48 KB of
                               // dynamic shared memory a launch gets without opting in)

// x / d for 0 <= x < 2^31 and a launch-invariant d >= 1: floor(x * m / 2^s) with m = ceil(2^(31+l) / d),
// l = ceil(log2 d), s = 31 + l. m * d - 2^s < d <= 2^l, so the error term x * (m * d - 2^s) / (d * 2^s) <
// 2^-l <= 1/d: exact (Granlund-Montgomery). d >= 2^31 gives 0 for every such x (m = 0).
struct Div31 {
    uint32_t m;
    int s;
};
Div31 make_div31(uint64_t d)
{
    if (d >= (1ull << 31)) return Div31{0u, 0};
    int l = 0;
    while ((1ull << l) < d) ++l;
    return Div31{static_cast<uint32_t>(((1ull << (31 + l)) + d - 1) / d), 31 + l};
}
__device__ __forceinline__ uint32_t div31(uint32_t x, Div31 v)
{
    return static_cast<uint32_t>((static_cast<uint64_t>(x) * v.m) >> v.s);
}

// smla_dcp_owns with the launch's divisors (index_rules.h: position t belongs to rank (t / I) % D and sits at
// (t / (D*I)) * I + t % I there).
struct Dcp {
    int on;
    uint32_t rank, d, i;
    Div31 by_i, by_d, by_di;
};
__device__ __forceinline__ bool dcp_owns(const Dcp &c, uint32_t t, uint32_t *local)
{
    const uint32_t g = div31(t, c.by_i);
    if (g - div31(g, c.by_d) * c.d != c.rank) return false;
    *local = div31(t, c.by_di) * c.i + (t - g * c.i);
    return true;
}

// One entry: smla_convert_index, with DCP paged rows filtered and mapped here first (p has dcp_size 0).
__device__ __forceinline__ int32_t convert_one(const smla_convert_indices_params &p, const smla_index_row &rc,
                                               const Dcp &dcp, int32_t tok)
{
    int64_t past_col; // a block past the cache: -1 here (the CPU's error)
    if (dcp.on && tok >= 0 && rc.ws_base == SMLA_PAGED_ROW) {
        uint32_t local;
        if (!dcp_owns(dcp, static_cast<uint32_t>(tok), &local)) return -1;
        tok = static_cast<int32_t>(local);
    }
    return smla_convert_index(&p, &rc, tok, &past_col);
}

template <bool VEC>
__device__ __forceinline__ void load_chunk(const int32_t *in, int64_t k0, int64_t group, int64_t K,
                                           int32_t v[kGroups][4])
{
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
        const int64_t k = k0 + g * group;
        if (VEC && k + 4 <= K) {
            const int4 a = *reinterpret_cast<const int4 *>(in + k);
            v[g][0] = a.x; v[g][1] = a.y; v[g][2] = a.z; v[g][3] = a.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[g][e] = k + e < K ? in[k + e] : -1;
        }
    }
}

template <bool VEC, bool COMPACT, bool SMEM_BT>
__global__ void __launch_bounds__(kMaxThreads) convert_kernel(smla_convert_indices_params p, Dcp dcp)
{
    extern __shared__ int32_t s_bt[]; // [max_blocks] when SMEM_BT
    __shared__ int s_cnt[2][kGroups][kMaxWarps];
    const int64_t n = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int32_t *in = p.topk_indices + n * p.in_stride;
    int32_t *out = p.out + n * p.out_stride;
    const int64_t K = p.topk, group = 4 * static_cast<int64_t>(blockDim.x), chunk = group * kGroups;
    const int64_t t4 = 4 * static_cast<int64_t>(threadIdx.x);

    int32_t v[kGroups][4];
    load_chunk<VEC>(in, t4, group, K, v);
    smla_index_row rc = smla_index_row_of(&p, n);
    if (SMEM_BT) {
        const int32_t *row = rc.bt_row;
        if (row) {
#pragma unroll 4
            for (int64_t b = threadIdx.x; b < p.max_blocks; b += blockDim.x) s_bt[b] = row[b];
        }
        __syncthreads();
        rc.bt_row = row ? s_bt : nullptr;
    }

    int64_t count = 0; // COMPACT: entries of the row written so far (CTA-uniform); else this warp's count
    int par = 0;
    for (int64_t c0 = 0; c0 < K; c0 += chunk, par ^= 1) {
        if (c0 > 0) load_chunk<VEC>(in, c0 + t4, group, K, v);
        // in row order: group g, then warp, then lane, then e. below[g]: valid entries of group g in the
        // lanes of this warp below this one; in_warp[g]: valid entries of this warp's part of group g
        int below[kGroups], in_warp[kGroups];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
            below[g] = in_warp[g] = 0;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t k = c0 + g * group + t4 + e;
                v[g][e] = k < K ? convert_one(p, rc, dcp, v[g][e]) : -1;
                const unsigned m = __ballot_sync(kFullMask, v[g][e] != -1);
                below[g] += __popc(m & ((1u << lane) - 1u));
                in_warp[g] += __popc(m);
            }
        }
        if (COMPACT) {
            if (lane == 0) {
#pragma unroll
                for (int g = 0; g < kGroups; ++g) s_cnt[par][g][warp] = in_warp[g];
            }
            __syncthreads();
            int64_t pos = count;
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                int64_t q = pos + below[g];
                for (int w = 0; w < nwarps; ++w) {
                    const int c = s_cnt[par][g][w];
                    if (w < warp) q += c;
                    pos += c;
                }
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (v[g][e] != -1) out[q++] = v[g][e];
            }
            count = pos;
        } else {
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                count += in_warp[g];
                const int64_t k = c0 + g * group + t4;
                if (VEC && k + 4 <= K) {
                    *reinterpret_cast<int4 *>(out + k) = make_int4(v[g][0], v[g][1], v[g][2], v[g][3]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (k + e < K) out[k + e] = v[g][e];
                }
            }
        }
    }
    if (COMPACT) {
        for (int64_t k = count + threadIdx.x; k < K; k += blockDim.x) out[k] = -1;
    } else if (p.valid_counts) {
        __syncthreads(); // s_cnt is free (not used without COMPACT): one slot per warp
        if (lane == 0) s_cnt[0][0][warp] = static_cast<int>(count);
        __syncthreads();
        if (threadIdx.x == 0) {
            count = 0;
            for (int w = 0; w < nwarps; ++w) count += s_cnt[0][0][w];
        }
    }
    if (p.valid_counts && threadIdx.x == 0) p.valid_counts[n] = static_cast<int32_t>(count);
}

template <bool VEC, bool COMPACT>
void launch(const smla_convert_indices_params &q, const Dcp &dcp, bool smem_bt, dim3 grid, dim3 block,
            cudaStream_t s)
{
    if (smem_bt)
        convert_kernel<VEC, COMPACT, true><<<grid, block, q.max_blocks * sizeof(int32_t), s>>>(q, dcp);
    else
        convert_kernel<VEC, COMPACT, false><<<grid, block, 0, s>>>(q, dcp);
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
    int threads = static_cast<int>(smla_ceil_div(p->topk < 1 ? 1 : p->topk, 4 * kGroups));
    threads = threads > kMaxThreads ? kMaxThreads : static_cast<int>(smla_ceil_div(threads, kWarp)) * kWarp;
    const bool vec = aligned16(p->topk_indices, 4 * p->in_stride) && aligned16(p->out, 4 * p->out_stride);
    const bool compact = p->dcp_size >= 1 && p->compact;
    const bool smem_bt = p->max_blocks <= kSmemBt && p->max_blocks <= p->topk;
    smla_convert_indices_params q = *p;
    Dcp dcp = {};
    if (p->dcp_size >= 1) {
        dcp.on = 1;
        dcp.rank = static_cast<uint32_t>(p->dcp_rank);
        dcp.d = static_cast<uint32_t>(p->dcp_size);
        dcp.i = static_cast<uint32_t>(p->dcp_interleave);
        dcp.by_i = make_div31(dcp.i);
        dcp.by_d = make_div31(dcp.d);
        dcp.by_di = make_div31(static_cast<uint64_t>(dcp.d) * dcp.i);
        q.dcp_size = 0; // the kernel filters DCP rows itself (convert_one)
    }
    const dim3 g(static_cast<unsigned>(p->num_tokens)), b(threads);
    cudaStream_t s = smla_stream(p->stream);
    if (compact) {
        if (vec) launch<true, true>(q, dcp, smem_bt, g, b, s);
        else launch<false, true>(q, dcp, smem_bt, g, b, s);
    } else {
        if (vec) launch<true, false>(q, dcp, smem_bt, g, b, s);
        else launch<false, false>(q, dcp, smem_bt, g, b, s);
    }
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
