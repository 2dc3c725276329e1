// Hopper (sm_90a) sparse MLA kernel over a bf16 K source for head tiles of 64, precision "fast" only, with three
// K buffers of 48 tokens ("tri" kernel, family sm90t). Semantics, outputs and split partials are those of the other
// kernels (sm80/kernel.cuh).
//
// Why: in the wide kernel (sm90/kernel.cuh) the two 64-token K buffers and Q fill shared memory, so a buffer is
// reloaded only after its tile's last reader and is needed again one tile later; the score warpgroup cannot issue
// the next tile's S before its softmax (the next tile would have to land a whole S earlier), so the tensor cores
// wait through every softmax (benchmarks/README.md, issue 16: both bounds near 3,600 cycles a tile). Here Q's RoPE
// part lives in WG0's registers (the A operand of S's last 4 k-steps), which leaves room for three K buffers of 48
// tokens. A warpgroup's wgmma issue waits for room in the tensor pipe (tools/wgmma_issue.cu), so WG0 cannot take its
// softmax while its own S runs; instead WG1's product of tile k waits for WG0's S of tile k + 1 and runs beside WG0's
// softmax of tile k + 1, which the third buffer allows (the buffer of tile k is held one S longer).
// Measured (benchmarks/README.md, issue 16, twenty-ninth and thirtieth sessions): correct; within a few percent of the
// wide kernel's speed, not yet faster; stays opt-in.
//
// CTA = one query row x 64 heads x one top-k split, 384 threads:
//   WG0 (ScoreWg, setmaxnreg kScoreRegs): S = Q K^T of each tile (m64n48k16 x 36, two chains summed in fp32: the
//     accuracy rule of sm90/score_tile.cuh), the softmax, P for WG1, O[:, 0:128] += P V with P from registers;
//   WG1 (ValueWg, kValueRegs): O[:, 128:512] += P V with P from shared memory;
//   WG2 (TriProducer, kProducerRegs): the tiles by cp.async into the three buffers in turn, each thread arriving
//     on the buffer's full barrier once its copies landed (.noinc), so it issues the next tile meanwhile.
// Shared-memory plan (Smem; 232,400 of the 232,448 B an sm_90 CTA may have, so no alignment slack: the dynamic
// shared memory base is 1024-byte aligned, which the kernel checks): Q's latent part (8 column blocks of
// [64 rows x 128 B], the 128-byte swizzle of plan.cuh), three K buffers of 9 column blocks of [48 rows x 128 B]
// (the same swizzle), the mbarriers full[3] and empty[3], the row flags (per buffer and producer warp, 12 bits),
// the rows' rescale factors alpha per buffer, the non-empty tile mask. P of a tile goes to WG1 through its buffer's
// RoPE block (dead once S is done) as [64 x 48] bf16 without swizzle (3 k-steps of [64 rows x 32 B], core matrices
// of 8 rows x 16 B: 128 B apart along the tokens, 256 B along the heads). The epilogue's row statistics and factors
// go through Q's region (dead once WG0's last S is done; WG1 never reads Q).
//
// Per tile it (buffer b = it % 3), WG0: mask, scale, maxima (lazy, as the wide kernel's: attention/softmax.cuh),
// P = 2^(S - m) in bf16, row sums in double; P and alpha published (kBarP + b); O rescaled, its P V issued; S(it + 1)
// issued (its buffer acquired); waits for both products, arrives on kBarS + (it & 1), frees buffer b. WG1: waits
// kBarP + b and kBarS + (it & 1), rescales, its P V, frees buffer b. The last tile has its own instantiation
// (NEXT = false): a branch around a wgmma would make ptxas serialise every wgmma of the kernel.
// Empty tiles cost nothing: the consumers mark the CTA's tiles that hold a valid index before the first load
// (scan_tiles_vec, producer.cuh), and only those run. Overflowed scores saturate (attention/softmax.cuh).
// ABL (profiling builds only, sm90/kernel.cuh's bits): 1 no K loads (zeros), 2 no S wgmma, 4 no P V wgmma; the
// other bits run the full kernel. Results are wrong then.
#pragma once

#include "attention/epilogue.cuh"
#include "attention/table.cuh"
#include "attention/sm90/plan.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/score_tile.cuh"
#include "attention/sm90/trace.cuh"
#include "attention/sm90/variants.cuh"

namespace attn {
namespace sm90 {
namespace tri {

// The measured form (benchmarks/README.md, issue 16, thirtieth session; the history has the switches measured no faster
// there, 52748d9: WG0's S of tile k + 1 issued before its softmax of tile k, alone or woven into it in groups; WG0's
// arrival after the issue of S(k + 1) instead of its end; its P V before the publication of P; the wide kernel's
// speculative softmax). Q's latent part comes by TMA from one thread where the launcher described q (a.q_tma), so that
// the consumers' tile scan does not queue behind Q's copies (else by the consumers' cp.async), and the producers copy
// the slice's tile 0 while the consumers scan the tiles (the wide kernel's SMLA_SM90_SPECULATE).

constexpr int kTB = 48;              // tokens per K tile
constexpr int kNBuf = 3;             // K buffers
constexpr int kKBlk = kTB * 128;     // one column block of a K buffer: [48 rows x 128 B]
constexpr int kKTile = 9 * kKBlk;    // one K buffer: 55,296 B
constexpr int kQBlocks = 8;          // Q's latent part in smem (the RoPE part: WG0's registers)
constexpr int kQrSteps = 4;          // S's k-steps with Q from registers (dims 512 .. 575)
constexpr int kJn = kTB / 8;         // S's accumulator column blocks of 8 tokens (24 floats a thread)
constexpr int kPk = kTB / 16;        // P V's k-steps
constexpr int kWarpRows = kTB / 4;   // rows of a tile per producer warp (12)
static_assert(kDqk == 36 * 16 && kDqk - 64 * kQBlocks == 16 * kQrSteps, "S: 32 k-steps from smem, 4 from registers");
static_assert(kTB % 16 == 0 && kWarpRows % 4 == 0, "whole P V k-steps; 4-row producer steps");
static_assert(kKBlk % 1024 == 0, "swizzled blocks");

// setmaxnreg budgets (multiples of 8, summing to the launch allocation 3 x 168: plan.cuh): WG0 holds O[:, 0:128]
// (64), S of this tile (24) and the next (2 chains, 48), P (12) and Q's RoPE fragments (16); WG1 O[:, 128:512] (192).
constexpr int kScoreRegs = 208, kValueRegs = 224, kProducerRegs = 72;
static_assert(kScoreRegs + kValueRegs + kProducerRegs <= 3 * kLaunchRegs, "the launch allocation");

// Named barriers (0 is __syncthreads): P of buffer b ready (kBarP + b: WG0 arrives, WG1 waits; WG0 arrives on it
// again only after WG1 freed the buffer), the epilogue's statistics, Q landed, the tile scan done (all 384
// threads), each warpgroup's staged output (kBarOut + warpgroup, 128 threads), WG0's S of tile it + 1 done (kBarS +
// (it & 1): WG0 arrives, WG1 waits; its next arrival on the same one, two tiles later, needs the buffer WG1 frees
// after that wait).
constexpr int kBarP = 1, kBarL = 4, kBarQ = 5, kBarStart = 6, kBarOut = 7, kBarS = 9;

struct Smem {
    static constexpr Region q = first_region(kQBlocks * kBlk);          // Q[:, 0:512], 8 column blocks
    static constexpr Region k = region_after(q, kNBuf * kKTile);        // three K buffers
    static constexpr Region bar = region_after(k, 2 * kNBuf * 8);       // full[3], empty[3]
    static constexpr Region valid = region_after(bar, kNBuf * 4 * 2);   // uint16 [3][4]: warp w's 12 rows' flags
    static constexpr Region alpha = region_after(valid, kNBuf * kHT * 4);  // float [3][64]: O's rescale
    static constexpr Region mask = region_after(alpha, kMaskWords * 4);    // the non-empty tiles
    static constexpr Region qbar = region_after(mask, 8);                  // Q's TMA mbarrier (a.q_tma)
    static constexpr int used = qbar.end();
    static constexpr int bytes = used;  // no slack: the base is 1024-byte aligned (checked by the kernel)
    static_assert(k.off % 1024 == 0 && bar.off % 8 == 0 && qbar.off % 8 == 0, "swizzled tiles, mbarriers");
    static_assert(bytes <= 227 * 1024, "sm_90 opt-in shared memory per block");
};

// The epilogue's use of Q's region: the row sums (double [64]) and maxima (float [64]) of a split partial at its
// start; the direct output's row factors (float [64]) in its last 256 B (block 7, which WG1 stages last: it reads
// its factors before its first staged block, and kOutPipe meets at every block).
constexpr int kQStatL = 0, kQStatM = 512, kQFactors = kQBlocks * kBlk - 256;
static_assert(kOutPipe, "the factors in Q's last block need WG1's meeting at each staged block");

struct Cta : CtaCommon {
    int h0;
    float *sAlpha;
    uint32_t *mask;
    uint16_t *flags;  // [3][4]: the row flags of buffer b's tile, a 12-bit word per producer warp

    __device__ __forceinline__ Cta(const Args &a, uint8_t *smem_raw, const GridPos &gp)
        : CtaCommon(a, smem_raw, gp, Smem::q.off, Smem::k.off, Smem::bar.off, Smem::valid.off, kTB)
    {
        h0 = gp.ht * kHT;
        sAlpha = reinterpret_cast<float *>(smem + Smem::alpha.off);
        mask = reinterpret_cast<uint32_t *>(smem + Smem::mask.off);
        flags = reinterpret_cast<uint16_t *>(smem + Smem::valid.off);
    }
    __device__ __forceinline__ uint32_t full(int b) const { return bar_full + 8 * b; }
    __device__ __forceinline__ uint32_t empty(int b) const { return bar_full + 8 * (kNBuf + b); }
    __device__ __forceinline__ uint32_t kbuf(int b) const { return sK + b * kKTile; }
    // The tile's 48 row flags, bit r for row r (warp w's 12 bits hold rows 12 w ..).
    __device__ __forceinline__ uint64_t row_flags(int b) const
    {
        const uint64_t v = *reinterpret_cast<const uint64_t *>(flags + 4 * b);
        return (v & 0xfffull) | ((v >> 4) & 0xfff000ull) | ((v >> 8) & 0xfff000000ull) | ((v >> 12) & 0xfff000000000ull);
    }
};

// The buffer ring: tile it's buffer and its use of it.
struct Ring {
    int b = 0, use = 0;
    __device__ __forceinline__ void next()
    {
        if (++b == kNBuf) b = 0, ++use;
    }
};

// ------------------------------------------------------------------------------------------------
// The producer (WG2): lane l of warp w copies 16-byte chunk l & 7 of the 9 column blocks of rows 12 w + 4 i + (l >> 3),
// i = 0..2, of every tile; lane 0 of each warp stores its 12 row flags and arrives once on the full barrier (so the
// barrier counts 128 copy arrivals and 4 flag arrivals).
// ------------------------------------------------------------------------------------------------
template <int ABL>
struct TriProducer : ProducerLane {
    static constexpr bool kNoLoad = (ABL & 1) != 0;
    static constexpr int kNi = kWarpRows / 4;
    const Cta &c;

    __device__ __forceinline__ TriProducer(const Args &a_, const Cta &cta) : ProducerLane(a_, cta.tid - 256, cta.lane), c(cta)
    {
    }
    __device__ __forceinline__ int row_of(int i) const { return kWarpRows * pw + 4 * i + sub; }

    __device__ __forceinline__ void fetch_idx(int t, int (&v)[kNi]) const
    {
#pragma unroll
        for (int i = 0; i < kNi; ++i) v[i] = tile_row_index<kTB>(c, t, row_of(i));
    }

    // The rows of indices idx into buffer b and (lane 0) the warp's row flags; commit(b) hands them over.
    __device__ __forceinline__ void copy(int b, const int (&idx)[kNi]) const
    {
        const uint32_t kb = c.kbuf(b);
        uint32_t bits = 0;
#pragma unroll
        for (int i = 0; i < kNi; ++i) {
            const int r = row_of(i);
            const bool ok = kv.valid(idx[i]);  // -1 past L
            const uint8_t *src = kv.row(idx[i], ok) + cl * 16;
            const int nb = (ok && !kNoLoad) ? 16 : 0;
            const uint32_t dst = chunk_dst(kb, r);
#pragma unroll
            for (int c8 = 0; c8 < 9; ++c8) copy16(dst + c8 * kKBlk, src + c8 * 128, nb);
            const uint32_t bal = __ballot_sync(0xffffffffu, ok);
#pragma unroll
            for (int s = 0; s < 4; ++s) bits |= ((bal >> (8 * s)) & 1u) << (4 * i + s);
        }
        if (c.lane == 0) c.flags[4 * b + pw] = static_cast<uint16_t>(bits);
    }
    __device__ __forceinline__ void commit(int b) const
    {
        if (c.lane == 0) mbar_arrive(c.full(b));  // releases the flags
        cp_async_mbar_arrive_noinc(c.full(b));
    }

    // The slice's tile 0 into buffer 0 before the scan (the slice has a tile), not yet committed.
    __device__ __forceinline__ void speculate() const
    {
        int idx[kNi];
        fetch_idx(0, idx);
        copy(0, idx);
    }

    // Every tile that runs, through the three buffers; speculated: speculate() ran (its copies are tile 0's where
    // the scan kept tile 0, else they land before buffer 0 is rewritten).
    __device__ __forceinline__ void run(bool speculated) const
    {
        int cur[kNi], nxt[kNi];
        int t = c.next_tile(0);
        const bool have0 = speculated && c.nt > 0 && t == 0;
        if (speculated && !have0) cp_async_wait_all();
        fetch_idx(t, cur);
        Ring r;
        for (int it = 0; it < c.nt; ++it, r.next()) {
            trace(a, it, 0);
            t = c.next_tile(t + 1);
            fetch_idx(t, nxt);
            if (r.use > 0) mbar_wait(c.empty(r.b), (r.use - 1) & 1);
            trace(a, it, 1);
            if (it > 0 || !have0) copy(r.b, cur);
            commit(r.b);
            trace(a, it, 2);
#pragma unroll
            for (int i = 0; i < kNi; ++i) cur[i] = nxt[i];
        }
        cp_async_wait_all();
    }
};

// ------------------------------------------------------------------------------------------------
// The consumers. The thread's rows r0, r0 + 8 of the 64 heads; accumulator column pairs 8 jn + 2 t4.
// ------------------------------------------------------------------------------------------------

// P of a tile as WG1's A operand: [64 heads x 48 tokens] bf16 at blk (the buffer's RoPE block), k-step kk at
// 2048 kk, no swizzle: core matrix (heads 8 i.., tokens 16 kk + 8 j..) at 256 i + 128 j, its row at 16 B apart.
constexpr uint32_t kPDescHi = 256u >> 4;  // sbo 256 B (the heads' core matrices); layout type 0 (no swizzle)
__device__ __forceinline__ uint64_t p_desc(uint32_t blk, int kk)
{
    const uint32_t lo = (((blk + 2048u * kk) & 0x3FFFF) >> 4) | ((128u >> 4) << 16);  // lbo 128 B (the tokens')
    return (static_cast<uint64_t>(kPDescHi) << 32) | lo;
}

template <int ABL>
struct ScoreWg {
    static constexpr bool kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0;
    const Args &a;
    const Cta &c;
    const int lane, t4, r0;
    float o[64];                  // O[:, 0:128]: o[4 jn + {0, 1} / {2, 3}] rows r0 / r0 + 8, columns 8 jn + 2 t4
    uint32_t qr[kQrSteps][4];     // Q's RoPE part: the A fragments of k-steps 32..35
    float m_r[2] = {-INFINITY, -INFINITY}, m_t[2] = {-INFINITY, -INFINITY};
    double l_r[2] = {0.0, 0.0};

    __device__ __forceinline__ ScoreWg(const Args &a_, const Cta &cta)
        : a(a_), c(cta), lane(cta.lane), t4(cta.lane & 3), r0(16 * ((cta.tid >> 5) & 3) + (cta.lane >> 2))
    {
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] = 0.f;
        // the m64k16 A fragment of k-step kk: rows r0 / r0 + 8, dims 512 + 16 kk + 2 t4 (+ 8), from global
#pragma unroll
        for (int kk = 0; kk < kQrSteps; ++kk)
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                const int hr = c.h0 + r0 + 8 * (f & 1);
                const int d = kDv + 16 * kk + 8 * (f >> 1) + 2 * t4;
                qr[kk][f] = hr < c.h ? __ldg(reinterpret_cast<const unsigned int *>(smla_q_at(&a.p, c.bi, c.si, hr, d)))
                                     : 0u;
            }
    }

    __device__ __forceinline__ void acquire(const Ring &r) const
    {
        mbar_wait(c.full(r.b), r.use & 1);
        fence_async_smem();  // the producers' cp.async data, read by wgmma
    }
    __device__ __forceinline__ void release(int b) const { mbar_arrive(c.empty(b)); }

    // S of buffer b's k-steps K0 .. K0 + N - 1 into d (chain 0: k-steps 0..17, chain 1: 18..35, each from its first
    // k-step on).
    template <int K0, int N>
    __device__ __forceinline__ void s_steps(int b, float (&d)[24]) const
    {
        if constexpr (kNoS) return;
        const uint32_t qd = opaque(desc_base(c.sQ, 16)), kd = opaque(desc_base(c.kbuf(b), 16));
#pragma unroll
        for (int kk = K0; kk < K0 + N; ++kk) {
            const uint32_t kof = (kk >> 2) * kKBlk + (kk & 3) * 32;
            if (kk < 4 * kQBlocks) wgmma_ss<0>(d, desc_at(qd, (kk >> 2) * kBlk + (kk & 3) * 32), desc_at(kd, kof), kk % 18 != 0);
            else wgmma_rs(d, qr[kk - 4 * kQBlocks], desc_at(kd, kof), kk % 18 != 0);
        }
    }
    // S of buffer b as its two chains into sa and sb, one commit group.
    __device__ __forceinline__ void s_issue(int b, float (&sa)[24], float (&sb)[24]) const
    {
        wg_fence();
        s_steps<0, 18>(b, sa);
        s_steps<18, 18>(b, sb);
        wg_commit();
    }
    __device__ __forceinline__ static void s_sum(float (&s)[24], float (&sa)[24], float (&sb)[24])
    {
        if constexpr (kNoS) {
#pragma unroll
            for (int i = 0; i < 24; ++i) s[i] = 0.f;
        } else {
            fence_regs(sa);
            fence_regs(sb);
#pragma unroll
            for (int i = 0; i < 24; ++i) s[i] = sa[i] + sb[i];
        }
    }

    // Mask (flags: bit 8 jn + e for token 8 jn + 2 t4 + e), scale, saturate (mask_scale_cols, sm90/score_tile.cuh),
    // the rows' maxima over the quad, the lazy reference max, alpha and nb (move_ref_max, sm90/score_tile.cuh).
    __device__ __forceinline__ void softmax_max(int b, float (&s)[24], float (&alpha)[2], float (&nb)[2])
    {
        const uint64_t fl = c.row_flags(b) >> (2 * t4);
        float mx[2];
        mask_scale_cols<kJn>([&](int jn, int e) { return ((fl >> (8 * jn + e)) & 1u) != 0; }, a.scale_log2, m_r, s, mx);
        quad_max(mx);
        move_ref_max(mx[0], m_r[0], m_t[0], alpha[0], nb[0]);
        move_ref_max(mx[1], m_r[1], m_t[1], alpha[1], nb[1]);
    }
    // P = 2^(s - m) as the A fragments of P V, and the row sums (scale_add_row_sums).
    __device__ __forceinline__ void softmax_exp(const float (&s)[24], const float (&alpha)[2], const float (&nb)[2],
                                                uint32_t (&p)[12])
    {
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int jn = 0; jn < kJn; ++jn) {
            const float p0 = ex2(s[4 * jn + 0] + nb[0]), p1 = ex2(s[4 * jn + 1] + nb[0]);
            const float p2 = ex2(s[4 * jn + 2] + nb[1]), p3 = ex2(s[4 * jn + 3] + nb[1]);
            rs[0] += p0 + p1;
            rs[1] += p2 + p3;
            const int f = 4 * (jn >> 1) + 2 * (jn & 1);  // k-step jn >> 1, token half jn & 1
            p[f] = pack_bf16x2(p0, p1);
            p[f + 1] = pack_bf16x2(p2, p3);
        }
        scale_add_row_sums(l_r, alpha, rs);
    }
    // P into buffer b's RoPE block (p_desc's layout: per k-step one stmatrix x4, matrix m = rows + 8 (m & 1), tokens
    // + 8 (m >> 1), the fragment registers' order) and alpha, then kBarP + b.
    __device__ __forceinline__ void publish(int b, const float (&alpha)[2], const uint32_t (&p)[12]) const
    {
        const int m = lane >> 3, row = (r0 & ~15) + 8 * (m & 1) + (lane & 7);
        const uint32_t blk = c.kbuf(b) + 8 * kKBlk + (row >> 3) * 256 + (m >> 1) * 128 + (row & 7) * 16;
#pragma unroll
        for (int kk = 0; kk < kPk; ++kk) stsm_x4(blk + 2048 * kk, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]);
        if (t4 == 0) {
            c.sAlpha[b * kHT + r0] = alpha[0];
            c.sAlpha[b * kHT + r0 + 8] = alpha[1];
        }
        fence_async_smem();
        named_arrive(kBarP + b, 256);
    }

    // O[:, 0:128] += P V (V: buffer b's column blocks 0, 1), one commit group.
    __device__ __forceinline__ void pv_issue(int b, uint32_t (&p)[12])
    {
        if constexpr (kNoPV) return;
        const uint32_t vd = opaque(desc_base(c.kbuf(b), kKBlk));
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < kPk; ++kk)
            wgmma_n128_rs(o, reinterpret_cast<const uint32_t(&)[4]>(p[4 * kk]), desc_at(vd, 16 * kk * 128));
        wg_commit();
    }

    // Tile it (ring position r, its S complete in s); NEXT: S of tile it + 1 (ring position rn) issued after its P V.
    template <bool NEXT>
    __device__ __forceinline__ void step(int it, const Ring &r, const Ring &rn, float (&s)[24])
    {
        float sa[24], sb[24], alpha[2];
        uint32_t p[12];
        float nb[2];
        trace(a, it, 0);
        softmax_max(r.b, s, alpha, nb);
        softmax_exp(s, alpha, nb, p);
        trace(a, it, 1);
        publish(r.b, alpha, p);
        trace(a, it, 2);
        rescale_rows(o, alpha);
        pv_issue(r.b, p);
        if constexpr (NEXT) {
            acquire(rn);
            s_issue(rn.b, sa, sb);
        }
        trace(a, it, 3);
        wg_wait0();
        fence_regs(o);
        fence_regs(p);
        if constexpr (NEXT) named_arrive(kBarS + (it & 1), 256);  // WG1 may multiply P of tile it now
        trace(a, it, 4);
        release(r.b);
        if constexpr (NEXT) s_sum(s, sa, sb);
    }

    __device__ __forceinline__ void run()
    {
        if (c.nt == 0) return;
        float s[24];
        {
            float sa[24], sb[24];
            Ring r0_;
            acquire(r0_);
            s_issue(0, sa, sb);
            wg_wait0();
            s_sum(s, sa, sb);
        }
        Ring r, rn;
        rn.next();
#pragma unroll 1
        for (int it = 0; it + 1 < c.nt; ++it) {
            step<true>(it, r, rn, s);
            r.next();
            rn.next();
        }
        step<false>(c.nt - 1, r, rn, s);
    }

    // The rows' sums over the quad, then the output: direct (staged through Q's region; the rows' factors handed
    // to WG1 through its last 256 B) or a split partial (the statistics through its start).
    __device__ __forceinline__ void epilogue()
    {
        quad_sum_rows(l_r);
        if (staged_direct(a)) {
            const auto stat = [&](int hf, int) { return RowStat{m_r[hf], l_r[hf], m_t[hf]}; };
            finish_cols_direct(a, c, c.h0, r0, 0, t4, o, stat, c.sQ, kBarOut, [&](const float (&f)[2]) {
                if (t4 == 0) {
                    float *const sf = reinterpret_cast<float *>(c.smem + Smem::q.off + kQFactors);
                    sf[r0] = f[0];
                    sf[r0 + 8] = f[1];
                }
                named_arrive(kBarL, 256);
            });
            return;
        }
        double *const sL = reinterpret_cast<double *>(c.smem + Smem::q.off + kQStatL);
        float *const sM = reinterpret_cast<float *>(c.smem + Smem::q.off + kQStatM);
        if (t4 == 0) {
            sL[r0] = l_r[0];
            sL[r0 + 8] = l_r[1];
            sM[r0] = m_r[0];
            sM[r0 + 8] = m_r[1];
        }
        named_sync(kBarL, 256);
        const auto stat = [&](int hf, int rl) { return RowStat{sM[rl], sL[rl], m_t[hf]}; };
        finish_cols<1>(a, c, c.h0, r0, 0, t4, o, stat);
    }
};

template <int ABL>
struct ValueWg {
    static constexpr bool kNoPV = (ABL & 4) != 0;
    const Args &a;
    const Cta &c;
    const int t4, r0;
    float o[192];  // O[:, 128:512]: o[0..127] columns 128..383 (an m64n256 accumulator), o[128..191] 384..511

    __device__ __forceinline__ ValueWg(const Args &a_, const Cta &cta)
        : a(a_), c(cta), t4(cta.lane & 3), r0(16 * ((cta.tid >> 5) & 3) + (cta.lane >> 2))
    {
#pragma unroll
        for (int i = 0; i < 192; ++i) o[i] = 0.f;
    }

    // Tile it: P and alpha (kBarP + b; the full barrier's phase, complete by then, orders the producers' writes
    // before our wgmma without relying on the named barrier's transitivity), then, but for the last tile, WG0's S of
    // tile it + 1 done (kBarS + (it & 1)); O rescaled, P V, buffer freed.
    __device__ __forceinline__ void tile(int it, const Ring &r)
    {
        trace(a, it, 0);
        named_sync(kBarP + r.b, 256);
        trace(a, it, 1);
        if (it + 1 < c.nt) {
            named_sync(kBarS + (it & 1), 256);  // WG0's S of tile it + 1 done: our product runs beside its softmax
            trace(a, it, 3);
        }
        mbar_wait(c.full(r.b), r.use & 1);
        fence_async_smem();
        const float alpha[2] = {c.sAlpha[r.b * kHT + r0], c.sAlpha[r.b * kHT + r0 + 8]};
        rescale_rows(o, alpha);
        if constexpr (!kNoPV) {
            const uint32_t kb = c.kbuf(r.b), vd = opaque(desc_base(kb, kKBlk));
            auto &oa = reinterpret_cast<float(&)[128]>(o[0]);
            auto &ob = reinterpret_cast<float(&)[64]>(o[128]);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < kPk; ++kk) {
                const uint64_t pd = p_desc(kb + 8 * kKBlk, kk);
                wgmma_n256_tb(oa, pd, desc_at(vd, 2 * kKBlk + 16 * kk * 128));
                wgmma_n128_tb(ob, pd, desc_at(vd, 6 * kKBlk + 16 * kk * 128));
            }
            wg_commit();
            wg_wait0();
            fence_regs(o);
        }
        trace(a, it, 2);
        mbar_arrive(c.empty(r.b));
    }

    __device__ __forceinline__ void run()
    {
        Ring r;
#pragma unroll 1
        for (int it = 0; it < c.nt; ++it, r.next()) tile(it, r);
    }

    __device__ __forceinline__ void epilogue()
    {
        if (staged_direct(a)) {
            named_sync(kBarL, 256);
            const float *const sf = reinterpret_cast<const float *>(c.smem + Smem::q.off + kQFactors);
            const float f[2] = {sf[r0], sf[r0 + 8]};
            stage_out_cols(a, c, c.h0, r0, 128, t4, o, f, c.sQ, kBarOut + 1);
            return;
        }
        named_sync(kBarL, 256);
        const double *const sL = reinterpret_cast<const double *>(c.smem + Smem::q.off + kQStatL);
        const float *const sM = reinterpret_cast<const float *>(c.smem + Smem::q.off + kQStatM);
        const auto stat = [&](int, int rl) { return RowStat{sM[rl], sL[rl], -INFINITY}; };  // half 1: no max_logits
        finish_cols<1>(a, c, c.h0, r0, 128, t4, o, stat);
    }
};

// The consumers' wait for Q's latent part (their own cp.async).
__device__ __forceinline__ void wait_q_latent()
{
    cp_async_wait_all();
    fence_async_smem();
    named_sync(kBarQ, 256);
}

// Internal linkage: the instantiation file owns its kernels.
namespace {

template <int ABL>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90t_kernel(const __grid_constant__ Args a)
{
    pdl_wait();  // before any global access: the stream's previous kernel is complete (common.cuh)
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if (smem_u32(smem_raw) & 1023u) __trap();  // Smem has no alignment slack
    Cta c(a, smem_raw, grid_pos(a));

    trace_edge(a, kTrStart);
    pdl_launch_dependents();  // the combine (split mode) may be scheduled; it waits for this grid
    // Q's latent part by TMA from one thread where the launcher described q (a.q_tma, decided on the slice's tile
    // count before the scan, as the wide kernel's q_by_tma), else by the consumers' cp.async
    const bool q_tma = a.q_tma && c.nt_all > 0;
    const uint32_t qbar = c.base + Smem::qbar.off;
    if (c.tid == 0) {
        for (int b = 0; b < kNBuf; ++b) {
            mbar_init(c.full(b), 128 + 4);  // the producers' copies (.noinc) and their warps' flag arrivals
            mbar_init(c.empty(b), 256);     // both consumer warpgroups
        }
        if (q_tma) mbar_init(qbar, 1);
        fence_mbarrier_init();
    }
    if (!q_tma && c.nt_all > 0 && c.tid < 256) issue_q<kHT, 256, kNopeChunks>(a, c, c.h0, c.tid);
    if (c.tid < kMaskWords) c.mask[c.tid] = 0u;
    __syncthreads();
    if (q_tma && c.tid == 0) tma_q<kQBlocks>(a, c.sQ, c.h0, static_cast<int>(c.si), static_cast<int>(c.bi), qbar);
    // the tiles without a valid index are neither loaded nor multiplied; the producers copy tile 0 meanwhile
    const bool spec = c.nt_all > 0;
    skip_empty_tiles_by_consumers<kThreads, kTB>(a, c, c.mask, kBarStart, [&] {
        if (spec) TriProducer<ABL>(a, c).speculate();
    });
    trace_edge(a, kTrScanned);
    if (c.tid >= 256) {
        setmaxnreg_dec<kProducerRegs>();
        TriProducer<ABL>(a, c).run(spec);
        return;
    }
    const auto wait_q = [&] {
        if (q_tma) mbar_wait(qbar, 0);  // TMA's bytes are visible to wgmma once the phase completes
        else wait_q_latent();
    };
    if (c.tid < 128) {
        setmaxnreg_inc<kScoreRegs>();
        ScoreWg<ABL> wg(a, c);
        wait_q();
        trace_edge(a, kTrQ);
        wg.run();
        trace_edge(a, kTrEpilogue);
        wg.epilogue();
    } else {
        setmaxnreg_inc<kValueRegs>();
        ValueWg<ABL> wg(a, c);
        wait_q();
        wg.run();
        trace_edge(a, kTrEpilogue);
        wg.epilogue();
    }
    trace_edge(a, kTrEnd);
}

// "fast" only: launch.cu chooses this family for such calls alone.
int launch(Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    return with_variant(a, [&](auto abl, auto fast) {
        if constexpr (!decltype(fast)::value) {
            return smla_fail(st, SMLA_ERR_UNSUPPORTED, "sparse MLA: the sm90t kernel computes precision=\"fast\" only");
        } else {
            return launch_kernel<attn_sm90t_kernel<decltype(abl)::value>>(a, grid, kThreads, Smem::bytes, s, dev, st);
        }
    });
}

}  // namespace

// The table entry (bf16 K, precision "fast").
constexpr KernelEntry entry()
{
    return KernelEntry{Family::sm90t, false, kHT, kTB, Smem::bytes, 1, kThreads, &launch, /*fuses=*/false, /*q_tma=*/true};
}

}  // namespace tri
}  // namespace sm90
}  // namespace attn
