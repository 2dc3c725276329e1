"""Host time of SparseMLAMetadata.with_workspaces (what attend(..., workspaces=) adds per call, and so what
smla.vllm pays per layer and step when vLLM's workspace manager lends the scratch), issue 19.

A split-mode step of the layer tests (5 decodes and 3 prefills, h = 16, topk 32, fp8 cache) built once
(on NumPy, the CPU); then with_workspaces over every buffer of its workspace_specs, as NumPy arrays and,
where torch is installed, as torch CPU tensors: the median of 7 runs of 2000 calls.

    PYTHONPATH=src python tools/workspace_check_cost.py
"""
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_layer_attend as T  # noqa: E402  (the layer tests' world and step)


def per_call_us(md, ws, n=2000, runs=7):
    for _ in range(200):
        md.with_workspaces(ws)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(n):
            md.with_workspaces(ws)
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def main():
    rng = np.random.default_rng(26)
    world, st = T.mixed_step(rng, "fp8_ds_mla", 16, 32)
    builder, _ = T.make(world, 16, 32, "split", ws_rows=320)
    md = T.build(builder, st)
    dt = {"int32": np.int32, "float32": np.float32, "bfloat16": T.BF16}
    ws = {n: np.zeros((s.shape[0] + 2,) + s.shape[1:], dt[s.dtype]) for n, s in md.workspace_specs.items()}
    print(f"with_workspaces over {len(ws)} buffers ({', '.join(sorted(ws))})")
    print(f"  numpy        {per_call_us(md, ws):7.1f} us per call")
    try:
        import torch
    except ImportError:
        print("  torch        (not installed)")
        return
    # the same builder (its buffers are NumPy, on the CPU): torch CPU tensors are on its device
    tdt = {"int32": torch.int32, "float32": torch.float32, "bfloat16": torch.bfloat16}
    ws_t = {n: torch.zeros((s.shape[0] + 2,) + s.shape[1:], dtype=tdt[s.dtype]) for n, s in md.workspace_specs.items()}
    print(f"  torch (CPU)  {per_call_us(md, ws_t):7.1f} us per call")


if __name__ == "__main__":
    main()
