// Stage timestamps of the sm90 kernels (the wide, pair, narrow and dims kernels), profiling builds only
// (SMLA_PROFILE_BUILD=1 -> SMLA_ATTN_ABLATION): where Nsight Compute's stall samples say which
// instruction waits, this says when, per tile, each warpgroup passes each point of its schedule, so the
// waits of one warpgroup can be matched with what the other (or the producer) was doing meanwhile.
// tools/trace_attn.py sets SMLA_ATTN_TRACE (run.attn_trace) to a device buffer of
// [kTraceCtas][kTraceSlots][kTraceSteps][kTraceEvents] uint64 (then every CTA's start / end: kTraceAllCtas below)
// and prints the result.
//
// CTAs SMLA_TRACE_CTA0 .. + kTraceCtas - 1 record (by default the first wave's; a later wave's CTAs show the
// steady state's prologue and epilogue, which the first wave's all-at-once Q loads do not); slot = the recording warp: 0 WG0's first warp, 1 WG1's first, 2 and
// 3 the producers' first and third (the pair kernel: buffer 0's and buffer 1's); step = the tile (wide
// kernel) or pair (pair kernel) index, kTraceSteps - 1 the prologue / epilogue; event = the point in the
// schedule (the kTr* names below). Lane 0 writes clock64() (one SM: one clock for the whole CTA). In
// other builds trace() is empty.
#pragma once

#include "attention/args.cuh"
#include "attention/ptx.cuh"

namespace attn {
namespace sm90 {

#ifndef SMLA_TRACE_CTA0
#define SMLA_TRACE_CTA0 0
#endif
// SMLA_TRACE_LIGHT = 1: only each step's event 0 (its start) and the edge events are recorded, so that the stamps
// cost less (the pair kernel's full set made its profiling build ~15% slower than the default build, the wide
// kernel's ~5%: thirty-fourth session, H100) and the step period and the CTA's boundaries can be read untouched by
// them.
#ifndef SMLA_TRACE_LIGHT
#define SMLA_TRACE_LIGHT 0
#endif
// SMLA_TRACE_EDGE_ONLY = 1: only the edge events (trace_edge: the prologue and the epilogue) are recorded; the steps'
// stamps are compiled out. Why: with the pair kernel's lean producer its profiling build spills 400-1,000 bytes with
// every stamp (LIGHT too; issue 16, thirty-ninth and fortieth sessions), so its loop runs slower than the default's;
// the boundary's stamps alone can still be read against the default build.
#ifndef SMLA_TRACE_EDGE_ONLY
#define SMLA_TRACE_EDGE_ONLY 0
#endif
constexpr int kTraceCtas = 16, kTraceSlots = 4, kTraceSteps = 48, kTraceEvents = 16;
constexpr int kTraceCta0 = SMLA_TRACE_CTA0;
constexpr int kTraceEdge = kTraceSteps - 1;  // the step of the prologue / epilogue events
// Edge events (step kTraceEdge), every slot: kernel start, the tile scan done, epilogue start and end; the
// consumers' Q landed (the wide kernel); the direct output's stages (finish_cols_direct, ConsumerBase::early_out:
// the row statistics met, the rows' factors ready, the warpgroup met at its first staged block, stage_out_cols);
// the producers' speculated tile 0 issued; the direct output's stores issued (before the rows' lse and max_logits);
// Q's TMA issued (the pair kernel's thread 0); the tile scan's own index loads back (scan_tiles_vec, WG0's first warp,
// before the barrier that ends the scan).
enum TraceEdge {
    kTrStart = 0, kTrScanned = 1, kTrEpilogue = 2, kTrEnd = 3, kTrQ = 4,
    kTrStats = 5, kTrStaged = 6, kTrStageMet = 7, kTrSpec = 8, kTrOut = 9,
    kTrQIssued = 10, kTrScanLoads = 11
};

// Every CTA's start and end (the global timer, ns) and SM, after the per-CTA stage records: [kTraceAllCtas][4]
// (start, end, SM, 0) for CTAs 0 .. kTraceAllCtas - 1 (tools/trace_attn.py: whether a call's CTAs start in step).
constexpr int kTraceAllCtas = 16384;
constexpr int64_t kTraceAllOff = static_cast<int64_t>(kTraceCtas) * kTraceSlots * kTraceSteps * kTraceEvents;

__device__ __forceinline__ void trace_at(const Args &a, int step, int ev)
{
#if defined(SMLA_ATTN_ABLATION)
    if (SMLA_TRACE_LIGHT && ev != 0 && step != kTraceEdge) return;
    if (!a.p.run.attn_trace || (threadIdx.x & 31) != 0 || step < 0 || step >= kTraceSteps) return;
    const int w = threadIdx.x >> 5;
    const int slot = w == 0 ? 0 : (w == 4 ? 1 : (w == 8 ? 2 : (w == 10 ? 3 : -1)));
    if (slot < 0) return;
    uint64_t *const buf = reinterpret_cast<uint64_t *>(a.p.run.attn_trace);
    const int64_t cta = static_cast<int64_t>(blockIdx.x) - kTraceCta0;
    if (cta >= 0 && cta < kTraceCtas)
        buf[((cta * kTraceSlots + slot) * kTraceSteps + step) * kTraceEvents + ev] = clock64();
    // the whole grid (WG0's start, WG1's end): when, on the clock all SMs share, and where each CTA ran
    if (step != kTraceEdge || (ev != kTrStart && ev != kTrEnd) || slot != (ev == kTrStart ? 0 : 1) ||
        blockIdx.x >= kTraceAllCtas)
        return;
    const uint64_t g = globaltimer();
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    uint64_t *const all = buf + kTraceAllOff + 4 * static_cast<int64_t>(blockIdx.x);
    all[ev == kTrStart ? 0 : 1] = g;
    all[2] = sm;
#else
    (void)a, (void)step, (void)ev;
#endif
}
// Event ev of step (tile or pair) step; SMLA_TRACE_EDGE_ONLY: none.
__device__ __forceinline__ void trace(const Args &a, int step, int ev)
{
    if (!SMLA_TRACE_EDGE_ONLY) trace_at(a, step, ev);
}
// Edge event ev (the prologue and the epilogue: TraceEdge).
__device__ __forceinline__ void trace_edge(const Args &a, int ev) { trace_at(a, kTraceEdge, ev); }

}  // namespace sm90
}  // namespace attn
