// Hopper (sm_90a) sparse MLA decode kernel for small head counts (h <= 32) over the fp8_ds_mla cache:
// the "register kernel" (family sm90r). Tokens are on the MMA's M dimension as in the narrow kernel
// (sm90/narrow_kernel.cuh), but no bf16 copy of the K tile is ever stored:
//   S^T [64 tokens x NH] = K [64 x 576] Q^T      (wgmma m64nNHk16, A = K from registers, B = Q in smem)
//   O^T [512 dims x NH] += V^T [512 x 64] P^T    (8 x m64nNHk16 per k-step, A = V^T from registers,
//                                                  B = P^T stored by the softmax)
// Each consumer thread dequantises its own A fragments straight from the cache bytes, which the bulk
// copy engine puts into shared memory as they are (656 B a token). Why: the narrow kernel's time went
// to shared-memory traffic (benchmarks/README.md, issue 17, tenth session: ~5000 wavefronts per 64-token
// tile, of which the bf16 tile's stores and the MMAs' A reads at N = 16 are ~4/5); here, by the byte
// count (an estimate, not measured), a tile costs its copy (328 wavefronts), the K reads (328), the V
// reads (256) and the small B operands. Measured slower than the narrow kernel all the same
// (benchmarks/README.md, issue 17, twelfth session): so `auto` does not pick it.
//
// Dimension orders. Both products contract over a dimension whose order is free, and O^T's rows are
// put back in order by the epilogue, so each thread's fragments are whole 16-byte pieces of a row:
//   S^T: thread t4 (lane & 3) owns latent dims [128 t4, 128 t4 + 128) (exactly scale tile t4) and RoPE
//     dims 512 + [16 t4, 16 t4 + 16); k-step j < 32 (chunk i = j / 4, m = j % 4) gives it latent dims
//     128 t4 + 16 ((i + 2 t4) & 7) + 4 m + {0..3} (the rotation by 2 t4 spreads a quarter warp's 16-byte
//     loads over all eight slots of a 128-byte line), k-step 32 + m RoPE dims 512 + 16 t4 + 4 m + {0..3}.
//     Fragment columns 2 t4 + e hold the first two of those dims, 2 t4 + 8 + e the last two. Q is stored
//     in the same order (load_q).
//   O^T: row g (+ 8) of warp w in m-tile mt is latent dim 16 (8 w + g) + 2 mt (+ 1): a thread's 16 dims
//     of a token are one 16-byte piece (scale tile w), and a k-step's fragment pairs the same dim of two
//     tokens (byte permutes of two dequantised pairs).
//
// CTA = one query row x all heads (NH = 16 or 32, rows past h zero) x one top-k split, 256 threads: two
// consumer warpgroups on alternate K tiles (warpgroup wg takes the slice's tiles wg, wg + 2, ..), each
// with its own online softmax (sm90/narrow_softmax.cuh), two raw tile buffers and its own mbarriers; the
// epilogue merges the two states. Lanes 0..15 of each of a warpgroup's warps (64 lanes, one token row
// each) fill its buffers: each lane of a valid row expects 656 bytes on the buffer's mbarrier and starts
// a bulk copy of the row (the compiler issues a warp's copies one lane at a time: they take uniform
// operands); invalid rows arrive without bytes. The buffer's valid-token mask goes into smem beside it.
// (16-byte cp.async by every thread instead was measured slower: benchmarks/README.md.) A buffer is
// refilled (tile jl + 2) once the warpgroup has read tile jl's last V bytes into registers and issued
// its last MMAs (kBarFree), so the copies overlap those MMAs; the index of each row was loaded a tile
// earlier.
// Per K tile and warpgroup:
//   wait    : the buffer's mbarrier (its 64 arrivals and the copied bytes);
//   scores  : 9 chunks of 4 k-steps: two 16-byte loads a thread (its two tokens), dequantised into the A
//             fragments (dequant_e4m3x4: bf16_rne(float(e4m3) * scale), the rule of every kernel), with
//             chunk i + 1 converted while chunk i's MMAs run; 3 accumulator chains of 12 k-steps;
//   softmax : HeadSoftmax (mask, scale, maxima across the 4 warps, P^T in smem, O^T rescale);
//   pv      : per k-step four 16-byte loads (tokens 2 t4 + {0, 1, 8, 9}), zeroed for invalid tokens,
//             dequantised and paired, then 8 MMAs (high: 16, P_hi and P_lo into the same accumulator).
// FAST: precision="fast" (P rounded to bf16, one P V MMA per k-step and m-tile).
// ABL != 0 only in profiling builds (sm90/kernel.cuh's bits): 1 no K copies (the tiles keep stale bytes;
// the rows still arrive), 2 no S wgmma, 4 no P V wgmma, 8 no dequant (the raw words are the fragments).
#pragma once

#include "attention/epilogue.cuh"
#include "attention/table.cuh"
#include "attention/sm90/narrow_softmax.cuh"
#include "attention/sm90/plan.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/variants.cuh"

namespace attn {
namespace sm90 {
namespace reg {

constexpr int kEntry = SMLA_FP8_ENTRY;  // 656 B: one token as the cache holds it
constexpr int kRawTile = kBN * kEntry;  // 41,984 B
constexpr int kWgs = 2;                 // consumer warpgroups, on alternate K tiles
constexpr int kBufs = 2 * kWgs;         // two raw tiles per warpgroup
constexpr int kThreads = 128 * kWgs;
constexpr int kIssueLanes = 16;         // lanes 0..15 of each warp of a warpgroup copy one token row each
static_assert(kEntry % 16 == 0 && kRawTile % 1024 == 0, "bulk copies of 16-byte multiples, aligned tiles");
// Named barriers of one warpgroup wg (+ wg; 0 is __syncthreads, for the whole CTA).
constexpr int kBarRed = 1, kBarP = 3, kBarFree = 5;

template <int NH_>
struct Cfg {
    static constexpr int NH = NH_, NS = NH / 2;
    static constexpr int kQBlk = NH * 128;   // one Q column block (64 dims of NH heads)
    static constexpr int kPBytes = NH * 128; // one P^T tile
    static constexpr int kOStride = kDv + 4; // floats per staged output row
    static_assert(NH == 16 || NH == 32, "wgmma n16 / n32");
};

// Shared memory (1024-byte aligned):
//   q     : Q [NH x 576] in the S^T dimension order, 9 column blocks of [NH rows x 128 B], swizzled;
//   raw   : kBufs raw K tiles [64 tokens x 656 B] (warpgroup wg: buffers 2 wg, 2 wg + 1);
//   p     : per warpgroup P^T [NH x 64] bf16, K-major, swizzled: P_hi, then P_lo;
//   bar   : mbarriers full[kBufs] (64 arrivals, one per token row, and the copied bytes);
//   valid : uint16 [kBufs][4], the valid tokens of each raw tile (read as one 64-bit mask);
//   red   : float [kWgs][2][4][NH], each warp's per-head tile maxima (parity of the tile);
//   lsum  : double [kWgs][4][NH], each warp's row sums; m: float [kWgs][NH], the row maxima (epilogue).
// The epilogue stages warpgroup wg's O as float [NH][kOStride] over its own two raw tiles.
template <class C>
struct Smem {
    static constexpr Region q = first_region(9 * C::kQBlk);
    static constexpr Region raw = region_after(q, kBufs * kRawTile);
    static constexpr Region p = region_after(raw, kWgs * 2 * C::kPBytes);
    static constexpr Region bar = region_after(p, kBufs * 8);
    static constexpr Region valid = region_after(bar, kBufs * 4 * 2);
    static constexpr Region red = region_after(valid, kWgs * 2 * 4 * C::NH * 4);
    static constexpr Region lsum = region_after(red, kWgs * 4 * C::NH * 8);
    static constexpr Region m = region_after(lsum, kWgs * C::NH * 4);
    static constexpr int used = m.end();
    static constexpr int bytes = used + 1024;  // slack to align the base to 1024 B
    static_assert(q.off % 1024 == 0 && raw.off % 1024 == 0 && p.off % 1024 == 0, "swizzled tiles, copy targets");
    static_assert(bar.off % 8 == 0 && valid.off % 8 == 0 && lsum.off % 8 == 0,
                  "mbarriers, the 64-bit valid masks and row sums are 8-byte");
    static_assert(C::NH * C::kOStride * 4 <= 2 * kRawTile, "a warpgroup's staged output fits in its raw tiles");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

template <class C>
struct Cta : CtaCommon {
    using S = Smem<C>;
    uint16_t *sMask;
    float *sRed, *sM;
    double *sLsum;

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw)
        : CtaCommon(a, smem_raw, grid_pos(a), S::q.off, S::raw.off, S::bar.off, S::valid.off)
    {
        sMask = reinterpret_cast<uint16_t *>(smem + S::valid.off);
        sRed = reinterpret_cast<float *>(smem + S::red.off);
        sLsum = reinterpret_cast<double *>(smem + S::lsum.off);
        sM = reinterpret_cast<float *>(smem + S::m.off);
    }
    __device__ __forceinline__ uint32_t raw(int b) const { return sK + b * kRawTile; }
    __device__ __forceinline__ uint64_t valid_mask(int b) const { return *reinterpret_cast<const uint64_t *>(sMask + 4 * b); }
    __device__ __forceinline__ uint32_t full(int b) const { return bar_full + 8 * b; }
    __device__ __forceinline__ float *staged(int wg) const
    {
        return reinterpret_cast<float *>(smem + S::raw.off + wg * 2 * kRawTile);
    }
};

// Q [NH x 576] into smem in the S^T dimension order (file comment), heads past h zero: every thread of
// the CTA takes dim pairs (4-byte loads; the pair's two dims are adjacent in both orders), then the
// CTA's barrier (the copies and the wgmma read it through the async proxy).
template <class C>
__device__ __forceinline__ void load_q(const Args &a, const Cta<C> &c)
{
    constexpr int kPairs = kDqk / 2;                     // 288 per head
    constexpr int kPer = C::NH * kPairs / kThreads;      // pairs per thread: all loads go out before any store
    static_assert(C::NH * kPairs % kThreads == 0, "whole pairs per thread");
    uint32_t v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
        const int t = c.tid + u * kThreads, n = t / kPairs, pp = t - n * kPairs;
        const int j = pp >> 3, k = 2 * (pp & 7);  // k-step j, fragment column k (even)
        const int q4 = (k & 7) >> 1, hi = k >> 3;
        const int d = j < 32 ? 128 * q4 + ((((j >> 2) + 2 * q4) & 7) << 4) + 4 * (j & 3) + 2 * hi
                             : kDv + 16 * q4 + 4 * (j - 32) + 2 * hi;
        v[u] = n < c.h ? __ldg(reinterpret_cast<const uint32_t *>(smla_q_at(&a.p, c.bi, c.si, n, d))) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
        const int t = c.tid + u * kThreads, n = t / kPairs, pp = t - n * kPairs;
        const int kg = 16 * (pp >> 3) + 2 * (pp & 7);
        st_shared_u32(c.sQ + (kg >> 6) * C::kQBlk + n * 128 + ((((kg & 63) >> 3) ^ (n & 7)) << 4) + (kg & 7) * 2, v[u]);
    }
    fence_async_smem();
    __syncthreads();
}

// One consumer warpgroup.
template <class C, int ABL, bool FAST>
struct Consumer : HeadSoftmax<C::NH, FAST, C::NH / 2> {
    static constexpr bool kNoLoad = (ABL & 1) != 0, kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0;
    static constexpr bool kNoDq = (ABL & 8) != 0;
    using Base = HeadSoftmax<C::NH, FAST, C::NH / 2>;
    using Base::o, Base::m_r, Base::l_r, Base::w, Base::g, Base::t4, Base::head;
    static constexpr int NH = C::NH, NS = C::NS, NL = NH / 4;
    using Frag = uint32_t[4][4];  // 4 k-steps (S) of A fragments
    using VFrag = uint32_t[8][4]; // one k-step (P V) of A fragments, 8 m-tiles

    const Args &a;
    const Cta<C> &c;
    const KvSource kv;
    const int wg;      // this warpgroup: its tiles wg, wg + 2, ..
    const int n;       // K tiles of this warpgroup
    const uint32_t sP;
    int idx_nx;        // lanes < 16: the index of row 16 w + lane of the next refill's tile

    __device__ __forceinline__ Consumer(const Args &a_, const Cta<C> &c_)
        : Base(c_.tid), a(a_), c(c_), kv(a_), wg(c_.tid >> 7), n((c_.nt + 1 - wg) >> 1),
          sP(c_.base + Smem<C>::p.off + wg * 2 * C::kPBytes), idx_nx(-1)
    {
    }

    __device__ __forceinline__ int buf(int jl) const { return 2 * wg + (jl & 1); }

    // The index of row 16 w + lane of this warpgroup's tile jl (lanes < 16; -1 past the slice or L).
    __device__ __forceinline__ int fetch(int jl) const
    {
        if (jl >= n || c.lane >= kIssueLanes) return -1;
        const int pos = (c.j0 + 2 * jl + wg) * kBN + kIssueLanes * w + c.lane;
        return pos < c.L ? __ldg(c.idx_row + pos) : -1;
    }

    // Tile jl's rows into its buffer (whole warps; lanes < 16 one row each): the warp's 16 bits of the
    // valid mask first (lane 0's arrival releases them), then a bulk copy or an arrival without bytes.
    __device__ __forceinline__ void issue(int jl, int idx) const
    {
        const int b = buf(jl), row = kIssueLanes * w + c.lane;
        const bool ok = kv.valid(idx);  // lanes >= 16: idx -1
        const uint32_t m = __ballot_sync(0xffffffffu, ok);
        if (c.lane == 0) c.sMask[4 * b + w] = static_cast<uint16_t>(m);
        if (c.lane >= kIssueLanes) return;
        if (ok && !kNoLoad) {
            mbar_arrive_expect_tx(c.full(b), kEntry);
            bulk_copy_g2s(c.raw(b) + row * kEntry, kv.row(idx, true), kEntry, c.full(b));
        } else {
            mbar_arrive(c.full(b));
        }
    }

    // The first two tiles, and the index of the third.
    __device__ __forceinline__ void start()
    {
        const int i0 = fetch(0), i1 = fetch(1);
        if (n > 0) issue(0, i0);
        if (n > 1) issue(1, i1);
        idx_nx = fetch(2);
    }

    // S^T of raw tile r into s (this thread's share), as file comment.
    __device__ __forceinline__ void scores(uint32_t r, float (&s)[NS]) const
    {
        const uint32_t r0 = r + (16 * w + g) * kEntry, r1 = r0 + 8 * kEntry;
        const float sc0 = __uint_as_float(ld_shared_u32(r0 + SMLA_FP8_SCALE_OFF + 4 * t4));
        const float sc1 = __uint_as_float(ld_shared_u32(r1 + SMLA_FP8_SCALE_OFF + 4 * t4));
        const uint32_t qd = opaque(desc_base(c.sQ, 16));
        float t0[NS], t1[NS], t2[NS];
        Frag fa[2];
        uint4 x0, y0, x1, y1;
        // chunk i's bytes: latent (i < 8: one 16-byte piece per token) or RoPE (i = 8: two)
        auto load = [&](int i) {
            if (i < 8) {
                const uint32_t off = 128 * t4 + ((((i + 2 * t4) & 7)) << 4);
                x0 = ld_shared_v4(r0 + off);
                y0 = ld_shared_v4(r1 + off);
            } else {
                const uint32_t off = SMLA_FP8_ROPE_OFF + 32 * t4;
                x0 = ld_shared_v4(r0 + off);
                x1 = ld_shared_v4(r0 + off + 16);
                y0 = ld_shared_v4(r1 + off);
                y1 = ld_shared_v4(r1 + off + 16);
            }
        };
        auto convert = [&](int i, Frag &f) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                if (i < 8 && kNoDq) {
                    f[m][0] = f[m][2] = word(x0, m);
                    f[m][1] = f[m][3] = word(y0, m);
                } else if (i < 8) {
                    dequant_e4m3x4(word(x0, m), sc0, f[m][0], f[m][2]);
                    dequant_e4m3x4(word(y0, m), sc1, f[m][1], f[m][3]);
                } else {  // bf16 RoPE dims 4 m .. 4 m + 3 of the thread's 16: words 2 m, 2 m + 1
                    const uint4 &xs = m < 2 ? x0 : x1, &ys = m < 2 ? y0 : y1;
                    f[m][0] = word(xs, 2 * (m & 1));
                    f[m][1] = word(ys, 2 * (m & 1));
                    f[m][2] = word(xs, 2 * (m & 1) + 1);
                    f[m][3] = word(ys, 2 * (m & 1) + 1);
                }
            }
        };
        load(0);
        convert(0, fa[0]);
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            wg_fence();
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const int kk = 4 * i + m;
                const uint64_t db = desc_at(qd, i * C::kQBlk + m * 32);
                if (kNoS) continue;
                if (kk < 12) wgmma_rs(t0, fa[i & 1][m], db, kk > 0);
                else if (kk < 24) wgmma_rs(t1, fa[i & 1][m], db, kk > 12);
                else wgmma_rs(t2, fa[i & 1][m], db, kk > 24);
            }
            wg_commit();
            if (i < 8) {
                load(i + 1);
                wg_wait1();  // chunk i - 1's MMAs are done with fa[(i + 1) & 1]
#pragma unroll
                for (int m = 0; m < 4; ++m) fence_regs(fa[(i + 1) & 1][m]);
                convert(i + 1, fa[(i + 1) & 1]);
            }
        }
        wg_wait0();
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            fence_regs(fa[0][m]);
            fence_regs(fa[1][m]);
        }
        fence_regs(t0);
        fence_regs(t1);
        fence_regs(t2);
#pragma unroll
        for (int i = 0; i < NS; ++i) s[i] = (t0[i] + t1[i]) + t2[i];
    }

    // O^T += V^T P^T over raw tile r (valid tokens vm) of local tile jl; refills the buffer with tile
    // jl + 2 once its last bytes are in registers.
    __device__ __forceinline__ void pv(uint32_t r, uint64_t vm, int jl)
    {
        const uint32_t pd = opaque(desc_base(sP, 16));
        const uint32_t piece = 16 * (8 * w + g);  // this thread's 16 latent dims (scale tile w)
        VFrag fv[2];
        uint4 v[4];
        float sc[4];
        // k-step kk's tokens 16 kk + 2 t4 + {0, 1, 8, 9}: their pieces and scales, zero when invalid
        auto load = [&](int kk) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int tok = 16 * kk + 2 * t4 + (e & 1) + 8 * (e >> 1);
                const uint32_t rr = r + tok * kEntry;
                const bool ok = (vm >> tok) & 1u;
                const uint4 x = ld_shared_v4(rr + piece);
                const uint32_t s = ld_shared_u32(rr + SMLA_FP8_SCALE_OFF + 4 * w);
                v[e] = ok ? x : make_uint4(0, 0, 0, 0);
                sc[e] = ok ? __uint_as_float(s) : 0.f;
            }
        };
        // m-tile mt: dims 2 mt (row g) and 2 mt + 1 (row g + 8) of the piece, tokens (e = 0, 1) and (2, 3)
        auto convert = [&](VFrag &f) {
#pragma unroll
            for (int wi = 0; wi < 4; ++wi) {  // word wi: m-tiles 2 wi (its low half) and 2 wi + 1
                uint32_t x[2], y[2], z[2], u[2];
                if constexpr (kNoDq) {
                    x[0] = x[1] = word(v[0], wi), y[0] = y[1] = word(v[1], wi);
                    z[0] = z[1] = word(v[2], wi), u[0] = u[1] = word(v[3], wi);
                } else {
                    dequant_e4m3x4(word(v[0], wi), sc[0], x[0], x[1]);
                    dequant_e4m3x4(word(v[1], wi), sc[1], y[0], y[1]);
                    dequant_e4m3x4(word(v[2], wi), sc[2], z[0], z[1]);
                    dequant_e4m3x4(word(v[3], wi), sc[3], u[0], u[1]);
                }
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    f[2 * wi + e][0] = __byte_perm(x[e], y[e], 0x5410);
                    f[2 * wi + e][1] = __byte_perm(x[e], y[e], 0x7632);
                    f[2 * wi + e][2] = __byte_perm(z[e], u[e], 0x5410);
                    f[2 * wi + e][3] = __byte_perm(z[e], u[e], 0x7632);
                }
            }
        };
        load(0);
        convert(fv[0]);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            wg_fence();
            const uint64_t dh = desc_at(pd, kk * 32), dl = desc_at(pd, C::kPBytes + kk * 32);
#pragma unroll
            for (int mt = 0; mt < 8 && !kNoPV; ++mt) {
                wgmma_rs(o[mt], fv[kk & 1][mt], dh, 1);
                if constexpr (!FAST) wgmma_rs(o[mt], fv[kk & 1][mt], dl, 1);
            }
            wg_commit();
            if (kk < 3) {
                load(kk + 1);
                wg_wait1();  // k-step kk - 1's MMAs are done with fv[(kk + 1) & 1]
#pragma unroll
                for (int mt = 0; mt < 8; ++mt) fence_regs(fv[(kk + 1) & 1][mt]);
                convert(fv[(kk + 1) & 1]);
            } else {
                refill(jl);  // its last bytes are in registers; the copies overlap the last MMAs
            }
        }
        wg_wait0();
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
            fence_regs(fv[0][mt]);
            fence_regs(fv[1][mt]);
            fence_regs(o[mt]);
        }
    }

    // Once every warp of the warpgroup has read tile jl's buffer, tile jl + 2 is copied into it.
    __device__ __forceinline__ void refill(int jl)
    {
        named_sync(kBarFree + wg, 128);
        if (jl + 2 < n) issue(jl + 2, idx_nx);
        idx_nx = fetch(jl + 3);
    }

    __device__ __forceinline__ void run()
    {
#pragma unroll 1
        for (int jl = 0; jl < n; ++jl) {
            const int b = buf(jl);
            const uint32_t r = c.raw(b);
            mbar_wait(c.full(b), (jl >> 1) & 1);
            const uint64_t vm = c.valid_mask(b);
            float s[NS], mx[NL];
            scores(r, s);
            const int tok = 16 * w + g;
            Base::tile_max(s, mx, (vm >> tok) & 1u, (vm >> (tok + 8)) & 1u, a.scale_log2,
                           c.sRed + (wg * 2 + (jl & 1)) * 4 * NH, kBarRed + wg);
            Base::softmax(s, mx, sP, kBarP + wg);
            pv(r, vm, jl);
        }
    }

    // Each warpgroup's row sums and maxima into smem and its O^T, back in dim order, over its raw tiles;
    // then warp W of the CTA writes heads W, W + 8, .. with the two states merged (finish_merged_row).
    __device__ __forceinline__ void epilogue()
    {
        Base::warp_sums();
        named_sync(kBarFree + wg, 128);  // every warp of the warpgroup is done reading its raw tiles
        if (g == 0) {
#pragma unroll
            for (int hl = 0; hl < NL; ++hl) {
                c.sLsum[(wg * 4 + w) * NH + head(hl)] = l_r[hl];
                if (w == 0) c.sM[wg * NH + head(hl)] = m_r[hl];
            }
        }
        float *so = c.staged(wg);
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
            for (int i = 0; i < NS; ++i) {
                const int hd = 8 * (i >> 2) + 2 * t4 + (i & 1);
                const int dim = 16 * (8 * w + g) + 2 * mt + ((i >> 1) & 1);
                so[hd * C::kOStride + dim] = o[mt][i];
            }
        __syncthreads();  // both warpgroups' states staged (every thread of the CTA gets here)
        const int wc = c.tid >> 5;
        const float *o0 = c.staged(0), *o1 = c.staged(1);
        for (int hd = wc; hd < NH && hd < c.h; hd += kThreads / 32) {
            double l0 = 0.0, l1 = 0.0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                l0 += c.sLsum[k * NH + hd];
                l1 += c.sLsum[(4 + k) * NH + hd];
            }
            finish_merged_row(a, c.row, c.bi, c.si, c.sp, c.h, hd, c.lane, c.sM[hd], c.sM[NH + hd], l0, l1,
                              o0 + hd * C::kOStride, o1 + hd * C::kOStride);
        }
    }
};

// Internal linkage: each instantiation file owns its kernels.
namespace {

template <class C, int ABL, bool FAST>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90r_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    extern __shared__ uint8_t smem_raw[];
    const Cta<C> c(a, smem_raw);

    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    if (c.tid == 0) {
#pragma unroll
        for (int b = 0; b < kBufs; ++b) mbar_init(c.full(b), 4 * kIssueLanes);
        fence_mbarrier_init();
    }
    __syncthreads();
    Consumer<C, ABL, FAST> wg(a, c);
    wg.start();
    if (c.nt > 0) {
        load_q(a, c);
        wg.run();
    }
    wg.epilogue();
}

// The variant the call asks for (sm90/variants.cuh).
template <class C>
int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    return with_variant(a, [&](auto abl, auto fast) {
        return launch_kernel<attn_sm90r_kernel<C, decltype(abl)::value, decltype(fast)::value>>(
            a, grid, kThreads, Smem<C>::bytes, s, dev, st);
    });
}

}  // namespace

// The table entry of the register kernel with NH heads (fp8_ds_mla only).
template <int NH>
constexpr KernelEntry entry()
{
    using C = Cfg<NH>;
    return KernelEntry{Family::sm90r, true, NH, kBN, Smem<C>::bytes, 1, kThreads, &launch<C>};
}

}  // namespace reg
}  // namespace sm90
}  // namespace attn
