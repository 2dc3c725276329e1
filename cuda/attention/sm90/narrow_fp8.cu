// The narrow wgmma kernels (h <= 32, tokens on M; sm90/narrow_kernel.cuh) for the fp8_ds_mla cache (decode), head
// tiles of 16 and 32. Compiled for sm_90a only (setup.py).
#include "attention/sm90/narrow_kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::narrow::entry<16, true>(), sm90::narrow::entry<32, true>()};
}  // namespace
const KernelList kSm90nFp8Kernels = {kEntries, 2};
}  // namespace attn
