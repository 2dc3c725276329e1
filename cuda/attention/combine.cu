// Split-top-k combine: when decode has too few query rows to fill the GPU, the launcher splits each
// row's top-k list across CTAs (launch.cu, plan_splits); each split writes its fp32 partial O and
// log2-domain lse into the caller's workspace (finish_row, attention/epilogue.cuh) and this kernel
// merges them, one warp per (row, head): out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - M). When a
// split saturated (part_lse's boxes), the splits saturated at +FLT_MAX (else, when no split has an
// ordinary lse, those at -FLT_MAX) count instead, w_s = their token counts. Empty splits are
// (0, -inf) and their O is never read.
#include "attention/epilogue.cuh"
#include "attention/ptx.cuh"
#include "attention/table.cuh"

namespace attn {
namespace {

constexpr int kCombineWarps = 8;

__global__ void __launch_bounds__(kCombineWarps * 32) attn_combine_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // launched as a programmatic dependent of the main kernel: its partials are complete
    const smla_attn_params &p = a.p;
    const int lane = threadIdx.x & 31;
    const int64_t w = static_cast<int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
    const int64_t h = p.h;
    if (w >= a.rows * h) return;
    const int64_t row = w / h;
    const int hr = static_cast<int>(w - row * h);
    const int64_t bi = row / p.s_q, si = row % p.s_q;
    const int ns = a.n_splits;
    const int64_t sstride = a.rows * h;  // between splits, in (row, head) units
    const float *lp = a.lse_part + w;

    float M = -INFINITY;  // the largest ordinary lse
    bool pos = false, neg = false;
    for (int s = lane; s < ns; s += 32) {
        const float ls = lp[s * sstride];
        const int sb = box_sign(ls);
        if (sb == 0) M = fmaxf(M, ls);
        pos = pos || sb > 0;
        neg = neg || sb < 0;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    pos = __any_sync(0xffffffffu, pos);
    neg = __any_sync(0xffffffffu, neg);
    // the splits that count: 1 saturated at +FLT_MAX, 0 ordinary, -1 saturated at -FLT_MAX, 2 none
    const int mode = pos ? 1 : (M != -INFINITY ? 0 : (neg ? -1 : 2));
    const bool none = mode == 2;

    // this lane's 16 columns: 4 groups of 4, at 4 * lane + 128 k
    double W = 0.0;
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    if (!none) {
        for (int s = 0; s < ns; ++s) {
            const float ls = lp[s * sstride];
            if (ls == -INFINITY) continue;  // empty split: (0, -inf), its O was not written
            const int sb = box_sign(ls);
            float ws;
            if (sb != 0) ws = sb == mode ? box_count(ls) : 0.f;
            else if (mode == 0) ws = ex2(ls - M);
            else ws = ls != ls ? ls : 0.f;  // outweighed by saturated splits; a NaN still poisons
            W += ws;
            const float4 *op = reinterpret_cast<const float4 *>(a.o_part + (s * sstride + w) * kDv) + lane;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float4 v = op[32 * k];
                acc[4 * k + 0] += ws * v.x;
                acc[4 * k + 1] += ws * v.y;
                acc[4 * k + 2] += ws * v.z;
                acc[4 * k + 3] += ws * v.w;
            }
        }
    }
    const double lse_d = mode == 0 ? (static_cast<double>(M) + log2(W)) * SMLA_LN2 : (mode == 1 ? INFINITY : -INFINITY);
    const float f = none ? 0.f : static_cast<float>(1.0 / W);
    store_out_row<4, 4, 128>(
        p, bi, si, hr, f, none, lse_d, [&] { return 4 * lane; }, [&] { return lane == 0; },
        [&](int k) { return make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]); }, [] {});
}

}  // namespace

int launch_combine(const Args &a, cudaStream_t s, bool pdl, const char *op, smla_status *st)
{
    const int64_t grid = (a.rows * a.p.h + kCombineWarps - 1) / kCombineWarps;
    if (grid > INT32_MAX)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: too many query rows (%lld)", op, (long long)a.rows);
    // pdl (sm_90+): a programmatic dependent of the main kernel, whose CTAs signal early
    // (pdl_launch_dependents): its launch overlaps the main kernel's tail, pdl_wait orders the reads
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(grid), 1, 1);
    cfg.blockDim = dim3(kCombineWarps * 32, 1, 1);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    SMLA_CUDA_CHECK(st, cudaLaunchKernelEx(&cfg, attn_combine_kernel, a));
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

}  // namespace attn
