"""Shared by the GPU benchmarks: the attention benchmarks' common options, the start (torch and an smla
with a usable CUDA GPU, or a clear message), the timers (events around each call; CUDA-graph replay) and
the JSON record."""
import argparse
import json
import os
import statistics


def attention_parser(doc, iters_full, iters_quick, shape_help):
    """The attention benchmarks' common options (--quick --json --iters --no-flush --no-baseline
    --kernel --shape); the caller adds its own and parses."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few shapes, fewer iterations")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--iters", type=int, default=0,
                    help=f"timed calls per shape (default {iters_full}, quick {iters_quick})")
    ap.add_argument("--no-flush", action="store_true", help="do not flush L2 between calls")
    ap.add_argument("--no-baseline", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--kernel", default="auto", choices=["auto", "portable", "sm90", "sm90n", "sm90p", "sm90r", "sm90d", "sm90t"],
                    help="smla kernel family (sets SMLA_ATTN_KERNEL): sm90 = the wide wgmma kernel on Hopper, "
                         "sm90n = the narrow one (h <= 32)")
    ap.add_argument("--shape", action="append", default=[], metavar=shape_help,
                    help="measure this shape (repeatable) instead of the default list")
    return ap


def precisions(args):
    """The calls' precision= values that --precision asks for ("both": high, then fast)."""
    return ["high", "fast"] if args.precision == "both" else [args.precision]


def shape_args(args):
    """The --shape values as int tuples (H,S_KV or H,S_Q,B)."""
    return [tuple(int(v) for v in sh.split(",")) for sh in args.shape]


def start_attention(name, args, iters, warmup):
    """Sets SMLA_ATTN_KERNEL and opens the GPU: (torch, smla, iters, warmup, flush) or None (message
    printed); iters and warmup are (full, quick) defaults, --iters overrides the first."""
    gpu = open_gpu(name, args.kernel)
    if gpu is None:
        return None
    pick = 1 if args.quick else 0
    return gpu[0], gpu[1], args.iters or iters[pick], warmup[pick], not args.no_flush


def write_json(path, torch, kernel, iters, results):
    """The run's results with the device, kernel family and iteration count, when path is given."""
    if not path:
        return
    dev = torch.cuda.get_device_properties(0)
    with open(path, "w") as f:
        json.dump(dict(device=dev.name, sms=dev.multi_processor_count, kernel=kernel, iters=iters,
                       results=results), f, indent=1)
    print(f"# wrote {path}")


def open_gpu(name, kernel=None):
    """(torch, smla) when both can run on a GPU here; else print why (prefixed by name) and return None.
    kernel: the attention kernel family to run (sets SMLA_ATTN_KERNEL), when given."""
    if kernel is not None:
        os.environ["SMLA_ATTN_KERNEL"] = kernel
    try:
        import torch
    except ImportError:
        print(f"{name}: torch is not installed; nothing to measure")
        return None
    import smla

    if not (torch.cuda.is_available() and smla.cuda_available()):
        print(f"{name}: no usable CUDA GPU (or smla built without CUDA); nothing to measure")
        return None
    return torch, smla


def flush_buffer(torch):
    """The 256 MiB buffer whose zeroing before a call leaves the L2 cold (event_times_us)."""
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def event_times_us(torch, fn, iters, scratch=None):
    """The CUDA-event times of iters calls of fn in us, scratch (flush_buffer, or None) zeroed before each."""
    evs = []
    for _ in range(iters):
        if scratch is not None:
            scratch.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        evs.append((a, b))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in evs]


def time_us(torch, fn, iters, warmup, flush):
    """Median CUDA-event time of fn in us over iters calls after warmup; flush=True zeroes a 256 MiB
    buffer before each call so the L2 starts cold."""
    scratch = flush_buffer(torch) if flush else None
    for _ in range(warmup):
        fn()
    return statistics.median(event_times_us(torch, fn, iters, scratch))


def graph_replay_us(torch, call, iters, reps=20):
    """GPU time per call of `call` captured `reps` times into one CUDA graph (warm L2, launch overhead
    amortised): CUDA-event time of max(10, iters // 2) replays over the call count. The first call runs
    eagerly on a side stream (module load, kernel attributes), as capture requires."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            call()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = max(10, iters // 2)
    a.record()
    for _ in range(n):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (n * reps)
