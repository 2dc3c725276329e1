"""Why pack_kv fp8 is slower per byte at 131072 tokens than at 16384 (issue 18): the same op and bytes with
the slots in random order (the benchmark's decode-like scatter), sorted, and contiguous, for fp8_ds_mla
(656-byte entries: every entry shares a 32-byte sector with a neighbour) and bf16 (1152-byte entries,
whole sectors). Ratio = GB/s over a torch device-to-device copy of the same bytes (benchmarks/
bench_memory_ops.py's method: CUDA-graph replays, buffers rotated past 3x the L2).

    python3 tools/pack_kv_scatter.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import torch  # noqa: E402

import smla  # noqa: E402
from bench_memory_ops import BLOCK, Bench, cache_of, entry_bytes, rand_bf16  # noqa: E402


def case(gen, t, cd, order):
    nb = t // BLOCK + 2
    nbytes = t * (1024 + 128 + 8) + t * entry_bytes(cd)

    def make(i):
        kv_c, k_pe = rand_bf16(torch, gen, (t, 512), 3.0), rand_bf16(torch, gen, (t, 64))
        slots = torch.randperm(nb * BLOCK, generator=gen, device="cuda")[:t]
        if order == "sorted":
            slots = slots.sort().values
        elif order == "contiguous":
            slots = torch.arange(t, device="cuda")
        cache = cache_of(torch, nb, cd)
        return lambda: smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)

    return make, nbytes


def main():
    bench = Bench(torch, 30, warmup=5)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'cache':<11} {'tokens':>7} {'slots':<11} {'time_us':>8} {'GB/s':>6} {'ratio':>6}")
    for cd in ("fp8_ds_mla", "bf16"):
        for t in (16384, 131072):
            for order in ("random", "sorted", "contiguous"):
                make, nbytes = case(gen, t, cd, order)
                us, gbps, cgbps = bench.bandwidth(make, nbytes)
                print(f"{cd:<11} {t:>7} {order:<11} {us:>8.1f} {gbps:>6.0f} {gbps / cgbps:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
