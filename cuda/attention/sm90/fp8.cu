// The wgmma kernel for the fp8_ds_mla cache (decode): register-staged dequantising producer, and its
// two-CTA crossover variant for two head tiles (sm90/producer.cuh). Compiled for sm_90a only (setup.py).
#include "attention/sm90/kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {sm90::entry<true>()};
}  // namespace
const KernelList kSm90Fp8Kernels = {kEntries, 1};
}  // namespace attn
