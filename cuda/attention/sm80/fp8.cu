// The portable kernel's configurations for the fp8_ds_mla cache (decode). NRAW, the raw staging
// buffers: 2 lets the next tile's copy overlap this tile's dequant; 64 x 64 has room for only 1.
#include "attention/sm80/kernel.cuh"

namespace attn {
namespace {
constexpr KernelEntry kEntries[] = {
    sm80::entry<sm80::Cfg<64, 64, true, 1>>(),
    sm80::entry<sm80::Cfg<64, 32, true, 2>>(),
    sm80::entry<sm80::Cfg<32, 64, true, 2>>(),
    sm80::entry<sm80::Cfg<32, 32, true, 2>>(),
    sm80::entry<sm80::Cfg<16, 32, true, 2>>(),
};
}  // namespace
const KernelList kSm80Fp8Kernels = {kEntries, static_cast<int>(sizeof(kEntries) / sizeof(kEntries[0]))};
}  // namespace attn
