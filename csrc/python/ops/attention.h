/* Shared by the two attention bindings: validation of the per-query arrays and the params fill. */
#ifndef SMLA_OPS_ATTENTION_H
#define SMLA_OPS_ATTENTION_H

#include "../binding.h"

/* The arrays of one attention call, in the decode ("batched") layout:
 * q [b, s_q, h, 576] (or, with q_pe [b, s_q, h, 64] present, q [b, s_q, h, 512]: the latent and the RoPE
 * part of each query row as two arrays, read in place), indices [b, s_q, topk], topk_length [b, s_q],
 * attn_sink [h], out [b, s_q, h, 512], lse [b, s_q, h], max_logits [b, s_q, h]. Prefill arrays are given
 * a unit leading dimension by smla_attn_unsqueeze after their own checks. */
typedef struct {
    smla_arr *q, *q_pe, *indices, *topk_length, *attn_sink, *out, *lse, *max_logits;
} smla_attn_arrays;

/* Checks the dtypes, shapes (batch_dims = 2 for decode, 1 for prefill), contiguity and writability of
 * every array (the limits on h and topk, and alignment, are core/checks.c's); out, lse and max_logits given
 * as smla._C.ALLOCATE are made once q is checked (smla_args_alloc). */
int smla_attn_check(smla_args *A, const smla_attn_arrays *x, int batch_dims);
void smla_attn_unsqueeze(smla_arr *a);
/* Parses precision ("high" / "fast"), checks softmax_scale (core/checks.h: before it becomes a float) and
 * copies pointers, strides, sizes (arrays in the batched layout), the stream and the settings of the
 * call; 0, or -1 with ValueError. */
int smla_attn_fill(smla_args *A, smla_attn_params *p, const smla_attn_arrays *x, double softmax_scale,
                   const char *precision);

#endif
