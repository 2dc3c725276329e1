"""Shared by the GPU attention benchmarks: the start (torch and an smla with a usable CUDA GPU, or a
clear message) and the timer."""
import statistics


def open_gpu(name):
    """(torch, smla) when both can run on a GPU here; else print why (prefixed by name) and return None."""
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


def time_us(torch, fn, iters, warmup, flush):
    """Median CUDA-event time of fn in us over iters calls after warmup; flush=True zeroes a 256 MiB
    buffer before each call so the L2 starts cold."""
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda") if flush else None
    for _ in range(warmup):
        fn()
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
    return statistics.median(a.elapsed_time(b) for a, b in evs) * 1e3
