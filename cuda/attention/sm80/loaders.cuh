// The portable kernel's loads into shared memory, all with cp.async so that the next tile streams in
// while the current one is computed:
//   load_q      : the CTA's Q tile (rows past h are zero-filled);
//   load_idx    : one tile of the row's indices into a slot of the 3-slot index ring (one tile ahead
//                 of the K rows that use them);
//   load_rows   : the K rows of a tile, gathered by index. bf16: 16-byte row chunks straight into a
//                 double-buffered bf16 tile (zero fill for invalid rows). fp8: the raw 656-byte
//                 entries into a staging buffer;
//   dequant_tile: fp8 only, staging buffer -> bf16 K tile in shared memory, with the one fp8_ds_mla
//                 read rule (dequant8, cuda/common.cuh), bit-exact with the CPU path.
// Invalid indices are never dereferenced: their rows are zero-filled (their scores become -inf in
// the S phase).
#pragma once

#include "attention/sm80/plan.cuh"

namespace attn {
namespace sm80 {

template <class C>
__device__ __forceinline__ void load_q(const Args &a, const Cta<C> &c)
{
    const smla_attn_params &p = a.p;
    for (int i = c.tid; i < C::HT * kRowChunks; i += C::NT) {
        const int r = i / kRowChunks, ch = i - r * kRowChunks;
        const bool ok = c.h0 + r < c.h;
        const uint16_t *src = ok ? smla_q_at(&p, c.bi, c.si, c.h0 + r, ch * 8) : p.q;  // q or q_pe
        cp_async16(row_chunk(c.sQ, r, ch), src, ok ? 16 : 0);
    }
}

// Indices of tile j into ring slot `slot` (positions past L read as nothing: zero-filled).
template <class C>
__device__ __forceinline__ void load_idx(const Cta<C> &c, int j, int slot)
{
    for (int i = c.tid; i < C::BN; i += C::NT) {
        const int pos = j * C::BN + i;
        const bool ok = pos < c.L;
        cp_async4(c.sIdxA + (slot * C::BN + i) * 4, ok ? c.idx_row + pos : c.idx_row, ok ? 4 : 0);
    }
}

// Rows of tile j (indices in ring slot `slot`) into `dst` (bf16 tiles: swizzled rows of kRowBytes;
// fp8: raw entries of kFp8Entry bytes). A warp copies 4 rows at a time, 8 lanes per row, each lane
// finding its own row's address (nothing serialised across the warp); in a bf16 row, lane chunk
// cl = lane & 7 of each 128-byte group has one swizzled offset for all 9 groups.
template <class C>
__device__ __forceinline__ void load_rows(const Args &a, const Cta<C> &c, int j, int slot, uint32_t dst)
{
    static_assert(C::BN % (4 * C::NW) == 0, "4 rows per warp per step");
    const smla_attn_params &p = a.p;
    const int sub = c.lane >> 3, cl = c.lane & 7;
#pragma unroll 1
    for (int r = 4 * c.warp + sub; r < C::BN; r += 4 * C::NW) {
        const int idx = c.sIdx[slot * C::BN + r];
        const bool ok = (j * C::BN + r) < c.L && idx >= 0 && static_cast<int64_t>(idx) < c.limit;
        const uint8_t *src = c.kv_base;
        if (ok)
            src = smla_cache_entry_valid(c.kv_base, static_cast<uint32_t>(idx), c.block_size, p.kv.block_stride,
                                         p.kv.entry_stride);
        const int nbytes = ok ? 16 : 0;
        if constexpr (C::FP8) {
            const uint32_t d = dst + r * kFp8Entry;
            for (int ch = cl; ch < kFp8Chunks; ch += 8) {
                if (a.evict_last) cp_async16_hint(d + ch * 16, src + ch * 16, nbytes, c.pol);
                else cp_async16(d + ch * 16, src + ch * 16, nbytes);
            }
        } else {
            const uint32_t d = dst + r * kRowBytes + ((cl ^ (r & 7)) << 4);
            src += cl * 16;
#pragma unroll
            for (int c8 = 0; c8 < kRowChunks / 8; ++c8) {
                if (a.evict_last) cp_async16_hint(d + c8 * 128, src + c8 * 128, nbytes, c.pol);
                else cp_async16(d + c8 * 128, src + c8 * 128, nbytes);
            }
        }
    }
}

// fp8 staging `raw` -> bf16 K tile `kdst`. Output chunk ch (8 values) of a row: ch < 64 from 8 e4m3
// bytes and scale ch / 16; ch >= 64 is a RoPE chunk copied bit for bit. Invalid rows were
// zero-filled, so they dequantise to zeros (0 * 0).
template <class C>
__device__ __forceinline__ void dequant_tile(const Cta<C> &c, const uint8_t *raw, uint32_t kdst)
{
#pragma unroll 1
    for (int r = c.warp; r < C::BN; r += C::NW) {
        const uint8_t *rr = raw + r * kFp8Entry;
        const float *sc = reinterpret_cast<const float *>(rr + SMLA_FP8_SCALE_OFF);
        for (int ch = c.lane; ch < kRowChunks; ch += 32) {
            uint4 v;
            if (ch < kNopeChunks) v = dequant8(*reinterpret_cast<const uint2 *>(rr + ch * 8), sc[ch >> 4]);
            else v = *reinterpret_cast<const uint4 *>(rr + SMLA_FP8_ROPE_OFF + (ch - kNopeChunks) * 16);
            st_shared_v4(row_chunk(kdst, r, ch), v);
        }
    }
}

}  // namespace sm80
}  // namespace attn
