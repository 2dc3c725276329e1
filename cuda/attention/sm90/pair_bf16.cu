// The pair kernel (sm90/pair_kernel.cuh) for a bf16 K source: prefill, and decode over a bf16 cache.
// Compiled for sm_90a only (setup.py).
#include "attention/sm90/pair_kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::pair::entry()};
}  // namespace
const KernelList kSm90pBf16Kernels = {kEntries, 1};
}  // namespace attn
