// Host side of the sparse MLA kernels: validation, kernel configuration per device, the split-top-k
// plan (shared by the launcher and the workspace-size query so that both agree), and launches.
#pragma once

#include <stdlib.h>
#include <string.h>

#include "attention_core.cuh"
#include "attention_sm90.cuh"

namespace {
namespace attn {

struct DevProps {
    int sms = 0;
    int smem_optin = 0;  // max dynamic smem per block
    int smem_sm = 0;     // smem per SM
    int cc = 0;          // major * 10 + minor
};

static int get_props(DevProps *d, int *dev_out, smla_status *st)
{
    constexpr int kMaxDev = 64;
    static DevProps cache[kMaxDev];
    static bool have[kMaxDev];
    int dev = 0;
    SMLA_CUDA_CHECK(st, cudaGetDevice(&dev));
    *dev_out = dev;
    if (dev >= 0 && dev < kMaxDev && have[dev]) {
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
    v.cc = major * 10 + minor;
    if (dev >= 0 && dev < kMaxDev) {
        cache[dev] = v;
        have[dev] = true;
    }
    *d = v;
    return SMLA_OK;
}

// One kernel configuration (a Cfg instantiation) as plain numbers.
struct Choice {
    int id = -1;  // index into the dispatch table below
    int ht = 0, bn = 0, smem = 0, occ = 1;
};

// The instantiated configurations, best first within each head tile.
//   id: 0..4 bf16, 5..9 fp8
using CfgB64x64 = Cfg<64, 64, false, 0>;
using CfgB64x32 = Cfg<64, 32, false, 0>;
using CfgB32x64 = Cfg<32, 64, false, 0>;
using CfgB32x32 = Cfg<32, 32, false, 0>;
using CfgB16x32 = Cfg<16, 32, false, 0>;
using CfgF64x64 = Cfg<64, 64, true, 1>;
using CfgF64x32 = Cfg<64, 32, true, 2>;
using CfgF32x64 = Cfg<32, 64, true, 2>;
using CfgF32x32 = Cfg<32, 32, true, 2>;
using CfgF16x32 = Cfg<16, 32, true, 2>;

template <class C>
static Choice make_choice(int id, const DevProps &d)
{
    Choice c;
    c.id = id;
    c.ht = C::HT;
    c.bn = C::BN;
    c.smem = C::SMEM;
    const int by_smem = d.smem_sm / (C::SMEM + 1024);  // 1 KB per CTA reserved by the system
    c.occ = by_smem < 1 ? 1 : (by_smem > C::MINB ? C::MINB : by_smem);
    return c;
}

// Kernel family (smla_run.attn_kernel, from SMLA_ATTN_KERNEL): portable (mma.sync, sm_80+), sm90
// (wgmma, any h), auto (default: sm90 for h > 32 on compute capability 9.0 when the sm_90a body is in
// the binary).
enum KernelFamily { kAuto = 0, kPortable = 1, kSm90 = 2 };

// True when attn_sm90_kernel<FP8> was compiled for sm_90a in this binary (a build without the sm_90a
// target leaves an empty body, which uses almost no registers).
template <bool FP8>
static bool sm90_available(int dev)
{
    constexpr int kMaxDev = 64;
    static signed char cached[kMaxDev];  // 0 unknown, 1 yes, -1 no
    if (dev >= 0 && dev < kMaxDev && cached[dev]) return cached[dev] > 0;
    cudaFuncAttributes fa;
    bool ok = cudaFuncGetAttributes(&fa, sm90::attn_sm90_kernel<FP8>) == cudaSuccess && fa.binaryVersion == 90 &&
              fa.numRegs >= 64;
    if (!ok) cudaGetLastError();
    if (dev >= 0 && dev < kMaxDev) cached[dev] = ok ? 1 : -1;
    return ok;
}

// Largest head tile <= the head count, then the largest K tile that fits this device's shared memory;
// h-tile 16 is the fallback that fits everywhere (~100 KB).
template <bool WITH_FP8>
static bool sm90_usable(bool fp8, int dev)
{
    if constexpr (WITH_FP8) {
        if (fp8) return sm90_available<true>(dev);
    }
    return !fp8 && sm90_available<false>(dev);
}

template <bool WITH_FP8>
static bool choose(int64_t h, bool fp8, KernelFamily fam, const DevProps &d, int dev, Choice *out)
{
    if (fam != kPortable && d.cc == 90 && (h > 32 || fam == kSm90) && sm90::kSMEM <= d.smem_optin &&
        sm90_usable<WITH_FP8>(fp8, dev)) {
        out->id = fp8 ? 11 : 10;
        out->ht = 64;
        out->bn = 64;
        out->smem = sm90::kSMEM;
        out->occ = 1;
        return true;
    }
    Choice cand[3];
    int n = 0;
    if (!fp8) {
        if (h > 32) {
            cand[n++] = make_choice<CfgB64x64>(0, d);
            cand[n++] = make_choice<CfgB64x32>(1, d);
        } else if (h > 16) {
            cand[n++] = make_choice<CfgB32x64>(2, d);
            cand[n++] = make_choice<CfgB32x32>(3, d);
        }
        cand[n++] = make_choice<CfgB16x32>(4, d);
    } else {
        if (h > 32) {
            cand[n++] = make_choice<CfgF64x64>(5, d);
            cand[n++] = make_choice<CfgF64x32>(6, d);
        } else if (h > 16) {
            cand[n++] = make_choice<CfgF32x64>(7, d);
            cand[n++] = make_choice<CfgF32x32>(8, d);
        }
        cand[n++] = make_choice<CfgF16x32>(9, d);
    }
    for (int i = 0; i < n; ++i)
        if (cand[i].smem <= d.smem_optin) {
            *out = cand[i];
            return true;
        }
    *out = cand[n - 1];
    return false;
}

constexpr int kMaxSplits = 64;

// Split count for `rows` query rows: minimises (waves) x (tiles per split + fixed cost) plus the
// combine pass. Fixed cost per CTA ~2 tiles (Q load, prologue, epilogue), ~3.5 with fp32 partials.
static int plan_splits(int64_t rows, int64_t n_ht, int64_t topk, const Choice &c, const DevProps &d)
{
    const int64_t base = rows * n_ht;
    const int64_t slots = static_cast<int64_t>(d.sms > 0 ? d.sms : 1) * c.occ;
    const int64_t nt = (topk + c.bn - 1) / c.bn;
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

static int64_t split_bytes_per_split(int64_t rows, int64_t h)
{
    return rows * h * (kDv + 1) * static_cast<int64_t>(sizeof(float));
}

template <class C>
static int launch_main(const Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    constexpr int kMaxDev = 64;
    static bool configured[kMaxDev];
    auto kern = attn_fwd_kernel<C>;
    if (dev < 0 || dev >= kMaxDev || !configured[dev]) {
        SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        if (dev >= 0 && dev < kMaxDev) configured[dev] = true;
    }
    kern<<<static_cast<unsigned>(grid), C::NT, C::SMEM, s>>>(a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

template <bool FP8, int ABL = 0>
static int launch_sm90(const Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
#if defined(SMLA_ATTN_ABLATION)
    if constexpr (ABL == 0) {  // profiling builds: SMLA_ATTN_ABLATE=<bits> (run.attn_ablate) picks a variant
        switch (a.p.run.attn_ablate) {
        case 1: return launch_sm90<FP8, 1>(a, grid, s, dev, st);
        case 2: return launch_sm90<FP8, 2>(a, grid, s, dev, st);
        case 4: return launch_sm90<FP8, 4>(a, grid, s, dev, st);
        case 6: return launch_sm90<FP8, 6>(a, grid, s, dev, st);
        case 8: return launch_sm90<FP8, 8>(a, grid, s, dev, st);
        case 16: return launch_sm90<FP8, 16>(a, grid, s, dev, st);
        case 7: return launch_sm90<FP8, 7>(a, grid, s, dev, st);
        default: break;
        }
    }
#endif
    constexpr int kMaxDev = 64;
    static bool configured[kMaxDev];
    // fp8 with two head tiles: clusters of the two (FlashMLA's crossover; see attn_sm90_body)
    const bool xo = FP8 && a.n_ht == 2;
    void (*kern)(Args) = sm90::attn_sm90_kernel<FP8, ABL>;
    if constexpr (FP8) {
        if (xo) kern = sm90::attn_sm90_xo_kernel<FP8, ABL>;
    }
    if (dev < 0 || dev >= kMaxDev || !configured[dev]) {
        SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(sm90::attn_sm90_kernel<FP8, ABL>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSMEM));
        if constexpr (FP8)
            SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(sm90::attn_sm90_xo_kernel<FP8, ABL>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, sm90::kSMEM));
        if (dev >= 0 && dev < kMaxDev) configured[dev] = true;
    }
    if (xo) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(static_cast<unsigned>(grid), 1, 1);
        cfg.blockDim = dim3(sm90::kThreads, 1, 1);
        cfg.dynamicSmemBytes = sm90::kSMEM;
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        SMLA_CUDA_CHECK(st, cudaLaunchKernelEx(&cfg, kern, a));
    } else {
        kern<<<static_cast<unsigned>(grid), sm90::kThreads, sm90::kSMEM, s>>>(a);
    }
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

template <bool WITH_FP8>
static int dispatch_main(int id, const Args &a, int64_t grid, cudaStream_t s, int dev, smla_status *st)
{
    switch (id) {
    case 10: return launch_sm90<false>(a, grid, s, dev, st);
    case 0: return launch_main<CfgB64x64>(a, grid, s, dev, st);
    case 1: return launch_main<CfgB64x32>(a, grid, s, dev, st);
    case 2: return launch_main<CfgB32x64>(a, grid, s, dev, st);
    case 3: return launch_main<CfgB32x32>(a, grid, s, dev, st);
    case 4: return launch_main<CfgB16x32>(a, grid, s, dev, st);
    default: break;
    }
    if constexpr (WITH_FP8) {
        switch (id) {
        case 5: return launch_main<CfgF64x64>(a, grid, s, dev, st);
        case 6: return launch_main<CfgF64x32>(a, grid, s, dev, st);
        case 7: return launch_main<CfgF32x64>(a, grid, s, dev, st);
        case 8: return launch_main<CfgF32x32>(a, grid, s, dev, st);
        case 9: return launch_main<CfgF16x32>(a, grid, s, dev, st);
        case 11: return launch_sm90<true>(a, grid, s, dev, st);
        default: break;
        }
    }
    return smla_fail(st, SMLA_ERR_UNSUPPORTED, "sparse MLA: kernel configuration %d is not built", id);
}

static bool misaligned(const void *ptr, int64_t bytes) { return (reinterpret_cast<uintptr_t>(ptr) % bytes) != 0; }

// Validation common to decode and prefill (the bindings check most of this already; the kernels rely
// on it, so it is repeated here for direct C callers).
static int check_params(const smla_attn_params *p, const char *op, smla_status *st)
{
    if (p->b < 0 || p->s_q < 0 || p->h < 1 || p->h > 128 || p->topk < 1 || p->topk > INT32_MAX / 2)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: unsupported shape b=%lld s_q=%lld h=%lld topk=%lld (need h in "
                         "1..128, topk >= 1)", op, (long long)p->b, (long long)p->s_q, (long long)p->h,
                         (long long)p->topk);
    if (p->kv.dtype != SMLA_CACHE_BF16 && p->kv.dtype != SMLA_CACHE_FP8_DS_MLA)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: unknown kv cache dtype %d", op, p->kv.dtype);
    if (p->kv.num_blocks < 0 || p->kv.block_size < 0 || p->kv.block_size > UINT32_MAX ||
        (p->kv.block_size > 0 && p->kv.num_blocks > INT64_MAX / p->kv.block_size))
        return smla_fail(st, SMLA_ERR_VALUE, "%s: bad kv cache shape (%lld blocks of %lld)", op,
                         (long long)p->kv.num_blocks, (long long)p->kv.block_size);
    if (!p->q || !p->out || !p->lse || !p->indices)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: q, indices, out and lse must not be NULL", op);
    // 16-byte rows: q, out (2-byte elements), the cache (bytes)
    const bool q_bad = misaligned(p->q, 16) || (p->b > 1 && p->q_stride_b % 8) ||
                       (p->s_q > 1 && p->q_stride_s % 8) || (p->h > 1 && p->q_stride_h % 8);
    if (q_bad) return smla_fail(st, SMLA_ERR_VALUE, "%s: q rows must be 16-byte aligned for the CUDA kernel", op);
    const bool o_bad = misaligned(p->out, 16) || (p->b > 1 && p->out_stride_b % 8) ||
                       (p->s_q > 1 && p->out_stride_s % 8) || (p->h > 1 && p->out_stride_h % 8);
    if (o_bad) return smla_fail(st, SMLA_ERR_VALUE, "%s: out rows must be 16-byte aligned for the CUDA kernel", op);
    const int64_t limit = p->kv.num_blocks * p->kv.block_size;
    if (limit > 0) {
        if (!p->kv.data)
            return smla_fail(st, SMLA_ERR_VALUE, "%s: kv cache data is NULL", op);
        const bool kv_bad = misaligned(p->kv.data, 16) || (p->kv.num_blocks > 1 && p->kv.block_stride % 16) ||
                            (p->kv.block_size > 1 && p->kv.entry_stride % 16);
        if (kv_bad)
            return smla_fail(st, SMLA_ERR_VALUE, "%s: kv cache rows must be 16-byte aligned for the CUDA kernel "
                             "(data pointer, block stride %lld B, entry stride %lld B)", op,
                             (long long)p->kv.block_stride, (long long)p->kv.entry_stride);
    }
    return SMLA_OK;
}

// Everything decode and prefill need to launch: configuration, split count, grid.
struct Launch {
    DevProps props;
    int dev = 0;
    Choice choice;
    int64_t rows = 0, n_ht = 0;
    int ns = 1;
};

template <bool WITH_FP8>
static int prepare(int64_t b, int64_t s_q, int64_t h, int64_t topk, int cache_dtype, int family, bool allow_split,
                   Launch *L, smla_status *st)
{
    int rc = get_props(&L->props, &L->dev, st);
    if (rc != SMLA_OK) return rc;
    if (!choose<WITH_FP8>(h, cache_dtype == SMLA_CACHE_FP8_DS_MLA, static_cast<KernelFamily>(family), L->props, L->dev, &L->choice))
        return smla_fail(st, SMLA_ERR_UNSUPPORTED, "sparse MLA: needs %d bytes of shared memory per block, device %d "
                         "allows %d", L->choice.smem, L->dev, L->props.smem_optin);
    L->rows = b * s_q;
    L->n_ht = (h + L->choice.ht - 1) / L->choice.ht;
    L->ns = allow_split ? plan_splits(L->rows, L->n_ht, topk, L->choice, L->props) : 1;
    return SMLA_OK;
}

template <bool WITH_FP8>
static int run_attention(const smla_attn_params *p, bool is_decode, smla_status *st)
{
    const char *op = is_decode ? "sparse_mla_decode" : "sparse_mla_prefill";
    int rc = check_params(p, op, st);
    if (rc != SMLA_OK) return rc;
    if (!WITH_FP8 && p->kv.dtype != SMLA_CACHE_BF16)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: kv must be bf16", op);
    if (p->b == 0 || p->s_q == 0) return SMLA_OK;

    Launch L;
    rc = prepare<WITH_FP8>(p->b, p->s_q, p->h, p->topk, p->kv.dtype, p->run.attn_kernel, is_decode && !p->max_logits, &L, st);
    if (rc != SMLA_OK) return rc;

    Args a;
    a.p = *p;
    a.limit = p->kv.num_blocks * p->kv.block_size;
    a.rows = L.rows;
    a.n_ht = static_cast<int>(L.n_ht);
    a.scale_log2 = p->softmax_scale * kLog2e;
    // m * ml_factor = the natural-log logit of the log2-domain kernel logit m (exact up to m's own
    // rounding); a zero / non-finite scale_log2 leaves plain ln 2
    a.ml_factor = (a.scale_log2 != 0.f && isfinite(a.scale_log2))
                      ? static_cast<double>(p->softmax_scale) / static_cast<double>(a.scale_log2)
                      : kLn2d;
    a.evict_last = is_decode ? 0 : 1;
    a.o_part = nullptr;
    a.lse_part = nullptr;

    int ns = L.ns;
    if (ns > 1) {
        // Fewer splits when the caller's workspace is missing or smaller than the plan.
        const int64_t per = split_bytes_per_split(L.rows, p->h);
        const int64_t fit = (p->workspace && !misaligned(p->workspace, 16)) ? p->workspace_bytes / per : 0;
        if (fit < ns) ns = fit < 2 ? 1 : static_cast<int>(fit);
    }
    a.n_splits = ns;
    if (ns > 1) {
        a.o_part = static_cast<float *>(p->workspace);
        a.lse_part = a.o_part + static_cast<int64_t>(ns) * L.rows * p->h * kDv;
    }
    const int64_t grid = L.rows * L.n_ht * ns;
    if (grid > INT32_MAX)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: too many query rows (%lld)", op, (long long)L.rows);
    cudaStream_t s = smla_stream(p->stream);
    rc = dispatch_main<WITH_FP8>(L.choice.id, a, grid, s, L.dev, st);
    if (rc != SMLA_OK || ns == 1) return rc;
    const int64_t cgrid = (L.rows * p->h + kCombineWarps - 1) / kCombineWarps;
    if (cgrid > INT32_MAX)
        return smla_fail(st, SMLA_ERR_VALUE, "%s: too many query rows (%lld)", op, (long long)L.rows);
    attn_combine_kernel<<<static_cast<unsigned>(cgrid), kCombineWarps * 32, 0, s>>>(a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

}  // namespace attn
}  // namespace
