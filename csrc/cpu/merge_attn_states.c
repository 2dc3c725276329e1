/* merge_attn_states on the CPU (docs/design.md section 4). Per (token i, head j), in float32, with the exact
 * operation order of core/merge_math.h (shared with cuda/memory/merge_attn_states.cu, so both give the same bits):
 *   la == lb == -inf (both empty): out = out_a copied bit for bit, lse = -inf
 *   a +inf side (a saturated state) and no NaN: wa, wb = 1 on +inf sides, 0 else; lse = +inf
 *   else M = fmaxf(la, lb), wa = exp(la - M), wb = exp(lb - M)   (merge_math.h's exp, not libm's)
 *        lse = M + log(wa + wb)
 *   out[k] = round_dtype((wa*oa[k] + wb*ob[k]) / (wa + wb))   (no FMA, division last)
 * A NaN lse is not remapped (docs/design.md is literal): it makes that row's out and lse NaN.
 * round_dtype: bf16 / f16 round to nearest even (core/number_formats.h, shared with the GPU). */
/* Bit-exactness with the CUDA twin needs every float op rounded on its own. setup.py builds with
 * -std=gnu11, where GCC's default is -ffp-contract=fast (a*b + c*d may become an FMA on FMA-capable
 * targets), so turn contraction off for this file (clang: core/number_formats.h's STDC pragma). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <string.h>

#include "core/params.h"
#include "core/merge_math.h"

static inline float load(int dtype, const void *base, int64_t idx)
{
    if (dtype == SMLA_DT_F32) return ((const float *)base)[idx];
    if (dtype == SMLA_DT_BF16) return smla_bf16_to_f32(((const uint16_t *)base)[idx]);
    return smla_f16_to_f32(((const uint16_t *)base)[idx]);
}

static inline void store(int dtype, void *base, int64_t idx, float v)
{
    if (dtype == SMLA_DT_F32) ((float *)base)[idx] = v;
    else if (dtype == SMLA_DT_BF16) ((uint16_t *)base)[idx] = smla_f32_to_bf16(v);
    else ((uint16_t *)base)[idx] = smla_f32_to_f16(v);
}

/* p passed smla_check_merge_attn_states (core/checks.c) */
int smla_cpu_merge_attn_states(const smla_merge_attn_states_params *p, smla_status *st)
{
    (void)st;
    const size_t esize = p->dtype == SMLA_DT_F32 ? 4 : 2;

    for (int64_t i = 0; i < p->n; i++) {
        for (int64_t j = 0; j < p->h; j++) {
            const float la = p->lse_a[i * p->la_stride_n + j * p->la_stride_h];
            const float lb = p->lse_b[i * p->lb_stride_n + j * p->lb_stride_h];
            const int64_t ia = i * p->oa_stride_n + j * p->oa_stride_h;
            const int64_t ib = i * p->ob_stride_n + j * p->ob_stride_h;
            const int64_t io = i * p->o_stride_n + j * p->o_stride_h;
            float wa, wb, lse;
            if (!smla_merge_weights(la, lb, &wa, &wb, &lse)) {
                /* memmove: out may be out_a itself */
                memmove((char *)p->out + io * (int64_t)esize, (const char *)p->out_a + ia * (int64_t)esize,
                        (size_t)p->d * esize);
            } else {
                for (int64_t k = 0; k < p->d; k++) {
                    float v = smla_merge_value(wa, load(p->dtype, p->out_a, ia + k), wb,
                                               load(p->dtype, p->out_b, ib + k));
                    store(p->dtype, p->out, io + k, v);
                }
            }
            if (p->out_lse) p->out_lse[i * p->lo_stride_n + j * p->lo_stride_h] = lse;
        }
    }
    return SMLA_OK;
}
