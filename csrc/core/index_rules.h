/* Index rules, written once for the CPU kernels and the CUDA kernels: where a slot's entry lies in the paged
 * cache (docs/design.md section 3), and convert_topk_indices / filter_convert_dcp_indices (section 4 and
 * the comment above smla_convert_indices_params in params.h): request-local position -> global slot
 * (or cache entry, for gather_upconvert) through the block table, prefill rows -> workspace rows, DCP
 * ownership. Users: csrc/cpu (pack_kv, unpack_kv, gather_upconvert, convert_topk_indices) and
 * cuda/memory (the same ops).
 *
 * The CPU's AVX2 convert path (csrc/cpu/convert_topk_indices.c) is the vector twin of smla_convert_index
 * (DCP included); its scalar path calls the function here, the GPU its two stages (smla_convert_locate
 * in its forms _paged and _as, smla_convert_slot_as) with the block-table reads of a thread's entries
 * issued together. The one difference between the backends is kept out of the rule: a block id >=
 * num_blocks makes smla_convert_slot return -1 and report the column, which the CPU turns into an error
 * and the GPU ignores (reporting it would need a sync). */
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
    /* a 32-bit division where both fit (a 64-bit one is a subroutine call on the GPU) */
    const int64_t blk = slot <= INT32_MAX && c->block_size <= INT32_MAX
                            ? (int64_t)((uint32_t)slot / (uint32_t)c->block_size)
                            : slot / c->block_size;
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

/* ---- division of a position (in [0, 2^31)) by a per-call constant, as a multiply and a shift ----
 * d >= 1; l = ceil(log2 d), m = ceil(2^(31 + l) / d) (< 2^32): m * d - 2^(31 + l) < d <= 2^l, which makes
 * (n * m) >> (31 + l) == n / d for every n < 2^31 (Granlund and Montgomery). Computed as the high word of
 * (2n) * m shifted right by l (the same number: floor(floor(2nm / 2^32) / 2^l) = floor(nm / 2^(31 + l))),
 * one multiply-high and one shift on the GPU. A d >= 2^31 exceeds every such n: m = 0 gives 0. Both
 * backends build it once per call, so no division is left per entry (a 32-bit division with a run-time
 * divisor is ~20 instructions on the GPU). */
typedef struct {
    uint32_t m, l;
} smla_udiv;

SMLA_HD smla_udiv smla_udiv_of(uint64_t d)
{
    smla_udiv v = {0u, 0u};
    if (d == 0 || d >= ((uint64_t)1 << 31)) return v;
    uint32_t l = 0;
    while (((uint64_t)1 << l) < d) l++;
    v.l = l;
    v.m = (uint32_t)((((uint64_t)1 << (31u + l)) + d - 1) / d);
    return v;
}

SMLA_HD uint32_t smla_udiv_q(smla_udiv v, uint32_t n) /* n < 2^31 */
{
    return (uint32_t)(((uint64_t)(n << 1) * v.m) >> 32) >> v.l;
}

/* smla_cache_entry_valid with the division by block_size as bs_div = smla_udiv_of(block_size), made once
 * (a kernel that locates many slots: sm90/dims_kernel.cuh); slot < 2^31. */
SMLA_HD const uint8_t *smla_cache_entry_udiv(const uint8_t *base, uint32_t slot, uint32_t block_size, smla_udiv bs_div,
                                             int64_t block_stride, int64_t entry_stride)
{
    const uint32_t blk = smla_udiv_q(bs_div, slot), off = slot - blk * block_size;
    return base + (int64_t)blk * block_stride + (int64_t)off * entry_stride;
}

/* ---- convert_topk_indices ---- */

/* What every entry of a call shares: the divisors (block_size, and with DCP the interleave I and the
 * world size D), made once per call by smla_convert_consts_of. */
typedef struct {
    int bs_shift;          /* log2(block_size) when it is a power of two <= 2^31, else -1 */
    smla_udiv bs, dcp_i, dcp_d;
    int dcp_pow2;          /* DCP with a power-of-two interleave and world size: shifts and masks */
    uint32_t dcp_li, dcp_ld; /* then log2 of each, and: tok >= 0 is this rank's iff */
    uint32_t dcp_own_mask, dcp_own_val; /* (tok & dcp_own_mask) == dcp_own_val (bit 31 in the mask: tok < 0
                                         * never matches) */
    uint32_t col_end;      /* min(max_blocks, 2^31): columns b < col_end exist */
    uint32_t blk_max;      /* the largest block id read as a slot: min(num_blocks - 1 when num_blocks > 0,
                            * INT32_MAX / block_size), so blk * block_size + off < 2^32 never wraps */
    uint32_t bs32;         /* block_size mod 2^32 (only used where the block fits: b * bs < 2^31) */
} smla_convert_consts;

SMLA_HD smla_convert_consts smla_convert_consts_of(const smla_convert_indices_params *p)
{
    smla_convert_consts k;
    const int64_t bs = p->block_size;
    k.bs_shift = -1;
    if (bs > 0 && (bs & (bs - 1)) == 0 && bs <= ((int64_t)1 << 31)) {
        k.bs_shift = 0;
        while (((int64_t)1 << k.bs_shift) < bs) k.bs_shift++;
    }
    k.bs = smla_udiv_of(bs > 0 ? (uint64_t)bs : 1u);
    k.dcp_i = smla_udiv_of(p->dcp_size >= 1 ? (uint64_t)p->dcp_interleave : 1u);
    k.dcp_d = smla_udiv_of(p->dcp_size >= 1 ? (uint64_t)p->dcp_size : 1u);
    k.dcp_pow2 = 0;
    k.dcp_li = k.dcp_ld = 0;
    k.dcp_own_mask = k.dcp_own_val = 0;
    if (p->dcp_size >= 1 && (p->dcp_size & (p->dcp_size - 1)) == 0 && p->dcp_interleave >= 1 &&
        (p->dcp_interleave & (p->dcp_interleave - 1)) == 0) {
        k.dcp_pow2 = 1;
        while (((int64_t)1 << k.dcp_li) < p->dcp_interleave) k.dcp_li++;
        while (((int64_t)1 << k.dcp_ld) < p->dcp_size) k.dcp_ld++;
        /* owner (t >> li) & (D - 1) == rank, for t in [0, 2^31): the owner bits of t in place. Mask bits
         * past 32 are no tok's (dropped); a rank << li >= 2^31 owns no such t: ~mask (nonzero: li >= 1
         * there, so bit 0 is outside the mask), a value the masked tok never has. */
        const uint64_t own = (uint64_t)p->dcp_rank << k.dcp_li;
        k.dcp_own_mask = 0x80000000u | (uint32_t)(((uint64_t)p->dcp_size - 1u) << k.dcp_li);
        k.dcp_own_val = own < ((uint64_t)1 << 31) ? (uint32_t)own : ~k.dcp_own_mask;
    }
    k.col_end = p->max_blocks > ((int64_t)1 << 31) ? (uint32_t)1 << 31 : (uint32_t)(p->max_blocks < 0 ? 0 : p->max_blocks);
    int64_t bm = bs > 0 ? INT32_MAX / bs : 0;
    if (p->num_blocks > 0 && p->num_blocks - 1 < bm) bm = p->num_blocks - 1;
    k.blk_max = (uint32_t)bm;
    k.bs32 = (uint32_t)bs;
    return k;
}

#define SMLA_PAGED_ROW INT64_MIN /* smla_index_row.ws_base of a row that reads the block table */

/* What the entries of row n share. */
typedef struct {
    const int32_t *bt_row; /* paged row: the block table row of its request; NULL outside [0, num_reqs) */
    int64_t ws_base;       /* prefill row: its workspace start; SMLA_PAGED_ROW otherwise */
    int dead;              /* a prefill id past num_prefills: every entry -1 */
    int live;              /* a paged row with a request (bt_row != NULL, not dead): tested once a row */
} smla_index_row;

SMLA_HD smla_index_row smla_index_row_of(const smla_convert_indices_params *p, int64_t n)
{
    smla_index_row rc = {NULL, SMLA_PAGED_ROW, 0, 0};
    const int64_t pr = p->prefill_request_ids ? (int64_t)p->prefill_request_ids[n] : -1;
    if (pr >= 0) {
        const int64_t num_prefills = p->prefill_workspace_starts ? p->num_prefills : 0;
        if (pr < num_prefills) rc.ws_base = p->prefill_workspace_starts[pr];
        else rc.dead = 1;
    } else {
        const int64_t r = p->req_id[n];
        if (r >= 0 && r < p->num_reqs) rc.bt_row = p->block_table + r * p->bt_stride;
    }
    rc.live = rc.bt_row != NULL && !rc.dead;
    return rc;
}

/* Entry tok of a row -> its slot or workspace row, or -1:
 *   tok < 0, a dead row or a paged row without a request   -> -1
 *   prefill row: ws_base + tok, -1 past INT32_MAX (no block-table check, no DCP filter: the workspace
 *     holds the request's whole gathered context, as vLLM's fix)
 *   DCP (dcp_size >= 1), paged row: position t is rank (t / I) % D's and sits at (t / (D*I)) * I + t % I
 *     there; another rank's position -> -1, else that local position
 *   paged row: b = tok / block_size; b >= max_blocks, block_table[b] < 0 or a slot past INT32_MAX -> -1,
 *     else block_table[b] * block_size + tok % block_size
 *   block_table[b] >= num_blocks (when num_blocks > 0)    -> -1, and *past_col = b (the caller's error)
 * In two stages, so that a kernel can issue the block-table reads of many entries at once:
 * smla_convert_locate gives the block-table column b to read (>= 0) and the offset in the block, or -1
 * with the entry's final value in *off; smla_convert_slot turns the block id read there into the slot.
 * (smla_convert_locate_paged is its paged part without the -1 selects, and smla_convert_slot_as takes
 * the power-of-two block size as an argument, for a kernel's own loop.)
 * A valid tok is in [0, 2^31), so the divisions are 32-bit ones by smla_udiv.
 * smla_convert_locate_as takes the call's cases as arguments, dcp = 0 without DCP, 1 with it, 2 with it
 * and a power-of-two interleave and world size (k->dcp_pow2: the divisions are shifts), and pow2 =
 * (k->bs_shift >= 0), so that a kernel can pass them as compile-time constants and compile each case's
 * entry loop without the tests; smla_convert_locate reads them from p and k. */
/* The paged part of smla_convert_locate_as (rc a paged row): whether the entry has a block-table column,
 * and the column b (*col) and the offset in the block (*off), meaningful only when it has one. A kernel
 * that reads the column under that flag (block id -1 otherwise) needs no -1 selects here: block id -1
 * makes smla_convert_slot_as -1 whatever the offset. */
SMLA_HD int smla_convert_locate_paged(const smla_convert_indices_params *p, const smla_convert_consts *k,
                                      const smla_index_row *rc, int32_t tok, uint32_t *col, uint32_t *off, int dcp,
                                      int pow2)
{
    int ok = tok >= 0 && rc->live;
    uint32_t t = (uint32_t)tok & 0x7fffffffu;
    if (dcp == 2) { /* the same with masks: the owner bits compared in place (k->dcp_own_*), and the local
                     * position (h << li) | t % I is t's low li bits kept, the bits above them shifted
                     * down by ld (t = tok where ok) */
        const uint32_t u = (uint32_t)tok, lo = (uint32_t)p->dcp_interleave - 1u, s = u >> k->dcp_ld;
        ok = rc->live && (u & k->dcp_own_mask) == k->dcp_own_val;
        t = s ^ ((s ^ u) & lo);
    } else if (dcp) { /* g = t / I, h = g / D: owner g - h * D, local h * I + t % I */
        const uint32_t g = smla_udiv_q(k->dcp_i, t), h = smla_udiv_q(k->dcp_d, g);
        ok = ok && g - h * (uint32_t)p->dcp_size == (uint32_t)p->dcp_rank;
        t = h * (uint32_t)p->dcp_interleave + (t - g * (uint32_t)p->dcp_interleave);
    }
    /* a block size >= 2^31 gives b = 0 (smla_udiv), whatever its low 32 bits */
    const uint32_t b = pow2 ? t >> k->bs_shift : smla_udiv_q(k->bs, t);
    *col = b;
    *off = pow2 ? t & (k->bs32 - 1u) : t - b * k->bs32;
    return ok && b < k->col_end;
}

SMLA_HD int32_t smla_convert_locate_as(const smla_convert_indices_params *p, const smla_convert_consts *k,
                                       const smla_index_row *rc, int32_t tok, int32_t *off, int dcp, int pow2)
{
    /* no early exit per entry: the tests are selects, and the branches left are on the row's and the
     * call's cases (prefill row, DCP, power-of-two block size), uniform over a GPU block */
    if (rc->ws_base != SMLA_PAGED_ROW) {
        const int64_t v = rc->ws_base + tok;
        *off = tok < 0 || v > INT32_MAX ? -1 : (int32_t)v;
        return -1;
    }
    uint32_t b, o;
    const int ok = smla_convert_locate_paged(p, k, rc, tok, &b, &o, dcp, pow2);
    *off = ok ? (int32_t)o : -1;
    return ok ? (int32_t)b : -1;
}

SMLA_HD int32_t smla_convert_locate(const smla_convert_indices_params *p, const smla_convert_consts *k,
                                    const smla_index_row *rc, int32_t tok, int32_t *off)
{
    return smla_convert_locate_as(p, k, rc, tok, off, p->dcp_size >= 1 ? 1 + k->dcp_pow2 : 0, k->bs_shift >= 0);
}

/* Stage 2: the block id read from column col -> the slot, or -1 (see smla_convert_locate). A block id in
 * [0, blk_max] gives blk * block_size + off < 2^31 + block_size <= 2^32: the slot in 32 unsigned bits,
 * checked against INT32_MAX; any other id is -1 (blk_max is below num_blocks, when given, and the
 * largest id whose slots can fit int32). With pow2 (a power-of-two block size 2^s, off < 2^s) that check
 * is left out: blk <= blk_max <= 2^(31 - s) - 1 already keeps the slot <= 2^31 - 1. */
SMLA_HD int32_t smla_convert_slot_as(const smla_convert_indices_params *p, const smla_convert_consts *k,
                                     int32_t blk, int32_t off, int32_t col, int64_t *past_col, int pow2)
{
    const uint32_t slot = (uint32_t)blk * k->bs32 + (uint32_t)off;
    if ((uint32_t)blk <= k->blk_max && (pow2 || slot <= (uint32_t)INT32_MAX)) return (int32_t)slot;
    if (p->num_blocks > 0 && blk >= p->num_blocks) *past_col = col;
    return -1;
}

SMLA_HD int32_t smla_convert_slot(const smla_convert_indices_params *p, const smla_convert_consts *k, int32_t blk,
                                  int32_t off, int32_t col, int64_t *past_col)
{
    return smla_convert_slot_as(p, k, blk, off, col, past_col, 0);
}

/* The two stages for one entry (the CPU's scalar path). */
SMLA_HD int32_t smla_convert_index(const smla_convert_indices_params *p, const smla_convert_consts *k,
                                   const smla_index_row *rc, int32_t tok, int64_t *past_col)
{
    int32_t off;
    const int32_t col = smla_convert_locate(p, k, rc, tok, &off);
    return col < 0 ? off : smla_convert_slot(p, k, rc->bt_row[col], off, col, past_col);
}

#endif /* SMLA_CORE_INDEX_RULES_H */
