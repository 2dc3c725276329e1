// The portable kernel's configurations for the bf16 cache (decode over a bf16 cache, and prefill),
// best first within each head tile; launch.cu picks one by rule (largest K tile that fits).
#include "attention/sm80/kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {
    sm80::entry<sm80::Cfg<64, 64, false, 0>>(),
    sm80::entry<sm80::Cfg<64, 32, false, 0>>(),
    sm80::entry<sm80::Cfg<32, 64, false, 0>>(),
    sm80::entry<sm80::Cfg<32, 32, false, 0>>(),
    sm80::entry<sm80::Cfg<16, 32, false, 0>>(),
};
}  // namespace
const KernelList kSm80Bf16Kernels = {kEntries, static_cast<int>(sizeof(kEntries) / sizeof(kEntries[0]))};
}  // namespace attn
