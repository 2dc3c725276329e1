// convert_topk_indices / filter_convert_dcp_indices: request-local top-k positions -> global cache
// slots (or prefill workspace rows). The rule of one entry is core/index_rules.h's, shared with the CPU,
// in its two stages (smla_convert_locate_paged / smla_convert_locate_as, smla_convert_slot_as); a block id
// >= num_blocks (when given), an error on the CPU, is -1 here, since reporting it would need a sync; the
// attention kernels then never read past the cache for it.
//
// One block per row, walked in chunks of blockDim.x * 8 entries, 8 consecutive entries per thread;
// positions in 32 bits (topk <= INT32_MAX). The call's cases are template parameters, so that the entry
// loop tests none of them per entry: DCP (none, any interleave and world size, both powers of two: masks
// and shifts), compaction, power-of-two block size, 16-byte alignment; the row's case (paged or prefill) is
// one block-uniform branch around the entry loops. 32 registers (8 blocks of 256 threads an SM): these
// kernels are bound by issued instructions and latency, not by bytes (benchmarks/README.md, issue 18).
// Stages of a chunk:
//   load    the thread's 8 entries (two 16-byte loads when aligned), before the row's request is read
//   locate  each entry's block-table column and offset, divisions by per-call constants (a prefill row:
//           its final values)
//   lookup  the 8 block ids read at once (one memory latency a chunk, not one per entry), block id -1
//           for an entry without a column, which makes its slot -1 (no select per entry)
//   store   in place (two 16-byte stores), or, with DCP compaction, through shared memory: each thread's
//           count of valid entries (those that are not -1), its lanes' prefix from 4 ballots (one per bit of the
//           count) and the warp totals (two warp reductions) give it its place among the chunk's valid
//           entries, which it writes there; then
//           - a row of one chunk (top-k <= 2048 with 16-byte alignment, the usual case): each thread
//             copies its own 8 positions of the row back with two 16-byte loads and stores: the
//             compacted entries, and past the count the -1 the thread wrote there at the start (two
//             barriers a row, no tail pass, no select);
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

// Shared memory through 32-bit shared-space addresses: the generic forms recomputed the shared window for
// each access.
__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The block's sum of one value per warp (`mine`, from the lane where `writer`), and the sum over the warps
// before this one (*before). warp_sums: kMaxWarps ints at shared address ws. One barrier; the slots of
// absent warps are never read. Two warp reductions of the warp values, one per lane: fewer instructions
// than every thread summing all 8 with selects.
__device__ __forceinline__ int block_sum(uint32_t ws, bool writer, int mine, int *before)
{
    static_assert(kMaxWarps <= kWarp, "one warp value per lane");
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p st.shared.b32 [%0], %1;\n\t}"
                 ::"r"(ws + 4u * warp), "r"(mine), "r"(static_cast<uint32_t>(writer)) : "memory");
    __syncthreads();
    int w;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.lt.u32 p, %1, %2;\n\tmov.b32 %0, 0;\n\t@p ld.shared.b32 %0, [%3];\n\t}"
                 : "=r"(w) : "r"(lane), "r"(nwarps), "r"(ws + 4u * lane) : "memory");
    *before = __reduce_add_sync(kFullMask, lane < warp ? w : 0);
    return __reduce_add_sync(kFullMask, w);
}

// The warp's votes for bit B of x (the test as one and-to-predicate: the compiler's own form of
// (x & B) != 0 took a shift, an and and a compare).
template <int B> __device__ __forceinline__ uint32_t ballot_bit(int x)
{
    uint32_t r;
    asm volatile("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\tand.b32 t, %1, %2;\n\tsetp.ne.b32 p, t, 0;\n\t"
                 "vote.sync.ballot.b32 %0, p, 0xffffffff;\n\t}" : "=r"(r) : "r"(x), "n"(B));
    return r;
}

// The chunk's valid entries v[] (those that are not -1) of this thread, packed in order into the
// shared array at `packed` (a shared-space address; the chunk's first valid entry first). Returns the
// chunk's count. One barrier before the packed writes (so the whole chunk has been read first, and
// warp_sums, at shared address ws, is filled); the caller syncs before reading packed.
// The lower lanes' entries: cnt <= 8 is 4 bits, so a ballot per bit and popc of the lower lanes' votes
// (4 votes, no dependent chain) replace a 5-step shuffle scan.
__device__ __forceinline__ int pack_chunk(const int32_t (&v)[kPerThread], int cnt, uint32_t ws, uint32_t packed)
{
    uint32_t lower;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(lower));
    const int x = __popc(ballot_bit<1>(cnt) & lower) + 2 * __popc(ballot_bit<2>(cnt) & lower) +
                  4 * __popc(ballot_bit<4>(cnt) & lower) + 8 * __popc(ballot_bit<8>(cnt) & lower);
    int before;
    const int total = block_sum(ws, (threadIdx.x & 31) == 31, x + cnt, &before);
    // entry e goes to addr + 4 * e less 4 per invalid entry before it: a predicated store at a constant
    // offset and a predicated decrement
    uint32_t addr = packed + 4u * static_cast<uint32_t>(before + x);
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) {
        if (v[e] != -1) asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr + 4u * e), "r"(v[e]) : "memory");
        else addr -= 4u;
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
    // positions in 32 bits: topk <= INT32_MAX (checked at the edge), so c0 + chunk < 2^32
    const uint32_t K = static_cast<uint32_t>(p.topk);
    const uint32_t chunk = blockDim.x * kPerThread;
    // A one-chunk row reads its positions past the count as -1 from packed: each thread's 8 written here,
    // before pack_chunk's barrier (for every row: a test would cost more than the two stores).
    if (COMPACT && VEC) {
        const int4 none = make_int4(-1, -1, -1, -1);
        reinterpret_cast<int4 *>(packed)[2 * threadIdx.x] = none;
        reinterpret_cast<int4 *>(packed)[2 * threadIdx.x + 1] = none;
    }
    pdl_wait();
    const int64_t n = blockIdx.x;
    const int32_t *in = p.topk_indices + n * p.in_stride;
    int32_t *out = p.out + n * p.out_stride;

    uint32_t count = 0;  // COMPACT: entries written so far (block-uniform); else this thread's count
    for (uint32_t c0 = 0; c0 < K; c0 += chunk) {
        // load
        const uint32_t k0 = c0 + threadIdx.x * kPerThread;
        const uint32_t rem = k0 < K ? min(K - k0, static_cast<uint32_t>(kPerThread)) : 0u;  // of the 8 in the row
        int32_t v[kPerThread];
        const bool full = VEC && rem == kPerThread;
        if (full) {
            const int4 a = reinterpret_cast<const int4 *>(in + k0)[0];
            const int4 b = reinterpret_cast<const int4 *>(in + k0)[1];
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {  // in + k0 first, so that e folds into the address (k0 + e is 32-bit)
#pragma unroll
            for (int e = 0; e < kPerThread; ++e) v[e] = e < rem ? (in + k0)[e] : -1;
        }
        // locate, lookup: a row reads the block table or is a prefill row (block-uniform), so that each
        // case's entry loop has no per-entry branch on it
        const smla_index_row rc = smla_index_row_of(&p, n);
        int cnt = kPerThread;  // this thread's valid entries: those that are not -1
        if (rc.ws_base == SMLA_PAGED_ROW) {
            int32_t blk[kPerThread];
            uint32_t off[kPerThread];
#pragma unroll
            for (int e = 0; e < kPerThread; ++e) {
                uint32_t col;
                const bool has = smla_convert_locate_paged(&p, &kc, &rc, v[e], &col, &off[e], DCP, POW2);
                blk[e] = has ? __ldg(rc.bt_row + col) : -1;  // block id -1: the entry is -1
            }
#pragma unroll
            for (int e = 0; e < kPerThread; ++e) {
                int64_t past_col; // a block past the cache: -1 here (the CPU's error)
                v[e] = smla_convert_slot_as(&p, &kc, blk[e], static_cast<int32_t>(off[e]), 0, &past_col, POW2);
                // a slot is -1 or in [0, INT32_MAX]: the sign bit counts the invalid ones
                cnt -= static_cast<int>(static_cast<uint32_t>(v[e]) >> 31);
            }
        } else {  // a prefill row's value is its workspace start + tok, which may be negative: only -1 is none
#pragma unroll
            for (int e = 0; e < kPerThread; ++e) {
                int32_t val;
                smla_convert_locate_as(&p, &kc, &rc, v[e], &val, DCP, POW2);
                v[e] = val;
                cnt -= val == -1;
            }
        }
        // store
        if constexpr (COMPACT) {
            const uint32_t total = pack_chunk(v, cnt, smem_addr(warp_sums), smem_addr(packed));
            __syncthreads();
            if (VEC && K <= chunk) {  // the row is this chunk: own positions, compacted entry or -1
                if (full) {
                    reinterpret_cast<int4 *>(out + k0)[0] = reinterpret_cast<const int4 *>(packed + k0)[0];
                    reinterpret_cast<int4 *>(out + k0)[1] = reinterpret_cast<const int4 *>(packed + k0)[1];
                } else {
#pragma unroll
                    for (int e = 0; e < kPerThread; ++e)
                        if (e < rem) (out + k0)[e] = packed[k0 + e];
                }
                count = total;
                break;
            }
            for (uint32_t j = threadIdx.x; j < total; j += blockDim.x) out[count + j] = packed[j];
            count += total;
            __syncthreads(); // packed and warp_sums are reused by the next chunk
            if (c0 + chunk >= K)
                for (uint32_t k = count + threadIdx.x; k < K; k += blockDim.x) out[k] = -1;
        } else {
            count += cnt;
            if (full) {
                reinterpret_cast<int4 *>(out + k0)[0] = make_int4(v[0], v[1], v[2], v[3]);
                reinterpret_cast<int4 *>(out + k0)[1] = make_int4(v[4], v[5], v[6], v[7]);
            } else {  // a chain of tests: the 8 store predicates kept from the loads spilled (sm_80)
#pragma unroll
                for (int e = 0; e < kPerThread; ++e) {
                    if (e >= rem) break;
                    (out + k0)[e] = v[e];
                }
            }
        }
    }
    if (!COMPACT && p.valid_counts) {  // the block's sum of the thread counts
        const int c = __reduce_add_sync(kFullMask, static_cast<int>(count));
        int unused;
        count = static_cast<uint32_t>(block_sum(smem_addr(warp_sums), (threadIdx.x & 31) == 0, c, &unused));
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
