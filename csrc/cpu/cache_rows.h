/* Private helpers of the CPU kernels: addressing one token of a paged smla_cache and dequantising
 * it (DESIGN section 3). Shared by unpack_kv, gather_upconvert, pack_kv and the CPU attention
 * kernels so that every reader produces the same bits.
 *
 * Dequant of fp8_ds_mla value i: bf16_rne(float(e4m3[i]) * scale[i / 128]) (one fp32 multiply, then
 * one rounding; the CUDA twin does the same and nothing can be contracted). The k_pe part and the
 * whole bf16 entry are copied bit for bit. Entries are read with memcpy: an entry may sit at any byte
 * offset (entry_stride / block_stride are only byte counts). Scales are little-endian fp32 and bf16
 * values are stored in host order; smla targets little-endian hosts only (x86-64, aarch64). */
#ifndef SMLA_CPU_CACHE_ROWS_H
#define SMLA_CPU_CACHE_ROWS_H

#include <stdint.h>
#include <string.h>

#include "../params.h"
#include "numerics.h"

/* Bytes of one entry for a cache dtype; 0 for an unknown dtype. */
static inline int64_t smla_cache_entry_bytes(int dtype)
{
    if (dtype == SMLA_CACHE_FP8_DS_MLA) return SMLA_FP8_ENTRY;
    if (dtype == SMLA_CACHE_BF16) return 2 * SMLA_D_QK;
    return 0;
}

/* Writable address of the entry of `slot`, or NULL when slot is outside [0, num_blocks*block_size).
 * Divides instead of multiplying num_blocks * block_size so that no int64 value can overflow. */
static inline uint8_t *smla_cache_row_mut(const smla_cache *c, int64_t slot)
{
    if (slot < 0 || c->block_size <= 0) return NULL;
    int64_t blk = slot / c->block_size, off = slot % c->block_size;
    if (blk >= c->num_blocks) return NULL;
    return (uint8_t *)c->data + blk * c->block_stride + off * c->entry_stride;
}

static inline const uint8_t *smla_cache_row(const smla_cache *c, int64_t slot)
{
    return smla_cache_row_mut(c, slot);
}

/* Entry at (block, offset) as a block table names it, or NULL when block is outside [0, num_blocks)
 * or offset outside [0, block_size). */
static inline const uint8_t *smla_cache_block_row(const smla_cache *c, int64_t block, int64_t offset)
{
    if (block < 0 || block >= c->num_blocks || offset < 0 || offset >= c->block_size) return NULL;
    return (const uint8_t *)c->data + block * c->block_stride + offset * c->entry_stride;
}

/* The 4 tile scales of an fp8_ds_mla entry. */
static inline void smla_fp8_scales(const uint8_t *entry, float s[SMLA_FP8_NUM_TILES])
{
    memcpy(s, entry + SMLA_FP8_SCALE_OFF, sizeof(float) * SMLA_FP8_NUM_TILES);
}

/* One entry as 576 bf16 bits: the latent part dequantised (fp8) or copied (bf16), then k_pe. */
static inline void smla_dequant_row_bf16(const smla_cache *c, const uint8_t *entry, uint16_t out[SMLA_D_QK])
{
    if (c->dtype != SMLA_CACHE_FP8_DS_MLA) {
        memcpy(out, entry, 2 * SMLA_D_QK);
        return;
    }
    float s[SMLA_FP8_NUM_TILES];
    smla_fp8_scales(entry, s);
    for (int i = 0; i < SMLA_D_NOPE; i++)
        out[i] = smla_f32_to_bf16(smla_e4m3_to_f32(entry[i]) * s[i / SMLA_FP8_TILE]);
    memcpy(out + SMLA_D_NOPE, entry + SMLA_FP8_ROPE_OFF, 2 * SMLA_D_ROPE);
}

/* The same row as floats: exactly the float value of each bf16 that smla_dequant_row_bf16 gives. */
static inline void smla_dequant_row_f32(const smla_cache *c, const uint8_t *entry, float out[SMLA_D_QK])
{
    uint16_t bits[SMLA_D_QK];
    smla_dequant_row_bf16(c, entry, bits);
    for (int i = 0; i < SMLA_D_QK; i++) out[i] = smla_bf16_to_f32(bits[i]);
}

#endif /* SMLA_CPU_CACHE_ROWS_H */
