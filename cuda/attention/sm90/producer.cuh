// The producer warpgroup (WG2, setmaxnreg WgRegs::producer) of the wgmma kernel: it fills the two K buffers,
// handing each over through mbarriers (full: producer -> consumers, empty: consumers -> producer),
// and marks each row valid or not (sValid) for the consumers' mask.
//   Bf16Producer: bf16 rows by 16-byte cp.async (zero fill for invalid rows), 8 lanes per row, each
//                 lane finding its own rows' addresses;
//   Fp8Producer : fp8_ds_mla rows by 16-byte loads into registers (two 4-row batches in flight per
//                 warp; row addresses found a tile ahead, one lane per row) and the exact dequant
//                 bf16_rne(float(e4m3) * scale) (dequant8, cuda/common.cuh) into smem. XO: the
//                 two-CTA crossover below.
// XO ("crossover", FlashMLA's two-CTA dequant split; fp8 with two head tiles): the two CTAs of a
// cluster are the two head tiles of one (query row, split) and read the same K rows; each loads and
// dequantises half of every tile (rows 32 * rank .. + 31) and stores it into its own K buffer and, with
// st.async, into the peer's, whose remote-ready barrier (rr) counts the bytes. The empty barriers count
// one arrival per consumer warp of both CTAs.
// ABL (profiling builds only, sm90/kernel.cuh): bit 1 leaves out the global K loads (zeros), bit 8 the
// fp8 dequant (raw bytes stored).
#pragma once

#include "attention/sm90/plan.cuh"
#include "attention/sm90/trace.cuh"

namespace attn {
namespace sm90 {

// Where K rows come from: the cache entry of a valid slot (ok), else the cache base (never read).
struct KvSource {
    const smla_attn_params &p;
    const uint8_t *kv_base;
    uint32_t block_size;
    int64_t limit;

    __device__ __forceinline__ explicit KvSource(const Args &a)
        : p(a.p), kv_base(static_cast<const uint8_t *>(a.p.kv.data)),
          block_size(static_cast<uint32_t>(a.p.kv.block_size)), limit(a.limit)
    {
    }
    // The attention rule's validity of a slot (docs/design.md section 4), past topk_length aside.
    __device__ __forceinline__ bool valid(int idx) const { return idx >= 0 && static_cast<int64_t>(idx) < limit; }
    __device__ __forceinline__ const uint8_t *row(int idx, bool ok) const
    {
        if (!ok) return kv_base;
        return smla_cache_entry_valid(kv_base, static_cast<uint32_t>(idx), block_size, p.kv.block_stride,
                                      p.kv.entry_stride);
    }
    // The same with the division by block_size as a multiply-shift (bs_div = smla_udiv_of(block_size), made once by
    // the caller; a block_size >= 2^31 has bs_div.m = 0, which gives block 0: right, as every slot is below 2^31), and
    // no branch: an invalid slot is taken as slot 0, whose entry is kv_base.
    __device__ __forceinline__ const uint8_t *row(int idx, bool ok, smla_udiv bs_div) const
    {
        return smla_cache_entry_udiv(kv_base, ok ? static_cast<uint32_t>(idx) : 0u, block_size, bs_div,
                                     p.kv.block_stride, p.kv.entry_stride);
    }
};

// A bf16 producer lane's place (the wide and the three-buffer kernels): warp pw of the producer warps from thread P0,
// row sub = lane >> 3 of each 4-row step, 16-byte chunk cl = lane & 7 of each column block; where rows come from
// (kv) and the copies' L2 policy (evict_last where the call asks for it: prefill).
struct ProducerLane {
    const Args &a;
    const KvSource kv;
    const int pw, sub, cl;
    const uint64_t pol;
    __device__ __forceinline__ ProducerLane(const Args &a_, int tid_from_p0, int lane)
        : a(a_), kv(a_), pw(tid_from_p0 >> 5), sub(lane >> 3), cl(lane & 7), pol(a_.evict_last ? policy_evict_last() : 0)
    {
    }
    // Where this lane's chunk of column block 0 of row r lives in the K buffer at kb (128-byte swizzle).
    __device__ __forceinline__ uint32_t chunk_dst(uint32_t kb, int r) const
    {
        return kb + r * 128 + ((cl ^ (r & 7)) << 4);
    }
    // One 16-byte copy (nb bytes read, the rest zero), with the L2 policy where the call has one.
    __device__ __forceinline__ void copy16(uint32_t dst, const uint8_t *src, int nb) const
    {
        if (a.evict_last) cp_async16_hint(dst, src, nb, pol);
        else cp_async16(dst, src, nb);
    }
    // The same with the form decided by the caller once (kHintAny: a.evict_last per copy, i.e. both forms in the code,
    // each predicated; kHintLast: with the evict_last policy; kHintNone: without).
    template <int HINT>
    __device__ __forceinline__ void copy16_as(uint32_t dst, const uint8_t *src, int nb) const
    {
        if constexpr (HINT == kHintLast) cp_async16_hint(dst, src, nb, pol);
        else if constexpr (HINT == kHintNone) cp_async16(dst, src, nb);
        else copy16(dst, src, nb);
    }
    static constexpr int kHintNone = 0, kHintLast = 1, kHintAny = 2;
};

// The index of row r of slice tile t of BN tokens: -1 past the slice's tiles or the row's top-k length.
template <int BN = kBN>
__device__ __forceinline__ int tile_row_index(const CtaCommon &c, int t, int r)
{
    const int pos = (c.j0 + t) * BN + r;
    return (t < c.nt_all && pos < c.L) ? __ldg(c.idx_row + pos) : -1;
}

// Empty tiles cost nothing (bf16 kernels): before the first load, the PW producer warps from thread P0
// mark the slice's tiles that hold any valid index (warp w takes tiles w, w + PW, ..) in mask
// (kMaskWords words, zeroed by the kernel before a __syncthreads). After a barrier of all the kernel's
// threads each of them takes the mask and the count of marked tiles (use_tile_mask; tiles past
// kMaskTiles count as marked).
template <int P0, int PW>
__device__ __forceinline__ void scan_tiles(const Args &a, const CtaCommon &c, uint32_t *mask)
{
    constexpr int kTiles = 8;  // tiles per warp in flight: the 16 loads of a lane are issued before any is used
    const KvSource kv(a);
    const int lane = c.lane, pw = (c.tid - P0) >> 5;
    const int nm = c.nt_all < kMaskTiles ? c.nt_all : kMaskTiles;
    const int last = c.L - 1;  // c.L >= 1 when the slice has tiles
    for (int t0 = pw; t0 < nm; t0 += PW * kTiles) {
        int v[2 * kTiles];
#pragma unroll
        for (int k = 0; k < 2 * kTiles; ++k) {  // unconditional loads (clamped into the row): one round trip
            const int pos = (c.j0 + t0 + PW * (k >> 1)) * kBN + 32 * (k & 1) + lane;
            v[k] = __ldg(c.idx_row + (pos < last ? pos : last));
            if (pos > last) v[k] = -1;
        }
#pragma unroll
        for (int k = 0; k < kTiles; ++k) {
            const int t = t0 + PW * k;
            const bool any = __any_sync(0xffffffffu, kv.valid(v[2 * k]) || kv.valid(v[2 * k + 1]));
            if (any && lane == 0 && t < nm) atomicOr(mask + (t >> 5), 1u << (t & 31));
        }
    }
}
// The same scan by the PW warps from thread T0 with 16-byte loads (kConsumerScan, plan.cuh): lane l takes the 8
// indices 8 (l & 7) .. of tile t0 + (l >> 3), so a warp covers 4 tiles a pass with 2 loads a lane; where the row
// is not 16-byte aligned or the 8 run past the row's top-k entries, 8 loads clamped into [0, L). BN: tokens per
// tile, a multiple of 8 up to 64 (lanes 8 (l & 7) >= BN take none).
template <int T0, int PW, int BN = kBN>
__device__ __forceinline__ void scan_tiles_vec(const Args &a, const CtaCommon &c, uint32_t *mask)
{
    static_assert(BN % 8 == 0 && BN <= 64, "8 indices a lane, 8 lanes a tile");
    const KvSource kv(a);
    const int lane = c.lane, w = (c.tid - T0) >> 5;
    const int nm = c.nt_all < kMaskTiles ? c.nt_all : kMaskTiles;
    const int last = c.L - 1, topk = static_cast<int>(a.p.topk);
    const bool vec = (reinterpret_cast<uintptr_t>(c.idx_row) & 15u) == 0;
    for (int t0 = 4 * w; t0 < nm; t0 += 4 * PW) {
        const int t = t0 + (lane >> 3);
        const int pos = (c.j0 + t) * BN + 8 * (lane & 7);
        int v[8];
        if (vec && pos + 8 <= topk) {
            const int4 x = __ldg(reinterpret_cast<const int4 *>(c.idx_row + pos));
            const int4 y = __ldg(reinterpret_cast<const int4 *>(c.idx_row + pos + 4));
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = __ldg(c.idx_row + (pos + k < last ? pos + k : last));
        }
        bool any = false;
#pragma unroll
        for (int k = 0; k < 8; ++k) any = any || (pos + k < c.L && kv.valid(v[k]));
        if (BN < 64 && 8 * (lane & 7) >= BN) any = false;  // the next tile's indices
        const uint32_t bal = __ballot_sync(0xffffffffu, any);
        if ((lane & 7) == 0 && t < nm && ((bal >> (lane & 24)) & 0xffu) != 0u) atomicOr(mask + (t >> 5), 1u << (t & 31));
    }
    trace_edge(a, kTrScanLoads);  // profiling builds: this warp's index loads are back (the ballot used them)
}

__device__ __forceinline__ void use_tile_mask(CtaCommon &c, const uint32_t *mask)
{
    const int nm = c.nt_all < kMaskTiles ? c.nt_all : kMaskTiles;
    int n = c.nt_all - nm;
    for (int w = 0; w < (nm + 31) / 32; ++w) n += __popc(mask[w]);
    c.tile_mask = mask;
    c.nt = n;
}

// The whole step for a kernel of NT threads whose producers are the PW warps from P0: they scan, all
// NT meet at named barrier bar, each takes the result.
// pre(): what the producers do first (the wide kernel: issue tile 0, Bf16Producer::speculate).
template <int P0, int PW, int NT, class Pre>
__device__ __forceinline__ void skip_empty_tiles(const Args &a, CtaCommon &c, uint32_t *mask, int bar, Pre pre)
{
    if (c.tid >= P0) {
        pre();
        scan_tiles<P0, PW>(a, c, mask);
    }
    named_sync(bar, NT);
    use_tile_mask(c, mask);
}
// kConsumerScan: the 256 consumer threads (8 warps from thread 0) scan (scan_tiles_vec) while the producers
// (threads 256 ..) do pre() alone.
template <int NT, int BN = kBN, class Pre>
__device__ __forceinline__ void skip_empty_tiles_by_consumers(const Args &a, CtaCommon &c, uint32_t *mask, int bar,
                                                              Pre pre)
{
    if (c.tid >= 256) pre();
    else scan_tiles_vec<0, 8, BN>(a, c, mask);
    named_sync(bar, NT);
    use_tile_mask(c, mask);
}
template <int P0, int PW, int NT>
__device__ __forceinline__ void skip_empty_tiles(const Args &a, CtaCommon &c, uint32_t *mask, int bar)
{
    skip_empty_tiles<P0, PW, NT>(a, c, mask, bar, [] {});
}

// The persistent kernel's tile scan of its next item (sm90/kernel.cuh) by the 128 producer threads, spread over the
// current item's tiles: a round covers 8 tiles (512 indices, 4 a thread); load() fetches a round's indices before the
// producers wait for a free buffer, use() marks the round's non-empty tiles in mask after the wait (scan_tiles' rule:
// a tile runs when one of its rows is valid and within the top-k length; tiles past kMaskTiles always run). The
// caller zeroes mask first and, once done(), meets the other producer threads before use_tile_mask.
struct ItemScan {
    const KvSource kv;
    const int32_t *idx;
    int base, L, topk, nm, rounds, tw, lane;
    bool vec;
    uint32_t *mask;
    int r = 0;
    int v[4];

    // live = false: no next item, nothing to scan
    __device__ __forceinline__ ItemScan(const Args &a, const CtaCommon &n, uint32_t *mask_, int tw_, bool live = true)
        : kv(a), idx(n.idx_row), base(n.j0 * kBN), L(n.L), topk(static_cast<int>(a.p.topk)),
          nm(n.nt_all < kMaskTiles ? n.nt_all : kMaskTiles), rounds(live ? (nm + 7) >> 3 : 0), tw(tw_), lane(tw_ & 31),
          vec((reinterpret_cast<uintptr_t>(n.idx_row) & 15u) == 0), mask(mask_)
    {
    }
    __device__ __forceinline__ bool done() const { return r >= rounds; }
    __device__ __forceinline__ void load()
    {
        if (done()) return;
        const int pos = base + 512 * r + 4 * tw;
        if (vec && pos + 4 <= topk) {
            const int4 x = __ldg(reinterpret_cast<const int4 *>(idx + pos));
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
        } else {
            const int last = L > 0 ? L - 1 : 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = L > 0 ? __ldg(idx + (pos + k < last ? pos + k : last)) : -1;
        }
    }
    __device__ __forceinline__ void use()
    {
        if (done()) return;
        const int pos = base + 512 * r + 4 * tw;
        bool any = false;
#pragma unroll
        for (int k = 0; k < 4; ++k) any = any || (pos + k < L && kv.valid(v[k]));
        const uint32_t bal = __ballot_sync(0xffffffffu, any);
        const int t = 8 * r + (tw >> 4);  // 16 threads a tile
        if ((lane & 15) == 0 && t < nm && ((bal >> (lane & 16)) & 0xffffu) != 0u) atomicOr(mask + (t >> 5), 1u << (t & 31));
        ++r;
    }
    // the rounds left, back to back (item 0's scan; an item with fewer tiles than the next one's rounds)
    __device__ __forceinline__ void finish()
    {
        while (!done()) {
            load();
            use();
        }
    }
};

// Who produces: the PW warps from thread P0 on (the wide kernel: WG2, 4 warps from thread 256; the
// narrow one, sm90/narrow_kernel.cuh: WG1 and WG2, 8 warps from thread 128). Each warp owns 64 / PW
// rows of every tile. They read only the kernels' common CTA fields (CtaCommon, sm90/plan.cuh).
//
// bf16 rows. Lanes 8s..8s+7 of producer warp pw copy row r_i = (64 / PW) pw + 4 i + s of each tile:
// lane chunk cl = lane & 7 of each of the 9 column blocks, so a lane's 9 cp.async share one swizzled
// offset (block c8 at +c8 * kBlk in smem, +c8 * 128 B in the row). Each lane finds its own rows'
// addresses (indices fetched a tile ahead): no per-row work is serialised across the warp.
// speculate(): the wide kernel issues the slice's tile 0 into buffer 0 before its tile scan (a causal
// row's tile 0 always runs, and almost every row's does), so the scan's round trip overlaps the first
// copies; run(true) then keeps them when the scan marked tile 0, else lets them land and reloads.
// TILE_FLAG (the wide kernel with kSpecSoftmax, plan.cuh): warp pw also sets byte pw of the buffer's
// Smem::full_tile word to whether all its rows of the tile are valid (set_full_rows, plan.cuh; its consumers
// skip the mask then).
template <int ABL, int P0 = 256, int PW = 4, bool TILE_FLAG = false>
struct Bf16Producer : ProducerLane {
    static_assert(!TILE_FLAG || (P0 == 256 && PW == 4), "the tile flag is the wide kernel's: four producer warps");
    static constexpr bool kNoLoad = (ABL & 1) != 0;
    static constexpr int kRows = kBN / PW, kNi = kRows / 4;  // rows per warp, 4-row steps
    static_assert(kRows % 4 == 0, "4 rows per warp step");
    const CtaCommon &c;

    __device__ __forceinline__ Bf16Producer(const Args &a_, const CtaCommon &cta)
        : ProducerLane(a_, cta.tid - P0, cta.lane), c(cta)
    {
    }

    // Row r_i of a tile (this lane's i-th).
    __device__ __forceinline__ int row_of(int i) const { return kRows * pw + 4 * i + sub; }

    // The indices of this lane's rows of slice tile t (nt_all: none, all -1).
    __device__ __forceinline__ void fetch_idx(int t, int (&v)[kNi]) const
    {
#pragma unroll
        for (int i = 0; i < kNi; ++i) v[i] = tile_row_index(c, t, row_of(i));
    }

    // The rows of indices idx into K buffer b, one cp.async group, and their row flags.
    __device__ __forceinline__ void issue(int b, const int (&idx)[kNi]) const
    {
        const uint32_t kb = c.sK + b * kTileBytes;
        bool all_ok = true;
#pragma unroll
        for (int i = 0; i < kNi; ++i) {
            const int r = row_of(i);
            const bool ok = kv.valid(idx[i]);  // -1 past L
            all_ok = all_ok && ok;
            const uint8_t *src = kv.row(idx[i], ok) + cl * 16;
            const int nb = (ok && !kNoLoad) ? 16 : 0;
            const uint32_t dst = chunk_dst(kb, r);
#pragma unroll
            for (int c8 = 0; c8 < 9; ++c8) copy16(dst + c8 * kBlk, src + c8 * 128, nb);
            if (cl == 0) c.sValid[b * kBN + r] = ok ? 1 : 0;
        }
        if constexpr (TILE_FLAG) {
            const bool full = __all_sync(0xffffffffu, all_ok);
            if (c.lane == 0) set_full_rows(c.smem, b, pw, full);
        }
        cp_async_commit();
    }

    // Slice tile 0 into buffer 0, before the scan (the slice has a tile).
    __device__ __forceinline__ void speculate() const
    {
        int idx[kNi];
        fetch_idx(0, idx);
        issue(0, idx);
    }

    // Every tile that runs, through the two buffers; speculated: speculate() ran.
    __device__ __forceinline__ void run(bool speculated) const { loop<false>(speculated, 0); }
    // The same for one item of a persistent CTA: g0, the buffers' uses so far (the ring runs on across items);
    // scan: the next item's tile scan, a round per tile (ItemScan: its loads before the wait for a free buffer).
    template <class Scan>
    __device__ __forceinline__ void run_ring(int g0, Scan &scan) const { loop<true>(false, g0, scan); }

  private:
    struct NoScan {
        __device__ __forceinline__ void load() {}
        __device__ __forceinline__ void use() {}
    };
    // RING = false keeps the single-item loop's code as it was measured (with g0 + it the compiler
    // schedules it differently), so the default build stays the validated SASS.
    template <bool RING, class Scan = NoScan>
    __device__ __forceinline__ void loop(bool speculated, int g0, Scan &&scan = Scan{}) const
    {
        int idx_cur[kNi], idx_nxt[kNi];
        int t_nxt = c.next_tile(0);
        const bool have0 = speculated && c.nt > 0 && t_nxt == 0;
        if (speculated && !have0) cp_async_wait_all();  // a wasted guess lands before buffer 0 is rewritten
        fetch_idx(t_nxt, idx_cur);
        for (int it = 0; it < c.nt; ++it) {
            const int gi = RING ? g0 + it : it;
            const int b = gi & 1, use = gi >> 1;
            trace(a, gi, 0);
            t_nxt = c.next_tile(t_nxt + 1);
            fetch_idx(t_nxt, idx_nxt);
            scan.load();
            if (use > 0) mbar_wait(c.bar_empty + 8 * b, (use - 1) & 1);
            scan.use();
            trace(a, gi, 1);
            if (it > 0 || !have0) issue(b, idx_cur);
            trace(a, gi, 2);
#pragma unroll
            for (int i = 0; i < kNi; ++i) idx_cur[i] = idx_nxt[i];
            cp_async_wait_all();
            trace(a, gi, 3);
            fence_async_smem();
            mbar_arrive(c.bar_full + 8 * b);
        }
    }
};

// One batch of a warp: 4 rows (r = pw + PW * (4 * batch + k)); lane l holds latent
// values 16l..16l+15 (scale tile l/8) and bytes 4l..4l+3 of the row's k_pe.
struct Fp8Batch {
    uint4 e[4];
    float s[4];
    uint32_t rope[4];
    bool ok[4];
};

// fp8_ds_mla rows: batches of 4 rows per warp, 64 / (4 PW) batches per tile (half with XO); batch q+1
// is loaded while q is stored. Row m of a warp's tile is row pw + PW m. Per tile, lane m < 64 / PW turns its row's
// index into the entry address (ptr) and validity bit (okm, a ballot), one tile ahead; the indices
// themselves are loaded two tiles ahead. No address arithmetic is serialised across the warp: a
// batch's row gets its address by two shuffles. (A bulk L2 prefetch of the entries a tile ahead was
// measured: no gain; in the narrow kernel, line prefetches two and four tiles ahead: slower, the more the
// farther; benchmarks/README.md, issue 17, tenth and twenty-fourth sessions.)
// SPREAD: in every quarter warp, lanes 4..7 store their odd latent chunk first, so that each 16-byte store
// of a quarter warp hits eight distinct slots of the swizzled rows (one shared-memory wavefront, not two).
// Measured (benchmarks/README.md, issue 17, tenth session): h = 64 decode (the wide kernel without the
// crossover) 9% faster, the narrow kernel and the crossover slightly slower; so only the former sets it.
template <int ABL, bool XO, int P0 = 256, int PW = 4, bool SPREAD = false>
struct Fp8Producer {
    static constexpr bool kNoLoad = (ABL & 1) != 0, kNoDq = (ABL & 8) != 0;
    static constexpr int kRows = kBN / PW;                      // rows of a tile per warp
    static constexpr int kNbq = (XO ? kRows / 2 : kRows) / 4;   // batches per tile per warp
    static constexpr uint32_t kRemoteBytes = 32 * (2 * kDqk + 4);  // per tile from the peer: rows + valid flags
    static_assert(kNbq >= 2 && kNbq % 2 == 0, "run() pairs batches");
    static_assert(!XO || PW == 4, "the crossover is written for one producer warpgroup");

    const CtaCommon &c;
    const KvSource kv;
    const int lane, pw;
    const int bq0;              // XO: this CTA's rows 32 * rank ..
    const uint32_t peer_base;   // XO: the peer's address of our smem base
    const int nq;               // batches of this warp
    const uint8_t *ptr_cur, *ptr_nxt;  // lane m < kRows: the entry of row m of the current / next tile
    uint32_t okm_cur, okm_nxt;         // their validity bits
    int idx_nn;                        // lane m < kRows: the index of row m two tiles ahead

    __device__ __forceinline__ Fp8Producer(const Args &a, const CtaCommon &cta, uint32_t peer, uint32_t peer_base_)
        : c(cta), kv(a), lane(cta.lane), pw((cta.tid - P0) >> 5), bq0(XO ? kNbq * static_cast<int>(peer ^ 1u) : 0),
          peer_base(peer_base_), nq(cta.nt * kNbq)
    {
    }

    __device__ __forceinline__ int fetch_idx(int it) const
    {
        if (it >= c.nt || lane >= kRows) return -1;
        const int pos = (c.j0 + it) * kBN + pw + PW * lane;
        return pos < c.L ? __ldg(c.idx_row + pos) : -1;
    }
    __device__ __forceinline__ void locate(int idx, const uint8_t *&ptr, uint32_t &okm) const
    {
        const bool ok = kv.valid(idx);
        ptr = kv.row(idx, ok);
        okm = __ballot_sync(0xffffffffu, ok);
    }

    // Batch q into registers (called with q = 0, 1, 2, ... in order).
    __device__ __forceinline__ void load(Fp8Batch &B, int q)
    {
        const int it = q / kNbq, bq = bq0 + q % kNbq;
        if (q % kNbq == 0 && it > 0) {
            ptr_cur = ptr_nxt;
            okm_cur = okm_nxt;
            locate(idx_nn, ptr_nxt, okm_nxt);
            idx_nn = fetch_idx(it + 2);
        }
        const uint64_t pc = reinterpret_cast<uint64_t>(ptr_cur);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int m = 4 * bq + k;
            const uint32_t lo = __shfl_sync(0xffffffffu, static_cast<uint32_t>(pc), m);
            const uint32_t hi = __shfl_sync(0xffffffffu, static_cast<uint32_t>(pc >> 32), m);
            const uint8_t *src = reinterpret_cast<const uint8_t *>((static_cast<uint64_t>(hi) << 32) | lo);
            B.ok[k] = (okm_cur >> m) & 1u;
            if constexpr (kNoLoad) {
                B.e[k] = make_uint4(0, 0, 0, 0);
                B.s[k] = 0.f;
                B.rope[k] = 0u;
            } else if (B.ok[k]) {
                B.e[k] = ldg_nc_v4(src + 16 * lane);
                B.s[k] = ldg_nc_f32(src + SMLA_FP8_SCALE_OFF + 4 * (lane >> 3));
                B.rope[k] = ldg_nc_u32(src + SMLA_FP8_ROPE_OFF + 4 * lane);
            }
        }
    }

    // Batch q, dequantised, into K buffer (q / kNbq) & 1 (XO: also into the peer's).
    __device__ __forceinline__ void store(const Fp8Batch &B, int q) const
    {
        const int it = q / kNbq, bq = bq0 + q % kNbq, b = it & 1;
        const uint32_t kb = c.sK + b * kTileBytes;
        const uint32_t rbar = peer_base + (c.bar_rr + 8 * b - c.base);  // the peer's rr[b]
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int r = pw + PW * (4 * bq + k);
            const uint4 z = make_uint4(0, 0, 0, 0);
            // chunk 2 lane + c0 first, then 2 lane + (c0 ^ 1): lane l's chunks sit in slot (2l & 7) ^ (r & 7)
            // and the next, so with even chunks first lanes l and l + 4 of a quarter warp share a slot
            const int c0 = (SPREAD && (lane & 4)) ? 1 : 0;
            const uint4 e = B.e[k];
            const uint2 e0 = c0 ? make_uint2(e.z, e.w) : make_uint2(e.x, e.y);
            const uint2 e1 = c0 ? make_uint2(e.x, e.y) : make_uint2(e.z, e.w);
            uint4 v0, v1;
            if constexpr (kNoDq) {
                v0 = v1 = B.ok[k] ? e : z;
            } else {
                v0 = B.ok[k] ? dequant8(e0, B.s[k]) : z;
                v1 = B.ok[k] ? dequant8(e1, B.s[k]) : z;
            }
            const uint32_t a0 = blk_addr(kb, r, 2 * lane + c0), a1 = blk_addr(kb, r, 2 * lane + (c0 ^ 1));
            const uint32_t ar = blk_addr(kb, r, kNopeChunks + (lane >> 2)) + 4 * (lane & 3);
            const uint32_t rope = B.ok[k] ? B.rope[k] : 0u;
            st_shared_v4(a0, v0);
            st_shared_v4(a1, v1);
            st_shared_u32(ar, rope);
            if (lane == 0) c.sValid[b * kBN + r] = B.ok[k] ? 1 : 0;
            if constexpr (XO) {
                st_async_v4(peer_base + (a0 - c.base), v0, rbar);
                st_async_v4(peer_base + (a1 - c.base), v1, rbar);
                st_async_u32(peer_base + (ar - c.base), rope, rbar);
                if (lane == 0)
                    st_async_u32(peer_base + static_cast<uint32_t>(Smem::valid.off + 4 * (b * kBN + r)),
                                 B.ok[k] ? 1u : 0u, rbar);
            }
        }
    }

    // Batch q with its hand-off: wait for the buffer to be free before a tile's first batch, signal
    // it full after its last.
    __device__ __forceinline__ void stage(const Fp8Batch &B, int q) const
    {
        const int it = q / kNbq, b = it & 1, use = it >> 1;
        const bool first = q % kNbq == 0, last = q % kNbq == kNbq - 1;
        if (first && use > 0) {
            // XO: the peer's consumers are done with its buffer b too (their arrivals count here). A
            // CTA-scope acquire: what follows reads nothing the peers wrote (an acquire.cluster would
            // invalidate L1 on every tile, CCTL.IVALL), and the writes that follow cannot overtake
            // reads that completed before the arrivals (ConsumerBase::release).
            mbar_wait(c.bar_empty + 8 * b, (use - 1) & 1);
        }
        // XO: our rr[b] expects the peer's half of this tile (its phase for tile it - 2 is over:
        // our consumers waited for it before releasing buffer b)
        if (XO && first && c.tid == P0) mbar_arrive_expect_tx(c.bar_rr + 8 * b, kRemoteBytes);
        store(B, q);
        if (last) {
            fence_async_smem();
            mbar_arrive(c.bar_full + 8 * b);
        }
    }

    __device__ __forceinline__ void run()
    {
        locate(fetch_idx(0), ptr_cur, okm_cur);
        locate(fetch_idx(1), ptr_nxt, okm_nxt);
        idx_nn = fetch_idx(2);
        Fp8Batch A, Bn;
        if (nq > 0) load(A, 0);
#pragma unroll 1
        for (int q = 0; q < nq; q += 2) {
            load(Bn, q + 1);  // nq is even: q + 1 < nq
            stage(A, q);
            if (q + 2 < nq) load(A, q + 2);
            stage(Bn, q + 1);
        }
    }
};

}  // namespace sm90
}  // namespace attn
