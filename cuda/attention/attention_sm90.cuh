// Hopper (sm_90a) sparse MLA kernel for head tiles of 64: warp-specialised, wgmma tensor cores.
//
// CTA = one query row x 64 heads x one top-k split, 384 threads:
//   WG0, WG1 (consumers, setmaxnreg 192): for each 64-token K tile both compute S = Q K^T for their
//     own 32 tokens (wgmma m64n32k16 x 36 as 3 chains of 12 summed in fp32, for accuracy; Q and K
//     from smem), exchange row maxima (named barrier),
//     write P = exp2(S - m) as two bf16 terms P_hi + P_lo (split_bf16x2; P_hi into the tile's dead
//     RoPE block, P_lo into a block of its own), and then each accumulates its half of the output,
//     O[:, 256*wg : 256*wg + 256] += P_hi V + P_lo V (wgmma m64n256k16 x 8, V = K[:, :512] read
//     N-major from smem), in 128 fp32 registers per thread. (A bf16 P alone rounds probabilities by
//     up to 2^-9 relative: ~1e-2 absolute output error when |V| ~ 10, outside docs/design.md's tolerances.)
//   WG2 (producer, setmaxnreg 120; 2 x 192 + 120 = 3 x 168, the launch allocation): fills the two K
//     buffers. bf16 rows: 16-byte cp.async (zero fill for invalid rows), 8 lanes per row, each lane
//     finding its own rows' addresses. fp8_ds_mla rows: 16-byte loads into registers (two 4-row
//     batches in flight per warp; row addresses found a tile ahead, one lane per row) and the exact
//     dequant bf16_rne(float(e4m3) * scale) into smem. With two head tiles (h > 64) the fp8 CTAs run
//     as clusters of 2 that each dequantise half of every tile for both (crossover, attn_sm90_body).
//     Buffer hand-off through mbarriers (full: producer -> consumers, empty: consumers -> producer).
// Where the time goes (H200, tools/ablate.py, benchmarks/README.md): the consumers' chain S -> softmax
// -> P V is serial and the two warpgroups run it in lockstep, so tensor-core time and the rest add up.
// Shared memory (1024-byte aligned, 128-byte swizzle, the layout wgmma descriptors describe): Q and
// each K buffer are 9 column blocks of [64 rows x 128 B]; element chunk c (8 values) of row r lives
// at block c/8, byte r*128 + ((c%8) ^ (r%8))*16. Total ~227 KB: 1 CTA per SM.
// Row sums are kept in double and lse / max_logits are formed in double (see the portable kernel);
// overflowed scores saturate as there (sat_needed / sat_score, attention_core.cuh).
// Semantics, outputs and the split-top-k partials are those of the portable kernel
// (attention_core.cuh); it is used for h > 32 on sm_90 devices when the sm_90a body was compiled.
#pragma once

#include "attention_core.cuh"

namespace {
namespace attn {
namespace sm90 {

constexpr int kThreads = 384;
constexpr int kBlk = 64 * 128;                 // one column block: 64 rows x 128 B
constexpr int kTileBytes = 9 * kBlk;           // 73,728 B: Q or one K buffer
static_assert(kDqk == 36 * 16, "the S phase below is written for 3 chains of 12 k-steps");
constexpr int kQ_OFF = 0;
constexpr int kK_OFF = kTileBytes;             // two K buffers
constexpr int kPLO_OFF = 3 * kTileBytes;       // P_lo [64 heads x 64 tokens] bf16: one column block
constexpr int kBAR_OFF = kPLO_OFF + kBlk;      // 4 mbarriers: full[2], empty[2]
constexpr int kVALID_OFF = kBAR_OFF + 64;      // int [2][64]
constexpr int kMAX_OFF = kVALID_OFF + 2 * 64 * 4;  // float [2][64] row maxima per consumer WG
// double [2][64] row sums per consumer WG, written in the epilogue over the row maxima (last read
// before the last tile's kBarP) and the 512 bytes after them
constexpr int kL_OFF = kMAX_OFF;
constexpr int kSMEM_USED = kMAX_OFF + 2 * 64 * 8;
constexpr int kSMEM = kSMEM_USED + 1024;       // slack to align the base to 1024 B
static_assert(kSMEM <= 227 * 1024, "sm_90 opt-in shared memory per block");
constexpr int kConsumerRegs = 192;
constexpr int kProducerRegs = 120;
constexpr int kBarMax = 1, kBarP = 2, kBarL = 3, kBarQ = 4;  // named barriers of the 256 consumer threads

__device__ __forceinline__ uint32_t blk_addr(uint32_t base, int row, int chunk)
{
    return base + static_cast<uint32_t>((chunk >> 3) * kBlk + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- sm_90a PTX wrappers ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// Cluster (crossover) helpers: the peer CTA's address of a local shared address, stores into the peer's
// shared memory that complete bytes on its mbarrier, arrivals on the peer's mbarrier, cluster barrier.
__device__ __forceinline__ uint32_t cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t mapa(uint32_t addr, uint32_t rank)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void st_async_v4(uint32_t addr, uint4 v, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
                 "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void st_async_u32(uint32_t addr, uint32_t v, uint32_t bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr), "r"(v),
                 "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar)  // bar: a shared::cluster address
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Wait with cluster-scope acquire: orders what follows after the peer's released arrivals / stores.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void named_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Keeps the compiler from moving reads / writes of wgmma accumulators across the async region.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
           (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

// S[64 x 32] (+)= A[64 x 16] B[32 x 16]^T, both K-major in smem.
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(accumulate));
}

#define SMLA_F8(b)                                                                                           \
    "+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]),         \
        "+f"(d[b + 6]), "+f"(d[b + 7])

// O[64 x 256] += A[64 x 16] (K-major) B[16 x 256] (N-major), both in smem.
__device__ __forceinline__ void wgmma_n256_tb(float (&d)[128], uint64_t da, uint64_t db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "
        "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "
        "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
        "%122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16), SMLA_F8(24), SMLA_F8(32), SMLA_F8(40), SMLA_F8(48), SMLA_F8(56),
          SMLA_F8(64), SMLA_F8(72), SMLA_F8(80), SMLA_F8(88), SMLA_F8(96), SMLA_F8(104), SMLA_F8(112), SMLA_F8(120)
        : "l"(da), "l"(db), "r"(1));
}
#undef SMLA_F8

__device__ __forceinline__ uint2 ldg_nc_v2(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ldg_nc_v4(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ldg_nc_u32(const uint8_t *p)
{
    uint32_t v;
    asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ float ldg_nc_f32(const uint8_t *p)
{
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
    return v;
}

// One warp's share of an fp8 tile: 4 rows (r = warp + 4 * (4 * batch + k)); lane l holds latent
// values 16l..16l+15 (scale tile l/8) and bytes 4l..4l+3 of the row's k_pe.
struct Fp8Batch {
    uint4 e[4];
    float s[4];
    uint32_t rope[4];
    bool ok[4];
};
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ABL != 0 only in profiling builds (SMLA_ATTN_ABLATION, tools/ablate.py): leave one stage out to time
// it by difference. Bits: 1 no global K loads (zeros), 2 no S = Q K^T wgmma, 4 no P V wgmma,
// 8 no fp8 dequant (raw bytes stored), 16 no P_lo V wgmma (bf16 P only). Results are wrong then.
// XO ("crossover", FlashMLA's two-CTA dequant split; fp8 with two head tiles): the two CTAs of a
// cluster are the two head tiles of one (query row, split) and read the same K rows; each loads and
// dequantises half of every tile (rows 32 * rank .. + 31) and stores it into its own K buffer and, with
// st.async, into the peer's, whose remote-ready barrier (rr) counts the bytes. The empty barriers count
// one arrival per consumer warp of both CTAs.
template <bool FP8, int ABL, bool XO>
__device__ __forceinline__ void attn_sm90_body(const Args &a)
{
    static_assert(FP8 || !XO, "the crossover is written for the fp8 producer");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr bool kNoLoad = (ABL & 1) != 0, kNoS = (ABL & 2) != 0, kNoPV = (ABL & 4) != 0;
    constexpr bool kNoDq = (ABL & 8) != 0, kNoLo = (ABL & 16) != 0;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw_base = smem_u32(smem_raw);
    const uint32_t base = (raw_base + 1023u) & ~1023u;
    uint8_t *smem = smem_raw + (base - raw_base);
    const smla_attn_params &p = a.p;

    const int tid = threadIdx.x;
    const int lane = tid & 31;

    int64_t bx = blockIdx.x;
    int sp, ht;
    int64_t row;
    if constexpr (XO) {  // blockIdx.x = (row * n_splits + split) * 2 + head tile; head tile = cluster rank
        ht = static_cast<int>(bx & 1);
        bx >>= 1;
        sp = static_cast<int>(bx % a.n_splits);
        row = bx / a.n_splits;
    } else {
        sp = static_cast<int>(bx % a.n_splits);
        bx /= a.n_splits;
        ht = static_cast<int>(bx % a.n_ht);
        row = bx / a.n_ht;
    }
    const int64_t bi = row / p.s_q, si = row % p.s_q;
    const int h = static_cast<int>(p.h);
    const int h0 = ht * 64;
    const RowSlice slice = row_slice(a, bi, si, sp, 64);
    const int32_t *idx_row = slice.idx;
    const int L = slice.L, j0 = slice.j0;
    const int nt = slice.j1 > j0 ? slice.j1 - j0 : 0;

    const uint32_t sQ = base + kQ_OFF;
    const uint32_t sK = base + kK_OFF;
    const uint32_t sPlo = base + kPLO_OFF;
    const uint32_t bar_full = base + kBAR_OFF, bar_empty = base + kBAR_OFF + 16, bar_rr = base + kBAR_OFF + 32;
    int *sValid = reinterpret_cast<int *>(smem + kVALID_OFF);
    float *sMax = reinterpret_cast<float *>(smem + kMAX_OFF);
    double *sL = reinterpret_cast<double *>(smem + kL_OFF);

    // ---- prologue: barriers (all 384 threads); the Q tile is issued by the consumers, which wait for
    // it on their own (kBarQ) while the producer already fetches indices and K rows ----
    if (tid == 0) {
        mbar_init(bar_full, 128);
        mbar_init(bar_full + 8, 128);
        mbar_init(bar_empty, XO ? 16 : 256);
        mbar_init(bar_empty + 8, XO ? 16 : 256);
        if constexpr (XO) {
            mbar_init(bar_rr, 1);
            mbar_init(bar_rr + 8, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (nt > 0 && tid < 256) {
        const uint16_t *qb = p.q + bi * p.q_stride_b + si * p.q_stride_s;
        for (int i = tid; i < 64 * kRowChunks; i += 256) {
            const int r = i / kRowChunks, c = i - r * kRowChunks;
            const bool ok = h0 + r < h;
            const uint16_t *src = ok ? qb + static_cast<int64_t>(h0 + r) * p.q_stride_h + c * 8 : qb;
            cp_async16(blk_addr(sQ, r, c), src, ok ? 16 : 0);
        }
        cp_async_commit();
    }
    if constexpr (XO) cluster_sync();  // both CTAs' barriers initialised
    else __syncthreads();              // barriers initialised
    const uint32_t peer = XO ? (cluster_rank() ^ 1u) : 0u;
    const uint32_t peer_base = XO ? mapa(base, peer) : 0u;  // the peer's address of our `base`

    const uint8_t *kv_base = static_cast<const uint8_t *>(p.kv.data);
    const uint32_t block_size = static_cast<uint32_t>(p.kv.block_size);
    const int64_t limit = a.limit;

    if (tid >= 256) {
        // =========================== producer ===========================
        setmaxnreg_dec<kProducerRegs>();
        const int pw = (tid - 256) >> 5;  // rows pw, pw + 4, ..., pw + 60
        auto row_src = [&](int idx, bool ok) -> const uint8_t * {
            if (!ok) return kv_base;
            const uint32_t u = static_cast<uint32_t>(idx);
            const uint32_t blk = u / block_size, off = u - blk * block_size;
            return kv_base + static_cast<int64_t>(blk) * p.kv.block_stride + static_cast<int64_t>(off) * p.kv.entry_stride;
        };
        if constexpr (!FP8) {
            // Lanes 8s..8s+7 copy row r_i = 16 pw + 4 i + s (i = 0..3) of each tile: lane chunk cl = lane & 7
            // of each of the 9 column blocks, so a lane's 9 cp.async share one swizzled offset (block c8
            // at +c8 * kBlk in smem, +c8 * 128 B in the row). Each lane finds its own 4 rows' addresses
            // (indices fetched a tile ahead): no per-row work is serialised across the warp.
            const uint64_t pol = a.evict_last ? policy_evict_last() : 0;
            const int sub = lane >> 3, cl = lane & 7;
            auto fetch_idx = [&](int it, int (&v)[4]) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int pos = (j0 + it) * 64 + 16 * pw + 4 * i + sub;
                    v[i] = (it < nt && pos < L) ? __ldg(idx_row + pos) : -1;
                }
            };
            int idx_cur[4], idx_nxt[4];
            fetch_idx(0, idx_cur);
            for (int it = 0; it < nt; ++it) {
                const int b = it & 1, use = it >> 1;
                fetch_idx(it + 1, idx_nxt);
                if (use > 0) mbar_wait(bar_empty + 8 * b, (use - 1) & 1);
                const uint32_t kb = sK + b * kTileBytes;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = 16 * pw + 4 * i + sub;
                    const int idx = idx_cur[i];
                    const bool ok = idx >= 0 && static_cast<int64_t>(idx) < limit;  // -1 past L
                    const uint8_t *src = row_src(idx, ok) + cl * 16;
                    const int nb = (ok && !kNoLoad) ? 16 : 0;
                    const uint32_t dst = kb + r * 128 + ((cl ^ (r & 7)) << 4);
#pragma unroll
                    for (int c8 = 0; c8 < 9; ++c8) {
                        if (a.evict_last) cp_async16_hint(dst + c8 * kBlk, src + c8 * 128, nb, pol);
                        else cp_async16(dst + c8 * kBlk, src + c8 * 128, nb);
                    }
                    if (cl == 0) sValid[b * 64 + r] = ok ? 1 : 0;
                }
                cp_async_commit();
#pragma unroll
                for (int i = 0; i < 4; ++i) idx_cur[i] = idx_nxt[i];
                cp_async_wait_all();
                fence_async_smem();
                mbar_arrive(bar_full + 8 * b);
            }
        } else {
            // batches of 4 rows per warp, 4 batches per tile; batch q+1 is loaded while q is stored.
            // Row m of a warp's tile is row pw + 4m. Per tile, lane m < 16 turns its row's index into
            // the entry address (ptr) and validity bit (okm, a ballot), one tile ahead; the indices
            // themselves are loaded two tiles ahead. No address arithmetic is serialised across the
            // warp: a batch's row gets its address by two shuffles. (A bulk L2 prefetch of the entries
            // a tile ahead was measured: no gain; benchmarks/README.md.)
            constexpr int kNbq = XO ? 2 : 4;                     // batches per tile per warp
            const int bq0 = XO ? 2 * static_cast<int>(peer ^ 1u) : 0;  // XO: this CTA's rows 32 * rank ..
            constexpr uint32_t kRemoteBytes = 32 * (2 * kDqk + 4);  // per tile from the peer: rows + valid flags
            const int nq = nt * kNbq;
            auto fetch_idx = [&](int it) -> int {
                if (it >= nt || lane >= 16) return -1;
                const int pos = (j0 + it) * 64 + pw + 4 * lane;
                return pos < L ? __ldg(idx_row + pos) : -1;
            };
            auto locate = [&](int idx, const uint8_t *&ptr, uint32_t &okm) {
                const bool ok = idx >= 0 && static_cast<int64_t>(idx) < limit;
                ptr = row_src(idx, ok);
                okm = __ballot_sync(0xffffffffu, ok);
            };
            const uint8_t *ptr_cur, *ptr_nxt;
            uint32_t okm_cur, okm_nxt;
            locate(fetch_idx(0), ptr_cur, okm_cur);
            locate(fetch_idx(1), ptr_nxt, okm_nxt);
            int idx_nn = fetch_idx(2);
            auto load = [&](Fp8Batch &B, int q) {  // called with q = 0, 1, 2, ... in order
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
            };
            auto store = [&](const Fp8Batch &B, int q) {
                const int it = q / kNbq, bq = bq0 + q % kNbq, b = it & 1;
                const uint32_t kb = sK + b * kTileBytes;
                const uint32_t rbar = peer_base + (bar_rr + 8 * b - base);  // the peer's rr[b]
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int r = pw + 4 * (4 * bq + k);
                    const uint4 z = make_uint4(0, 0, 0, 0);
                    uint4 v0, v1;
                    if constexpr (kNoDq) {
                        v0 = v1 = B.ok[k] ? B.e[k] : z;
                    } else {
                        v0 = B.ok[k] ? dequant8(make_uint2(B.e[k].x, B.e[k].y), B.s[k]) : z;
                        v1 = B.ok[k] ? dequant8(make_uint2(B.e[k].z, B.e[k].w), B.s[k]) : z;
                    }
                    const uint32_t a0 = blk_addr(kb, r, 2 * lane), a1 = blk_addr(kb, r, 2 * lane + 1);
                    const uint32_t ar = blk_addr(kb, r, 64 + (lane >> 2)) + 4 * (lane & 3);
                    const uint32_t rope = B.ok[k] ? B.rope[k] : 0u;
                    st_shared_v4(a0, v0);
                    st_shared_v4(a1, v1);
                    st_shared_u32(ar, rope);
                    if (lane == 0) sValid[b * 64 + r] = B.ok[k] ? 1 : 0;
                    if constexpr (XO) {
                        st_async_v4(peer_base + (a0 - base), v0, rbar);
                        st_async_v4(peer_base + (a1 - base), v1, rbar);
                        st_async_u32(peer_base + (ar - base), rope, rbar);
                        if (lane == 0)
                            st_async_u32(peer_base + static_cast<uint32_t>(kVALID_OFF + 4 * (b * 64 + r)),
                                         B.ok[k] ? 1u : 0u, rbar);
                    }
                }
            };
            auto stage = [&](const Fp8Batch &B, int q) {
                const int it = q / kNbq, b = it & 1, use = it >> 1;
                const bool first = q % kNbq == 0, last = q % kNbq == kNbq - 1;
                if (first && use > 0) {
                    // XO: the peer's consumers are done with its buffer b too (their arrivals count here)
                    if constexpr (XO) mbar_wait_cluster(bar_empty + 8 * b, (use - 1) & 1);
                    else mbar_wait(bar_empty + 8 * b, (use - 1) & 1);
                }
                // XO: our rr[b] expects the peer's half of this tile (its phase for tile it - 2 is over:
                // our consumers waited for it before releasing buffer b)
                if (XO && first && tid == 256) mbar_arrive_expect_tx(bar_rr + 8 * b, kRemoteBytes);
                store(B, q);
                if (last) {
                    fence_async_smem();
                    mbar_arrive(bar_full + 8 * b);
                }
            };
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
        return;
    }

    // =========================== consumers ===========================
    setmaxnreg_inc<kConsumerRegs>();
    cp_async_wait_all();  // this thread's part of Q
    fence_async_smem();
    named_sync(kBarQ, 256);  // all of Q landed (and visible to wgmma)
    const int wg = tid >> 7;           // 0 or 1
    const int w = (tid >> 5) & 3;      // warp within the warpgroup: rows 16w..16w+15
    const int g = lane >> 2, t4 = lane & 3;
    const int r0 = 16 * w + g;         // this thread's rows r0, r0 + 8

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY};
    double l_r[2] = {0.0, 0.0};  // row sums in double (see the portable kernel)

    for (int it = 0; it < nt; ++it) {
        const int b = it & 1, use = it >> 1;
        const uint32_t kb = sK + b * kTileBytes;
        mbar_wait(bar_full + 8 * b, use & 1);
        if constexpr (XO) {
            mbar_wait(bar_rr + 8 * b, use & 1);  // the peer's half of the tile
            fence_async_smem();
        }

        // S[64 heads x 32 tokens] for tokens 32*wg .. 32*wg + 31. Accuracy: one 36-step tensor-core
        // chain over 576 dims loses up to ~1e-6 (natural-log units) on a logit, at docs/design.md's lse /
        // max_logits tolerance; so the 576 dims are 3 chains of 192 (12 wgmma steps each), summed
        // in fp32 with round-to-nearest: the first into s, the others into t while s is ready.
        float s[16], t[16];
        auto s_chain = [&](float (&d)[16], int c) {
            wg_fence();  // d was read since its last wgmma
#pragma unroll
            for (int kk = 12 * c; kk < 12 * c + 12; ++kk) {
                const uint32_t qa = sQ + (kk >> 2) * kBlk + (kk & 3) * 32;
                const uint32_t ka = kb + (kk >> 2) * kBlk + (32 * wg) * 128 + (kk & 3) * 32;
                wgmma_n32(d, desc(qa, 16, 1024), desc(ka, 16, 1024), kk > 12 * c);
            }
            wg_commit();
        };
        if constexpr (kNoS) {
#pragma unroll
            for (int i = 0; i < 16; ++i) s[i] = 0.f;
        } else {
            s_chain(s, 0);
            s_chain(t, 1);
            wg_wait0();
            fence_regs(s);
            fence_regs(t);
#pragma unroll
            for (int i = 0; i < 16; ++i) s[i] += t[i];
            s_chain(t, 2);
            wg_wait0();
            fence_regs(t);
#pragma unroll
            for (int i = 0; i < 16; ++i) s[i] += t[i];
        }

        // mask, scale (log2 domain), row max over this warpgroup's 32 tokens
        const int *valid = sValid + b * 64;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int jn = 0; jn < 4; ++jn) {
            const int tok = 32 * wg + 8 * jn + 2 * t4;
            const bool ok0 = valid[tok] != 0, ok1 = valid[tok + 1] != 0;
            s[4 * jn + 0] = ok0 ? s[4 * jn + 0] * a.scale_log2 : -INFINITY;
            s[4 * jn + 1] = ok1 ? s[4 * jn + 1] * a.scale_log2 : -INFINITY;
            s[4 * jn + 2] = ok0 ? s[4 * jn + 2] * a.scale_log2 : -INFINITY;
            s[4 * jn + 3] = ok1 ? s[4 * jn + 3] * a.scale_log2 : -INFINITY;
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
        }
        // overflow (rare; attention_core.cuh): saturate this thread's valid scores when its maxima say so
        if (sat_needed(mx[0], m_r[0]) || sat_needed(mx[1], m_r[1])) {
            mx[0] = mx[1] = -INFINITY;
#pragma unroll
            for (int jn = 0; jn < 4; ++jn) {
                const int tok = 32 * wg + 8 * jn + 2 * t4;
                if (valid[tok] != 0) {
                    s[4 * jn + 0] = sat_score(s[4 * jn + 0]);
                    s[4 * jn + 2] = sat_score(s[4 * jn + 2]);
                }
                if (valid[tok + 1] != 0) {
                    s[4 * jn + 1] = sat_score(s[4 * jn + 1]);
                    s[4 * jn + 3] = sat_score(s[4 * jn + 3]);
                }
                mx[0] = fmaxf(mx[0], fmaxf(s[4 * jn + 0], s[4 * jn + 1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[4 * jn + 2], s[4 * jn + 3]));
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
        if (t4 == 0) {
            sMax[wg * 64 + r0] = mx[0];
            sMax[wg * 64 + r0 + 8] = mx[1];
        }
        // both halves' maxima; both warpgroups done reading the RoPE block, and done with the previous
        // tile's P V (so P_lo, one buffer for both K buffers, may be rewritten)
        named_sync(kBarMax, 256);
        float base_[2], alpha[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float tm = fmaxf(sMax[r0 + 8 * i], sMax[64 + r0 + 8 * i]);
            const float mn = fmaxf(m_r[i], tm);
            base_[i] = mn == -INFINITY ? 0.f : mn;
            alpha[i] = ex2(m_r[i] - base_[i]);
            m_r[i] = mn;
        }
        float rs[2] = {0.f, 0.f};
        const uint32_t pblk = kb + 8 * kBlk;  // P[64 heads][64 tokens] in the RoPE block
#pragma unroll
        for (int jn = 0; jn < 4; ++jn) {
            const float p0 = ex2(s[4 * jn + 0] - base_[0]), p1 = ex2(s[4 * jn + 1] - base_[0]);
            const float p2 = ex2(s[4 * jn + 2] - base_[1]), p3 = ex2(s[4 * jn + 3] - base_[1]);
            rs[0] += p0 + p1;
            rs[1] += p2 + p3;
            const int tok = 32 * wg + 8 * jn + 2 * t4;
            uint32_t hi01, lo01, hi23, lo23;
            split_bf16x2(p0, p1, hi01, lo01);
            split_bf16x2(p2, p3, hi23, lo23);
            st_shared_u32(blk_addr(pblk, r0, tok >> 3) + (tok & 7) * 2, hi01);
            st_shared_u32(blk_addr(pblk, r0 + 8, tok >> 3) + (tok & 7) * 2, hi23);
            st_shared_u32(blk_addr(sPlo, r0, tok >> 3) + (tok & 7) * 2, lo01);
            st_shared_u32(blk_addr(sPlo, r0 + 8, tok >> 3) + (tok & 7) * 2, lo23);
        }
        l_r[0] = l_r[0] * static_cast<double>(alpha[0]) + static_cast<double>(rs[0]);
        l_r[1] = l_r[1] * static_cast<double>(alpha[1]) + static_cast<double>(rs[1]);
        fence_async_smem();
        named_sync(kBarP, 256);  // P_hi and P_lo complete (both token halves)

        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // the max moved (rarely, late on)
#pragma unroll
            for (int jn = 0; jn < 32; ++jn) {
                o[4 * jn + 0] *= alpha[0];
                o[4 * jn + 1] *= alpha[0];
                o[4 * jn + 2] *= alpha[1];
                o[4 * jn + 3] *= alpha[1];
            }
        }
        if constexpr (!kNoPV) {
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const uint32_t pa = pblk + kk * 32;
                const uint32_t va = kb + (4 * wg) * kBlk + (16 * kk) * 128;
                const uint64_t dv = desc(va, kBlk, 1024);
                wgmma_n256_tb(o, desc(pa, 16, 1024), dv);
                if constexpr (!kNoLo) wgmma_n256_tb(o, desc(sPlo + kk * 32, 16, 1024), dv);
            }
            wg_commit();
            wg_wait0();
            fence_regs(o);
        }
        if constexpr (XO) {
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(bar_empty + 8 * b);
                mbar_arrive_remote(peer_base + (bar_empty + 8 * b - base));
            }
        } else {
            mbar_arrive(bar_empty + 8 * b);
        }
    }

    // XO: the peer may not leave while our arrivals / stores into its shared memory are in flight, nor
    // we while its are (the producers, which have left, are not waited for: their stores completed
    // before the consumers' last rr wait)
    if constexpr (XO) cluster_sync();

    // ---- epilogue: row sums of both warpgroups, normalise, write columns 256*wg.. ----
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 1);
        l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 2);
    }
    if (t4 == 0) {
        sL[wg * 64 + r0] = l_r[0];
        sL[wg * 64 + r0 + 8] = l_r[1];
    }
    named_sync(kBarL, 256);
    const bool split = a.n_splits > 1;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int rl = r0 + 8 * hf;
        const int hr = h0 + rl;
        if (hr >= h) continue;
        const double l = sL[rl] + sL[64 + rl];
        const float m = m_r[hf];
        const bool none = m == -INFINITY;
        const double lse_d = row_lse(m, l, a.ml_factor);
        float f = none ? 0.f : static_cast<float>(1.0 / l);
        const int col0 = 256 * wg + 2 * t4;
        if (split) {
            const int64_t prow = (static_cast<int64_t>(sp) * a.rows + row) * h + hr;
            if (!none) {
                float *op = a.o_part + prow * kDv + col0;
#pragma unroll
                for (int jn = 0; jn < 32; ++jn)
                    *reinterpret_cast<float2 *>(op + 8 * jn) =
                        make_float2(o[4 * jn + 2 * hf] * f, o[4 * jn + 2 * hf + 1] * f);
            }
            if (wg == 0 && t4 == 0) a.lse_part[prow] = part_lse(m, l, lse_d);
        } else {
            const float lse = static_cast<float>(lse_d);
            if (p.attn_sink && !none) f *= static_cast<float>(sink_factor(p.attn_sink[hr * p.sink_stride], lse_d));
            uint16_t *op = p.out + bi * p.out_stride_b + si * p.out_stride_s + hr * p.out_stride_h + col0;
#pragma unroll
            for (int jn = 0; jn < 32; ++jn)
                *reinterpret_cast<uint32_t *>(op + 8 * jn) =
                    pack_bf16x2(o[4 * jn + 2 * hf] * f, o[4 * jn + 2 * hf + 1] * f);
            if (wg == 0 && t4 == 0) {
                p.lse[bi * p.lse_stride_b + si * p.lse_stride_s + hr * p.lse_stride_h] = lse;
                if (p.max_logits)
                    p.max_logits[bi * p.ml_stride_b + si * p.ml_stride_s + hr * p.ml_stride_h] =
                        row_max_logit(m, a.ml_factor);
            }
        }
    }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <bool FP8, int ABL = 0>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90_kernel(const __grid_constant__ Args a)
{
    attn_sm90_body<FP8, ABL, false>(a);
}

// Clusters of the two head tiles of one query row (grid x even; see attn_sm90_body).
// Launched with a cluster dimension of 2 (attention_launch.cuh).
template <bool FP8, int ABL = 0>
__global__ void __launch_bounds__(kThreads, 1) attn_sm90_xo_kernel(const __grid_constant__ Args a)
{
    attn_sm90_body<FP8, ABL, true>(a);
}

}  // namespace sm90
}  // namespace attn
}  // namespace
