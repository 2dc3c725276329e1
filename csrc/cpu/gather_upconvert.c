/* gather_upconvert on the CPU: for request r and 0 <= i < seq_lens[r],
 *   workspace[workspace_starts[r] + i] = dequant(token p = seq_starts[r] + i of request r),
 * token p living in block block_table[r, p / block_size] at offset p % block_size. Rows outside
 * [0, ws_rows) are skipped; a token with p < 0, p / block_size >= max_blocks or a block id outside
 * [0, num_blocks) gives a row of +0.0. Dequant is cache_rows.h's (bit-identical to unpack_kv).
 * Overlapping requests: the later request wins here (unspecified on the GPU). */
#include <string.h>

#include "../params.h"
#include "cache_rows.h"

int smla_cpu_gather_upconvert(const smla_gather_upconvert_params *p, smla_status *st)
{
    const smla_cache *c = &p->cache;
    if (smla_cache_entry_bytes(c->dtype) == 0)
        return smla_fail(st, SMLA_ERR_VALUE, "gather_upconvert: unknown kv_cache_dtype code %d", c->dtype);
    if (p->num_reqs < 0 || p->max_blocks < 0 || p->ws_rows < 0 || c->block_size <= 0 || c->num_blocks < 0)
        return smla_fail(st, SMLA_ERR_VALUE,
                         "gather_upconvert: invalid sizes (num_reqs %lld, max_blocks %lld, ws_rows %lld, "
                         "block_size %lld)", (long long)p->num_reqs, (long long)p->max_blocks,
                         (long long)p->ws_rows, (long long)c->block_size);

    const int64_t bs = c->block_size;
    for (int64_t r = 0; r < p->num_reqs; r++) {
        const int64_t len = p->seq_lens[r], ws0 = p->workspace_starts[r];
        const int64_t start = p->seq_starts ? p->seq_starts[r] : 0;
        /* clip i so that 0 <= ws0 + i < ws_rows; all values are int32-sized, nothing overflows */
        int64_t lo = ws0 < 0 ? -ws0 : 0;
        int64_t hi = len < p->ws_rows - ws0 ? len : p->ws_rows - ws0;
        const int32_t *bt = p->block_table + r * p->bt_stride;
        for (int64_t i = lo; i < hi; i++) {
            uint16_t *out = p->workspace + (ws0 + i) * p->ws_stride;
            const int64_t pos = start + i;
            const uint8_t *entry = NULL;
            if (pos >= 0 && pos / bs < p->max_blocks)
                entry = smla_cache_block_row(c, bt[pos / bs], pos % bs);
            if (entry)
                smla_dequant_row_bf16(c, entry, out);
            else
                memset(out, 0, 2 * SMLA_D_QK);
        }
    }
    return SMLA_OK;
}
