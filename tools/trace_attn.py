"""When each warpgroup of the sm90 bf16 prefill kernels passes each point of its schedule, per tile (the
wide kernel) or per pair of tiles (the pair kernel): the stage timestamps of cuda/attention/sm90/trace.cuh,
recorded by 16 CTAs of one call (h=128, s_q=4096, s_kv=32768, top-k 2048 random, the benchmark's case): the
first wave's, or those from SMLA_TRACE_CTA0 on (sm90/trace.cuh; e.g. 3960, a mid-run wave's, whose prologue is not
the first wave's all-at-once Q loads), printed as mean intervals in SM cycles over the steady-state steps, with
the wide kernel's prologue (start to the scan, Q, tile 0) and its last tile into the epilogue. --kernel sm90d:
the dims kernel's fp8 decode instead (h=16, s_q=1, b=128, 32K tokens a request: the decode benchmark's
case), per tile of each group of warps (sm90/dims_kernel.cuh, DimsEv); --kernel sm90n: the narrow kernel's
prefill (--h 16 or 32), per tile of its consumer and two of its producer warps (--consumers 2: of its two consumer
warpgroups and two producer warps). Nsight Compute's
stall samples say which instruction waits; this says what the other warpgroup and the producer were
doing meanwhile (hand-off latencies, how long a K region takes to land after its copies were issued).
Then every CTA's start and end on the global timer: how crowded the CTA starts are (a call whose CTAs all take the
same time can run its waves in step, every SM loading Q and storing its output at once). Needs a profiling build
(SMLA_PROFILE_BUILD=1: the timestamps are compiled in only there).

    SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace
    (a mid-run wave: build a copy made by tools/variant_tree.sh OUT.tar.gz SMLA_TRACE_CTA0=3960; with SMLA_TRACE_LIGHT=1
     as well only each step's start and the prologue / epilogue edges are stamped: cheaper stamps, fewer rows; with
     SMLA_TRACE_EDGE_ONLY=1 only the edges: the pair kernel's profiling build then hardly spills)
    PYTHONPATH=src python3 tools/trace_attn.py [--kernel sm90|sm90p|sm90t|sm90d|sm90n] [--precision fast|high] [--h 128]
        [--stagger-ns N] [--jitter-ns J]  (the first wave spread over N ns, every CTA delayed by up to J ns: do the
                        waves stay apart? the grid rows below)
        [--steps A-B]  (the wide kernel's steps A .. B - 1 one by one; with SMLA_SM90_PERSISTENT=1 a step is a use of
                        the K ring, so an item boundary shows as one step)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_sparse_mla_decode as bd  # noqa: E402
import bench_sparse_mla_prefill as bp  # noqa: E402
from _gpu import open_gpu  # noqa: E402

CTAS, SLOTS, STEPS, EVENTS = 16, 4, 48, 16  # sm90/trace.cuh: kTraceCtas, kTraceSlots, kTraceSteps, kTraceEvents
ALL_CTAS = 16384  # sm90/trace.cuh, kTraceAllCtas: every CTA's (start, end, SM, 0) after the stage records
EDGE = STEPS - 1
WG0, WG1, PR0, PR1 = range(4)  # slots: WG0's first warp, WG1's first, the producers' first and third

# (label, (slot, step offset, event), (slot, step offset, event)): the interval from the first point of
# step k + offset to the second, averaged over the steady-state steps k and the CTAs. Events: the
# comments at sm90/consumer.cuh (wide) and sm90/pair_kernel.cuh (PairEv, pair).
WIDE = [
    ("WG0 tile period (start k -> start k+1)", (WG0, 0, 0), (WG0, 1, 0)),
    ("WG0 wait for K (start -> landed)", (WG0, 0, 0), (WG0, 0, 1)),
    ("WG0 S (landed -> S done)", (WG0, 0, 1), (WG0, 0, 2)),
    ("WG0 softmax (S done -> P ready)", (WG0, 0, 2), (WG0, 0, 3)),
    ("WG0 publish P (-> arrived)", (WG0, 0, 3), (WG0, 0, 4)),
    ("WG0 its P V (published -> done)", (WG0, 0, 4), (WG0, 0, 5)),
    ("WG0 release + loop (P V done -> next start)", (WG0, 0, 5), (WG0, 1, 0)),
    ("WG1 wait for P (start -> P received)", (WG1, 0, 0), (WG1, 0, 1)),
    ("WG1 hand-off (WG0 published -> WG1 received)", (WG0, 0, 4), (WG1, 0, 1)),
    ("WG1 its P V (received -> done)", (WG1, 0, 1), (WG1, 0, 2)),
    ("producer wait for a free buffer", (PR0, 0, 0), (PR0, 0, 1)),
    ("producer issue (free -> issued)", (PR0, 0, 1), (PR0, 0, 2)),
    ("producer copies landing (issued -> landed, one thread)", (PR0, 0, 2), (PR0, 0, 3)),
    ("K tile: issued -> WG0 saw it landed", (PR0, 0, 2), (WG0, 0, 1)),
]
# the three-buffer kernel (sm90/tri_kernel.cuh; its trace() events): WG0 0 start of tile k, 1 softmax of k done, 2 P
# of k published, 3 its P V of k and S of k + 1 issued (tile k + 1 acquired between), 4 both done; WG1 0 start, 1 P
# received, 3 WG0's S of k + 1 done (seen), 2 its P V done; producers 0 start, 1 buffer free, 2 copies issued
TRI = [
    ("WG0 tile period (start k -> start k+1)", (WG0, 0, 0), (WG0, 1, 0)),
    ("WG0 softmax(k) (start -> P ready)", (WG0, 0, 0), (WG0, 0, 1)),
    ("WG0 publish P (-> arrived)", (WG0, 0, 1), (WG0, 0, 2)),
    ("WG0 issue: its P V(k), acquire k+1, S(k+1)", (WG0, 0, 2), (WG0, 0, 3)),
    ("WG0 wait: its P V(k), S(k+1) (-> done)", (WG0, 0, 3), (WG0, 0, 4)),
    ("WG0 release + S sum + loop (-> next start)", (WG0, 0, 4), (WG0, 1, 0)),
    ("WG1 wait for P (start -> P received)", (WG1, 0, 0), (WG1, 0, 1)),
    ("WG1 hand-off (WG0 published -> WG1 received)", (WG0, 0, 2), (WG1, 0, 1)),
    ("WG1 wait for S(k+1) (P received -> S done seen)", (WG1, 0, 1), (WG1, 0, 3)),
    ("WG1 its P V (S done seen -> done)", (WG1, 0, 3), (WG1, 0, 2)),
    ("WG1 P V done -> WG0's P(k+1) ready", (WG1, 0, 2), (WG0, 1, 1)),
    ("producer wait for a free buffer", (PR0, 0, 0), (PR0, 0, 1)),
    ("producer issue (free -> issued)", (PR0, 0, 1), (PR0, 0, 2)),
    ("tile k+1: issued -> WG0 issue done", (PR0, 1, 2), (WG0, 0, 3)),
]
PAIR = [
    ("WG0 pair period (start k -> start k+1)", (WG0, 0, 0), (WG0, 1, 0)),
    ("WG0 mask + max (-> M0 published)", (WG0, 0, 0), (WG0, 0, 1)),
    ("WG0 softmax + local P V issue", (WG0, 0, 1), (WG0, 0, 2)),
    ("WG0 wait for WG1's max", (WG0, 0, 2), (WG0, 0, 3)),
    ("WG0 local P V done", (WG0, 0, 3), (WG0, 0, 4)),
    ("WG0 rescale + store P0", (WG0, 0, 4), (WG0, 0, 5)),
    ("WG0 wait for P1", (WG0, 0, 5), (WG0, 0, 6)),
    ("WG0 next early region landed (remote P V issued)", (WG0, 0, 6), (WG0, 0, 7)),
    ("WG0 remote P V done", (WG0, 0, 7), (WG0, 0, 8)),
    ("WG0 next late region landed", (WG0, 0, 8), (WG0, 0, 9)),
    ("WG0 next S done", (WG0, 0, 9), (WG0, 0, 10)),
    ("WG1 pair period", (WG1, 0, 0), (WG1, 1, 0)),
    ("WG1 mask + wait for WG0's max", (WG1, 0, 0), (WG1, 0, 1)),
    ("WG1 max hand-off (WG0 published -> WG1 received)", (WG0, 0, 1), (WG1, 0, 1)),
    ("WG1 softmax + store P1", (WG1, 0, 1), (WG1, 0, 2)),
    ("WG1 wait for P0 (local P V issued)", (WG1, 0, 2), (WG1, 0, 3)),
    ("WG1 local P V done", (WG1, 0, 3), (WG1, 0, 4)),
    # WG1 frees its regions first (kReleaseFirst): remote done (6) comes before its next first S chain (5)
    ("WG1 remote P V done", (WG1, 0, 4), (WG1, 0, 6)),
    ("WG1 next early region landed (frees first)", (WG1, 0, 6), (WG1, 0, 5)),
    ("WG1 next late region landed", (WG1, 0, 5), (WG1, 0, 7)),
    ("WG1 next S done", (WG1, 0, 7), (WG1, 0, 8)),
    # the producer's four warps fill every region in turn (events 1 + 4 b + 2 r: region r of buffer b free, + 1 issued)
    ("producer: buffer 0 early: wait for its free", (PR0, 0, 0), (PR0, 0, 1)),
    ("producer: buffer 0 early: free -> issued", (PR0, 0, 1), (PR0, 0, 2)),
    ("producer: buffer 0 early: free -> flags written", (PR0, 0, 1), (PR0, 0, 9)),
    ("producer: buffer 1 early: wait for its free", (PR0, 0, 2), (PR0, 0, 5)),
    ("producer: buffer 1 early: free -> issued", (PR0, 0, 5), (PR0, 0, 6)),
    ("producer: buffer 1 early: free -> flags written", (PR0, 0, 5), (PR0, 0, 11)),
    ("producer: buffer 0 late: wait for its free", (PR0, 0, 6), (PR0, 0, 3)),
    ("producer: buffer 0 late: free -> issued", (PR0, 0, 3), (PR0, 0, 4)),
    ("producer: buffer 1 late: wait for its free", (PR0, 0, 4), (PR0, 0, 7)),
    ("producer: buffer 1 late: free -> issued", (PR0, 0, 7), (PR0, 0, 8)),
    ("buffer 0 early: issued -> WG0 saw it landed", (PR0, 1, 2), (WG0, 0, 7)),
    ("buffer 0 late: issued -> WG0 saw it landed", (PR0, 1, 4), (WG0, 0, 9)),
    ("buffer 1 early: issued -> WG1 saw it landed", (PR0, 1, 6), (WG1, 0, 5)),
    ("buffer 1 late: issued -> WG1 saw it landed", (PR0, 1, 8), (WG1, 0, 7)),
]
# the dims kernel: slots 0 / 1 the two groups' first warps (step: the group's k-th tile), 2 / 3 the
# producers' first and third warps (step i / 2 of tile i; events 0-2 even tiles = group 0's, 3-5 odd)
DIMS_STAGES = [("wait for its stage", 0, 1), ("loads, dequant, S MMAs issued", 1, 2),
               ("partials stored + barrier 1", 2, 3), ("block softmax, P stored + barrier 2", 3, 4),
               ("verdict + P gathered", 4, 5), ("P V issued", 5, 6)]
DIMS = [row for g, slot in (("G0", WG0), ("G1", WG1)) for row in
        [(f"{g} tile period (top k -> top k+1)", (slot, 0, 0), (slot, 1, 0))] +
        [(f"{g} {name}", (slot, 0, a), (slot, 0, b)) for name, a, b in DIMS_STAGES] +
        [(f"{g} loop back (P V issued -> next top)", (slot, 0, 6), (slot, 1, 0))]]
DIMS += [("G1 top after G0 top (same k)", (WG0, 0, 0), (WG1, 0, 0))]
DIMS += [(f"producer {p}, {par} tiles: {name}", (slot, 0, a + 3 * odd), (slot, 0, b + 3 * odd))
         for p, slot in ((0, PR0), (2, PR1)) for odd, par in ((0, "even"), (1, "odd"))
         for name, a, b in (("wait for a free stage", 0, 1), ("issue", 1, 2))]
DIMS += [(f"producer 0, {par} tiles: stage free -> {g} saw it full", (PR0, 0, 1 + 3 * odd), (slot, 0, 1))
         for odd, par, g, slot in ((0, "even", "G0", WG0), (1, "odd", "G1", WG1))]
# the narrow kernel (sm90/narrow_kernel.cuh): slot 0 the consumer's first warp, slots 1 and 2 the producers'
# first and fifth warps (warps 4 and 8 of the CTA; trace.cuh's WG1 and producer slots); step = the tile.
NPR0, NPR4 = WG1, PR0
NARROW_STAGES = [("wait for K (top -> landed)", 0, 1), ("S (landed -> S done)", 1, 2),
                 ("mask, softmax, P stored", 2, 3), ("P V (issued -> done)", 3, 4)]


def narrow_rows(consumers, producers):
    """The narrow kernel's rows: per consumer (label, slot) its tile period and stages, per producer warp
    (number, slot) its wait, issue and landing."""
    rows = [row for wg, slot in consumers for row in
            [(f"{wg} tile period (top k -> top k+1)", (slot, 0, 0), (slot, 1, 0))] +
            [(f"{wg} {name}", (slot, 0, a), (slot, 0, b)) for name, a, b in NARROW_STAGES] +
            [(f"{wg} loop back (P V done -> next top)", (slot, 0, 4), (slot, 1, 0))]]
    return rows + [(f"producer warp {n}: {name}", (slot, 0, a), (slot, 0, b))
                   for n, slot in producers
                   for name, a, b in (("wait for the buffer (top -> free)", 0, 1), ("issue (free -> issued)", 1, 2),
                                      ("landing (issued -> all its copies landed)", 2, 3))]


NARROW = narrow_rows((("consumer", WG0),), ((0, NPR0), (4, NPR4))) + [
    ("producer warp 0: loop back (landed -> next top)", (NPR0, 0, 3), (NPR0, 1, 0)),
    ("tile k: producer 0 issued -> consumer saw it landed", (NPR0, 0, 2), (WG0, 0, 1)),
    ("tile k: producer 0 landed -> consumer saw it landed", (NPR0, 0, 3), (WG0, 0, 1)),
    ("tile k+2 issued (producer 0) after tile k's P V done", (WG0, 0, 4), (NPR0, 2, 2)),
]
# the bf16 narrow kernel with two consumer warpgroups (sm90/narrow_kernel.cuh, SplitConsumer; --consumers 2):
# slots 0 and 1 the two consumer warpgroups' first warps, 2 and 3 the producers' first and third warps; their
# stage "S" includes the partial S^T's hand-over
NARROW2 = narrow_rows((("consumer 0", WG0), ("consumer 1", WG1)), ((0, PR0), (2, PR1))) + [
    ("tile k: producer 0 landed -> consumer 0 saw it landed", (PR0, 0, 3), (WG0, 0, 1)),
    ("tile k+2 issued (producer 0) after consumer 0's P V done", (WG0, 0, 4), (PR0, 2, 2)),
]
# Edge rows (step EDGE): the prologue (a wide kernel's tiles, or the pair kernel's own events: PAIR_PROLOGUE), then
# the epilogue, the same events in both kernels.
PROLOGUE = [
    ("prologue: start -> tile 0 issued (producer warp 0)", (PR0, None, 0), (PR0, None, 8)),
    ("prologue: start -> the scan's index loads back (WG0's first warp)", (WG0, None, 0), (WG0, None, 11)),
    ("prologue: start -> tile scan done", (WG0, None, 0), (WG0, None, 1)),
    ("prologue: start -> Q landed (WG0)", (WG0, None, 0), (WG0, None, 4)),
    ("prologue: start -> tile 0 landed (producer warp 0)", (PR0, None, 0), (PR0, 0, 3)),
    ("prologue: start -> WG0 saw tile 0 landed", (WG0, None, 0), (WG0, 0, 1)),
    ("prologue: start -> tile 0's S done (WG0)", (WG0, None, 0), (WG0, 0, 2)),
    ("prologue: start -> tile 1's top (WG0)", (WG0, None, 0), (WG0, 1, 0)),
]
# the pair kernel's (PairEv and the producer's events in sm90/pair_kernel.cuh; edge event 8: the speculated tile 0
# issued, SMLA_SM90P_SPECULATE)
PAIR_PROLOGUE = [
    ("prologue: start -> speculated tile 0 issued (producer warp 0)", (PR0, None, 0), (PR0, None, 8)),
    ("prologue: start -> Q's TMA issued (thread 0)", (WG0, None, 0), (WG0, None, 10)),
    ("prologue: start -> the scan's index loads back (WG0's first warp)", (WG0, None, 0), (WG0, None, 11)),
    ("prologue: start -> tile scan done (WG0)", (WG0, None, 0), (WG0, None, 1)),
    ("prologue: start -> tile scan done (producer warp 0)", (PR0, None, 0), (PR0, None, 1)),
    ("prologue: start -> Q landed (WG0)", (WG0, None, 0), (WG0, None, 4)),
    ("prologue: Q's TMA issued -> Q landed (WG0)", (WG0, None, 10), (WG0, None, 4)),
    ("prologue: start -> buffer 0 early region issued (producer)", (PR0, None, 0), (PR0, 0, 2)),
    ("prologue: start -> buffer 1 late region issued (producer)", (PR0, None, 0), (PR0, 0, 8)),
    ("prologue: start -> pair 0's top (WG0: tile 0's S done)", (WG0, None, 0), (WG0, 0, 0)),
    ("prologue: start -> pair 0's top (WG1: tile 1's S done)", (WG1, None, 0), (WG1, 0, 0)),
    ("prologue: start -> pair 1's top (WG0)", (WG0, None, 0), (WG0, 1, 0)),
]
EPILOGUE = [
    ("epilogue WG0", (WG0, None, 2), (WG0, None, 3)),
    ("epilogue WG1", (WG1, None, 2), (WG1, None, 3)),
] + [(f"epilogue {wg}: {name}", (slot, None, a), (slot, None, b))
     for wg, slot in (("WG0", WG0), ("WG1", WG1))
     for name, a, b in (("start -> row statistics met", 2, 5), ("statistics -> row factors ready", 5, 6),
                        ("factors -> first block met", 6, 7), ("first block met -> stores issued", 7, 9),
                        ("stores issued -> end (the stats writer: lse, max_logits)", 9, 3))] + [
    ("WG0 epilogue start -> WG1 epilogue start", (WG0, None, 2), (WG1, None, 2)),
    ("whole CTA (WG0 start -> WG1 end)", (WG0, None, 0), (WG1, None, 3)),
]


def intervals(t, a, b, k):
    """Per CTA of t, the cycles from point a of step k to point b (a point: (slot, step offset or None for the edge
    step, event)); CTAs that did not record both are left out."""
    out = []
    for c in t:
        ka = EDGE if a[1] is None else k + a[1]
        kb = EDGE if b[1] is None else k + b[1]
        if ka >= STEPS or kb >= STEPS:
            continue
        va, vb = c[a[0]][ka][a[2]], c[b[0]][kb][b[2]]
        if va and vb:
            out.append(vb - va)
    return out


def summarize(t, kernel):
    """Lines of mean intervals from the [CTAS][SLOTS][STEPS][EVENTS] timestamps t (0: not recorded); the
    first line says over what. [] when nothing was recorded."""
    steps = [k for c in t for k in range(EDGE) if c[WG0][k][0]]
    edges = any(c[WG0][EDGE][0] for c in t)
    if not steps and not edges:
        return []
    nsteps = max(steps) + 1 if steps else 0
    lo, hi = 2, nsteps - 3  # steady state: skip the first two and the last steps
    lines = [f"{nsteps} steps a CTA, means over steps {lo}..{hi - 1} of {len(t)} CTAs, SM cycles (us at 1.8 GHz)"
             if steps else f"no step stamps (a SMLA_TRACE_EDGE_ONLY build): the edge intervals of {len(t)} CTAs only"]

    for label, a, b in ({"sm90p": PAIR, "sm90t": TRI, "sm90d": DIMS, "sm90n": NARROW, "sm90n2": NARROW2}.get(kernel, WIDE)
                        if steps else []):
        vals = [v for k in range(lo, hi) for v in intervals(t, a, b, k)]
        if vals:
            m = sum(vals) / len(vals)
            lines.append(f"{label:<56} {m:>9.0f} cyc {m / 1800:>7.3f} us   (min {min(vals)}, max {max(vals)}, n {len(vals)})")
        else:
            lines.append(f"{label:<56}  (not recorded)")
    for label, a, b in (PAIR_PROLOGUE if kernel == "sm90p" else PROLOGUE) + EPILOGUE:
        vals = intervals(t, a, b, 0)
        if vals:
            m = sum(vals) / len(vals)
            lines.append(f"{label:<56} {m:>9.0f} cyc {m / 1800:>7.3f} us")
    if kernel != "sm90":
        return lines
    # the wide kernel's last tile (each CTA's own last recorded step) into the epilogue
    for label, (sa, ea), (sb, eb) in LAST:
        vals = []
        for c in t:
            n = max([k for k in range(EDGE) if c[WG0][k][0]], default=-1)
            if n < 0:
                continue
            va = c[sa][n][ea] if ea is not None else c[sa][EDGE][0]
            vb = c[sb][EDGE][eb]
            if va and vb:
                vals.append(vb - va)
        if vals:
            m = sum(vals) / len(vals)
            lines.append(f"{label:<56} {m:>9.0f} cyc {m / 1800:>7.3f} us")
    return lines


def per_step(t, k0, k1):
    """The wide kernel's schedule step by step (steps k0 .. k1 - 1, means over the CTAs that recorded them; columns:
    rows of WIDE): in the persistent kernel (SMLA_SM90_PERSISTENT) a step is a K ring use, so an item boundary shows
    as one step. (Its prologue / epilogue rows in summarize then mix items.)"""
    names = ("WG0 period", "WG0 K wait", "WG0 S", "WG1 P wait", "prod free wait", "prod issue", "prod landing")
    cols = [WIDE[i] for i in (0, 1, 2, 7, 10, 11, 12)]
    lines = ["step " + "".join(f"{name:>15}" for name in names)]
    for k in range(k0, min(k1, EDGE - 1)):
        row = []
        for _, a, b in cols:
            vals = intervals(t, a, b, k)
            row.append(f"{sum(vals) / len(vals):>15.0f}" if vals else f"{'-':>15}")
        lines.append(f"{k:>4} " + "".join(row))
    return lines


# (label, (slot, event of the last tile), (slot, edge event)): the wide kernel's last tile and epilogue
LAST = [
    ("last tile: WG0 top -> WG0 epilogue start", (WG0, 0), (WG0, 2)),
    ("last tile: WG0 P V done -> WG0 epilogue start", (WG0, 5), (WG0, 2)),
    ("last tile: WG1 P V done -> WG1 epilogue start", (WG1, 2), (WG1, 2)),
    ("last tile: WG1 P V done -> WG1 end", (WG1, 2), (WG1, 3)),
]


def cta_times(all_rows):
    """When (the global timer, us from the earliest of them) and where (SM) the first 16 CTAs of a wave in the middle of
    the grid ran (sm90/trace.cuh, kTraceAllCtas): CTAs of one wave that start within a few us of each other run their
    boundaries (Q, indices, output) in step."""
    n = sum(1 for r in all_rows if r[0] and r[1])
    sms = len(set(r[2] for r in all_rows if r[0] and r[1])) or 1
    k0 = n // 2 // sms * sms  # a wave's first CTA (one CTA an SM): 3,960 for h=128, s_q 4096 on 132 SMs
    rows = [(s, e, sm) for s, e, sm, _ in all_rows[k0:k0 + 16] if s and e]
    if not rows:
        return []
    t0 = min(r[0] for r in rows)
    starts = sorted((r[0] - t0) / 1000 for r in rows)
    lines = [f"CTAs {k0}..{k0 + 15} (start us, run us, SM): "
             + ", ".join(f"({(s - t0) / 1000:.1f}, {(e - s) / 1000:.1f}, {sm})" for s, e, sm in rows)]
    lines.append(f"CTA starts: spread {starts[-1] - starts[0]:.1f} us over {len(rows)} CTAs, "
                 f"mean run {sum(e - s for s, e, _ in rows) / len(rows) / 1000:.1f} us")
    return lines


def crowd(starts_us):
    """The mean number of other CTAs that start in the same microsecond as a CTA (1-us bins): ~1-2 where the SMs'
    CTA boundaries are spread over time, up to the SM count where every SM starts its next CTA at once."""
    bins = {}
    for s in starts_us:
        bins[int(s)] = bins.get(int(s), 0) + 1
    n = sum(bins.values())
    return sum(c * c for c in bins.values()) / n - 1 if n else 0.0


def grid_times(all_rows):
    """The whole grid's start and end times (sm90/trace.cuh, kTraceAllCtas): how crowded the CTA starts are in the
    first wave, the middle half of the call and its last tenth, and the CTAs' run times there."""
    rows = [(s, e, sm) for s, e, sm, _ in all_rows if s and e]
    if not rows:
        return []
    t0 = min(r[0] for r in rows)
    t1 = max(r[1] for r in rows)
    span = (t1 - t0) / 1000
    lines = [f"grid: {len(rows)} CTAs on {len(set(r[2] for r in rows))} SMs, {span:.1f} us from the first start "
             "to the last end"]
    parts = (("first tenth", 0.0, 0.1), ("middle half", 0.25, 0.75), ("last tenth", 0.9, 1.0))
    for name, a, b in parts:
        sel = [r for r in rows if a * span <= (r[0] - t0) / 1000 < b * span]
        if not sel:
            continue
        runs = sorted((e - s) / 1000 for s, e, _ in sel)
        lines.append(f"grid, CTAs starting in the {name}: {len(sel)}, crowd {crowd([(s - t0) / 1000 for s, _, _ in sel]):.1f}"
                     f" (other CTAs starting in the same us), run us min / median / max {runs[0]:.1f} / "
                     f"{runs[len(runs) // 2]:.1f} / {runs[-1]:.1f}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="sm90", choices=["sm90", "sm90p", "sm90t", "sm90d", "sm90n"])
    ap.add_argument("--precision", default="fast", choices=["fast", "high"])
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--s-kv", type=int, default=32768)
    ap.add_argument("--consumers", type=int, choices=[1, 2],
                    help="sm90n: the kernel's consumer warpgroups, by default its rule (sm90/narrow_plan.cuh, "
                         "bf16_consumers: two at h 17-32 in \"high\"); 2 for a build with SMLA_NARROW_BF16_CW=2")
    ap.add_argument("--ablate", type=int, default=0, help="the ablation variant traced (SMLA_ATTN_ABLATE; 0: the full kernel)")
    ap.add_argument("--stagger-ns", type=int, default=0,
                    help="the first wave's start spread of the bf16 wide and pair kernels (SMLA_ATTN_STAGGER_NS, "
                         "sm90/plan.cuh: stagger_start); 0: none")
    ap.add_argument("--jitter-ns", type=int, default=0,
                    help="each CTA's pseudo-random start delay below this (SMLA_ATTN_JITTER_NS, the same kernels); 0: none")
    ap.add_argument("--steps", default="", help="A-B: the wide kernel's steps A .. B - 1 one by one (per_step)")
    args = ap.parse_args()
    gpu = open_gpu("trace_attn", args.kernel)
    if gpu is None:
        return 0
    torch, smla = gpu
    if not smla.build_info().get("ablation"):
        print("not a profiling build (smla.build_info()['ablation'] is False): rebuild with SMLA_PROFILE_BUILD=1")
        return 1
    buf = torch.zeros(CTAS * SLOTS * STEPS * EVENTS + 4 * ALL_CTAS, dtype=torch.int64, device="cuda")
    h = args.h
    if args.kernel == "sm90d":  # the decode benchmark's s_q=1, b=128 case on the fp8 cache, at most 16 heads
        h, b = min(args.h, 16), 128
        case = f"decode h={h}, s_q=1, b={b}"
        cache, bt = bd.build_cache(torch, smla, b, "fp8_ds_mla")
        q = torch.randn((b, 1, h, 576), device="cuda").to(torch.bfloat16)
        idx = bd.make_indices(torch, bt, b, 1, seed=1)
        os.environ["SMLA_ATTN_KERNEL"] = "sm90d"

        def call():
            return smla.sparse_mla_decode(q, cache, idx, softmax_scale=bd.SCALE, kv_cache_dtype="fp8_ds_mla",
                                          precision=args.precision)
    else:
        kv = torch.randn((args.s_kv, 576), device="cuda").to(torch.bfloat16)
        idx = bp.make_indices(torch, args.s_kv, seed=2)
        q = torch.randn((bp.S_Q, h, 576), device="cuda").to(torch.bfloat16)
        case = f"prefill h={h}, s_kv={args.s_kv}"

        def call():
            return smla.sparse_mla_prefill(q, kv, idx, softmax_scale=bp.SCALE, precision=args.precision)

    os.environ["SMLA_ATTN_ABLATE"] = str(args.ablate)
    os.environ["SMLA_ATTN_STAGGER_NS"] = str(args.stagger_ns)
    os.environ["SMLA_ATTN_JITTER_NS"] = str(args.jitter_ns)
    call()
    torch.cuda.synchronize()
    os.environ["SMLA_ATTN_TRACE"] = str(buf.data_ptr())
    try:
        call()
        torch.cuda.synchronize()
    finally:
        del os.environ["SMLA_ATTN_TRACE"]
    flat = buf.cpu()
    t = flat[:CTAS * SLOTS * STEPS * EVENTS].view(CTAS, SLOTS, STEPS, EVENTS).tolist()
    all_rows = flat[CTAS * SLOTS * STEPS * EVENTS:].view(ALL_CTAS, 4).tolist()
    consumers = args.consumers or (2 if 16 < h <= 32 and args.precision == "high" else 1)
    lines = summarize(t, "sm90n2" if args.kernel == "sm90n" and consumers == 2 else args.kernel)
    if not lines:
        print("nothing recorded")
        return 1
    print(f"# kernel {args.kernel}, {case}, {args.precision}, ablation {args.ablate}, stagger {args.stagger_ns} ns, "
          f"jitter {args.jitter_ns} ns; "
          + lines[0])
    print("\n".join(lines[1:]))
    print("\n".join(cta_times(all_rows) + grid_times(all_rows)))
    if args.steps and args.kernel == "sm90":
        k0, k1 = (int(x) for x in args.steps.split("-"))
        print("\n".join(per_step(t, k0, k1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
