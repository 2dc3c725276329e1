// smla.sparse_mla_prefill on CUDA: sparse MLA over bf16 kv[s_kv, 576] (one block of s_kv rows, b = 1).
//
// Design (kernels shared with decode: attention_sm90.cuh for h > 32 on sm_90, wgmma with a cp.async
// producer warpgroup; attention_core.cuh, mma.sync, for the rest and for sm_80):
// - One CTA per (query token, head tile of 16/32/64 heads), never split (prefill has thousands of
//   rows). Grid x = token * head_tiles + tile: the CTAs running at the same time are neighbouring
//   tokens whose top-k sets overlap, and K rows are loaded with an L2 evict_last hint so that those
//   shared rows stay in L2. s_q is only bounded by grid.x (2^31 - 1).
// - bf16 K rows are gathered with 16-byte cp.async into a double-buffered tile (zero fill and a -inf
//   score for invalid indices); returns out, natural-log lse and max_logits.
#include "attention_launch.cuh"

extern "C" int smla_cuda_sparse_mla_prefill(const smla_attn_params *p, smla_status *st)
{
    return attn::run_attention<false>(p, /*is_decode=*/false, st);
}
