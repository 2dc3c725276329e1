/* convert_topk_indices / filter_convert_dcp_indices on the CPU (params.h, DESIGN section 4). Per
 * entry tok of row n, in int64 so that no int32 input can overflow:
 *   tok < 0                                   -> -1
 *   prefill row (p = prefill_request_ids[n] >= 0):
 *     p >= num_prefills or ws[p] + tok > INT32_MAX -> -1, else ws[p] + tok: no block-table check and
 *     no DCP filter (as vLLM's fix: the workspace holds the request's whole gathered context)
 *   DCP (dcp_size >= 1), paged rows: g = tok, I = interleave, D = dcp_size;
 *     (g / I) % D != dcp_rank                 -> -1
 *     else tok := (g / (D*I)) * I + g % I     (position in this rank's cache)
 *   paged row: r = req_id[n], b = tok / block_size;
 *     r outside [0, num_reqs), b >= max_blocks, block_table[r, b] < 0, or slot > INT32_MAX -> -1,
 *     else slot = block_table[r, b] * block_size + tok % block_size
 * DCP with compact: the entries != -1 move to the front in their original order, the rest is -1.
 * valid_counts[n] = number of entries != -1. out may alias topk_indices (same strides): every entry is
 * read before any entry at or after its column is written. */
#include <limits.h>

#include "../params.h"

static int32_t convert_one(const smla_convert_indices_params *p, int64_t tok, int64_t ws_base,
                           const int32_t *bt_row)
{
    if (tok < 0) return -1;
    if (ws_base != INT64_MIN) { /* prefill row */
        int64_t v = ws_base + tok;
        return v > INT32_MAX ? -1 : (int32_t)v;
    }
    if (p->dcp_size >= 1) {
        const int64_t I = p->dcp_interleave, D = p->dcp_size;
        if ((tok / I) % D != p->dcp_rank) return -1;
        tok = (tok / (D * I)) * I + tok % I;
    }
    if (!bt_row) return -1;
    const int64_t b = tok / p->block_size;
    if (b >= p->max_blocks) return -1;
    const int64_t blk = bt_row[b];
    if (blk < 0) return -1;
    const int64_t slot = blk * p->block_size + tok % p->block_size;
    return slot > INT32_MAX ? -1 : (int32_t)slot;
}

int smla_cpu_convert_topk_indices(const smla_convert_indices_params *p, smla_status *st)
{
    if (p->num_tokens < 0 || p->topk < 0 || p->num_reqs < 0 || p->max_blocks < 0 || p->block_size <= 0)
        return smla_fail(st, SMLA_ERR_VALUE,
                         "convert_topk_indices: invalid sizes (num_tokens %lld, topk %lld, num_reqs %lld, "
                         "max_blocks %lld, block_size %lld)", (long long)p->num_tokens, (long long)p->topk,
                         (long long)p->num_reqs, (long long)p->max_blocks, (long long)p->block_size);
    if (p->dcp_size < 0 || (p->dcp_size >= 1 && (p->dcp_rank < 0 || p->dcp_rank >= p->dcp_size ||
                                                 p->dcp_interleave < 1)))
        return smla_fail(st, SMLA_ERR_VALUE,
                         "convert_topk_indices: invalid DCP setting (dcp_size %d, dcp_rank %d, interleave %d)",
                         p->dcp_size, p->dcp_rank, p->dcp_interleave);
    const int64_t num_prefills = p->prefill_workspace_starts ? p->num_prefills : 0;
    const int compact = p->dcp_size >= 1 && p->compact;

    for (int64_t n = 0; n < p->num_tokens; n++) {
        const int32_t *in = p->topk_indices + n * p->in_stride;
        int32_t *out = p->out + n * p->out_stride;
        const int64_t pr = p->prefill_request_ids ? p->prefill_request_ids[n] : -1;
        const int64_t r = p->req_id[n];
        const int32_t *bt_row = NULL;
        int64_t ws_base = INT64_MIN; /* INT64_MIN: paged row */
        int all_invalid = 0;
        if (pr >= 0) {
            if (pr < num_prefills) ws_base = p->prefill_workspace_starts[pr];
            else all_invalid = 1;
        } else if (r >= 0 && r < p->num_reqs) {
            bt_row = p->block_table + r * p->bt_stride;
        }
        int64_t count = 0;
        for (int64_t k = 0; k < p->topk; k++) {
            const int32_t v = all_invalid ? -1 : convert_one(p, in[k], ws_base, bt_row);
            if (compact) {
                if (v != -1) out[count++] = v;
            } else {
                out[k] = v;
                count += v != -1;
            }
        }
        if (compact)
            for (int64_t k = count; k < p->topk; k++) out[k] = -1;
        if (p->valid_counts) p->valid_counts[n] = (int32_t)count;
    }
    return SMLA_OK;
}
