"""Why the benchmark's CUDA-event times of the bf16 prefill run ~11% above Nsight Compute's kernel durations of the same
kernel (issue 16, forty-second session, H200: 4,366.6 us against 3.87 ms at h=128 s_kv=32K "fast"): the same call
timed after an idle gap (the card cool, its power budget unspent) and back to back for a few seconds (as the benchmark
runs it: L2 flushed before each call), with nvidia-smi's SM clock, board power, active clock-event reasons and
temperature sampled during the back-to-back stretch. If the back-to-back times exceed the idle-gap ones by about the
clock's drop, the card holds its power limit and a kernel's energy per call, not only its cycles, sets its speed.

    PYTHONPATH=src python3 tools/clock_study.py 128,32768:fast 128,8192:fast [--seconds 4] [--gaps 8]
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

QUERY = ["nvidia-smi", "-i", "0",
         "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu",
         "--format=csv,noheader,nounits"]


def poll(samples, stop):
    """nvidia-smi's readings, back to back, each with the time its query returned."""
    while not stop.is_set():
        try:
            out = subprocess.run(QUERY, capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return
        samples.append((time.monotonic(), out))


def study(torch, smla, B, event_times_us, scratch, h, s_kv, prec, args):
    """One shape: the idle-gap calls, then the back-to-back stretch with nvidia-smi sampled."""
    kv, idx = B.random_kv(torch, s_kv)
    q, out, lse, ml = B.query(torch, torch.Generator(device="cuda").manual_seed(h), B.S_Q, h)

    def call():
        smla.sparse_mla_prefill(q, kv, idx, softmax_scale=B.SCALE, out=out, lse=lse, max_logits=ml, precision=prec)
    event_times_us(torch, call, 3)  # warm-up
    gap = []
    for _ in range(args.gaps):
        time.sleep(0.2)
        gap += event_times_us(torch, call, 1, scratch)
    samples, stop = [], threading.Event()
    th = threading.Thread(target=poll, args=(samples, stop), daemon=True)
    t0, bb = time.monotonic(), []
    th.start()
    while time.monotonic() - t0 < args.seconds:
        bb += event_times_us(torch, call, 20, scratch)  # L2 flushed before each call, as the benchmark
    stop.set()
    th.join(timeout=10)
    n = len(bb)
    print(f"h={h} s_kv={s_kv} {prec}: after a 0.2 s gap {statistics.median(gap):.1f} (min {min(gap):.1f}); back to back:"
          f" first 10 {statistics.median(bb[:10]):.1f}, second half of {n} {statistics.median(bb[n // 2:]):.1f}",
          flush=True)
    late = [s for t, s in samples if t - t0 > args.seconds / 4]
    for s in late[:: max(1, len(late) // 6)]:
        print(f"    smi: {s}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", nargs="+", metavar="H,S_KV:PRECISION")
    ap.add_argument("--seconds", type=float, default=4.0, help="the back-to-back stretch per shape")
    ap.add_argument("--gaps", type=int, default=8, help="calls after an idle gap of 0.2 s each")
    args = ap.parse_args()
    import torch
    import smla
    import bench_sparse_mla_prefill as B
    from _gpu import event_times_us, flush_buffer

    scratch = flush_buffer(torch)
    print(f"# {torch.cuda.get_device_name(0)}; us; smi: SM MHz, board W, clock-event reasons (hex mask), deg C")
    for spec in args.spec:
        shape, _, prec = spec.partition(":")
        h, s_kv = (int(x) for x in shape.split(","))
        study(torch, smla, B, event_times_us, scratch, h, s_kv, prec or "fast", args)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
