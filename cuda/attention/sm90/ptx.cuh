// The sm_90a PTX wrappers of the wgmma kernel (sm90/kernel.cuh): mbarriers, the two-CTA cluster
// (mapa, st.async, remote arrivals, cluster barrier), named barriers, setmaxnreg, wgmma with its
// shared-memory descriptors, and non-coherent global loads. Files under cuda/attention/sm90/ are
// compiled for sm_90a only (setup.py), which the guard below enforces.
#pragma once

#include "attention/ptx.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cuda/attention/sm90/ holds sm_90a code: compile it for -gencode=arch=compute_90a,code=sm_90a only"
#endif

namespace attn {
namespace sm90 {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the barriers initialised above visible to the cluster (and to the async proxy).
__device__ __forceinline__ void fence_mbarrier_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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
// Arrival on a peer CTA's barrier (bar: a shared::cluster address), default semantics (release at CTA
// scope), as CUTLASS's ClusterBarrier::arrive(cta_id). The consumers only use it to say "done reading
// this buffer", after reads that have completed (wgmma.wait_group, loaded values consumed), so no
// cluster-scope release is needed; .release.cluster costs a MEMBAR.GPU per arrival (9 % of the decode
// kernel's warp-stall samples under tools/gpu_profile.sh; benchmarks/README.md).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Named barriers between warpgroups that reach them from different code (WG0 and WG1 each have their
// own loop): barrier.sync / barrier.arrive without .aligned, which PTX requires when the threads of a
// barrier do not all execute the same instruction (bar.sync is barrier.sync.aligned; compute-sanitizer
// synccheck stops the kernel at the first such barrier).
__device__ __forceinline__ void named_sync(int id, int n)
{
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// named_sync that also ORs v over the n threads: every one of them gets the result.
__device__ __forceinline__ bool named_sync_or(int id, int n, bool v)
{
    uint32_t r;
    asm volatile("{\n.reg .pred pi, po;\nsetp.ne.u32 pi, %1, 0;\nbarrier.red.or.pred po, %2, %3, pi;\nselp.u32 %0, 1, 0, po;\n}\n"
                 : "=r"(r)
                 : "r"(static_cast<uint32_t>(v)), "r"(id), "r"(n)
                 : "memory");
    return r != 0;
}
// Arrive at named barrier id without waiting (a producer side; the consumer side waits with named_sync).
__device__ __forceinline__ void named_arrive(int id, int n)
{
    asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
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
// Waits until at most N wgmma groups of this warpgroup are pending (wait_group takes N in 0..7); wg_wait0: none.
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void wg_wait0() { wg_wait<0>(); }
// Keeps the compiler from moving reads / writes of wgmma accumulators across the async region.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Keeps register-A operands of an in-flight wgmma allocated until after its wait.
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Shared-memory matrix descriptors of these kernels: 128-byte swizzle, stride (sbo) 1024 B, leading byte
// offset lbo. Split in two so that a k-step's descriptor costs one 32-bit add: desc_base once per operand
// (the low word: start address >> 4, bits 0..13, and lbo >> 4, bits 16..29), desc_at(base, off) per
// k-step. The start address field holds any shared-memory address (< 2^18 B) and base + off stays in it
// for every operand here (off < the 227 KB of shared memory), so the add never carries out of the field.
// (Built from the fields, as wgmma's own encoding was before: 12 uniform instructions per wgmma.)
constexpr uint32_t kDescHi = (1024u >> 4) | (1u << 30);  // sbo 1024 B; bit 62: 128-byte swizzle
__device__ __forceinline__ uint32_t desc_base(uint32_t addr, uint32_t lbo)
{
    return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16);
}
__device__ __forceinline__ uint64_t desc_at(uint32_t base, uint32_t off)
{
    return (static_cast<uint64_t>(kDescHi) << 32) | (base + (off >> 4));
}

// x, opaque to the compiler: descriptor bases are the same on every tile, so without this it would
// hoist the k-steps' descriptors derived from them out of the tile loop and hold (or spill) them all.
__device__ __forceinline__ uint32_t opaque(uint32_t x)
{
    asm volatile("" : "+r"(x));
    return x;
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

// O[64 x 256] += A[64 x 16] B[16 x 256], A in registers (the m64k16 A fragment: a[0] row g, k 2t..2t+1;
// a[1] row g + 8; a[2], a[3] the same at k + 8), B N-major in smem.
__device__ __forceinline__ void wgmma_n256_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
        "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "
        "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "
        "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
        "%122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16), SMLA_F8(24), SMLA_F8(32), SMLA_F8(40), SMLA_F8(48), SMLA_F8(56),
          SMLA_F8(64), SMLA_F8(72), SMLA_F8(80), SMLA_F8(88), SMLA_F8(96), SMLA_F8(104), SMLA_F8(112), SMLA_F8(120)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// m64n128k16 with A from registers (wgmma_n256_rs's fragment) / from shared memory, B N-major (as
// wgmma_n256_tb): the 128-column share of P V (the wide bf16 kernel with SMLA_SM90_SPLIT = 128).
__device__ __forceinline__ void wgmma_n128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63} "
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16), SMLA_F8(24), SMLA_F8(32), SMLA_F8(40), SMLA_F8(48), SMLA_F8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_n128_tb(float (&d)[64], uint64_t da, uint64_t db)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
        "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
        "%61, %62, %63} "
        ", %64, %65, p, 1, 1, 0, 1;\n}\n"
        : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16), SMLA_F8(24), SMLA_F8(32), SMLA_F8(40), SMLA_F8(48), SMLA_F8(56)
        : "l"(da), "l"(db), "r"(1));
}
// Waits until at most one wgmma group of this warpgroup is pending (groups complete in order).
__device__ __forceinline__ void wg_wait1() { wg_wait<1>(); }
// This thread's arrival on the mbarrier, made once every cp.async it issued so far has landed (.noinc:
// it is one of the arrivals the barrier was initialised to expect).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The narrow kernel's products (sm90/narrow_kernel.cuh), tokens on M: D[64 x N] (+)= A[64 x 16] B[16 x N]
// with both operands in smem, B K-major; A K-major (TA = 0: S^T = K Q^T) or M-major (TA = 1: O^T = V^T P^T,
// V^T read from the K tile as stored); N = 16, 32 or 64 (the split consumer's stacked P^T at 32 heads;
// with TA = 0 also the wide and pair kernels' S = Q K^T, m64n64k16).
template <int TA>
__device__ __forceinline__ void wgmma_ss(float (&d)[8], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
                 : SMLA_F8(0)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}
template <int TA>
__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, 0;\n}\n"
                 : SMLA_F8(0), SMLA_F8(8)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}
template <int TA>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, 0;\n}\n"
                 : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16), SMLA_F8(24)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}
// The register kernel's products (sm90/reg_kernel.cuh): D[64 x N] (+)= A[64 x 16] B[16 x N], N = 16 or 32,
// A from registers (wgmma_n256_rs's fragment), B K-major in smem.
__device__ __forceinline__ void wgmma_rs(float (&d)[8], const uint32_t (&a)[4], uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : SMLA_F8(0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, "
                 "p, 1, 1, 0;\n}\n"
                 : SMLA_F8(0), SMLA_F8(8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
// The wide bf16 kernel's S with Q from registers (SMLA_SM90_QREG; and tools/wgmma_rate.cu): m64n64k16, A the
// m64k16 fragment, B K-major.
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16), SMLA_F8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
// The three-buffer kernel's S (sm90/tri_kernel.cuh): m64n48k16, a 48-token K tile, A (Q) from shared memory (TA = 0,
// K-major) or from registers (wgmma_n256_rs's fragment), B K-major.
template <int TA>
__device__ __forceinline__ void wgmma_ss(float (&d)[24], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23}, %24, %25, p, 1, 1, %27, 0;\n}\n"
                 : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TA));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[24], const uint32_t (&a)[4], uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1, 0;\n}\n"
                 : SMLA_F8(0), SMLA_F8(8), SMLA_F8(16)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
#undef SMLA_F8

// bytes (a multiple of 16) from global src to shared dst (both 16-byte aligned) by the bulk-copy engine;
// completes that many bytes of transaction count on the mbarrier bar (the caller expected them).
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// bytes (a multiple of 16, src 16-byte aligned) of global memory into L2, by the bulk-copy engine (no completion).
__device__ __forceinline__ void bulk_prefetch_l2(const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// One box of the 4-d tensor map at map (a __grid_constant__ parameter's address) at coordinates c0..c3 into
// shared dst, completing its bytes on the mbarrier bar (the caller expected them), with L2 policy pol.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, int c0, int c1, int c2, int c3, uint32_t bar,
                                            uint64_t pol)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v)
{
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(v) : "memory");
}

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

}  // namespace sm90
}  // namespace attn
