// The split-top-k combine kernel (the merge rule and its thread layout: attention/combine.cuh): launched
// after the main kernel of a split decode that does not merge its own partials (launch.cu: the fused
// decode does, where its kernel and grid allow), one group of G threads per (row, head).
#include "attention/combine.cuh"
#include "attention/table.cuh"

namespace attn {
namespace {

template <int G>
__global__ void __launch_bounds__(kCombineThreads) attn_combine_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // launched as a programmatic dependent of the main kernel: its partials are complete
    const int64_t w = static_cast<int64_t>(blockIdx.x) * (kCombineThreads / G) + threadIdx.x / G;  // (row, head)
    if (w >= a.rows * a.p.h) return;
    combine_pair<G>(a, w, static_cast<int>(threadIdx.x % G), static_cast<int>(threadIdx.x & 31));
}

}  // namespace

int launch_combine(const Args &a, cudaStream_t s, const char *op, smla_status *st)
{
    // many splits (few rows): a CTA per (row, head); else a warp per (row, head)
    const int g = a.n_splits >= kCombineGroupSplits ? kCombineThreads : 32;
    const int64_t pairs = a.rows * a.p.h, per_cta = kCombineThreads / g;
    const int64_t grid = (pairs + per_cta - 1) / per_cta;
    if (grid > INT32_MAX)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: too many query rows (%lld)", op, (long long)a.rows);
    // a programmatic dependent of the main kernel (sm_90+), whose CTAs signal early
    // (pdl_launch_dependents): its launch overlaps the main kernel's tail, pdl_wait orders the reads
    smla_launch(g == 32 ? attn_combine_kernel<32> : attn_combine_kernel<kCombineThreads>,
                dim3(static_cast<unsigned>(grid)), dim3(kCombineThreads), 0, s, 1, a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

}  // namespace attn
