// What every sparse MLA attention kernel (cuda/attention/sm80, sm90, combine.cu) is given: the sizes
// of one token's row in each cache format, the kernel arguments (Args) the launcher (launch.cu) fills
// once per call, and the slice of the top-k list one CTA reads (row_slice). Kernels trust these
// values: the bindings check the params at the edge (csrc/python), the launcher adds only what it
// derives (split count, log2-domain scale, workspace pointers).
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the launcher gets the encoder from the runtime)
#include <math.h>

#include "common.cuh"
#include "core/index_rules.h"

namespace attn {

constexpr int kDqk = SMLA_D_QK;             // 576: q / K row (latent 512 + RoPE 64)
constexpr int kDv = SMLA_D_V;               // 512: V = K[:, :512], the output row
constexpr int kRowBytes = 2 * kDqk;         // one bf16 row of Q / K in smem: 1152 B
constexpr int kRowChunks = kRowBytes / 16;  // 72 sixteen-byte chunks
constexpr int kNopeChunks = 2 * SMLA_D_NOPE / 16;  // 64: chunks of a bf16 row that hold the latent part
constexpr int kFp8Entry = SMLA_FP8_ENTRY;   // 656 B: one fp8_ds_mla token (docs/design.md section 3)
constexpr int kFp8Chunks = kFp8Entry / 16;  // 41
static_assert(SMLA_FP8_TILE == 16 * 8, "a bf16 chunk c < 64 of an fp8 row takes scale c >> 4");
static_assert(kFp8Entry % 16 == 0 && SMLA_FP8_ROPE_OFF % 16 == 0, "fp8 entries are copied in 16-byte chunks");

// The arguments of every attention kernel, passed by value (__grid_constant__).
struct Args {
    smla_attn_params p;
    int64_t limit;     // valid slots: [0, limit)
    int64_t rows;      // b * s_q
    int n_ht;          // head tiles per row
    int n_splits;      // top-k splits per (row, head tile); > 1: partials + combine
    float scale_log2;  // softmax_scale * log2(e), rounded to fp32
    double ml_factor;  // softmax_scale / scale_log2 (~ln 2): log2-domain kernel logits -> natural logits,
                       // undoing scale_log2's fp32 rounding (lse = m * ml_factor + ln(l))
    float *o_part;     // [n_splits, rows, h, 512] fp32 (split mode)
    float *lse_part;   // [n_splits, rows, h] fp32, log2 domain (split mode)
    int evict_last;    // L2 evict_last hint on K rows (prefill: neighbouring rows share K)
    int n_sms;         // the device's SMs (a persistent kernel's grid, sm90/kernel.cuh)
    int l2_bytes;      // the device's L2 (the persistent pair kernel's rule, sm90/pair_kernel.cuh)
    int fused;         // n_splits > 1 and the kernel merges the partials itself after a grid-wide barrier
                       // (a cooperative launch; attention/combine.cuh), else the combine kernel does
    // The bf16 wide kernel's Q tile by TMA (sm90/kernel.cuh), where the launcher could describe q (and q_pe) to
    // the tensor-memory accelerator (launch.cu, set_q_maps): q_map / qpe_map, else 0 and the kernel loads Q by
    // cp.async. Last, and 64-byte aligned as CUtensorMap is.
    int q_tma;
    CUtensorMap q_map, qpe_map;
};

// The bf16 wide kernel loads its Q tile by TMA where it can (Args::q_tma; launch.cu, set_q_maps). 0: always by
// cp.async, as the other kernels do.
#ifndef SMLA_Q_TMA
#define SMLA_Q_TMA 1
#endif

// What one CTA of query row (bi, si) and top-k split sp reads: the row's indices, its top-k length L
// (topk_length clamped to [0, topk]) and its tiles [j0, j1) of bn tokens (j1 <= j0: none).
// Which work a CTA of the main kernels does: launch.cu sizes the one-dimensional grid as
// blockIdx.x = (row * n_ht + head tile) * n_splits + split, row = request * s_q + token. (The sm90 fp8
// two-CTA cluster orders its grid by head tile last; sm90/plan.cuh.)
// SMLA_REVERSE_ROWS (1, the default): the grid walks the rows from the last to the first. In a causal
// prefill the later tokens attend to more of the prompt, so their CTAs start first and the short ones
// fill the last wave (longest first); each CTA's work and result are unchanged. Measured on the H200
// (benchmarks/README.md, "Issue 16, eighth session"): causal fresh prompt h=64 "fast" 640-656 against
// 663-669 us, "high" 815 against 875; h=128 within the noise. 0 restores the forward order.
#ifndef SMLA_REVERSE_ROWS
#define SMLA_REVERSE_ROWS 1
#endif
struct GridPos {
    int64_t row, bi, si;
    int ht, sp;
};
__device__ __forceinline__ GridPos grid_pos_of(const Args &a, int64_t bx)
{
    GridPos g;
    g.sp = static_cast<int>(bx % a.n_splits);
    bx /= a.n_splits;
    g.ht = static_cast<int>(bx % a.n_ht);
    g.row = bx / a.n_ht;
    if (SMLA_REVERSE_ROWS) g.row = a.rows - 1 - g.row;
    g.bi = g.row / a.p.s_q, g.si = g.row % a.p.s_q;
    return g;
}
__device__ __forceinline__ GridPos grid_pos(const Args &a) { return grid_pos_of(a, blockIdx.x); }

struct RowSlice {
    const int32_t *idx;
    int L, j0, j1;
};
__device__ __forceinline__ RowSlice row_slice(const Args &a, int64_t bi, int64_t si, int sp, int bn)
{
    const smla_attn_params &p = a.p;
    const int topk = static_cast<int>(p.topk);
    RowSlice r;
    r.idx = p.indices + bi * p.idx_stride_b + si * p.idx_stride_s;
    r.L = topk;
    if (p.topk_length) {
        const int v = p.topk_length[bi * p.tl_stride_b + si * p.tl_stride_s];
        r.L = v < 0 ? 0 : (v > topk ? topk : v);
    }
    const int ntile = (r.L + bn - 1) / bn;
    const int tps = (ntile + a.n_splits - 1) / a.n_splits;
    r.j0 = sp * tps;
    r.j1 = min(ntile, r.j0 + tps);
    return r;
}

}  // namespace attn
