// The dims kernel (h <= 16 over the fp8_ds_mla cache, heads on mma.sync's M, the dims cut across warps;
// sm90/dims_kernel.cuh), head tile 16. Compiled for sm_90a only (setup.py).
#include "attention/sm90/dims_kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::dims::entry()};
}  // namespace
const KernelList kSm90dFp8Kernels = {kEntries, 1};
}  // namespace attn
