"""Host (Python) time of SparseMLAAttention.forward and build() with the ops stubbed out (issue 18): what the
layer itself adds to a step, apart from the ops' own host time and the GPU. torch CPU tensors (NumPy with
--lib numpy), a decode step of --batch requests x s_q 1, h heads, topk 2048, fp8_ds_mla cache; best of 5
bursts of --calls calls. Also the cost of one torch view / reshape, the unit the layer avoids.

    PYTHONPATH=src python3 tools/layer_host_time.py [--mode split|mixed] [--lib torch|numpy]
"""
import argparse
import os
import sys
import time

import numpy as np

try:
    import smla
except ImportError:  # run from a source tree built in place
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import smla
import smla.layer as L  # noqa: E402
from smla.metadata import SparseMLAMetadataBuilder  # noqa: E402


def best_us(fn, calls):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="split", choices=["split", "mixed"])
    ap.add_argument("--lib", default="torch", choices=["torch", "numpy"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    # the ops the layer calls, stubbed (their own host time is tools/host_overhead.py's)
    L.pack_kv = lambda *x, **k: x[2]
    L.convert_topk_indices = lambda *x, **k: k["out"]
    L.sparse_mla_decode = lambda *x, **k: (k["out"], k["lse"])
    L.sparse_mla_prefill = lambda *x, **k: (k["out"], k["lse"], k["max_logits"])
    L.gather_upconvert = lambda *x, **k: x[1]
    if a.lib == "torch":
        import torch

        arr = torch.from_numpy
        bf = lambda *shape: torch.zeros(shape, dtype=torch.bfloat16)  # noqa: E731
        ref = torch.empty(0, dtype=torch.int32)
    else:
        import ml_dtypes

        arr = lambda x: x  # noqa: E731
        bf = lambda *shape: np.zeros(shape, ml_dtypes.bfloat16)  # noqa: E731
        ref = np.empty(0, np.int32)

    R, h, topk, bs, ctx = a.batch, a.heads, 2048, 64, 16384
    cfg = smla.SparseMLAConfig(num_heads=h, kv_cache_dtype="fp8_ds_mla", block_size=bs, topk=topk,
                               max_model_len=ctx + 1, max_num_seqs=R, max_num_batched_tokens=R, mode=a.mode)
    builder = SparseMLAMetadataBuilder.from_config(cfg, device=ref)
    attn = L.SparseMLAAttention.from_config(cfg, 0.1)
    bpr = -(-(ctx + 1) // bs)
    qsl, seq = np.arange(R + 1, dtype=np.int32), np.full(R, ctx + 1, np.int32)
    bt, slots = arr(np.arange(R * bpr, dtype=np.int32).reshape(R, bpr)), arr(np.arange(R, dtype=np.int32))
    cache = arr(np.zeros(smla.kv_cache_shape(R * bpr, bs, "fp8_ds_mla"), np.uint8))
    q, kv_c, k_pe, out = bf(R, h, 576), bf(R, 512), bf(R, 64), bf(R, h, 512)
    tk = arr(np.zeros((R, topk), np.int32))
    args = (arr(qsl), arr(seq), bt, slots)
    build = lambda: builder.build(*args, query_start_loc_cpu=qsl, seq_lens_cpu=seq)  # noqa: E731
    md = build()
    fwd = best_us(lambda: attn.forward(q, kv_c, k_pe, cache, tk, md, out=out), a.calls)
    bld = best_us(build, max(1, a.calls // 10))
    print(f"{a.lib} {a.mode}, {R} decodes, h={h}: forward {fwd:.2f} us (ops stubbed), build {bld:.1f} us")
    if a.lib == "torch":
        print(f"one torch view q[:64] {best_us(lambda: q[:64], 100000) * 1e3:.0f} ns, "
              f"reshape {best_us(lambda: q.reshape(R, 1, h, 576), 100000) * 1e3:.0f} ns")


if __name__ == "__main__":
    main()
