"""Benchmark the CPU sparse MLA kernels against a straightforward NumPy implementation and the machine.

Measures, all in one process and one run:
  - peak: a tight FMA loop (fp32, the widest of AVX-512F / AVX2+FMA this CPU has) in a small C file
    compiled here with the system cc and loaded with ctypes, run on as many threads as smla uses
    (and a vdpbf16ps loop where AVX512_BF16 exists); without a C compiler, a large NumPy float32
    matmul stands in (said so in the output);
  - memory bandwidth: a NumPy copy of 512 MiB (bytes read + bytes written over the time);
  - sparse_mla_decode at h = 16, 64, 128, topk 2048, s_q 1, b = 1..32, fp8_ds_mla and bf16 caches:
    every request owns CTX cached tokens on shuffled blocks (block_size 64, written by pack_kv) and
    each query token picks 2048 distinct random positions of its request; precision "high" and "fast"
    (docs/design.md section 4: "fast" rounds P to bf16 for P*V where the level has bf16 dot products);
  - sparse_mla_prefill at s_q 256 (--quick: 64), h 128, topk 2048 over a bf16 kv of 8192 rows, both
    precisions;
  - pack_kv (16K tokens to random slots), gather_upconvert (16K rows) and convert_topk_indices
    (4096 x 2048, block_size 64) in GB/s (bytes read + written), against the same op forced onto the
    portable path on one thread (SMLA_CPU_ISA=portable, SMLA_NUM_THREADS=1) and the copy bandwidth.
GFLOP/s counts 2 * tokens * h * topk * (576 + 512). "x numpy" is the NumPy version's time over
smla's (gather + dequantise + float32 matmul + softmax + matmul, per query token, with NumPy's BLAS
threads). Two ceilings, both measured in the run: the fp32 FMA rate and the vdpbf16ps rate; "% path"
is smla's GFLOP/s over the rate of the instruction the level that ran multiplies with (vdpbf16ps on
the avx512bf16 level, FMA otherwise), "% fma" and "% bf16" over each ceiling. "read ms" is the time the
step's unique cache rows take to read at the copy bandwidth, "x read" smla's time over it (the memory
bound); "bound ms" is the larger of that and the flops at the path's rate (the roofline), "x bound"
smla's time over it.

--stages (a profiling build, SMLA_PROFILE_BUILD=1, whose CPU attention can leave stages out:
SMLA_ATTN_ABLATE) times decode h=128 / h=16 at b=8 and the prefill with each stage left out in turn and
prints what each stage costs (full time minus the time without it): the dequantisation of K rows, the
scores, the softmax, P*V and "fast"'s V row pairs. Perf counters are not available on every machine;
these are the benchmark's own stage timings.
Times are the best of the repeats (about a second of calls per shape; the machine may be shared: the
load average and the busiest other processes before and after the run are printed and stored).
Outputs are preallocated.

    python benchmarks/bench_cpu.py [--quick] [--stages] [--json out.json] [--threads N] [--isa avx2]
"""
import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import ml_dtypes
import numpy as np

import smla

BF16 = ml_dtypes.bfloat16
PRECISIONS = ("high", "fast")
TOPK = 2048
CTX = 4096
BLOCK = 64
SCALE = 576 ** -0.5

PEAK_C = r"""
#include <immintrin.h>
/* n iterations of 12 independent FMA chains; returns the flops executed */
__attribute__((target("avx2,fma"))) double fma_avx2(long n, float *sink)
{
    __m256 a[12], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    *sink = s[0];
    return (double)n * 12 * 8 * 2;
}
__attribute__((target("avx512f"))) double fma_avx512(long n, float *sink)
{
    __m512 a[16], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    }
    __m512 s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, a[i]);
    *sink = s[0];
    return (double)n * 16 * 16 * 2;
}
__attribute__((target("avx512f,avx512bw,avx512bf16"))) double dpbf16(long n, float *sink)
{
    __m512 a[16];
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    }
    __m512 s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, a[i]);
    *sink = s[0];
    return (double)n * 16 * 32 * 2;
}
int has(int which)
{
    __builtin_cpu_init();
    if (which == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (which == 1) return __builtin_cpu_supports("avx512f");
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}
"""


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few shapes, fewer repeats")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--threads", type=int, default=0, help="SMLA_NUM_THREADS (default: as set, else all CPUs)")
    ap.add_argument("--isa", default="", help="SMLA_CPU_ISA for the run (default: as set, else smla's default level)")
    ap.add_argument("--no-numpy", action="store_true", help="skip the NumPy baseline")
    ap.add_argument("--stages", action="store_true",
                    help="stage timings of the attention kernels (needs a SMLA_PROFILE_BUILD=1 build)")
    return ap.parse_args()


def busy_processes():
    """Load average and the busiest other processes: the machine may be shared."""
    try:
        ps = subprocess.run(["ps", "-eo", "pcpu,pid,comm", "--sort=-pcpu"], capture_output=True, text=True,
                            timeout=10).stdout.splitlines()[1:]
    except (OSError, subprocess.SubprocessError):
        ps = []
    mine = str(os.getpid())
    others = [" ".join(line.split()) for line in ps if line.split()[1:2] != [mine] and line.split()[2:3] != ["ps"]]
    return {"loadavg": [round(v, 2) for v in os.getloadavg()], "top": [p for p in others[:5]]}


def best_of(fn, reps, warmup=1, budget_s=0.0):
    """Best and median of reps timed calls (more, up to 30, while they fit in budget_s seconds)."""
    for _ in range(warmup):
        fn()
    ts = []
    while len(ts) < reps or (len(ts) < 30 and sum(ts) + (ts[-1] if ts else 0) < budget_s):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts), statistics.median(ts)


# ---------------------------------------------------------------------------------------------
# the machine
# ---------------------------------------------------------------------------------------------

def load_peak_lib(tmp):
    src, lib = os.path.join(tmp, "peak.c"), os.path.join(tmp, "peak.so")
    with open(src, "w") as f:
        f.write(PEAK_C)
    cc = os.environ.get("CC", "cc")
    try:
        subprocess.run([cc, "-O3", "-shared", "-fPIC", src, "-o", lib], check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    so = ctypes.CDLL(lib)
    for name in ("fma_avx2", "fma_avx512", "dpbf16"):
        getattr(so, name).restype = ctypes.c_double
        getattr(so, name).argtypes = [ctypes.c_long, ctypes.POINTER(ctypes.c_float)]
    return so


def threaded_rate(fn, nthreads, n, reps=5):
    """FLOP/s of fn(n) run on nthreads threads at once (ctypes releases the GIL)."""
    best = 0.0
    for _ in range(reps):
        flops = [0.0] * nthreads
        sinks = [ctypes.c_float() for _ in range(nthreads)]

        def run(i):
            flops[i] = fn(n, ctypes.byref(sinks[i]))

        ts = [threading.Thread(target=run, args=(i,)) for i in range(nthreads)]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        best = max(best, sum(flops) / (time.perf_counter() - t))
    return best


def measure_peak(nthreads, tmp):
    so = load_peak_lib(tmp)
    res = {}
    if so is not None and so.has(0):
        if so.has(1):
            res["fma_gflops"], res["fma_isa"] = threaded_rate(so.fma_avx512, nthreads, 20_000_000) / 1e9, "avx512f"
        else:
            res["fma_gflops"], res["fma_isa"] = threaded_rate(so.fma_avx2, nthreads, 30_000_000) / 1e9, "avx2+fma"
        if so.has(2):
            res["dpbf16_gflops"] = threaded_rate(so.dpbf16, nthreads, 20_000_000) / 1e9
        res["peak_source"] = "C FMA loop (cc + ctypes)"
    a = np.random.default_rng(0).standard_normal((3072, 3072), dtype=np.float32)
    t, _ = best_of(lambda: a @ a, 3)
    res["numpy_sgemm_gflops"] = 2 * 3072 ** 3 / t / 1e9
    if "fma_gflops" not in res:
        res["fma_gflops"], res["fma_isa"] = res["numpy_sgemm_gflops"], "numpy sgemm"
        res["peak_source"] = "NumPy float32 matmul (no C compiler or no AVX2)"
    return res


def measure_bandwidth():
    src = np.ones(512 << 20, np.uint8)
    dst = np.empty_like(src)
    t, _ = best_of(lambda: np.copyto(dst, src), 5)
    return 2 * src.nbytes / t / 1e9


# ---------------------------------------------------------------------------------------------
# cases and the NumPy implementation
# ---------------------------------------------------------------------------------------------

E4M3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def decode_case(cd, b, h, rng):
    nblk = CTX // BLOCK
    num_blocks = b * nblk
    cache = np.zeros(smla.kv_cache_shape(num_blocks, BLOCK, cd), np.uint8 if cd == "fp8_ds_mla" else BF16)
    perm = rng.permutation(num_blocks).astype(np.int64)
    pos = np.arange(CTX)
    slots = np.concatenate([perm[r * nblk + pos // BLOCK] * BLOCK + pos % BLOCK for r in range(b)])
    kv_c = rng.standard_normal((slots.size, 512), dtype=np.float32).astype(BF16)
    k_pe = rng.standard_normal((slots.size, 64), dtype=np.float32).astype(BF16)
    smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
    idx = np.stack([slots[r * CTX + rng.choice(CTX, TOPK, replace=False)] for r in range(b)]).astype(np.int32)
    q = rng.standard_normal((b, 1, h, 576), dtype=np.float32).astype(BF16)
    return q, cache, idx.reshape(b, 1, TOPK)


def numpy_rows(cache, cd, slots):
    """float32 K rows [n, 576] of these slots (dequantised as the cache format says)."""
    if cd == "bf16":
        return cache.reshape(-1, 576)[slots].astype(np.float32)
    e = cache.reshape(-1, 656)[slots]
    scales = np.ascontiguousarray(e[:, 512:528]).view(np.float32)
    lat = (E4M3[e[:, :512]].reshape(-1, 4, 128) * scales[:, :, None]).reshape(-1, 512)
    pe = np.ascontiguousarray(e[:, 528:]).view(BF16).astype(np.float32)
    return np.concatenate([lat, pe], axis=1)


def numpy_attention(q, k, scale):
    """q [h, 576] float32, k [n, 576] float32 -> out [h, 512], lse [h]."""
    s = (q @ k.T) * scale
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=1, keepdims=True)
    return (p @ k[:, :512]) / l, (m + np.log(l))[:, 0]


def numpy_decode(q, cache, idx, cd):
    b, s_q = idx.shape[:2]
    qf = q.astype(np.float32)
    for bi in range(b):
        for si in range(s_q):
            numpy_attention(qf[bi, si], numpy_rows(cache, cd, idx[bi, si]), SCALE)


def numpy_prefill(q, kv, idx):
    qf = q.astype(np.float32)
    for i in range(idx.shape[0]):
        numpy_attention(qf[i], kv[idx[i]].astype(np.float32), SCALE)


# ---------------------------------------------------------------------------------------------

def memory_ops(rng, reps, budget):
    """pack_kv / gather_upconvert / convert_topk_indices: the run's path and threads, then the portable
    path on one thread, in the same process."""
    t_tok = 16384
    kv_c = rng.standard_normal((t_tok, 512), dtype=np.float32).astype(BF16)
    k_pe = rng.standard_normal((t_tok, 64), dtype=np.float32).astype(BF16)
    cases = []
    for cd in ("fp8_ds_mla", "bf16"):
        cache = np.zeros(smla.kv_cache_shape(t_tok // BLOCK, BLOCK, cd), np.uint8 if cd == "fp8_ds_mla" else BF16)
        entry = cache.shape[2] * cache.itemsize
        slots = rng.permutation(t_tok).astype(np.int64)
        cases.append((f"pack_kv {cd} 16K tokens", t_tok * (1152 + 8 + entry),
                      lambda cache=cache, slots=slots, cd=cd:
                      smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)))
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
        ws = np.empty((t_tok, 576), BF16)
        bt = rng.permutation(t_tok // BLOCK).astype(np.int32).reshape(1, -1)
        lens, starts = np.array([t_tok], np.int32), np.array([0], np.int32)
        cases.append((f"gather_upconvert {cd} 16K rows", t_tok * (entry + 1152),
                      lambda cache=cache, ws=ws, bt=bt, lens=lens, starts=starts, cd=cd:
                      smla.gather_upconvert(cache, ws, bt, lens, starts, kv_cache_dtype=cd)))
    n, k = 4096, TOPK
    req = np.zeros(n, np.int32)
    bt = rng.permutation(2048).astype(np.int32).reshape(1, -1)
    tok = rng.integers(-1, 2048 * BLOCK, (n, k)).astype(np.int32)
    out, counts = np.empty((n, k), np.int32), np.empty(n, np.int32)
    cases.append(("convert_topk_indices 4096x2048", n * k * 8,
                  lambda: smla.convert_topk_indices(req, bt, tok, block_size=BLOCK, out=out, valid_counts=counts,
                                                    return_valid_counts=True)))
    res = []
    for name, nbytes, f in cases:
        t, _ = best_of(f, reps, budget_s=budget / 3)
        saved = {v: os.environ.get(v) for v in ("SMLA_CPU_ISA", "SMLA_NUM_THREADS")}
        os.environ.update(SMLA_CPU_ISA="portable", SMLA_NUM_THREADS="1")
        tp, _ = best_of(f, max(2, reps // 2), budget_s=budget / 3)
        for v, old in saved.items():
            if old is None:
                os.environ.pop(v)
            else:
                os.environ[v] = old
        res.append(dict(op=name, ms=t * 1e3, gbps=nbytes / t / 1e9, portable_ms=tp * 1e3))
        print(f"  {name}: {t * 1e3:.2f} ms (portable, one thread: {tp * 1e3:.2f} ms)", flush=True)
    return res


# SMLA_ATTN_ABLATE bits (csrc/cpu/sparse_mla_attention.c, ATTN_ABL_*) and what leaving each out removes
STAGES = [(1, "dequant"), (2, "scores"), (4, "softmax"), (8, "P*V"), (16, "V pairs")]


def stages(rng, reps, budget):
    """Each attention stage's cost: the full time minus the time with that stage left out (a profiling
    build; the outputs of the ablated calls are wrong by design)."""
    if not smla.build_info().get("ablation"):
        print("stages: this build cannot leave stages out; build with SMLA_PROFILE_BUILD=1 "
              "(SMLA_CUDA=0 SMLA_PROFILE_BUILD=1 python setup.py build_ext --inplace)")
        return None
    cases = []
    for h in (128, 16):
        q, cache, idx = decode_case("fp8_ds_mla", 8, h, rng)
        out, lse = np.empty((8, 1, h, 512), BF16), np.empty((8, 1, h), np.float32)
        cases.append((f"decode fp8 h={h} b=8",
                      lambda prec, q=q, cache=cache, idx=idx, out=out, lse=lse: smla.sparse_mla_decode(
                          q, cache, idx, softmax_scale=SCALE, kv_cache_dtype="fp8_ds_mla", out=out, lse=lse,
                          precision=prec)))
    s_q, s_kv = 64, 8192
    kv = rng.standard_normal((s_kv, 576), dtype=np.float32).astype(BF16)
    pidx = np.stack([rng.choice(s_kv, TOPK, replace=False) for _ in range(s_q)]).astype(np.int32)
    pq = rng.standard_normal((s_q, 128, 576), dtype=np.float32).astype(BF16)
    pout, plse = np.empty((s_q, 128, 512), BF16), np.empty((s_q, 128), np.float32)
    cases.append(("prefill bf16 h=128 64", lambda prec: smla.sparse_mla_prefill(
        pq, kv, pidx, softmax_scale=SCALE, out=pout, lse=plse, precision=prec)))
    res, saved = [], os.environ.get("SMLA_ATTN_ABLATE")
    print(f"{'stages (ms)':22s} {'prec':4s} {'full':>8s} " + " ".join(f"{n:>8s}" for _, n in STAGES)
          + f" {'rest':>8s}   (a stage: full minus the time without it; rest: full minus all of them)")
    try:
        for name, f in cases:
            for prec in PRECISIONS:
                times = {}
                for bits in [0] + [b for b, _ in STAGES]:
                    os.environ["SMLA_ATTN_ABLATE"] = str(bits)
                    times[bits], _ = best_of(lambda: f(prec), reps, budget_s=budget)
                full = times[0] * 1e3
                cost = {n: full - times[b] * 1e3 for b, n in STAGES}
                res.append(dict(case=name, precision=prec, full_ms=full, **{n + "_ms": v for n, v in cost.items()}))
                print(f"{name:22s} {prec:4s} {full:8.2f} " + " ".join(f"{cost[n]:8.2f}" for _, n in STAGES)
                      + f" {full - sum(cost.values()):8.2f}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("SMLA_ATTN_ABLATE", None)
        else:
            os.environ["SMLA_ATTN_ABLATE"] = saved
    return res


def print_table(rows):
    print(f"{'op':8s} {'cache':10s} {'prec':4s} {'h':>4s} {'b/s_q':>6s} {'ms':>9s} {'GFLOP/s':>8s} {'% path':>7s} "
          f"{'% fma':>6s} {'% bf16':>7s} {'numpy ms':>9s} {'x numpy':>8s} {'read ms':>8s} {'x read':>7s} "
          f"{'bound ms':>9s} {'x bound':>8s}")
    for r in rows:
        print(f"{r['op']:8s} {r['cache']:10s} {r['precision']:4s} {r['h']:4d} {r['tokens']:6d} {r['ms']:9.2f} "
              f"{r['gflops']:8.1f} {r['pct_path']:6.1f}% {r['pct_fma']:5.1f}% "
              + (f"{r['pct_bf16']:6.1f}% " if "pct_bf16" in r else f"{'-':>7s} ")
              + (f"{r['numpy_ms']:9.1f} {r['x_numpy']:8.1f} " if "numpy_ms" in r else f"{'-':>9s} {'-':>8s} ")
              + f"{r['read_ms']:8.2f} {r['x_read']:7.2f} {r['bound_ms']:9.2f} {r['x_bound']:8.2f}")


def path_peak(peak, isa):
    """The rate of the instruction the attention level `isa` multiplies with, and its name."""
    if isa == "avx512bf16" and "dpbf16_gflops" in peak:
        return peak["dpbf16_gflops"], "vdpbf16ps"
    return peak["fma_gflops"], peak["fma_isa"] + " FMA"


def finish_rows(rows, peak, isa, bw):
    """Fractions of both ceilings and of the path's, and the roofline bound, from the run's best peak
    and bandwidth."""
    rate, _ = path_peak(peak, isa)
    for r in rows:
        r["pct_path"] = 100 * r["gflops"] / rate
        r["pct_fma"] = 100 * r["gflops"] / peak["fma_gflops"]
        if "dpbf16_gflops" in peak:
            r["pct_bf16"] = 100 * r["gflops"] / peak["dpbf16_gflops"]
        r["read_ms"] = r["unique_bytes"] / (bw * 1e9) * 1e3
        r["x_read"] = r["ms"] / r["read_ms"]
        r["bound_ms"] = max(r["read_ms"], r["flops"] / (rate * 1e9) * 1e3)
        r["x_bound"] = r["ms"] / r["bound_ms"]


def summary(res, peak, isa):
    """Issue 20's targets, against the path's rate (vdpbf16ps on the avx512bf16 level)."""
    rows, (rate, rate_name) = res["rows"], path_peak(peak, isa)

    def pick(op, h, prec, tokens=None):
        return [r for r in rows if r["op"] == op and r["h"] == h and r["precision"] == prec
                and (tokens is None or r["tokens"] in tokens)]

    t, parts = {}, []
    for prec, floor in (("fast", 75), ("high", 60)):
        sel = pick("decode", 128, prec, (1, 8))
        if sel:
            t[f"decode_h128_{prec}_min_pct_path"] = v = min(r["pct_path"] for r in sel)
            parts.append(f"decode h=128 {prec} >= {floor}%: min {v:.1f}% ({'met' if v >= floor else 'missed'})")
    sel = pick("prefill", 128, "fast")
    if sel:
        t["prefill_h128_fast_pct_path"] = v = min(r["pct_path"] for r in sel)
        parts.append(f"prefill h=128 fast >= 75%: {v:.1f}% ({'met' if v >= 75 else 'missed'})")
    for prec in ("fast", "high"):
        sel = pick("decode", 16, prec)
        if sel:
            t[f"decode_h16_{prec}_max_x_bound"] = v = max(r["x_bound"] for r in sel)
            parts.append(f"decode h=16 {prec} within 2x of max(read, flops at the path's rate): max {v:.2f}x "
                         f"({'met' if v <= 2 else 'missed'})")
    h128 = [r for r in rows if r["op"] == "decode" and r["h"] == 128 and "numpy_ms" in r]
    if h128:
        t["decode_h128_min_x_numpy"] = min(r["x_numpy"] for r in h128)
        parts.append(f"decode h=128 x numpy: min {t['decode_h128_min_x_numpy']:.1f}x")
    res["targets"] = t
    print(f"targets (% of {rate_name} {rate:.0f} GFLOP/s): " + "; ".join(parts))


def main():
    args = parse()
    if args.threads:
        os.environ["SMLA_NUM_THREADS"] = str(args.threads)
    if args.isa:
        os.environ["SMLA_CPU_ISA"] = args.isa
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    nthreads = int(os.environ.get("SMLA_NUM_THREADS", "0") or 0) or cpus
    rng = np.random.default_rng(0)
    reps, np_reps = (3, 1) if args.quick else (5, 2)
    budget = 0.5 if args.quick else 1.5

    res = {"machine": platform.processor() or platform.machine(), "cpus": cpus, "threads": nthreads,
           "isa": os.environ.get("SMLA_CPU_ISA") or f"default ({smla.build_info()['cpu_isa']})", "build": smla.build_info(),
           "busy_before": busy_processes()}
    tmp = tempfile.TemporaryDirectory()
    res["peak_before"] = measure_peak(nthreads, tmp.name)
    res["copy_gbps_before"] = measure_bandwidth()
    print(f"threads {nthreads} of {cpus} CPUs, SMLA_CPU_ISA={res['isa']}; "
          f"busy before: load {res['busy_before']['loadavg']}, top {res['busy_before']['top'][:3]}")

    rows = []

    def measure(op, cache, h, b, tokens, f, flops, uniq_bytes, numpy_fn):
        """f(precision) runs the op; one row per precision, NumPy's time (one run) next to both."""
        tn = None
        for prec in PRECISIONS:
            t, tmed = best_of(lambda: f(prec), reps, budget_s=budget)
            row = dict(op=op, cache=cache, precision=prec, h=h, b=b, tokens=tokens, ms=t * 1e3,
                       median_ms=tmed * 1e3, flops=flops, gflops=flops / t / 1e9, unique_bytes=uniq_bytes)
            if numpy_fn is not None:
                if tn is None:
                    tn, _ = best_of(numpy_fn, np_reps, warmup=0)
                    time.sleep(0.3)  # let NumPy's BLAS threads go back to sleep before smla runs again
                row["numpy_ms"], row["x_numpy"] = tn * 1e3, tn / t
            rows.append(row)
            print(f"  {op} {cache} {prec} h={h} tokens={tokens}: {t * 1e3:.2f} ms, {row['gflops']:.1f} GFLOP/s"
                  + (f", numpy {row['numpy_ms']:.1f} ms" if numpy_fn else ""), flush=True)

    heads = (16, 128) if args.quick else (16, 64, 128)
    batches = (1, 8) if args.quick else (1, 4, 16, 32)
    cds = ("fp8_ds_mla",) if args.quick else ("fp8_ds_mla", "bf16")
    for cd in cds:
        for h in heads:
            for b in batches:
                q, cache, idx = decode_case(cd, b, h, rng)
                out = np.empty((b, 1, h, 512), BF16)
                lse = np.empty((b, 1, h), np.float32)
                f = lambda prec: smla.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE, kv_cache_dtype=cd,
                                                        out=out, lse=lse, precision=prec)
                measure("decode", cd, h, b, b, f, 2 * b * h * TOPK * 1088,
                        np.unique(idx).size * cache.shape[2] * cache.itemsize,
                        None if args.no_numpy else (lambda: numpy_decode(q, cache, idx, cd)))
                del q, cache, idx

    s_q = 64 if args.quick else 256
    s_kv = 8192
    kv = rng.standard_normal((s_kv, 576), dtype=np.float32).astype(BF16)
    idx = np.stack([rng.choice(s_kv, TOPK, replace=False) for _ in range(s_q)]).astype(np.int32)
    q = rng.standard_normal((s_q, 128, 576), dtype=np.float32).astype(BF16)
    out, lse, ml = (np.empty((s_q, 128, 512), BF16), np.empty((s_q, 128), np.float32),
                    np.empty((s_q, 128), np.float32))
    f = lambda prec: smla.sparse_mla_prefill(q, kv, idx, softmax_scale=SCALE, out=out, lse=lse, max_logits=ml,
                                             precision=prec)
    measure("prefill", "bf16", 128, 1, s_q, f, 2 * s_q * 128 * TOPK * 1088, np.unique(idx).size * 576 * 2,
            None if args.no_numpy else (lambda: numpy_prefill(q, kv, idx)))

    mem = memory_ops(rng, reps, budget)

    # the machine again: a neighbour's burst may have hidden its peak or bandwidth the first time
    res["peak_after"] = measure_peak(nthreads, tmp.name)
    res["copy_gbps_after"] = measure_bandwidth()
    tmp.cleanup()
    res["busy_after"] = busy_processes()
    res["peak"] = max(res["peak_before"], res["peak_after"], key=lambda p: p["fma_gflops"])
    res["copy_gbps"] = max(res["copy_gbps_before"], res["copy_gbps_after"])
    peak, bw = res["peak"]["fma_gflops"], res["copy_gbps"]
    print(f"peak: {peak:.1f} GFLOP/s ({res['peak']['fma_isa']}, {res['peak']['peak_source']}; before "
          f"{res['peak_before']['fma_gflops']:.1f}, after {res['peak_after']['fma_gflops']:.1f})"
          + (f", vdpbf16ps {res['peak']['dpbf16_gflops']:.1f}" if "dpbf16_gflops" in res["peak"] else "")
          + f"; NumPy sgemm {res['peak']['numpy_sgemm_gflops']:.1f} GFLOP/s; copy {bw:.1f} GB/s "
          f"(read + written bytes)")
    print(f"busy after: load {res['busy_after']['loadavg']}, top {res['busy_after']['top'][:3]}")
    isa = smla.build_info()["cpu_isa"]
    finish_rows(rows, res["peak"], isa, bw)
    res["rows"] = rows
    print_table(rows)
    summary(res, res["peak"], isa)
    if args.stages:
        res["stages"] = stages(rng, reps, budget)
    res["memory_ops"] = mem
    print(f"{'memory op':34s} {'ms':>8s} {'GB/s':>7s} {'of copy':>8s} {'portable 1t ms':>15s} {'x portable':>11s}")
    for m in mem:
        print(f"{m['op']:34s} {m['ms']:8.2f} {m['gbps']:7.1f} {m['gbps'] / bw:8.2f} {m['portable_ms']:15.2f} "
              f"{m['portable_ms'] / m['ms']:11.1f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
