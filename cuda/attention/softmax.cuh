// The online-softmax rules of one K tile that both kernel families (sm80/, sm90/) follow: overflowed
// scores saturate (sat_needed, sat_score) and each probability goes to the tensor cores as two bf16
// terms (split_bf16x2). The rules of a finished row (lse, sink, split partials) are in epilogue.cuh.
#pragma once

#include "attention/args.cuh"

namespace attn {

// ------------------------------------------------------------------------------------------------
// Overflow (docs/design.md sections 4 and 8), shared by both kernels and the combine. A valid score
// (log2 domain) beyond the fp32 range saturates at +-FLT_MAX, so the online softmax never meets
// inf - inf. A row whose maximum saturated at +FLT_MAX gives the mean of its saturated tokens' values
// (every other p = ex2(s - FLT_MAX) is 0) and lse = max_logits = +inf; a row whose every valid score
// saturated at -FLT_MAX gives the mean of them all and lse = max_logits = -inf. A thread saturates
// its scores of a tile only when its own row maxima say it may matter (sat_needed), so a tile
// without overflow pays a few compares per row, nothing per score.
// ------------------------------------------------------------------------------------------------
constexpr float kFltMax = 3.40282347e+38f;

// One valid score, saturated; NaN stays NaN.
__device__ __forceinline__ float sat_score(float x)
{
    return x == INFINITY ? kFltMax : (x == -INFINITY ? -kFltMax : x);
}

// mx: the max of this thread's scores of a row in this tile; m: the row's running max before it. +inf
// shows in mx. A valid -inf matters only while the row has nothing above -FLT_MAX (so neither this
// thread nor the row so far); next to a larger score, -inf and -FLT_MAX both weigh 0.
__device__ __forceinline__ bool sat_needed(float mx, float m)
{
    return mx == INFINITY || (mx <= -kFltMax && m <= -kFltMax);
}

// The lazy maximum's slack (log2 domain), one rule for the Hopper kernels that keep one (the wide kernel's
// reference max, the dims and narrow kernels' lazy maximum): a tile whose maxima stay within kLazySlack of the
// maximum its probabilities are taken against keeps it, so P <= 2^8 and O and l need no rescale; lse =
// m + log2(l) holds for any such reference, and max_logits comes from the true maximum kept beside it.
constexpr float kLazySlack = 8.f;

// p = hi + lo with hi = bf16_rne(p) and lo = bf16_rne(p - hi) (p - hi is exact in fp32): P V is done
// as P_hi V + P_lo V, so the probabilities carry ~16 significant bits instead of bf16's 8 (a bf16 P
// alone gives errors of ~2^-9 |V| per dominant token: up to ~1e-2 on outputs whose V entries reach
// ~10, far outside docs/design.md's 1e-3 absolute tolerance).
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo)
{
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

}  // namespace attn
