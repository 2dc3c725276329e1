// The narrow wgmma kernels (h <= 32, tokens on M; sm90/narrow_kernel.cuh) for the bf16 cache (decode over a bf16 cache, and prefill), head
// tiles of 16 and 32. Compiled for sm_90a only (setup.py).
#include "attention/sm90/narrow_kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::narrow::entry<16, false>(), sm90::narrow::entry<32, false>()};
}  // namespace
const KernelList kSm90nBf16Kernels = {kEntries, 2};
}  // namespace attn
