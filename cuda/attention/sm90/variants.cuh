// Which compiled variant of an sm90 kernel (the wide one, sm90/kernel.cuh, or the narrow one,
// sm90/narrow_kernel.cuh) a call runs: its precision (FAST: precision="fast") and, in profiling builds
// (SMLA_PROFILE_BUILD=1 -> SMLA_ATTN_ABLATION), the ablation variant run.attn_ablate names (ABL, the bits
// of sm90/kernel.cuh; 0 is the full kernel). One list of ablation variants for both kernels: the ones
// tools/ablate.py times (its VARIANTS, less 0).
#pragma once

#include <type_traits>

#include "attention/args.cuh"

namespace attn {
namespace sm90 {

// f(std::integral_constant<int, ABL>, std::bool_constant<FAST>) for the call's precision.
template <int ABL, class F>
int with_precision(const Args &a, F &&f)
{
    if (a.p.precision == SMLA_PRECISION_FAST) return f(std::integral_constant<int, ABL>{}, std::true_type{});
    return f(std::integral_constant<int, ABL>{}, std::false_type{});
}

template <class F, int ABL, int... MORE>
int with_ablation(const Args &a, F &&f)
{
    if (a.p.run.attn_ablate == ABL) return with_precision<ABL>(a, f);
    if constexpr (sizeof...(MORE) > 0) return with_ablation<F, MORE...>(a, static_cast<F &&>(f));
    else return with_precision<0>(a, f);
}

// f for the variant the call asks for.
template <class F>
int with_variant(const Args &a, F &&f)
{
#if defined(SMLA_ATTN_ABLATION)
    return with_ablation<F, 1, 2, 4, 6, 7, 8, 16, 32>(a, static_cast<F &&>(f));
#else
    return with_precision<0>(a, f);
#endif
}

}  // namespace sm90
}  // namespace attn
