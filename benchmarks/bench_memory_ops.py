"""Benchmark the CUDA memory ops (pack_kv, unpack_kv, gather_upconvert, convert_topk_indices,
filter_convert_dcp_indices, merge_attn_states) against a torch device-to-device copy.

Bandwidth counts the bytes each op must read plus the bytes it writes (index arrays included), over
the CUDA-event time of CUDA-graph replays of many captured calls (GPU time; the host overhead of a
Python call is not in these figures). Calls rotate over enough copies of their buffers that
the working set is >= 3x the L2 (so small shapes measure DRAM, not L2); the copy baseline of the same
byte count rotates the same way, and "ratio" = op GB/s / copy GB/s measured in the same run (the issue
target is >= 0.7 at the large sizes). Small-size latencies are CUDA-graph replays of 20 captured
calls (warm L2, launch overhead amortised), per call.

    python benchmarks/bench_memory_ops.py [--quick] [--iters N] [--ops pack_kv,...] [--json benchmarks/results/memory_ops.json]
"""
import argparse
import json
import math
import os
import sys
import time

from _gpu import graph_replay_us  # benchmarks/_gpu.py (scripts run from this folder)

TARGET = 0.7
BLOCK = 64


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and iterations")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per shape (default 100, quick 30)")
    ap.add_argument("--ops", default="", help="comma-separated op names to measure (default: all)")
    ap.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                   "memory_ops.json"), help="where to write the results")
    return ap.parse_args()


class Bench:
    def __init__(self, torch, iters, warmup):
        self.torch = torch
        self.iters = iters
        self.warmup = warmup
        props = torch.cuda.get_device_properties(0)
        self.l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
        self.copy_cache = {}

    def sets_for(self, nbytes):
        """Copies of the buffers to rotate over so the working set is >= 3x the L2."""
        return 1 if nbytes >= 3 * self.l2 else min(64, math.ceil(3 * self.l2 / max(nbytes, 1)))

    def time_us(self, calls):
        """GPU time per call: the calls are captured once into a CUDA graph (every op is capturable)
        and the graph is replayed, so Python and launch overhead stay out of the bandwidth figures."""
        torch = self.torch
        for i in range(max(self.warmup, len(calls))):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        seq = calls * max(1, 20 // len(calls))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in seq:
                c()
        g.replay()
        torch.cuda.synchronize()
        reps = max(3, self.iters // len(seq))
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        del g
        return a.elapsed_time(b) * 1e3 / (reps * len(seq))

    def copy_gbps(self, nbytes):
        """torch D2D copy moving nbytes in total (nbytes/2 read + nbytes/2 written)."""
        key = nbytes
        if key not in self.copy_cache:
            torch = self.torch
            half = max(16, nbytes // 2)
            n = self.sets_for(nbytes)
            bufs = [(torch.empty(half, dtype=torch.uint8, device="cuda"),
                     torch.empty(half, dtype=torch.uint8, device="cuda")) for _ in range(n)]
            calls = [lambda d=d, s=s: d.copy_(s) for d, s in bufs]
            us = self.time_us(calls)
            self.copy_cache[key] = 2 * half / us * 1e-3
            del bufs, calls
            torch.cuda.empty_cache()
        return self.copy_cache[key]

    def bandwidth(self, make_call, nbytes):
        """make_call(i) -> a zero-argument call on the i-th buffer set. Returns (us, GB/s, copy GB/s)."""
        calls = [make_call(i) for i in range(self.sets_for(nbytes))]
        us = self.time_us(calls)
        del calls
        self.torch.cuda.empty_cache()
        return us, nbytes / us * 1e-3, self.copy_gbps(nbytes)

    def graph_latency_us(self, call):
        return graph_replay_us(self.torch, call, self.iters)


# ------------------------------------------------------------------------------------------- cases

def rand_bf16(torch, gen, shape, scale=1.0):
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)


def cache_of(torch, nb, cd):
    if cd == "fp8_ds_mla":
        return torch.zeros((nb, BLOCK, 656), dtype=torch.uint8, device="cuda")
    return torch.zeros((nb, BLOCK, 576), dtype=torch.bfloat16, device="cuda")


def entry_bytes(cd):
    return 656 if cd == "fp8_ds_mla" else 1152


def filled_cache(torch, smla, gen, nb, cd):
    cache = cache_of(torch, nb, cd)
    t = nb * BLOCK
    for t0 in range(0, t, 1 << 20):
        t1 = min(t, t0 + (1 << 20))
        smla.pack_kv(rand_bf16(torch, gen, (t1 - t0, 512), 3.0), rand_bf16(torch, gen, (t1 - t0, 64)), cache,
                     torch.arange(t0, t1, device="cuda"), kv_cache_dtype=cd)
    return cache


def pack_case(torch, smla, gen, t, cd):
    """t tokens scattered to random slots of a cache of t + 1 block (decode-like writes)."""
    nb = t // BLOCK + 2
    nbytes = t * (1024 + 128 + 8) + t * entry_bytes(cd)

    def make(i):
        kv_c, k_pe = rand_bf16(torch, gen, (t, 512), 3.0), rand_bf16(torch, gen, (t, 64))
        slots = torch.randperm(nb * BLOCK, generator=gen, device="cuda")[:t]
        cache = cache_of(torch, nb, cd)
        return lambda: smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)

    return make, nbytes


def unpack_case(torch, smla, gen, n, cd):
    nb = max(4, n // BLOCK)
    cache = filled_cache(torch, smla, gen, nb, cd)
    nbytes = n * (4 + entry_bytes(cd) + 1152)

    def make(i):
        slots = torch.randint(0, nb * BLOCK, (n,), generator=gen, device="cuda", dtype=torch.int32)
        out = torch.empty((n, 576), dtype=torch.bfloat16, device="cuda")
        return lambda: smla.unpack_kv(cache, slots, kv_cache_dtype=cd, out=out)

    return make, nbytes


def gather_case(torch, smla, gen, lens, cd):
    """Requests of the given lengths on shuffled blocks, gathered back to back into the workspace."""
    r = len(lens)
    m = max(-(-x // BLOCK) for x in lens)
    nb = r * m
    total = sum(lens)
    cache = filled_cache(torch, smla, gen, nb, cd)
    bt = torch.randperm(nb, generator=gen, device="cuda").to(torch.int32).view(r, m)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    starts = torch.cumsum(seq_lens, 0, dtype=torch.int32) - seq_lens
    nbytes = total * (entry_bytes(cd) + 1152) + r * m * 4

    def make(i):
        ws = torch.empty((total, 576), dtype=torch.bfloat16, device="cuda")
        return lambda: smla.gather_upconvert(cache, ws, bt, seq_lens, starts, kv_cache_dtype=cd)

    return make, nbytes


def convert_case(torch, smla, gen, n, k, dcp=None):
    """n rows of k request-local positions (valid prefix of 3/4 of the row) over 8 requests with
    32K-token contexts; counts returned."""
    r, ctx = 8, 32768
    m = ctx // BLOCK * (dcp or 1)
    bt = torch.randperm(r * m, generator=gen, device="cuda").to(torch.int32).view(r, m)
    req = torch.randint(0, r, (n,), generator=gen, device="cuda", dtype=torch.int32)
    nbytes = n * k * 4 * 2 + n * 8

    def make(i):
        tok = torch.randint(0, ctx, (n, k), generator=gen, device="cuda", dtype=torch.int32)
        tok[:, 3 * k // 4:] = -1
        out = torch.empty_like(tok)
        cnt = torch.empty((n,), dtype=torch.int32, device="cuda")
        if dcp:
            return lambda: smla.filter_convert_dcp_indices(req, bt, tok, block_size=BLOCK, dcp_size=dcp,
                                                           dcp_rank=dcp - 1, out=out, valid_counts=cnt)
        return lambda: smla.convert_topk_indices(req, bt, tok, block_size=BLOCK, return_valid_counts=True,
                                                 out=out, valid_counts=cnt)

    return make, nbytes


def merge_case(torch, smla, gen, n, h, d, dtype):
    dt = getattr(torch, dtype)
    es = torch.empty((), dtype=dt).element_size()
    nbytes = n * h * d * es * 3 + n * h * 4 * 3

    def make(i):
        oa = torch.randn((n, h, d), generator=gen, device="cuda").to(dt)
        ob = torch.randn((n, h, d), generator=gen, device="cuda").to(dt)
        la = torch.randn((n, h), generator=gen, device="cuda") * 5
        lb = torch.randn((n, h), generator=gen, device="cuda") * 5
        out, lse = torch.empty_like(oa), torch.empty_like(la)
        return lambda: smla.merge_attn_states(oa, la, ob, lb, out=out, out_lse=lse)

    return make, nbytes


def bandwidth_cases(quick):
    pack_t = [16384, 131072] if quick else [1024, 16384, 131072, 1_000_000]
    gather = [[8192], [131072]] if quick else [[8192], [32768], [131072], [4096] * 32, [1000, 60000, 300] * 4]
    cases = [("pack_kv", "fp8_ds_mla", dict(t=t)) for t in pack_t]
    cases += [("pack_kv", "bf16", dict(t=t)) for t in ([16384] if quick else [16384, 131072])]
    cases += [("unpack_kv", cd, dict(n=n)) for cd in ("fp8_ds_mla", "bf16") for n in
              ([131072] if quick else [16384, 131072])]
    cases += [("gather_upconvert", "fp8_ds_mla", dict(lens=g)) for g in gather]
    cases += [("gather_upconvert", "bf16", dict(lens=[131072]))]
    cases += [("convert_topk_indices", None, dict(n=n, k=2048)) for n in (4096, 256)]
    cases += [("filter_convert_dcp_indices", None, dict(n=n, k=2048, dcp=4)) for n in (4096, 256)]
    merges = [(4096, 128, 512, "bfloat16")] if quick else [(4096, 128, 512, "bfloat16"), (512, 128, 512, "bfloat16"),
                                                          (4096, 16, 512, "float32"), (4096, 128, 512, "float16")]
    cases += [("merge_attn_states", dt, dict(n=n, h=h, d=d)) for n, h, d, dt in merges]
    return cases


def make_case(torch, smla, gen, op, var, kw):
    if op == "pack_kv":
        return pack_case(torch, smla, gen, kw["t"], var)
    if op == "unpack_kv":
        return unpack_case(torch, smla, gen, kw["n"], var)
    if op == "gather_upconvert":
        return gather_case(torch, smla, gen, kw["lens"], var)
    if op in ("convert_topk_indices", "filter_convert_dcp_indices"):
        return convert_case(torch, smla, gen, kw["n"], kw["k"], kw.get("dcp"))
    return merge_case(torch, smla, gen, kw["n"], kw["h"], kw["d"], var)


def latency_cases():
    return [("pack_kv", "fp8_ds_mla", dict(t=1)), ("pack_kv", "fp8_ds_mla", dict(t=64)),
            ("unpack_kv", "fp8_ds_mla", dict(n=64)), ("gather_upconvert", "fp8_ds_mla", dict(lens=[64])),
            ("gather_upconvert", "fp8_ds_mla", dict(lens=[2048])),
            ("convert_topk_indices", None, dict(n=1, k=2048)), ("convert_topk_indices", None, dict(n=32, k=2048)),
            ("filter_convert_dcp_indices", None, dict(n=32, k=2048, dcp=2)),
            ("merge_attn_states", "bfloat16", dict(n=1, h=128, d=512)),
            ("merge_attn_states", "bfloat16", dict(n=32, h=128, d=512))]


def describe(kw):
    parts = []
    for k, v in kw.items():
        if k == "lens":
            v = f"{len(v)}x{v[0]}" if len(set(v)) == 1 else f"{len(v)} reqs, {sum(v)} tok"
        parts.append(f"{k}={v}")
    return " ".join(parts)


def main():
    args = parse()
    try:
        import torch
    except ImportError:
        print("bench_memory_ops: torch is not installed; nothing to measure")
        return 0
    import smla

    if not (torch.cuda.is_available() and smla.cuda_available()):
        print("bench_memory_ops: no usable CUDA GPU (or smla built without CUDA); nothing to measure")
        return 0
    iters = args.iters or (30 if args.quick else 100)
    bench = Bench(torch, iters, warmup=5)
    props = torch.cuda.get_device_properties(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, L2 {bench.l2 >> 20} MiB; {iters} calls per shape; "
          f"bytes = read + written; ratio = GB/s over a torch D2D copy of the same bytes (target >= {TARGET})")
    print(f"{'op':<27} {'variant':<10} {'shape':<26} {'MB':>8} {'time_us':>9} {'GB/s':>7} {'copyGB/s':>8} "
          f"{'ratio':>6}")
    results = []
    t0 = time.time()
    keep = set(args.ops.split(",")) if args.ops else None
    for op, var, kw in bandwidth_cases(args.quick):
        if keep and op not in keep:
            continue
        make, nbytes = make_case(torch, smla, gen, op, var, kw)
        us, gbps, cgbps = bench.bandwidth(make, nbytes)
        ratio = gbps / cgbps
        rec = dict(kind="bandwidth", op=op, variant=var, shape=kw, bytes=nbytes, time_us=us, gbps=gbps,
                   copy_gbps=cgbps, ratio=ratio)
        results.append(rec)
        print(f"{op:<27} {str(var or '-'):<10} {describe(kw):<26} {nbytes / 1e6:>8.1f} {us:>9.2f} {gbps:>7.0f} "
              f"{cgbps:>8.0f} {ratio:>6.2f}{'' if ratio >= TARGET or nbytes < 64e6 else '  < target'}", flush=True)
    print(f"\n{'op':<27} {'variant':<10} {'shape':<26} {'graph latency_us':>16}")
    for op, var, kw in latency_cases():
        if keep and op not in keep:
            continue
        make, nbytes = make_case(torch, smla, gen, op, var, kw)
        us = bench.graph_latency_us(make(0))
        results.append(dict(kind="latency", op=op, variant=var, shape=kw, bytes=nbytes, time_us=us))
        print(f"{op:<27} {str(var or '-'):<10} {describe(kw):<26} {us:>16.2f}", flush=True)
    print(f"# {time.time() - t0:.1f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(device=props.name, sms=props.multi_processor_count, l2_bytes=bench.l2, iters=iters,
                           target_ratio=TARGET, results=results), f, indent=1)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
