// The kernel table: what each instantiation file (sm80/bf16.cu, sm80/fp8.cu, sm90/bf16.cu,
// sm90/fp8.cu, sm90/narrow_bf16.cu, sm90/narrow_fp8.cu, sm90/reg_fp8.cu, sm90/dims_fp8.cu, sm90/tri_bf16.cu) offers the launcher (launch.cu), one entry per compiled kernel configuration, and
// the combine kernel's launch (combine.cu). launch.cu chooses an entry by rule from these numbers
// alone; nothing else ties a configuration to the launcher, so adding one is adding an entry.
//
// The sm90 lists exist only when setup.py compiled cuda/attention/sm90/ (sm_90a among the build
// archs), which it says with -DSMLA_HAVE_SM90=1.
#pragma once

#include "attention/args.cuh"

namespace attn {

// Launches one kernel over `grid` CTAs for a call whose Args are filled (device `dev`, current). A kernel
// that fuses the split combine clears a.fused when the grid is larger than the device holds at once (then
// the caller launches the combine kernel); every other launch leaves a untouched.
using LaunchFn = int (*)(Args &a, int64_t grid, cudaStream_t stream, int dev, smla_status *st);

enum class Family {
    sm80,  // portable: mma.sync, any head tile, sm_80 and later (sm80/)
    sm90,  // Hopper: warp-specialised wgmma, head tile 64, compute capability 9.0 only (sm90/)
    sm90n, // Hopper, h <= 32: wgmma with tokens on M, head tile 16 or 32 (sm90/narrow_kernel.cuh)
    sm90p, // Hopper, bf16 K: consumer warpgroups on alternate K tiles, head tile 64 (sm90/pair_kernel.cuh)
    sm90r, // Hopper, fp8 K, h <= 32: tokens on M, A fragments dequantised in registers (sm90/reg_kernel.cuh)
    sm90d, // Hopper, fp8 K, h <= 16: heads on mma.sync's M, dims across warps (sm90/dims_kernel.cuh)
    sm90t, // Hopper, bf16 K, precision "fast": three 48-token K buffers, WG1's P V beside the next softmax (sm90/tri_kernel.cuh)
};

struct KernelEntry {
    Family family;
    bool fp8;        // reads an fp8_ds_mla cache (else bf16)
    int ht;          // heads per CTA
    int bn;          // tokens per K tile
    int smem;        // dynamic shared memory per CTA, bytes
    int min_blocks;  // CTAs per SM its register budget allows (caps the occupancy the split plan assumes)
    int threads;     // per CTA
    LaunchFn launch;
    bool fuses = false;  // can merge its own split partials (Args::fused; a cooperative launch of one wave)
    bool q_tma = false;  // reads Q by TMA where the launcher describes it (Args::q_map, set_q_maps in launch.cu)
};

struct KernelList {
    const KernelEntry *entries;
    int n;
};

extern const KernelList kSm80Bf16Kernels;  // sm80/bf16.cu
extern const KernelList kSm80Fp8Kernels;   // sm80/fp8.cu
#if SMLA_HAVE_SM90
extern const KernelList kSm90Bf16Kernels;  // sm90/bf16.cu
extern const KernelList kSm90Fp8Kernels;   // sm90/fp8.cu
extern const KernelList kSm90nBf16Kernels;  // sm90/narrow_bf16.cu
extern const KernelList kSm90nFp8Kernels;   // sm90/narrow_fp8.cu
extern const KernelList kSm90pBf16Kernels;  // sm90/pair_bf16.cu
extern const KernelList kSm90rFp8Kernels;   // sm90/reg_fp8.cu
extern const KernelList kSm90dFp8Kernels;   // sm90/dims_fp8.cu
extern const KernelList kSm90tBf16Kernels;  // sm90/tri_bf16.cu
#endif

// One plain launch of KERNEL (an attention kernel of Args) over `grid` CTAs of `threads` threads and `smem`
// bytes of dynamic shared memory, its shared-memory limit raised once per device first: the launch of the
// families without a fused split (sm80, the pair, register and dims kernels; the wide and narrow ones
// also choose a cooperative launch); cluster > 1: in clusters of that many CTAs along x (grid a multiple of it).
template <auto KERNEL>
int launch_kernel(Args &a, int64_t grid, int threads, int smem, cudaStream_t s, int dev, smla_status *st,
                  int cluster = 1)
{
    static OncePerDevice configured;
    if (configured.needed(dev)) {
        SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        configured.mark(dev);
    }
    smla_launch(KERNEL, dim3(static_cast<unsigned>(grid)), dim3(threads), smem, s, cluster, a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

// A persistent launch of KERNEL (its CTAs take the grid's work items in turn, grid_pos_of): min(grid, the CTAs the
// device holds at once) CTAs, whole clusters of `cluster` (grid is a multiple of it), the resident count found once per
// device and cluster size.
template <auto KERNEL>
int launch_persistent(Args &a, int64_t grid, int threads, int smem, cudaStream_t s, int dev, smla_status *st,
                      int cluster = 1)
{
    static OncePerDevice configured;
    static ResidentCtas resident[2];  // clusters of 1, of 2
    if (configured.needed(dev)) {
        SMLA_CUDA_CHECK(st, cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        for (int cl = 1; cl <= 2; ++cl) resident[cl - 1].set(dev, smla_resident_ctas(KERNEL, threads, smem, cl, a.n_sms));
        configured.mark(dev);
    }
    const int cl = cluster == 2 ? 2 : 1;
    int64_t cap = dev >= 0 && dev < kMaxDevices ? resident[cl - 1].n[dev] : 0;
    if (cap < cl) cap = a.n_sms >= cl ? a.n_sms : cl;
    int64_t ctas = grid < cap ? grid : cap;
    ctas -= ctas % cl;
    smla_launch(KERNEL, dim3(static_cast<unsigned>(ctas)), dim3(threads), smem, s, cl, a);
    SMLA_CUDA_LAUNCH_CHECK(st);
    return SMLA_OK;
}

// The split-top-k combine over the partials of a.n_splits splits (combine.cu), a programmatic dependent
// of the main kernel where the device has PDL (smla_launch); `op` names the call in errors.
int launch_combine(const Args &a, cudaStream_t stream, const char *op, smla_status *st);

}  // namespace attn
