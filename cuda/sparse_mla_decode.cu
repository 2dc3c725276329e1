// smla.sparse_mla_decode on CUDA: sparse MLA over a paged KV cache (fp8_ds_mla or bf16).
//
// Design (phase 1, sm_80+; see attention_core.cuh for the kernel itself):
// - One CTA per (query row = (request, token), head tile of 16/32/64 heads, top-k split); the grid is
//   one-dimensional (x = (row * head_tiles + tile) * splits + split), so any b * s_q works.
// - fp8 rows are gathered raw with cp.async and dequantised in shared memory to the exact bf16 values
//   the CPU path produces, then the same bf16 tensor-core loop as prefill runs over them.
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
                                                              int cache_dtype)
{
    if (b <= 0 || s_q <= 0 || h < 1 || h > 128 || topk < 1) return 0;
    if (cache_dtype != SMLA_CACHE_BF16 && cache_dtype != SMLA_CACHE_FP8_DS_MLA) return 0;
    smla_status st = {0, {0}};
    attn::Launch L;
    if (attn::prepare<true>(b, s_q, h, topk, cache_dtype, /*allow_split=*/true, &L, &st) != SMLA_OK) {
        cudaGetLastError();
        return 0;
    }
    if (L.ns <= 1) return 0;
    const int64_t bytes = L.ns * attn::split_bytes_per_split(L.rows, h);
    return (bytes + 255) / 256 * 256;
}
