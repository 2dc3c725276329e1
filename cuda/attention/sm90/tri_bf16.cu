// The three-buffer kernel (sm90/tri_kernel.cuh) for a bf16 K source, precision "fast": prefill, and decode over a
// bf16 cache. Compiled for sm_90a only (setup.py).
#include "attention/sm90/tri_kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::tri::entry()};
}  // namespace
const KernelList kSm90tBf16Kernels = {kEntries, 1};
}  // namespace attn
