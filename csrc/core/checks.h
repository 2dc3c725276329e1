/* The rules of each op's params, checked once at the edge (docs/design.md section 8): the binding calls
 * smla_check_<op> after it has filled the params from checked arrays, for the CPU and the CUDA kernels
 * alike, and the kernels trust their params. Shapes, limits, layout codes and the alignment the kernels
 * need live here; what only the data can tell (a slot past the cache, ...) stays in the CPU kernels.
 * Plain C: 0 (SMLA_OK), or the code of st, whose message starts with the argument's name. */
#ifndef SMLA_CHECKS_H
#define SMLA_CHECKS_H

#include "params.h"

#ifdef __cplusplus
extern "C" {
#endif

int smla_check_pack_kv(const smla_pack_kv_params *p, int on_cuda, smla_status *st);
int smla_check_unpack_kv(const smla_unpack_kv_params *p, int on_cuda, smla_status *st);
int smla_check_gather_upconvert(const smla_gather_upconvert_params *p, int on_cuda, smla_status *st);
int smla_check_convert_topk_indices(const smla_convert_indices_params *p, int on_cuda, smla_status *st);
/* The same with the DCP filter on (dcp_size >= 1). */
int smla_check_filter_convert_dcp_indices(const smla_convert_indices_params *p, int on_cuda, smla_status *st);
int smla_check_merge_attn_states(const smla_merge_attn_states_params *p, int on_cuda, smla_status *st);
int smla_check_sparse_mla_decode(const smla_attn_params *p, int on_cuda, smla_status *st);
int smla_check_sparse_mla_prefill(const smla_attn_params *p, int on_cuda, smla_status *st);

/* The shape limits of one attention call: b, s_q >= 0, h in 1..SMLA_MAX_HEADS, topk in
 * 1..SMLA_MAX_TOPK. Messages name q and indices, or with scalars = 1 the arguments b, s_q, h and topk
 * (sparse_mla_decode_workspace_size). */
int smla_check_attn_shape(int64_t b, int64_t s_q, int64_t h, int64_t topk, int scalars, smla_status *st);
/* softmax_scale as the caller gave it (before it becomes the float of the params): finite, and
 * |scale| * log2(e) finite in fp32 (the kernels work in the log2 domain). */
int smla_check_softmax_scale(double scale, smla_status *st);

#ifdef __cplusplus
}
#endif

#endif /* SMLA_CHECKS_H */
