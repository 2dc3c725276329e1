// gather_upconvert: for request r and 0 <= i < seq_lens[r],
//   workspace[workspace_starts[r] + i] = dequant(token seq_starts[r] + i of request r)
// (rows outside [0, ws_rows) skipped; position < 0, past max_blocks or a block id outside
// [0, num_blocks) -> zero row). Same bits as csrc/cpu/gather_upconvert.c for valid requests; the CPU
// rejects those cases (negative seq_lens / starts, rows past the workspace, positions past the block
// table, blocks outside the cache) before writing, but seq_lens and the block table live on the
// device here, so checking them would need a sync: this behaviour is documented instead.
//
// seq_lens live on the device, so the grid cannot depend on them: it is (request, chunk) tasks over
// x, chunks per request fixed from ws_rows on the host, and each block walks its request's rows with
// a stride of chunks * warps. One warp per row, two rows in flight per warp (cache_rows.cuh).
#include "cache_rows.cuh"

namespace {

using namespace smla;

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerWarp = 2;
constexpr int64_t kRowsPerTask = 64;    // a chunk's share when one request owns the whole workspace
constexpr int64_t kMaxTasks = 8192;     // bound on (request, chunk) tasks when requests are many
constexpr int64_t kMaxGrid = 1 << 30;

template <int DT, bool VIN, bool VOUT>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp, 4)
    gather_kernel(smla_gather_upconvert_params p, int64_t chunks)
{
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t ntasks = p.num_reqs * chunks;
    for (int64_t task = blockIdx.x; task < ntasks; task += gridDim.x) {
        const int64_t r = task / chunks, c = task - r * chunks;
        const int64_t len = p.seq_lens[r], ws0 = p.workspace_starts[r];
        const int64_t start = p.seq_starts ? static_cast<int64_t>(p.seq_starts[r]) : 0;
        // clip i so that 0 <= ws0 + i < ws_rows (int32 inputs: nothing overflows)
        const int64_t lo = ws0 < 0 ? -ws0 : 0;
        const int64_t hi = len < p.ws_rows - ws0 ? len : p.ws_rows - ws0;
        const int32_t *bt = p.block_table + r * p.bt_stride;
        const int64_t step = chunks * kWarpsPerBlock;
        for (int64_t i0 = lo + c * kWarpsPerBlock + warp; i0 < hi; i0 += step * kRowsPerWarp) {
            RowFrag<DT> f[kRowsPerWarp];
#pragma unroll
            for (int u = 0; u < kRowsPerWarp; ++u) {
                const int64_t i = i0 + u * step;
                if (i >= hi) break;
                f[u].template load<VIN>(smla_cache_entry_of(&p.cache, bt, p.max_blocks, start + i), lane);
            }
#pragma unroll
            for (int u = 0; u < kRowsPerWarp; ++u) {
                const int64_t i = i0 + u * step;
                if (i >= hi) break;
                f[u].template store<VOUT>(p.workspace + (ws0 + i) * p.ws_stride, lane);
            }
        }
    }
}

template <int DT> void launch_dt(const smla_gather_upconvert_params &p, bool vin, bool vout, int64_t chunks,
                                 dim3 g, dim3 b, cudaStream_t s)
{
    smla_launch(vin ? (vout ? gather_kernel<DT, true, true> : gather_kernel<DT, true, false>)
                    : (vout ? gather_kernel<DT, false, true> : gather_kernel<DT, false, false>),
                g, b, 0, s, 1, p, chunks);
}

} // namespace

// p passed smla_check_gather_upconvert (csrc/core/checks.c)
extern "C" int smla_cuda_gather_upconvert(const smla_gather_upconvert_params *p, smla_status *st)
{
    const smla_cache &c = p->cache;
    if (p->num_reqs == 0 || p->ws_rows == 0) return SMLA_OK;
    // A request writes at most ws_rows rows: give each enough chunks to spread the whole workspace
    // over the GPU, but keep the total number of (mostly idle) tasks bounded when requests are many.
    int64_t chunks = smla_ceil_div(p->ws_rows, kRowsPerTask);
    const int64_t cap = kMaxTasks / p->num_reqs;
    if (chunks > cap) chunks = cap;
    if (chunks < 1) chunks = 1;
    int64_t tasks = p->num_reqs * chunks;
    const dim3 g(static_cast<unsigned>(tasks < kMaxGrid ? tasks : kMaxGrid)), b(kWarpsPerBlock * kWarp);
    const bool vin = aligned16(c.data, c.block_stride, c.entry_stride);
    const bool vout = aligned16(p->workspace, 2 * p->ws_stride);
    cudaStream_t s = smla_stream(p->stream);
    if (c.dtype == SMLA_CACHE_FP8_DS_MLA) launch_dt<SMLA_CACHE_FP8_DS_MLA>(*p, vin, vout, chunks, g, b, s);
    else launch_dt<SMLA_CACHE_BF16>(*p, vin, vout, chunks, g, b, s);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
