// The register kernels (h <= 32 over the fp8_ds_mla cache, A fragments dequantised in registers;
// sm90/reg_kernel.cuh), head tiles of 16 and 32. Compiled for sm_90a only (setup.py).
#include "attention/sm90/reg_kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::reg::entry<16>(), sm90::reg::entry<32>()};
}  // namespace
const KernelList kSm90rFp8Kernels = {kEntries, 2};
}  // namespace attn
