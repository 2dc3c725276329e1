// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows). The rule of one entry is core/index_rules.h's smla_convert_index,
// shared with the CPU; a block id >= num_blocks (when given), an error on the CPU, is -1 here, since
// reporting it would need a sync; the attention kernels then never read past the cache for it.
//
// Persistent CTAs of W warps (W = ceil(topk / 256), at most 8), as many as fit on the GPU, each walking rows
// n = blockIdx.x, + gridDim.x, ... in one pass per row. A row is walked in rounds of W * 256 entries; in a
// round warp w owns 256 consecutive entries as 2 groups of 128, lane l reading and writing entries
// 4l..4l+3 of each group: every warp access is 512 contiguous bytes (one 16-byte access per lane when rows
// are 16-byte aligned). The next row's first round is loaded while this row is converted and written, so a
// CTA always has reads in flight (measured on the H200: one CTA per row, which converts between its reads
// and writes, ran at 0.63 of copy speed).
// The block-table row lives in shared memory (max_blocks <= 4096 and <= topk): one coalesced load per
// request change, then each entry's block lookup is a shared-memory read instead of a gather through L1
// (32 lanes on up to 32 different lines: the gathers, not DRAM, set the old kernel's pace).
// Counts are ballots: a warp's valid entries are popc of its ballots, and with DCP compaction a lane's
// output position is the row's count so far + the counts of the warps before it in this round (one
// barrier per round, through a double-buffered shared array) + the popc of the ballots below its lane: the
// valid entries land at the front in their original order (deterministic), the tail gets -1.
// out may alias topk_indices: a round is read completely (before its barrier, or by the same thread)
// before any of it is written, compacted writes never reach past the round being processed, and the
// prefetched row is another row.
//
// DCP ownership (smla_dcp_owns) divides by dcp_size, interleave and their product, which are fixed for the
// launch: here each division is a 32x32->64-bit multiply and a shift by a magic number made on the host
// (Div31 below; exact for every dividend < 2^31, i.e. every valid position), the rest of the rule is
// smla_convert_index itself on the local position. Tested against the CPU (which runs smla_dcp_owns) over
// dcp sizes 1-4 and interleaves 1-4.
#include "cache_rows.cuh"
#include "core/index_rules.h"

namespace {

using namespace smla;

constexpr int kGroup = 128;              // entries of one warp access (4 per lane)
constexpr int kGroups = 2;               // groups per warp per round
constexpr int kWarpSpan = kGroup * kGroups;
constexpr int kMaxWarps = 8;
constexpr int kSmemBt = 4096;            // block-table entries cached per CTA at most (16 KB, under the
                                         // 48 KB of dynamic shared memory a launch gets without opting in)
constexpr int kMaxDevices = 64;

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

// The entries of a warp's span starting at k0 (lane offset included) into v; -1 past the row.
template <bool VEC>
__device__ __forceinline__ void load_span(const int32_t *in, int64_t k0, int64_t K, int32_t v[kGroups][4])
{
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
        const int64_t k = k0 + g * kGroup;
        if (VEC && k + 4 <= K) {
            const int4 a = *reinterpret_cast<const int4 *>(in + k);
            v[g][0] = a.x; v[g][1] = a.y; v[g][2] = a.z; v[g][3] = a.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[g][e] = k + e < K ? in[k + e] : -1;
        }
    }
}

template <bool VEC, bool COMPACT>
__global__ void __launch_bounds__(kMaxWarps * kWarp, 4) convert_kernel(smla_convert_indices_params p, Dcp dcp,
                                                                       int bt_cached)
{
    extern __shared__ int32_t s_bt[]; // [max_blocks] when bt_cached
    __shared__ int s_cnt[2][kMaxWarps];
    __shared__ int s_row[2][kMaxWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int64_t K = p.topk, N = p.num_tokens;
    const int64_t round = static_cast<int64_t>(nwarps) * kWarpSpan;
    const int64_t w_off = static_cast<int64_t>(warp) * kWarpSpan + 4 * lane;
    const int32_t *cached = nullptr; // the block-table row now in s_bt (CTA-uniform)
    int par = 0, rpar = 0;

    int64_t n = blockIdx.x;
    int32_t v[kGroups][4];
    if (n < N) load_span<VEC>(p.topk_indices + n * p.in_stride, w_off, K, v);
    for (; n < N; n += gridDim.x, rpar ^= 1) {
        // the next row's first round, in flight while this row is converted and written
        const int64_t nn = n + gridDim.x;
        int32_t nv[kGroups][4];
        if (nn < N) load_span<VEC>(p.topk_indices + nn * p.in_stride, w_off, K, nv);

        smla_index_row rc = smla_index_row_of(&p, n);
        if (bt_cached && rc.bt_row) {
            if (rc.bt_row != cached) {
                __syncthreads(); // every warp is done with the previous row's table
#pragma unroll 4
                for (int64_t b = threadIdx.x; b < p.max_blocks; b += blockDim.x) s_bt[b] = rc.bt_row[b];
                cached = rc.bt_row;
                __syncthreads();
            }
            rc.bt_row = s_bt;
        }
        const int32_t *in = p.topk_indices + n * p.in_stride;
        int32_t *out = p.out + n * p.out_stride;
        int64_t count = 0; // COMPACT: entries of the row written so far (CTA-uniform); else this warp's count
        for (int64_t r0 = 0; r0 < K; r0 += round, par ^= 1) {
            if (r0 > 0) load_span<VEC>(in, r0 + w_off, K, v);
            // a warp's entries in row order: group g, then lane, then e. below[g]: valid entries of group g
            // in the lanes below this one; total: valid entries of the warp in this round
            int below[kGroups], in_group[kGroups], total = 0;
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                below[g] = in_group[g] = 0;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int64_t k = r0 + w_off + g * kGroup + e;
                    v[g][e] = k < K ? convert_one(p, rc, dcp, v[g][e]) : -1;
                    const unsigned m = __ballot_sync(kFullMask, v[g][e] != -1);
                    below[g] += __popc(m & ((1u << lane) - 1u));
                    in_group[g] += __popc(m);
                }
                total += in_group[g];
            }
            if (COMPACT) {
                if (lane == 0) s_cnt[par][warp] = total;
                __syncthreads();
                int64_t pos = count, round_total = 0;
                for (int w = 0; w < nwarps; ++w) {
                    const int c = s_cnt[par][w];
                    if (w < warp) pos += c;
                    round_total += c;
                }
#pragma unroll
                for (int g = 0; g < kGroups; ++g) {
                    int64_t q = pos + below[g];
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (v[g][e] != -1) out[q++] = v[g][e];
                    pos += in_group[g];
                }
                count += round_total;
            } else {
                count += total;
#pragma unroll
                for (int g = 0; g < kGroups; ++g) {
                    const int64_t k = r0 + w_off + g * kGroup;
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
            // per-row buffers alternate: thread 0 reads this one before the next row's barrier
            if (lane == 0) s_row[rpar][warp] = static_cast<int>(count);
            __syncthreads();
            if (threadIdx.x == 0) {
                count = 0;
                for (int w = 0; w < nwarps; ++w) count += s_row[rpar][w];
            }
        }
        if (p.valid_counts && threadIdx.x == 0) p.valid_counts[n] = static_cast<int32_t>(count);
#pragma unroll
        for (int g = 0; g < kGroups; ++g)
#pragma unroll
            for (int e = 0; e < 4; ++e) v[g][e] = nv[g][e];
    }
}

// CTAs of this kernel that fit on one SM of device dev (cached: one occupancy query per kernel and device).
template <bool VEC, bool COMPACT>
int ctas_per_sm(int dev, int threads, size_t smem)
{
    static int cache[kMaxDevices][kMaxWarps + 1][2];
    const int w = threads / kWarp, s = smem > 0;
    int *c = dev >= 0 && dev < kMaxDevices ? &cache[dev][w][s] : nullptr;
    if (c && *c > 0) return *c;
    int occ = 0;
    // with the most shared memory a launch of this shape may ask for, so the figure holds for every call
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, convert_kernel<VEC, COMPACT>, threads,
                                                      s ? kSmemBt * sizeof(int32_t) : 0) != cudaSuccess ||
        occ < 1) {
        cudaGetLastError();
        occ = 1;
    }
    if (c) *c = occ;
    return occ;
}

int sm_count(int dev)
{
    static int cache[kMaxDevices];
    if (dev >= 0 && dev < kMaxDevices && cache[dev] > 0) return cache[dev];
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
        cudaGetLastError();
        n = 1;
    }
    if (dev >= 0 && dev < kMaxDevices) cache[dev] = n;
    return n;
}

template <bool VEC, bool COMPACT>
void launch(const smla_convert_indices_params &q, const Dcp &dcp, int bt_cached, int warps, size_t smem, cudaStream_t s)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        dev = -1;
    }
    const int threads = warps * kWarp;
    const int64_t fit = static_cast<int64_t>(sm_count(dev)) * ctas_per_sm<VEC, COMPACT>(dev, threads, smem);
    const unsigned grid = static_cast<unsigned>(q.num_tokens < fit ? q.num_tokens : fit);
    convert_kernel<VEC, COMPACT><<<grid, threads, smem, s>>>(q, dcp, bt_cached);
}

} // namespace

// p passed smla_check_convert_topk_indices (csrc/core/checks.c); what is left is this launch's grid
extern "C" int smla_cuda_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st)
{
    if (p->num_tokens == 0) return SMLA_OK;
    int warps = static_cast<int>(smla_ceil_div(p->topk < 1 ? 1 : p->topk, kWarpSpan));
    warps = warps > kMaxWarps ? kMaxWarps : warps;
    const bool vec = aligned16(p->topk_indices, 4 * p->in_stride) && aligned16(p->out, 4 * p->out_stride);
    const bool compact = p->dcp_size >= 1 && p->compact;
    // the block-table row in shared memory when it is no longer than the row of indices
    const int bt_cached = p->max_blocks <= kSmemBt && p->max_blocks <= p->topk;
    const size_t smem = bt_cached ? static_cast<size_t>(p->max_blocks) * sizeof(int32_t) : 0;
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
    cudaStream_t s = smla_stream(p->stream);
    if (compact) {
        if (vec) launch<true, true>(q, dcp, bt_cached, warps, smem, s);
        else launch<false, true>(q, dcp, bt_cached, warps, smem, s);
    } else {
        if (vec) launch<true, false>(q, dcp, bt_cached, warps, smem, s);
        else launch<false, false>(q, dcp, bt_cached, warps, smem, s);
    }
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
