// merge_attn_states: lse-weighted merge of two partial attention results (docs/design.md section 4). The float
// arithmetic (weights, exp/log, value formula) is csrc/core/merge_math.h, shared with the CPU kernel
// so both give the same bits; this file only moves the data.
//
// A block holds blockDim.y (token, head) pairs with blockDim.x threads each; a thread handles 16
// bytes per step of its pair's d values, two steps at a time (scalar steps when d or the strides are
// not 16B-aligned).
#include "cache_rows.cuh"
#include "core/merge_math.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPairThreads = 64;
constexpr int64_t kMaxGrid = 1 << 30;

template <int DT> struct Elt;
template <> struct Elt<SMLA_DT_BF16> {
    using Raw = uint16_t;
    static __device__ __forceinline__ float to_f(Raw r) { return smla_bf16_to_f32(r); }
    static __device__ __forceinline__ Raw from_f(float f) { return smla_f32_to_bf16(f); }
};
template <> struct Elt<SMLA_DT_F16> {
    using Raw = uint16_t;
    static __device__ __forceinline__ float to_f(Raw r) { return smla_f16_to_f32(r); }
    static __device__ __forceinline__ Raw from_f(float f) { return smla_f32_to_f16(f); }
};
template <> struct Elt<SMLA_DT_F32> {
    using Raw = uint32_t;
    static __device__ __forceinline__ float to_f(Raw r) { return smla_bits_to_f32(r); }
    static __device__ __forceinline__ Raw from_f(float f) { return smla_f32_to_bits(f); }
};

// W consecutive raw elements: one 16-byte access when VEC, else W = 1.
template <typename Raw, bool VEC> struct Pack {
    static constexpr int W = VEC ? 16 / static_cast<int>(sizeof(Raw)) : 1;
    union {
        uint4 v;
        Raw e[16 / sizeof(Raw)];
    } u;
    __device__ __forceinline__ void load(const Raw *p)
    {
        if (VEC) u.v = *reinterpret_cast<const uint4 *>(p);
        else u.e[0] = *p;
    }
    __device__ __forceinline__ void store(Raw *p) const
    {
        if (VEC) *reinterpret_cast<uint4 *>(p) = u.v;
        else *p = u.e[0];
    }
};

template <int DT, bool VEC>
__global__ void __launch_bounds__(kThreads) merge_kernel(smla_merge_attn_states_params p, int64_t npairs)
{
    pdl_wait();
    using E = Elt<DT>;
    using Raw = typename E::Raw;
    using PK = Pack<Raw, VEC>;
    constexpr int W = PK::W;
    const int64_t per_block = blockDim.y, step = static_cast<int64_t>(blockDim.x) * W;
    for (int64_t base = blockIdx.x * per_block; base < npairs; base += gridDim.x * per_block) {
        const int64_t q = base + threadIdx.y;
        const bool active = q < npairs;
        int64_t i = 0, j = 0;
        float lse = 0.0f;
        if (active) {
            i = q / p.h;
            j = q - i * p.h;
            const float la = p.lse_a[i * p.la_stride_n + j * p.la_stride_h];
            const float lb = p.lse_b[i * p.lb_stride_n + j * p.lb_stride_h];
            float wa, wb;
            const int ok = smla_merge_weights(la, lb, &wa, &wb, &lse);
            const Raw *a = static_cast<const Raw *>(p.out_a) + i * p.oa_stride_n + j * p.oa_stride_h;
            const Raw *b = static_cast<const Raw *>(p.out_b) + i * p.ob_stride_n + j * p.ob_stride_h;
            Raw *o = static_cast<Raw *>(p.out) + i * p.o_stride_n + j * p.o_stride_h;
            // two steps per iteration, both loaded before either is stored (more bytes in flight; out
            // may alias out_a, so the compiler could not hoist the second loads itself)
            for (int64_t k = static_cast<int64_t>(threadIdx.x) * W; k < p.d; k += 2 * step) {
                const int64_t k2 = k + step;
                const bool two = k2 < p.d;
                PK va[2], vb[2];
                va[0].load(a + k);
                if (two) va[1].load(a + k2);
                if (ok) {
                    vb[0].load(b + k);
                    if (two) vb[1].load(b + k2);
#pragma unroll
                    for (int u = 0; u < 2; ++u)
#pragma unroll
                        for (int e = 0; e < W; ++e)
                            va[u].u.e[e] = E::from_f(smla_merge_value(wa, E::to_f(va[u].u.e[e]), wb,
                                                                      E::to_f(vb[u].u.e[e])));
                }
                va[0].store(o + k); // both states empty: out_a bit for bit
                if (two) va[1].store(o + k2);
            }
        }
        if (p.out_lse) {
            __syncthreads(); // out_lse may alias lse_a / lse_b: every thread has read them
            if (active && threadIdx.x == 0) p.out_lse[i * p.lo_stride_n + j * p.lo_stride_h] = lse;
        }
    }
}

template <int DT> void launch_dt(const smla_merge_attn_states_params &p, bool vec, int64_t npairs, cudaStream_t s)
{
    const int64_t esize = DT == SMLA_DT_F32 ? 4 : 2;
    const int64_t w = vec ? 16 / esize : 1;
    const int64_t steps = smla_ceil_div(p.d, w); // 16-byte (or scalar) steps per pair, two per thread
    int bx = 1;
    while (bx < kMaxPairThreads && 2 * bx < steps) bx *= 2;
    const int by = kThreads / bx;
    const int64_t nblk = smla_ceil_div(npairs, by);
    const dim3 g(static_cast<unsigned>(nblk < kMaxGrid ? nblk : kMaxGrid)), b(bx, by);
    smla_launch(vec ? merge_kernel<DT, true> : merge_kernel<DT, false>, g, b, 0, s, 1, p, npairs);
}

} // namespace

// p passed smla_check_merge_attn_states (csrc/core/checks.c)
extern "C" int smla_cuda_merge_attn_states(const smla_merge_attn_states_params *p, smla_status *st)
{
    const int64_t npairs = p->n * p->h;
    if (npairs == 0) return SMLA_OK;
    const int64_t esize = p->dtype == SMLA_DT_F32 ? 4 : 2;
    const int64_t w = 16 / esize;
    const bool vec = p->d % w == 0 && smla::aligned16(p->out_a, esize * p->oa_stride_n, esize * p->oa_stride_h) &&
                     smla::aligned16(p->out_b, esize * p->ob_stride_n, esize * p->ob_stride_h) &&
                     smla::aligned16(p->out, esize * p->o_stride_n, esize * p->o_stride_h);
    cudaStream_t s = smla_stream(p->stream);
    if (p->dtype == SMLA_DT_BF16) launch_dt<SMLA_DT_BF16>(*p, vec, npairs, s);
    else if (p->dtype == SMLA_DT_F16) launch_dt<SMLA_DT_F16>(*p, vec, npairs, s);
    else launch_dt<SMLA_DT_F32>(*p, vec, npairs, s);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}
