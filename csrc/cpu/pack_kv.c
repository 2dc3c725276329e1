/* pack_kv on the CPU: the reference writer of the KV cache (DESIGN section 3); cuda/pack_kv.cu must
 * give the same bytes. Per token t with a slot in [0, num_blocks*block_size) (others are skipped and
 * leave the cache untouched):
 *   bf16:        entry = kv_c[t] (512 bf16) then k_pe[t] (64 bf16), bit for bit.
 *   fp8_ds_mla:  per tile of 128 latent values,
 *                  amax = fmaxf over fabsf(float(x))      (fmaxf drops NaN; any order gives the same)
 *                  pow2: s = pow2_ceil(fmaxf(amax / 448.0f, 1e-4f))   (one fp32 division)
 *                  fp32: s = fmaxf(amax / 448.0f, FLT_MIN)
 *                  byte i = e4m3_satfinite_rne(float(x_i) / s)         (fp32 division, not x * (1/s))
 *                scale t at byte 512 + 4t (fp32), k_pe bf16 bits at byte 528.
 * An Inf element makes s = Inf and itself NaN (Inf/Inf); -0.0 gives 0x80.
 * Duplicate slots: the last token wins here; on the GPU which one wins is unspecified. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "../params.h"
#include "numerics.h"
#include "cache_rows.h"

static void pack_fp8_entry(uint8_t *entry, const uint16_t *kv_c, const uint16_t *k_pe, int rule)
{
    for (int t = 0; t < SMLA_FP8_NUM_TILES; t++) {
        const uint16_t *x = kv_c + t * SMLA_FP8_TILE;
        float v[SMLA_FP8_TILE];
        float amax = 0.0f;
        for (int i = 0; i < SMLA_FP8_TILE; i++) {
            v[i] = smla_bf16_to_f32(x[i]);
            amax = fmaxf(amax, fabsf(v[i]));
        }
        float s = amax / 448.0f;
        s = rule == SMLA_SCALE_POW2 ? smla_pow2_ceil(fmaxf(s, 1e-4f)) : fmaxf(s, FLT_MIN);
        for (int i = 0; i < SMLA_FP8_TILE; i++)
            entry[t * SMLA_FP8_TILE + i] = smla_f32_to_e4m3(v[i] / s);
        memcpy(entry + SMLA_FP8_SCALE_OFF + 4 * t, &s, 4);
    }
    memcpy(entry + SMLA_FP8_ROPE_OFF, k_pe, 2 * SMLA_D_ROPE);
}

int smla_cpu_pack_kv(const smla_pack_kv_params *p, smla_status *st)
{
    const smla_cache *c = &p->cache;
    if (smla_cache_entry_bytes(c->dtype) == 0)
        return smla_fail(st, SMLA_ERR_VALUE, "pack_kv: unknown kv_cache_dtype code %d", c->dtype);
    if (c->dtype == SMLA_CACHE_FP8_DS_MLA && p->scale_rule != SMLA_SCALE_POW2 &&
        p->scale_rule != SMLA_SCALE_FP32)
        return smla_fail(st, SMLA_ERR_VALUE, "pack_kv: unknown scale_rule code %d", p->scale_rule);
    if (p->num_tokens < 0 || c->block_size <= 0 || c->num_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE, "pack_kv: invalid sizes (num_tokens %lld, block_size %lld)",
                         (long long)p->num_tokens, (long long)c->block_size);

    for (int64_t t = 0; t < p->num_tokens; t++) {
        int64_t slot = p->slot_is_i64 ? ((const int64_t *)p->slot_mapping)[t]
                                      : (int64_t)((const int32_t *)p->slot_mapping)[t];
        uint8_t *entry = smla_cache_row_mut(c, slot);
        if (!entry) continue;
        const uint16_t *kv_c = p->kv_c + t * p->kv_c_stride;
        const uint16_t *k_pe = p->k_pe + t * p->k_pe_stride;
        if (c->dtype == SMLA_CACHE_FP8_DS_MLA) {
            pack_fp8_entry(entry, kv_c, k_pe, p->scale_rule);
        } else {
            memcpy(entry, kv_c, 2 * SMLA_D_NOPE);
            memcpy(entry + 2 * SMLA_D_NOPE, k_pe, 2 * SMLA_D_ROPE);
        }
    }
    return SMLA_OK;
}
