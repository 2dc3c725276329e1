// The portable sparse MLA kernel (mma.sync, sm_80 and later), used for every head count off Hopper
// and for h <= 32 on it: one CTA = one query row x one tile of HT heads (16, 32 or 64) x one range
// of top-k tiles; a flash-attention style loop over BN-token K tiles gathered into shared memory,
// bf16 tensor cores (m16n8k16, fp32 accumulate) fed by ldmatrix, online softmax in fp32 (log2
// domain). The kernel body is the pipeline of its stages:
//   plan.cuh    : Cfg, the shared-memory plan, the CTA's coordinates (Cta);
//   loaders.cuh : Q, the index ring, K rows (bf16 cp.async / fp8 staging + dequant);
//   tile.cuh    : per K tile, S = Q K^T, masked online softmax, O += P V;
//   epilogue    : row sums across the S-phase warps, then finish_row (attention/epilogue.cuh): bf16
//                 out, natural-log lse, max_logits, attn_sink, or, when the top-k is split across CTAs
//                 (decode with few rows), fp32 partial O plus log2-domain lse for the combine.
// K-tile pipeline, one CTA-wide barrier per tile (plus B1 / B2 inside the tile and one more for the
// fp8 dequant): bf16 tiles are double-buffered; fp8 entries stream into NRAW staging buffers (2:
// the next tile's copy overlaps this tile's dequant; 1: where shared memory allows only one) and
// are dequantised into a single bf16 tile. Indices run one tile ahead of the rows that use them.
//
// Each instantiation file (sm80/bf16.cu, sm80/fp8.cu) lists its configurations with entry<C>().
#pragma once

#include "attention/epilogue.cuh"
#include "attention/table.cuh"
#include "attention/sm80/loaders.cuh"
#include "attention/sm80/tile.cuh"

namespace attn {
namespace sm80 {

// Row sums across the S-phase warps (through smem, over the last tile's maxima), then each thread
// writes its PV-phase share: rows mt * 16 + g (+ 8) x columns warp * OC + 2 t4 + 8 nt.
template <class C>
__device__ __forceinline__ void epilogue(const Args &a, const Cta<C> &c, RowState<C> &st)
{
    constexpr int HT = C::HT;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        st.l_r[i] += __shfl_xor_sync(0xffffffffu, st.l_r[i], 1);
        st.l_r[i] += __shfl_xor_sync(0xffffffffu, st.l_r[i], 2);
    }
    {
        const int r0 = c.wr * 16 + c.g;
        if (c.t4 == 0) {  // sRed (here as double) was last read before B2 of the last tile
            c.sRedD[c.wc * HT + r0] = st.l_r[0];
            c.sRedD[c.wc * HT + r0 + 8] = st.l_r[1];
            if (c.wc == 0) {
                c.sM[r0] = st.m_r[0];
                c.sM[r0 + 8] = st.m_r[1];
            }
        }
    }
    __syncthreads();

    // warp and t4 as locals for the lambdas below: read through c there, nvcc gives the 32 x 32 and
    // 64 x 32 tiles 2 more registers on sm_90a (tools/kernel_resources.py)
    const int warp = c.warp, t4 = c.t4;
    const bool split = a.n_splits > 1;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int rl = mt * 16 + c.g + 8 * hf;
            const int hr = c.h0 + rl;
            if (hr >= c.h) continue;
            double l = 0.0;
#pragma unroll
            for (int w = 0; w < C::WC; ++w) l += c.sRedD[w * HT + rl];
            finish_row<C::NTO>(
                a, c.row, c.bi, c.si, c.sp, c.h, hr, split, c.sM[rl], l, [&] { return warp * C::OC + 2 * t4; },
                [&] { return warp == 0 && t4 == 0; },
                [&](int nt) { return make_float2(st.o[mt][nt][2 * hf], st.o[mt][nt][2 * hf + 1]); });
        }
    }
}

// Internal linkage: each instantiation file owns its kernels (no two files register one kernel).
namespace {

template <class C>
__global__ void __launch_bounds__(C::NT, C::MINB) attn_sm80_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    constexpr int BN = C::BN;
    extern __shared__ __align__(128) uint8_t smem[];
    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    const Cta<C> c(a, smem);
    RowState<C> st;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NTO; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) st.o[mt][nt][e] = 0.f;

    if (c.j0 < c.j1) {
        // prologue: Q and the first index tile, then the first K rows and the second index tile
        load_q(a, c);
        load_idx(c, c.j0, 0);
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        load_rows(a, c, c.j0, 0, C::FP8 ? c.sRaw : c.sK);
        if (c.j0 + 1 < c.j1) load_idx(c, c.j0 + 1, 1);
        cp_async_commit();

        for (int j = c.j0; j < c.j1; ++j) {
            const int it = j - c.j0;
            cp_async_wait_all();
            __syncthreads();  // B0: tile j (and index tile j+1) landed; every warp is done with tile j-1
            uint32_t kb;
            if constexpr (!C::FP8) {  // double-buffered bf16 tiles: load j + 1 while j is computed
                kb = c.sK + (it & 1) * (BN * kRowBytes);
                if (j + 1 < c.j1) load_rows(a, c, j + 1, (it + 1) % 3, c.sK + ((it + 1) & 1) * (BN * kRowBytes));
                if (j + 2 < c.j1) load_idx(c, j + 2, (it + 2) % 3);
                cp_async_commit();
            } else if constexpr (C::NRAW == 2) {  // two staging buffers: copy j + 1 while j is dequantised
                kb = c.sK;
                if (j + 1 < c.j1) load_rows(a, c, j + 1, (it + 1) % 3, c.sRaw + ((it + 1) & 1) * (BN * kFp8Entry));
                if (j + 2 < c.j1) load_idx(c, j + 2, (it + 2) % 3);
                cp_async_commit();
                dequant_tile(c, c.raw + (it & 1) * (BN * kFp8Entry), c.sK);
                __syncthreads();  // K tile complete
            } else {  // one staging buffer: dequantise j, then copy j + 1 into it
                kb = c.sK;
                dequant_tile(c, c.raw, c.sK);
                __syncthreads();  // K tile complete, staging buffer free
                if (j + 1 < c.j1) load_rows(a, c, j + 1, (it + 1) % 3, c.sRaw);
                if (j + 2 < c.j1) load_idx(c, j + 2, (it + 2) % 3);
                cp_async_commit();
            }
            tile(a, c, j, kb, it % 3, st);
        }
        cp_async_wait_all();
    }

    epilogue(a, c, st);
}

template <class C>
int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    return launch_kernel<attn_sm80_kernel<C>>(a, grid, C::NT, Smem<C>::bytes, s, dev, st);
}

}  // namespace

// The table entry of configuration C.
template <class C>
constexpr KernelEntry entry()
{
    return KernelEntry{Family::sm80, C::FP8, C::HT, C::BN, Smem<C>::bytes, C::MINB, C::NT, &launch<C>};
}

}  // namespace sm80
}  // namespace attn
