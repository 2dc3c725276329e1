/* unpack_kv on the CPU: out[i] = dequantised entry of slots[i] (core/fp8_ds_mla.h's read rule,
 * bf16_rne(float(e4m3) * scale), for the fp8 latent part, bit copies otherwise); a slot outside
 * [0, num_blocks*block_size) gives a row of +0.0. cuda/memory/unpack_kv.cu must give the same bits. */
#include <string.h>

#include "core/params.h"
#include "cache_rows.h"

/* p passed smla_check_unpack_kv (core/checks.c) */
int smla_cpu_unpack_kv(const smla_unpack_kv_params *p, smla_status *st)
{
    (void)st;
    const smla_cache *c = &p->cache;
    for (int64_t i = 0; i < p->n; i++) {
        int64_t slot = p->slots_is_i64 ? ((const int64_t *)p->slots)[i]
                                       : (int64_t)((const int32_t *)p->slots)[i];
        uint16_t *out = p->out + i * p->out_stride;
        const uint8_t *entry = smla_cache_entry(c, slot);
        if (entry)
            smla_dequant_row_bf16(c, entry, out);
        else
            memset(out, 0, 2 * SMLA_D_QK);
    }
    return SMLA_OK;
}
