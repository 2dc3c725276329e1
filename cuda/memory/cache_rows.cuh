// Device helpers for the paged KV cache: vector / byte-wise memory access and the warp-wide
// dequantisation of one cache entry into a 576-value bf16 row (docs/design.md section 3); slot addressing
// is core/index_rules.h's (smla_cache_entry, shared with the CPU).
// Used by pack_kv, unpack_kv and gather_upconvert; the attention kernels may reuse them.
#pragma once

#include "common.cuh"
#include "core/index_rules.h"

namespace smla {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// True when p and every stride (bytes) keep 16-byte alignment, i.e. every row start is 16B aligned.
static inline bool aligned16(const void *p, int64_t s0 = 0, int64_t s1 = 0)
{
    return ((reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(s0) | static_cast<uintptr_t>(s1)) &
            15u) == 0;
}

// ---- read-ahead: pack_kv holds one token row per warp in registers, so its loads alone leave the DRAM
// idle while the warp quantises and stores; a warp asks L2 for the row of a token one wave later
// (prefetch.global.L2: no register, no wait), whose loads then hit L2 ----
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// ---- memory access: V = 16B-aligned vector access, else byte (cache) / 16-bit (bf16 arrays) pieces ----
__device__ __forceinline__ uint32_t ld_u32_bytes(const uint8_t *p)
{
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
           (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
__device__ __forceinline__ void st_u32_bytes(uint8_t *p, uint32_t v)
{
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
    p[2] = static_cast<uint8_t>(v >> 16);
    p[3] = static_cast<uint8_t>(v >> 24);
}

template <bool V> __device__ __forceinline__ uint4 ld16(const uint8_t *p)
{
    if (V) return *reinterpret_cast<const uint4 *>(p);
    return make_uint4(ld_u32_bytes(p), ld_u32_bytes(p + 4), ld_u32_bytes(p + 8), ld_u32_bytes(p + 12));
}
template <bool V> __device__ __forceinline__ uint2 ld8(const uint8_t *p)
{
    if (V) return *reinterpret_cast<const uint2 *>(p);
    return make_uint2(ld_u32_bytes(p), ld_u32_bytes(p + 4));
}
template <bool V> __device__ __forceinline__ uint32_t ld4(const uint8_t *p)
{
    if (V) return *reinterpret_cast<const uint32_t *>(p);
    return ld_u32_bytes(p);
}
template <bool V> __device__ __forceinline__ void st16(uint8_t *p, uint4 v)
{
    if (V) {
        *reinterpret_cast<uint4 *>(p) = v;
    } else {
        st_u32_bytes(p, v.x); st_u32_bytes(p + 4, v.y); st_u32_bytes(p + 8, v.z); st_u32_bytes(p + 12, v.w);
    }
}
template <bool V> __device__ __forceinline__ void st8(uint8_t *p, uint2 v)
{
    if (V) {
        *reinterpret_cast<uint2 *>(p) = v;
    } else {
        st_u32_bytes(p, v.x); st_u32_bytes(p + 4, v.y);
    }
}
template <bool V> __device__ __forceinline__ void st4(uint8_t *p, uint32_t v)
{
    if (V) *reinterpret_cast<uint32_t *>(p) = v;
    else st_u32_bytes(p, v);
}

// 8 consecutive 16-bit values (bf16 arrays are at least 2-byte aligned).
template <bool V> __device__ __forceinline__ uint4 ld16_u16(const uint16_t *p)
{
    if (V) return *reinterpret_cast<const uint4 *>(p);
    return make_uint4(p[0] | (static_cast<uint32_t>(p[1]) << 16), p[2] | (static_cast<uint32_t>(p[3]) << 16),
                      p[4] | (static_cast<uint32_t>(p[5]) << 16), p[6] | (static_cast<uint32_t>(p[7]) << 16));
}
// The same for data read once (ld.global.cs: evict-first in L1 and L2).
template <bool V> __device__ __forceinline__ uint4 ld16_u16_stream(const uint16_t *p)
{
    if (V) return __ldcs(reinterpret_cast<const uint4 *>(p));
    return ld16_u16<false>(p);
}
template <bool V> __device__ __forceinline__ void st16_u16(uint16_t *p, uint4 v)
{
    if (V) {
        *reinterpret_cast<uint4 *>(p) = v;
    } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            p[2 * i] = static_cast<uint16_t>(w[i]);
            p[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
        }
    }
}

// ---- one cache entry -> one 576-value bf16 row, by one warp ----
// Lane l owns output bytes [16l, 16l+16) and [512+16l, 512+16l+16) of the latent part (values 8l.. and
// 256+8l..), and lanes 0..7 the 16-byte pieces of k_pe; so every warp-wide access is contiguous.
// Split into load and store so a warp can keep several rows in flight.
template <int DT> struct RowFrag;

template <> struct RowFrag<SMLA_CACHE_FP8_DS_MLA> {
    uint2 q0, q1;  // e4m3 values 8l..8l+7 and 256+8l..256+8l+7
    float s0, s1;  // their tile scales (tiles l/16 and 2 + l/16)
    uint4 rope;    // lanes < 8: k_pe bf16 values 8l..8l+7
    bool valid;

    template <bool V> __device__ __forceinline__ void load(const uint8_t *e, int lane)
    {
        valid = e != nullptr;
        if (!valid) return;
        q0 = ld8<V>(e + 8 * lane);
        q1 = ld8<V>(e + 256 + 8 * lane);
        s0 = __uint_as_float(ld4<V>(e + SMLA_FP8_SCALE_OFF + 4 * (lane >> 4)));
        s1 = __uint_as_float(ld4<V>(e + SMLA_FP8_SCALE_OFF + 8 + 4 * (lane >> 4)));
        if (lane < 8) rope = ld16<V>(e + SMLA_FP8_ROPE_OFF + 16 * lane);
    }
    template <bool V> __device__ __forceinline__ void store(uint16_t *dst, int lane) const
    {
        const uint4 z = make_uint4(0, 0, 0, 0);
        st16_u16<V>(dst + 8 * lane, valid ? dequant8(q0, s0) : z);
        st16_u16<V>(dst + 256 + 8 * lane, valid ? dequant8(q1, s1) : z);
        if (lane < 8) st16_u16<V>(dst + SMLA_D_NOPE + 8 * lane, valid ? rope : z);
    }
};

template <> struct RowFrag<SMLA_CACHE_BF16> {
    uint4 a, b, c;  // 16-byte pieces l, 32+l and (lanes < 8) 64+l of the 1152-byte entry
    bool valid;

    template <bool V> __device__ __forceinline__ void load(const uint8_t *e, int lane)
    {
        valid = e != nullptr;
        if (!valid) return;
        a = ld16<V>(e + 16 * lane);
        b = ld16<V>(e + 512 + 16 * lane);
        if (lane < 8) c = ld16<V>(e + 1024 + 16 * lane);
    }
    template <bool V> __device__ __forceinline__ void store(uint16_t *dst, int lane) const
    {
        const uint4 z = make_uint4(0, 0, 0, 0);
        st16_u16<V>(dst + 8 * lane, valid ? a : z);
        st16_u16<V>(dst + 256 + 8 * lane, valid ? b : z);
        if (lane < 8) st16_u16<V>(dst + 512 + 8 * lane, valid ? c : z);
    }
};

} // namespace smla
