// Host side of smla.sparse_mla_decode and smla.sparse_mla_prefill on CUDA, the attention launcher's
// one translation unit: device properties, the kernel choice from the table (attention/table.cuh),
// the split-top-k plan (shared by the launch and the workspace-size query, so that both agree), and
// the extern "C" entry points of csrc/core/params.h.
//
// - One CTA per (query row = (request, token), head tile of 16/32/64 heads, top-k split); the grid is
//   one-dimensional (x = (row * head_tiles + tile) * splits + split), so any b * s_q works. Prefill
//   (a bf16 kv[s_kv, 576] seen as one block of s_kv rows, b = 1) is never split: it has thousands of
//   rows, and neighbouring tokens, whose top-k sets overlap, run at the same time, so K rows are
//   loaded with an L2 evict_last hint.
// - On sm_90: h > 32 the warp-specialised wgmma kernels, over a bf16 K source the pair kernel
//   (sm90/pair_kernel.cuh) where the rows fill the SMs, else the wide kernel (sm90/kernel.cuh); h <= 32 the
//   narrow wgmma kernel with tokens on M (sm90/narrow_kernel.cuh); on request the other families
//   and, for fp8 caches at h <= 32, the register kernel (sm90/reg_kernel.cuh; slower than the narrow
//   one so far: benchmarks/README.md); for fp8 caches at h <= 16 the dims kernel (sm90/dims_kernel.cuh,
//   heads on mma.sync's M, the dims across warps), by default where the call has enough rows.
//   Elsewhere the portable mma.sync kernel (sm80/).
//   All give the exact bf16 values of the CPU path (bf16_rne(float(e4m3) * scale)).
//   SMLA_ATTN_KERNEL=auto|portable|sm90|sm90n|sm90p|sm90r|sm90d|sm90t (run.attn_kernel) picks the family at run
//   time (tests, A/B): sm90 the wide kernel for any h, sm90n the narrow one where h <= 32 (the wide one
//   above), sm90p the pair kernel over a bf16 K source for any h (the wide one for fp8), sm90r the
//   register kernel over an fp8 cache where h <= 32 (else as sm90n), sm90d the dims kernel over an fp8 cache
//   where h <= 16 (else as sm90n), sm90t the three-buffer kernel over a bf16 K source in precision "fast" (else
//   the wide one).
// - When b * s_q * head_tiles CTAs cannot fill the GPU, decode splits the top-k list across CTAs:
//   each writes fp32 partial O and a log2 lse into the caller's workspace and the combine kernel
//   (combine.cu) merges them. A missing or smaller workspace means fewer splits.
// - No allocation, no host synchronisation: a decode step can be captured in a CUDA graph.
// - The params are trusted: the bindings check them at the edge (csrc/python with csrc/core's
//   checks). This file fails only where it cannot launch: no kernel for the cache format, too little
//   shared memory, a grid past 2^31 - 1 CTAs.
#include <limits.h>

#include "attention/combine.cuh"
#include "attention/table.cuh"
#include "core/attention_math.h"

namespace attn {
namespace {

struct DevProps {
    int sms = 0;
    int smem_optin = 0;  // max dynamic smem per block
    int smem_sm = 0;     // smem per SM
    int cc = 0;          // major * 10 + minor
    int l2 = 0;          // L2 bytes
};

int get_props(DevProps *d, int *dev_out, smla_status *st)
{
    static DevProps cache[kMaxDevices];
    static OncePerDevice have;
    int dev = 0;
    SMLA_CUDA_CHECK(st, cudaGetDevice(&dev));
    *dev_out = dev;
    if (!have.needed(dev)) {
        *d = cache[dev];
        return SMLA_OK;
    }
    DevProps v;
    int major = 0, minor = 0;
    SMLA_CUDA_CHECK(st, cudaDeviceGetAttribute(&v.sms, cudaDevAttrMultiProcessorCount, dev));
    SMLA_CUDA_CHECK(st, cudaDeviceGetAttribute(&v.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    SMLA_CUDA_CHECK(st, cudaDeviceGetAttribute(&v.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    SMLA_CUDA_CHECK(st, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    SMLA_CUDA_CHECK(st, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    SMLA_CUDA_CHECK(st, cudaDeviceGetAttribute(&v.l2, cudaDevAttrL2CacheSize, dev));
    v.cc = major * 10 + minor;
    if (dev >= 0 && dev < kMaxDevices) {
        cache[dev] = v;
        have.mark(dev);
    }
    *d = v;
    return SMLA_OK;
}

// The kernel family a call asks for (smla_run.attn_kernel, from SMLA_ATTN_KERNEL).
enum Request { kAuto = 0, kPortable = 1, kSm90 = 2, kSm90n = 3, kSm90p = 4, kSm90r = 5, kSm90d = 6, kSm90t = 7 };

// Every kernel in this binary; the sm90 ones only when setup.py compiled them.
const KernelList *const kLists[] = {
    &kSm80Bf16Kernels, &kSm80Fp8Kernels,
#if SMLA_HAVE_SM90
    &kSm90Bf16Kernels, &kSm90Fp8Kernels, &kSm90nBf16Kernels, &kSm90nFp8Kernels, &kSm90pBf16Kernels, &kSm90rFp8Kernels,
    &kSm90dFp8Kernels, &kSm90tBf16Kernels,
#endif
};

// f(entry) for every kernel of family fam that reads the cache format fp8.
template <class F>
void for_each_kernel(Family fam, bool fp8, F f)
{
    for (const KernelList *list : kLists)
        for (int i = 0; i < list->n; ++i)
            if (list->entries[i].family == fam && list->entries[i].fp8 == fp8) f(list->entries[i]);
}

// A chosen kernel and the CTAs per SM the split plan may assume: what its shared memory leaves room
// for (1 KB per CTA reserved by the system), at least 1, at most its min_blocks.
struct Choice {
    const KernelEntry *k = nullptr;
    int occ = 1;
};
Choice make_choice(const KernelEntry *k, const DevProps &d)
{
    Choice c;
    c.k = k;
    const int by_smem = d.smem_sm / (k->smem + 1024);
    c.occ = by_smem < 1 ? 1 : (by_smem > k->min_blocks ? k->min_blocks : by_smem);
    return c;
}

// The sm80 kernel with head tile ht and the largest K tile whose shared memory the device allows.
const KernelEntry *largest_fitting_tile(int ht, bool fp8, const DevProps &d)
{
    const KernelEntry *best = nullptr;
    for_each_kernel(Family::sm80, fp8, [&](const KernelEntry &e) {
        if (e.ht == ht && e.smem <= d.smem_optin && (!best || e.bn > best->bn)) best = &e;
    });
    return best;
}

#if SMLA_HAVE_SM90
// The first kernel of family fam (cache format fp8) whose shared memory the device allows; the one of them with the
// smallest head tile that holds h heads. nullptr where none.
const KernelEntry *first_fitting(Family fam, bool fp8, const DevProps &d)
{
    const KernelEntry *k = nullptr;
    for_each_kernel(fam, fp8, [&](const KernelEntry &e) {
        if (!k && e.smem <= d.smem_optin) k = &e;
    });
    return k;
}
const KernelEntry *smallest_holding(Family fam, bool fp8, int64_t h, const DevProps &d)
{
    const KernelEntry *k = nullptr;
    for_each_kernel(fam, fp8, [&](const KernelEntry &e) {
        if (e.ht >= h && e.smem <= d.smem_optin && (!k || e.ht < k->ht)) k = &e;
    });
    return k;
}
#endif

// The dims kernel is the default for fp8 caches at h <= 16 when b * s_q * kDimsRowsPerSm >= the SMs.
constexpr int64_t kDimsRowsPerSm = 4;

// SMLA_SM90P_AUTO (default 1): auto picks the pair kernel (sm90p) over a bf16 K source for h > 32 where the call's
// rows fill the SMs (b * s_q >= SMs: prefill, large decode batches; fewer rows split the top-k, which the wide kernel
// merges in the same launch). Measured (H100, thirty-sixth session, call 7, bench_sparse_mla_prefill.py --kernel
// auto|sm90 over issue 16's shapes, two rounds): "fast" faster than the wide kernel at h=128 8K / 32K / 128K
// (4,373-4,407 us against 4,545-4,739 at 32K) and h=64 8K / 128K, level at h=64 32K; "high" faster at h=128 8K
// (5,092-5,131 against 5,557-5,602), slower at h=64 128K (3,565-3,600 against 3,354-3,501). The whole CUDA suite
// passed with it (same session, calls 5 and 7). 0: the wide kernel there.
#ifndef SMLA_SM90P_AUTO
#define SMLA_SM90P_AUTO 1
#endif

// The kernel for h heads over a cache of format fp8 (b * s_q = rows) on device d, by these rules:
// 1. On a compute capability 9.0 device (sm_90a code runs nowhere else) of a binary that has the sm90
//    kernels (SMLA_HAVE_SM90), unless the call asked for portable: for h <= 32 the register kernel
//    (sm90r, fp8 only) when the call asked for it; for h <= 16 over fp8 the dims kernel (sm90d) when
//    asked for, or by default (auto) with rows * kDimsRowsPerSm >= SMs; else the narrow kernel (sm90n;
//    each the smallest head tile that holds h) unless the call asked for sm90 or sm90p; the pair
//    kernel (sm90p, bf16 K only) when the call asked for it, or by default (SMLA_SM90P_AUTO) for h > 32 where
//    rows >= SMs (benchmarks/README.md, issue 16, thirty-sixth session); the three-buffer kernel (sm90t, bf16 K,
//    precision "fast") when the call asked for it; the wide kernel for h > 32, when the call asked for sm90, or
//    for sm90n / sm90p / sm90r / sm90t where that kernel does not apply. Only kernels whose shared memory fits (else the rules below).
// 2. sm80: the head tile is the smallest one that holds h (the largest one for more heads than
//    that), with the largest K tile that fits the device's shared memory; when none does, the
//    smallest head tile's largest fitting K tile (the fallback, ~100 KB, fits every sm_80+ GPU).
// False when nothing fits; *need is then the least shared memory an sm80 kernel asks for.
bool choose(int64_t h, bool fp8, bool fast, int64_t rows, int request, const DevProps &d, Choice *out, int *need)
{
#if SMLA_HAVE_SM90
    if (request != kPortable && d.cc == 90) {
        const KernelEntry *k = nullptr;
        // the dims kernel by default where the call has rows for a quarter of the SMs or more (kDimsRowsPerSm);
        // fewer rows split the top-k more finely, and there the narrow kernel, which merges its own
        // partials in the same launch, is faster (benchmarks/README.md, issue 17, fifteenth session)
        const bool dims = request == kSm90d || (request == kAuto && rows * kDimsRowsPerSm >= d.sms);
        if (request == kSm90r || dims)
            k = smallest_holding(request == kSm90r ? Family::sm90r : Family::sm90d, fp8, h, d);
        if (!k && !fp8 && fast && request == kSm90t) k = first_fitting(Family::sm90t, fp8, d);
        if (!k && request != kSm90 && request != kSm90p && request != kSm90t)
            k = smallest_holding(Family::sm90n, fp8, h, d);
        const bool pair_auto = SMLA_SM90P_AUTO && request == kAuto && h > 32 && rows >= d.sms;
        if (!k && !fp8 && (request == kSm90p || pair_auto)) k = first_fitting(Family::sm90p, fp8, d);
        if (!k && (h > 32 || request != kAuto)) k = first_fitting(Family::sm90, fp8, d);
        if (k) {
            *out = make_choice(k, d);
            return true;
        }
    }
#else
    (void)request;
    (void)rows;
    (void)fast;
#endif
    int ht = 0, ht_max = 0, ht_min = INT_MAX;
    *need = INT_MAX;
    for_each_kernel(Family::sm80, fp8, [&](const KernelEntry &e) {
        if (e.ht >= h && (ht == 0 || e.ht < ht)) ht = e.ht;
        ht_max = e.ht > ht_max ? e.ht : ht_max;
        ht_min = e.ht < ht_min ? e.ht : ht_min;
        *need = e.smem < *need ? e.smem : *need;
    });
    const KernelEntry *k = largest_fitting_tile(ht ? ht : ht_max, fp8, d);
    if (!k) k = largest_fitting_tile(ht_min, fp8, d);
    if (!k) return false;
    *out = make_choice(k, d);
    return true;
}

constexpr int kMaxSplits = 64;

// Split count for `rows` query rows: minimises (waves) x (tiles per split + fixed cost) plus the
// combine pass. Fixed cost per CTA ~2 tiles (Q load, prologue, epilogue), ~3.5 with fp32 partials.
int plan_splits(int64_t rows, int64_t n_ht, int64_t topk, const Choice &c, const DevProps &d)
{
    const int64_t base = rows * n_ht;
    const int64_t slots = static_cast<int64_t>(d.sms > 0 ? d.sms : 1) * c.occ;
    const int64_t nt = (topk + c.k->bn - 1) / c.k->bn;
    int best = 1;
    double best_cost = 0;
    for (int64_t ns = 1; ns <= nt && ns <= kMaxSplits; ++ns) {
        const int64_t waves = (base * ns + slots - 1) / slots;
        const int64_t tps = (nt + ns - 1) / ns;
        if (ns > 1 && (ns - 1) * tps >= nt) continue;  // ns - 1 splits give the same tiles per split
        double cost = static_cast<double>(waves) * (static_cast<double>(tps) + (ns > 1 ? 3.5 : 2.0));
        if (ns > 1) cost += 1.0 + 0.5 * static_cast<double>(waves);
        if (ns == 1 || cost < best_cost) {
            best = static_cast<int>(ns);
            best_cost = cost;
        }
        if (base * ns >= 4 * slots) break;
    }
    return best;
}

// ---- Q's tensor maps (the bf16 wide kernel loads its Q tile by TMA: sm90/kernel.cuh, tma_q) ----
typedef CUresult (*EncodeTiledFn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled through the runtime (no libcuda link), looked up once; null where the
// driver has none.
EncodeTiledFn tensor_map_encoder()
{
    static const EncodeTiledFn fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            return static_cast<EncodeTiledFn>(nullptr);
        }
        return reinterpret_cast<EncodeTiledFn>(f);
    }();
    return fn;
}

// m: the bf16 array at base as [b][s_q][h][d] (q or q_pe; strides in elements, d contiguous), boxes of 64 values x
// 64 heads with the 128-byte swizzle of the kernels' Q / K blocks; heads past h read as zeros. False where TMA
// cannot take it: a base or a stride that is not a multiple of 16 bytes.
bool encode_q_map(CUtensorMap *m, const uint16_t *base, int64_t d, const smla_attn_params *p, int64_t sb, int64_t ss,
                  int64_t sh)
{
    const EncodeTiledFn enc = tensor_map_encoder();
    if (!enc) return false;
    // a dimension of extent 1 is never stepped over: its stride is whatever keeps the strides ascending
    if (p->h == 1) sh = d;
    if (p->s_q == 1) ss = sh * p->h;
    if (p->b == 1) sb = ss * p->s_q;
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(p->h),
                                static_cast<cuuint64_t>(p->s_q), static_cast<cuuint64_t>(p->b)};
    const cuuint64_t strides[3] = {static_cast<cuuint64_t>(2 * sh), static_cast<cuuint64_t>(2 * ss),
                                   static_cast<cuuint64_t>(2 * sb)};
    if ((reinterpret_cast<uintptr_t>(base) & 15u) || sh <= 0 || ss <= 0 || sb <= 0 ||
        ((strides[0] | strides[1] | strides[2]) & 15u))
        return false;
    const cuuint32_t box[4] = {64, 64, 1, 1}, elem[4] = {1, 1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t *>(base), dims, strides, box, elem,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// a.q_map (and a.qpe_map where q_pe is given) for a kernel that reads them (KernelEntry::q_tma): a.q_tma = 1 where
// both encode.
void set_q_maps(Args &a, const KernelEntry &k)
{
    const smla_attn_params &p = a.p;
    a.q_tma = 0;
    if (!SMLA_Q_TMA || !k.q_tma) return;
    const int64_t d = p.q_pe ? kDv : kDqk;
    if (!encode_q_map(&a.q_map, p.q, d, &p, p.q_stride_b, p.q_stride_s, p.q_stride_h)) return;
    if (p.q_pe && !encode_q_map(&a.qpe_map, p.q_pe, kDqk - kDv, &p, p.q_pe_stride_b, p.q_pe_stride_s, p.q_pe_stride_h))
        return;
    a.q_tma = 1;
}

// Workspace bytes per split: fp32 partial O [rows, h, 512] and lse [rows, h].
int64_t split_bytes_per_split(int64_t rows, int64_t h)
{
    return rows * h * (kDv + 1) * static_cast<int64_t>(sizeof(float));
}

// Everything decode and prefill need to launch: the kernel, the split count, the grid.
struct Launch {
    DevProps props;
    int dev = 0;
    Choice choice;
    int64_t rows = 0, n_ht = 0;
    int ns = 1;
};

int prepare(int64_t b, int64_t s_q, int64_t h, int64_t topk, bool fp8, bool fast, int request, bool allow_split, Launch *L,
            smla_status *st)
{
    int rc = get_props(&L->props, &L->dev, st);
    if (rc != SMLA_OK) return rc;
    int need = 0;
    if (!choose(h, fp8, fast, b * s_q, request, L->props, &L->choice, &need))
        return smla_fail(st, SMLA_ERR_UNSUPPORTED, "sparse MLA: needs %d bytes of shared memory per block, device %d "
                         "allows %d", need, L->dev, L->props.smem_optin);
    L->rows = b * s_q;
    L->n_ht = (h + L->choice.k->ht - 1) / L->choice.k->ht;
    L->ns = allow_split ? plan_splits(L->rows, L->n_ht, topk, L->choice, L->props) : 1;
    return SMLA_OK;
}

int run_attention(const smla_attn_params *p, bool is_decode, smla_status *st)
{
    const char *op = is_decode ? "sparse_mla_decode" : "sparse_mla_prefill";
    if (p->kv.dtype != SMLA_CACHE_BF16 && p->kv.dtype != SMLA_CACHE_FP8_DS_MLA)
        return smla_fail(st, SMLA_ERR_UNSUPPORTED, "%s: no CUDA kernel reads kv cache dtype %d", op, p->kv.dtype);
    if (p->b == 0 || p->s_q == 0) return SMLA_OK;

    Launch L;
    int rc = prepare(p->b, p->s_q, p->h, p->topk, p->kv.dtype == SMLA_CACHE_FP8_DS_MLA,
                     p->precision == SMLA_PRECISION_FAST, p->run.attn_kernel,
                     is_decode && !p->max_logits, &L, st);
    if (rc != SMLA_OK) return rc;

    Args a;
    a.p = *p;
    a.limit = p->kv.num_blocks * p->kv.block_size;
    a.rows = L.rows;
    a.n_ht = static_cast<int>(L.n_ht);
    a.scale_log2 = smla_attn_scale_log2(p->softmax_scale);
    a.ml_factor = smla_attn_to_ln(p->softmax_scale, a.scale_log2);
    a.evict_last = is_decode ? 0 : 1;
    a.n_sms = L.props.sms;
    a.l2_bytes = L.props.l2;
    a.o_part = nullptr;
    a.lse_part = nullptr;
    set_q_maps(a, *L.choice.k);

    int ns = L.ns;
    if (ns > 1) {
        // Fewer splits when the caller's workspace is missing or smaller than the plan (its 16-byte
        // alignment is checked at the edge).
        const int64_t per = split_bytes_per_split(L.rows, p->h);
        const int64_t fit = p->workspace ? p->workspace_bytes / per : 0;
        if (fit < ns) ns = fit < 2 ? 1 : static_cast<int>(fit);
    }
    a.n_splits = ns;
    if (ns > 1) {
        a.o_part = static_cast<float *>(p->workspace);
        a.lse_part = a.o_part + static_cast<int64_t>(ns) * L.rows * p->h * kDv;
    }
    // A kernel that can merges its own partials (one launch, no combine kernel) where the grid spreads the
    // merges over most of the GPU, as the combine kernel does (at least 7/8 of the SMs; fewer CTAs took
    // longer to merge: h = 64, b = 2, 64 CTAs; benchmarks/README.md, issue 18), with at most kFusedPairsPerCta (row, head) pairs a CTA and
    // kCombineGroupSplits splits or more (combine.cuh); its launch clears a.fused where the device cannot
    // hold the grid at once.
    const int64_t grid = L.rows * L.n_ht * ns;
    a.fused = ns >= kCombineGroupSplits && L.choice.k->fuses && p->run.fused_combine &&
                      L.rows * p->h <= kFusedPairsPerCta * grid && 8 * grid >= 7 * static_cast<int64_t>(L.props.sms)
                  ? 1
                  : 0;
    if (grid > INT32_MAX)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: too many query rows (%lld)", op, (long long)L.rows);
    cudaStream_t s = smla_stream(p->stream);
    rc = L.choice.k->launch(a, grid, s, L.dev, st);
    if (rc != SMLA_OK || ns == 1 || a.fused) return rc;
    return launch_combine(a, s, op, st);
}

}  // namespace
}  // namespace attn

extern "C" int smla_cuda_sparse_mla_decode(const smla_attn_params *p, smla_status *st)
{
    return attn::run_attention(p, /*is_decode=*/true, st);
}

extern "C" int smla_cuda_sparse_mla_prefill(const smla_attn_params *p, smla_status *st)
{
    return attn::run_attention(p, /*is_decode=*/false, st);
}

extern "C" int64_t smla_cuda_sparse_mla_decode_workspace_size(int64_t b, int64_t s_q, int64_t h, int64_t topk,
                                                              int cache_dtype, int attn_kernel)
{
    if (b <= 0 || s_q <= 0 || h < 1 || h > SMLA_MAX_HEADS || topk < 1) return 0;
    if (cache_dtype != SMLA_CACHE_BF16 && cache_dtype != SMLA_CACHE_FP8_DS_MLA) return 0;
    smla_status st = {0, {0}};
    attn::Launch L;
    // precision unknown here: the plan of a "high" call (a "fast" one on sm90t plans its splits over 48-token tiles,
    // and run_attention fits them to the caller's workspace)
    if (attn::prepare(b, s_q, h, topk, cache_dtype == SMLA_CACHE_FP8_DS_MLA, /*fast=*/false, attn_kernel,
                      /*allow_split=*/true, &L, &st) != SMLA_OK) {
        cudaGetLastError();
        return 0;
    }
    if (L.ns <= 1) return 0;
    const int64_t bytes = L.ns * attn::split_bytes_per_split(L.rows, h);
    return (bytes + 255) / 256 * 256;
}
