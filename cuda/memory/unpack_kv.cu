// unpack_kv: out[i] = dequantised cache entry of slots[i] (bf16_rne(float(e4m3) * scale) for the fp8
// latent part, bit copies otherwise); an invalid slot gives a zero row. One warp per row, two rows in
// flight per warp (cache_rows.cuh). Same bits as csrc/cpu/unpack_kv.c.
#include "cache_rows.cuh"

namespace {

using namespace smla;

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerWarp = 2;

template <int DT, bool VIN, bool VOUT, bool I64>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) unpack_kernel(smla_unpack_kv_params p)
{
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * kRowsPerWarp;
    RowFrag<DT> f[kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
        const int64_t i = i0 + u;
        if (i >= p.n) break;
        const int64_t slot = I64 ? static_cast<const int64_t *>(p.slots)[i]
                                 : static_cast<int64_t>(static_cast<const int32_t *>(p.slots)[i]);
        f[u].template load<VIN>(smla_cache_entry(&p.cache, slot), lane);
    }
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
        const int64_t i = i0 + u;
        if (i >= p.n) break;
        f[u].template store<VOUT>(p.out + i * p.out_stride, lane);
    }
}

template <int DT, bool VIN, bool VOUT> void launch_dt(const smla_unpack_kv_params &p, dim3 g, dim3 b, cudaStream_t s)
{
    smla_launch(p.slots_is_i64 ? unpack_kernel<DT, VIN, VOUT, true> : unpack_kernel<DT, VIN, VOUT, false>, g, b, 0, s, 1, p);
}

template <bool VIN, bool VOUT> void launch(const smla_unpack_kv_params &p, dim3 g, dim3 b, cudaStream_t s)
{
    if (p.cache.dtype == SMLA_CACHE_FP8_DS_MLA) launch_dt<SMLA_CACHE_FP8_DS_MLA, VIN, VOUT>(p, g, b, s);
    else launch_dt<SMLA_CACHE_BF16, VIN, VOUT>(p, g, b, s);
}

} // namespace

// p passed smla_check_unpack_kv (csrc/core/checks.c); what is left is this launch's grid
extern "C" int smla_cuda_unpack_kv(const smla_unpack_kv_params *p, smla_status *st)
{
    const smla_cache &c = p->cache;
    if (p->n == 0) return SMLA_OK;
    const int64_t nblk = smla_ceil_div(p->n, kWarpsPerBlock * kRowsPerWarp);
    if (nblk > 0x7fffffffLL)
        return smla_fail(st, SMLA_ERR_VALUE, "slots: %lld rows exceed one CUDA grid",
                         static_cast<long long>(p->n));
    const bool vin = aligned16(c.data, c.block_stride, c.entry_stride);
    const bool vout = aligned16(p->out, 2 * p->out_stride);
    const dim3 g(static_cast<unsigned>(nblk)), b(kWarpsPerBlock * kWarp);
    cudaStream_t s = smla_stream(p->stream);
    if (vin && vout) launch<true, true>(*p, g, b, s);
    else if (vin) launch<true, false>(*p, g, b, s);
    else if (vout) launch<false, true>(*p, g, b, s);
    else launch<false, false>(*p, g, b, s);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
