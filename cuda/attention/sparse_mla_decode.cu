// smla.sparse_mla_decode on CUDA: sparse MLA over a paged KV cache (fp8_ds_mla or bf16).
//
// Design (kernels in attention_core.cuh, portable sm_80+, and attention_sm90.cuh, Hopper wgmma):
// - One CTA per (query row = (request, token), head tile of 16/32/64 heads, top-k split); the grid is
//   one-dimensional (x = (row * head_tiles + tile) * splits + split), so any b * s_q works.
// - h > 32 on sm_90: the warp-specialised wgmma kernel (a producer warpgroup dequantises fp8 rows into
//   two bf16 K buffers while two consumer warpgroups run QK^T and PV). Otherwise the portable
//   mma.sync kernel: fp8 rows gathered raw with cp.async and dequantised in shared memory. Both give
//   the exact bf16 values of the CPU path (bf16_rne(float(e4m3) * scale)).
// - SMLA_ATTN_KERNEL=portable|sm90|auto (default auto; the binding passes it in run.attn_kernel) picks the
//   family at run time (tests, A/B).
// - When b * s_q * head_tiles CTAs cannot fill the GPU, the top-k list is split across CTAs: each
//   writes fp32 partial O and a log2 lse into the caller's workspace and a combine kernel merges
//   them (lse-weighted; empty splits are (0, -inf)). The split count comes from one plan shared with
//   smla_cuda_sparse_mla_decode_workspace_size; a missing or smaller workspace means fewer splits.
// - No allocation, no host synchronisation: a decode step can be captured in a CUDA graph.
#include "attention_launch.cuh"

extern "C" int smla_cuda_sparse_mla_decode(const smla_attn_params *p, smla_status *st)
{
    return attn::run_attention<true>(p, /*is_decode=*/true, st);
}

extern "C" int64_t smla_cuda_sparse_mla_decode_workspace_size(int64_t b, int64_t s_q, int64_t h, int64_t topk,
                                                              int cache_dtype, int attn_kernel)
{
    if (b <= 0 || s_q <= 0 || h < 1 || h > 128 || topk < 1) return 0;
    if (cache_dtype != SMLA_CACHE_BF16 && cache_dtype != SMLA_CACHE_FP8_DS_MLA) return 0;
    smla_status st = {0, {0}};
    attn::Launch L;
    if (attn::prepare<true>(b, s_q, h, topk, cache_dtype, attn_kernel, /*allow_split=*/true, &L, &st) != SMLA_OK) {
        cudaGetLastError();
        return 0;
    }
    if (L.ns <= 1) return 0;
    const int64_t bytes = L.ns * attn::split_bytes_per_split(L.rows, h);
    return (bytes + 255) / 256 * 256;
}
