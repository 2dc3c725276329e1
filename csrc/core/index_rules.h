/* Index rules, written once for the CPU kernels and the CUDA kernels: where a slot's entry lies in the paged
 * cache (docs/design.md section 3), and convert_topk_indices / filter_convert_dcp_indices (section 4 and
 * the comment above smla_convert_indices_params in params.h): request-local position -> global slot
 * (or cache entry, for gather_upconvert) through the block table, prefill rows -> workspace rows, DCP
 * ownership. Users: csrc/cpu (pack_kv, unpack_kv, gather_upconvert, convert_topk_indices) and
 * cuda/memory (the same ops).
 *
 * The CPU's AVX2 convert path (csrc/cpu/convert_topk_indices.c) is the vector twin of smla_convert_index
 * (DCP included); its scalar path and the GPU call the function here. The one difference between
 * the backends is kept out of the rule: a block id >= num_blocks makes smla_convert_index return -1 and
 * report the column, which the CPU turns into an error and the GPU ignores (reporting it would need a
 * sync). */
#ifndef SMLA_CORE_INDEX_RULES_H
#define SMLA_CORE_INDEX_RULES_H

#include <stdint.h>

#include "params.h"

/* ---- the paged cache: slot = block * block_size + offset (block_size > 0, checked at the edge) ---- */

/* Bytes of one entry of a cache dtype; 0 for an unknown one. */
SMLA_HD int64_t smla_cache_entry_bytes(int dtype)
{
    if (dtype == SMLA_CACHE_FP8_DS_MLA) return SMLA_FP8_ENTRY;
    if (dtype == SMLA_CACHE_BF16) return 2 * SMLA_D_QK;
    return 0;
}

/* The entry at (block id, offset in the block), or NULL when the block id is outside [0, num_blocks).
 * The offset is the caller's, in [0, block_size). */
SMLA_HD uint8_t *smla_cache_entry_at(const smla_cache *c, int64_t blk, int64_t off)
{
    if (blk < 0 || blk >= c->num_blocks) return NULL;
    return (uint8_t *)c->data + blk * c->block_stride + off * c->entry_stride;
}

/* The entry of a slot, or NULL when the slot is outside [0, num_blocks * block_size). Divides rather than
 * multiplying num_blocks * block_size, so no int64 value can overflow. */
SMLA_HD uint8_t *smla_cache_entry(const smla_cache *c, int64_t slot)
{
    if (slot < 0) return NULL;
    const int64_t blk = slot / c->block_size;
    return smla_cache_entry_at(c, blk, slot - blk * c->block_size);
}

/* The entry of a slot the caller already knows is valid (0 <= slot < num_blocks * block_size, slots being
 * int32), for the attention kernels' K-row gathers: 32-bit division and offset (a 64-bit division is a
 * long instruction sequence on the GPU), and the cache's geometry passed as the kernel holds it. */
SMLA_HD const uint8_t *smla_cache_entry_valid(const uint8_t *base, uint32_t slot, uint32_t block_size,
                                              int64_t block_stride, int64_t entry_stride)
{
    const uint32_t blk = slot / block_size, off = slot - blk * block_size;
    return base + (int64_t)blk * block_stride + (int64_t)off * entry_stride;
}

/* The entry of position pos of a request whose block table row is bt_row (max_blocks columns), or NULL
 * when pos < 0, pos / block_size >= max_blocks or the block id is outside [0, num_blocks). */
SMLA_HD uint8_t *smla_cache_entry_of(const smla_cache *c, const int32_t *bt_row, int64_t max_blocks, int64_t pos)
{
    if (pos < 0) return NULL;
    const int64_t b = pos / c->block_size;
    if (b >= max_blocks) return NULL;
    return smla_cache_entry_at(c, bt_row[b], pos - b * c->block_size);
}

/* ---- DCP: position g belongs to rank (g / I) % D and sits at (g / (D*I)) * I + g % I there ---- */

/* Whether rank owns position t (in [0, 2^31)) of a cache spread over D ranks in runs of I; if so *local
 * is its position in that rank's cache (<= t). 32-bit divisions: a 64-bit one is a long instruction
 * sequence on the GPU. */
SMLA_HD int smla_dcp_owns(uint32_t t, int rank, int D, int I, uint32_t *local)
{
    const uint32_t i = (uint32_t)I, d = (uint32_t)D;
    const uint32_t g = i == 1 ? t : t / i;
    if (g % d != (uint32_t)rank) return 0;
    const uint64_t di = (uint64_t)d * i;
    const uint32_t rounds = di > t ? 0u : t / (uint32_t)di;
    *local = rounds * i + (t - g * i);
    return 1;
}

/* ---- convert_topk_indices ---- */

#define SMLA_PAGED_ROW INT64_MIN /* smla_index_row.ws_base of a row that reads the block table */

/* What the entries of row n share. */
typedef struct {
    const int32_t *bt_row; /* paged row: the block table row of its request; NULL outside [0, num_reqs) */
    int64_t ws_base;       /* prefill row: its workspace start; SMLA_PAGED_ROW otherwise */
    int dead;              /* a prefill id past num_prefills: every entry -1 */
    int bs_shift;          /* log2(block_size) when it is a power of two <= 2^31, else -1 */
} smla_index_row;

SMLA_HD smla_index_row smla_index_row_of(const smla_convert_indices_params *p, int64_t n)
{
    const int64_t bs = p->block_size;
    smla_index_row rc = {NULL, SMLA_PAGED_ROW, 0, -1};
    if ((bs & (bs - 1)) == 0 && bs <= ((int64_t)1 << 31)) {
#if defined(__CUDA_ARCH__)
        rc.bs_shift = __ffsll(bs) - 1;
#else
        rc.bs_shift = __builtin_ctzll((unsigned long long)bs);
#endif
    }
    const int64_t pr = p->prefill_request_ids ? (int64_t)p->prefill_request_ids[n] : -1;
    if (pr >= 0) {
        const int64_t num_prefills = p->prefill_workspace_starts ? p->num_prefills : 0;
        if (pr < num_prefills) rc.ws_base = p->prefill_workspace_starts[pr];
        else rc.dead = 1;
    } else {
        const int64_t r = p->req_id[n];
        if (r >= 0 && r < p->num_reqs) rc.bt_row = p->block_table + r * p->bt_stride;
    }
    return rc;
}

/* Entry tok of a row -> its slot or workspace row, or -1:
 *   tok < 0, a dead row or a paged row without a request   -> -1
 *   prefill row: ws_base + tok, -1 past INT32_MAX (no block-table check, no DCP filter: the workspace
 *     holds the request's whole gathered context, as vLLM's fix)
 *   DCP (dcp_size >= 1), paged row: another rank's position -> -1, else its local position
 *   paged row: b = tok / block_size; b >= max_blocks, block_table[b] < 0 or a slot past INT32_MAX -> -1,
 *     else block_table[b] * block_size + tok % block_size
 *   block_table[b] >= num_blocks (when num_blocks > 0)    -> -1, and *past_col = b (the caller's error)
 * A valid tok is in [0, 2^31), so the divisions are 32-bit, with the int64 results of params.h. */
SMLA_HD int32_t smla_convert_index(const smla_convert_indices_params *p, const smla_index_row *rc, int32_t tok,
                                   int64_t *past_col)
{
    if (tok < 0 || rc->dead) return -1;
    if (rc->ws_base != SMLA_PAGED_ROW) {
        const int64_t v = rc->ws_base + tok;
        return v > INT32_MAX ? -1 : (int32_t)v;
    }
    uint32_t t = (uint32_t)tok;
    if (p->dcp_size >= 1 && !smla_dcp_owns(t, p->dcp_rank, p->dcp_size, p->dcp_interleave, &t)) return -1;
    if (!rc->bt_row) return -1;
    int64_t b, off;
    if (rc->bs_shift >= 0) {
        b = t >> rc->bs_shift;
        off = t & ((1u << rc->bs_shift) - 1u);
    } else if (p->block_size <= INT32_MAX) {
        const uint32_t bs = (uint32_t)p->block_size, q = t / bs;
        b = q;
        off = t - q * bs;
    } else {
        b = 0;
        off = t;
    }
    if (b >= p->max_blocks) return -1;
    const int64_t blk = rc->bt_row[b];
    if (blk < 0) return -1;
    if (p->num_blocks > 0 && blk >= p->num_blocks) {
        *past_col = b;
        return -1;
    }
    const int64_t slot = blk * p->block_size + off;
    return slot > INT32_MAX ? -1 : (int32_t)slot;
}

#endif /* SMLA_CORE_INDEX_RULES_H */
