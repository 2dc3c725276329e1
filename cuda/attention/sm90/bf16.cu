// The wgmma kernel for the bf16 cache (decode over a bf16 cache, and prefill): cp.async producer.
// Compiled for sm_90a only (setup.py).
#include "attention/sm90/kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::entry<false>()};
}  // namespace
const KernelList kSm90Bf16Kernels = {kEntries, 1};
}  // namespace attn
