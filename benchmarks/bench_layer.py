"""SparseMLAAttention on the GPU (torch) at DeepSeek-V3.2 sizes (h=128, topk=2048, fp8_ds_mla cache).

1. One decode step and one prefill step, with the step time split into pack_kv / convert_topk_indices
   / gather_upconvert / attention kernels / rest (Python, launch gaps; measured as total minus the
   parts, from an idle GPU), "rest ahead" (the same with the host running ahead of the GPU, as in a
   serving loop: GPU time that is neither an op nor waiting for the host), the step's host time, plus
   build() host time and the decode step replayed from a CUDA graph.
2. mixed vs split for one prefill chunk of 1K-16K new tokens (context before it: --contexts) at
   h = 16, 64, 128: the measurement behind smla.config.MIN_HEADS_FOR_SPLIT (mode="auto").

Prints tables and writes JSON (--json, default $OUT/bench_layer.json or ./bench_layer.json).
Without a usable GPU (or torch) it says so and exits 0.
"""
import argparse
import json
import math
import os
import sys
import time

try:
    import smla
except ImportError:  # run from a source tree built in place (tools/gpu_run.sh)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    import smla

SCALE = 192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2
PARTS = ("pack", "convert", "gather", "attention")
_WRAPPED = {"pack_kv": "pack", "convert_topk_indices": "convert", "gather_upconvert": "gather",
            "sparse_mla_decode": "attention", "sparse_mla_prefill": "attention"}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--decode-batch", type=int, default=128, help="decode requests (default 128)")
    p.add_argument("--decode-sq", type=int, default=1, help="tokens per decode request (MTP: 2)")
    p.add_argument("--decode-context", type=int, default=16384, help="tokens per decode request's context")
    p.add_argument("--prefill-tokens", type=int, default=8192, help="new tokens of the breakdown prefill step")
    p.add_argument("--chunks", default="1024,2048,4096,8192,16384", help="prefill chunk sizes for mixed vs split")
    p.add_argument("--contexts", default="0,32768", help="context before the prefill chunk")
    p.add_argument("--sweep-heads", default="16,64,128")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_layer.json"))
    return p.parse_args(argv)


class Timer:
    """Wraps the ops the layer calls (smla.layer's names) to record CUDA events around each call. The
    events are made before the timed step (a pool): making one inside it would count the benchmark's
    own host time as the step's "rest"."""

    POOL = 64  # event pairs: more op calls than any step here makes

    def __init__(self, torch):
        import smla.layer as L

        self.torch, self.L, self.active, self.calls = torch, L, False, []
        self.pool = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(self.POOL)]
        self.orig = {name: getattr(L, name) for name in _WRAPPED}
        for name, part in _WRAPPED.items():
            setattr(L, name, self._wrap(self.orig[name], part))

    def _wrap(self, fn, part):
        def run(*a, **k):
            if not self.active:
                return fn(*a, **k)
            i = len(self.calls)
            e0, e1 = self.pool[i] if i < self.POOL else (self.torch.cuda.Event(enable_timing=True),
                                                          self.torch.cuda.Event(enable_timing=True))
            e0.record()
            r = fn(*a, **k)
            e1.record()
            self.calls.append((part, e0, e1))
            return r
        return run

    def restore(self):
        for name, fn in self.orig.items():
            setattr(self.L, name, fn)

    def _timed(self, fn, s, e, ahead=False, per_op=True):
        """One timed run of fn: (total ms, [(part, ms)], host ms of fn itself). ahead: the GPU is first given
        a sleep of AHEAD_CYCLES, so the host queues the whole step before the GPU reaches it and the step's
        GPU time holds no host time (a serving loop's host runs ahead of the GPU the same way). per_op:
        events around each op call (else the parts list is empty)."""
        torch = self.torch
        self.calls = []
        self.active = per_op
        if ahead:
            torch.cuda._sleep(self.AHEAD_CYCLES)
        s.record()
        t0 = time.perf_counter()
        fn()
        host = (time.perf_counter() - t0) * 1e3
        e.record()
        self.active = False
        torch.cuda.synchronize()
        return s.elapsed_time(e), [(part, a.elapsed_time(b)) for part, a, b in self.calls], host

    AHEAD_CYCLES = 4_000_000  # ~2 ms at the H200's clock: far longer than any step's host time here

    def measure(self, fn, iters, warmup):
        """(mean total ms, {part: mean ms}) of fn() over iters runs, from CUDA events, the GPU idle when the
        step starts (its host time before each kernel shows as GPU time). The parts include "rest" (total
        minus the ops), "untimed", the mean total of as many runs without the per-op events (what the
        instrumentation itself adds to the step is total - untimed), "rest ahead", the rest when the host
        has queued the step before the GPU starts it (GPU time that is neither an op nor the host's), and
        "host", the wall time of fn() itself (the layer's host cost per step, op calls included)."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        runs = [self._timed(fn, s, e) for _ in range(iters)]
        ahead = [self._timed(fn, s, e, ahead=True) for _ in range(iters)]
        plain = [self._timed(fn, s, e, per_op=False) for _ in range(iters)]
        n = len(runs)

        def split(rs):
            parts = {p: 0.0 for p in PARTS}
            for _, calls, _ in rs:
                for part, ms in calls:
                    parts[part] += ms / n
            total = sum(r[0] for r in rs) / n
            return total, parts, max(0.0, total - sum(parts.values()))

        total, parts, parts["rest"] = split(runs)
        parts["untimed"] = sum(r[0] for r in plain) / n
        parts["rest ahead"] = split(ahead)[2]
        parts["host"] = sorted(r[2] for r in plain)[n // 2]
        return total, parts


def fill_cache(torch, cache, kv_dtype, gen):
    """Valid random entries without running pack_kv over millions of tokens: e4m3 bytes below
    0x7F (no NaN) with a random sign, tile scales 2**-4, rope N(0, 1) bf16; bf16 caches N(0, 0.5)."""
    if kv_dtype == "bf16":
        cache.normal_(0.0, 0.5, generator=gen)
        return
    nope = cache[..., :512]
    nope.copy_(torch.randint(0, 0x7F, nope.shape, device=cache.device, dtype=torch.uint8, generator=gen)
               | (torch.randint(0, 2, nope.shape, device=cache.device, dtype=torch.uint8, generator=gen) << 7))
    cache[..., 512:528].view(torch.float32).fill_(2.0 ** -4)
    cache[..., 528:656].view(torch.bfloat16).normal_(0.0, 1.0, generator=gen)


class Step:
    """One step's inputs on the GPU: requests with (context, new tokens), block tables, slots, q, kv,
    and top-k positions drawn from each token's causal prefix (duplicates allowed). gen (CPU) seeds
    the block permutation, gdev (CUDA) everything else."""

    def __init__(self, torch, reqs, h, topk, bs, kv_dtype, gen, gdev, dev):
        import numpy as np

        self.R = len(reqs)
        q_lens = np.array([q for _, q in reqs], np.int32)
        seq = np.array([c + q for c, q in reqs], np.int32)
        self.T = int(q_lens.sum())
        self.max_len = int(seq.max())
        bpr = -(-self.max_len // bs)
        self.num_blocks = self.R * bpr + 1
        perm = torch.randperm(self.num_blocks - 1, generator=gen, device="cpu").numpy().astype(np.int32)
        bt = perm[: self.R * bpr].reshape(self.R, bpr)
        req = np.repeat(np.arange(self.R), q_lens)
        pos = np.concatenate([np.arange(c, c + q) for c, q in reqs]).astype(np.int64)
        slots = bt[req, pos // bs].astype(np.int64) * bs + pos % bs
        self.host = dict(qsl=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32), seq_lens=seq,
                         block_table=bt, slot_mapping=slots)
        self.dev = {k: torch.from_numpy(v).to(dev) for k, v in self.host.items()}
        shape = smla.kv_cache_shape(self.num_blocks, bs, kv_dtype)
        self.cache = torch.empty(shape, dtype=torch.uint8 if kv_dtype == "fp8_ds_mla" else torch.bfloat16, device=dev)
        fill_cache(torch, self.cache, kv_dtype, gdev)
        bf = dict(dtype=torch.bfloat16, device=dev)
        self.q = torch.randn((self.T, h, 576), generator=gdev, **bf) * 0.5
        self.kv_c = torch.randn((self.T, 512), generator=gdev, **bf) * 0.5
        self.k_pe = torch.randn((self.T, 64), generator=gdev, **bf) * 0.5
        p = torch.from_numpy(pos).to(dev)
        r = torch.rand((self.T, topk), generator=gdev, device=dev)
        idx = (r * (p[:, None] + 1).to(torch.float32)).to(torch.int32)
        cols = torch.arange(topk, device=dev)[None, :]
        self.topk = torch.where(cols <= p[:, None], idx, torch.full_like(idx, -1))

    def config(self, h, topk, bs, kv_dtype, mode):
        return smla.SparseMLAConfig(num_heads=h, kv_cache_dtype=kv_dtype, block_size=bs, topk=topk,
                                    max_model_len=self.max_len, max_num_seqs=self.R,
                                    max_num_batched_tokens=self.T, mode=mode)


def run_step(torch, timer, step, h, topk, bs, kv_dtype, mode, dev, a, graph=False):
    from smla.layer import SparseMLAAttention
    from smla.metadata import SparseMLAMetadataBuilder

    cfg = step.config(h, topk, bs, kv_dtype, mode)
    builder = SparseMLAMetadataBuilder.from_config(cfg, device=dev)
    attn = SparseMLAAttention.from_config(cfg, SCALE)
    args = (step.dev["qsl"], step.dev["seq_lens"], step.dev["block_table"], step.dev["slot_mapping"])
    md = builder.build(*args, query_start_loc_cpu=step.host["qsl"], seq_lens_cpu=step.host["seq_lens"])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        md = builder.build(*args, query_start_loc_cpu=step.host["qsl"], seq_lens_cpu=step.host["seq_lens"])
    torch.cuda.synchronize()
    build_ms = (time.perf_counter() - t0) * 1e3 / a.iters
    out = torch.empty((step.T, h, 512), dtype=torch.bfloat16, device=dev)

    def fwd():
        attn.forward(step.q, step.kv_c, step.k_pe, step.cache, step.topk, md, out=out)

    total, parts = timer.measure(fwd, a.iters, a.warmup)
    flops = 2.0 * step.T * h * topk * (576 + 512)
    res = dict(mode=attn.mode, h=h, topk=topk, tokens=step.T, requests=step.R, total_ms=total,
               parts_ms=parts, build_host_ms=build_ms, tflops=flops / total / 1e9,
               chunks=len(md.chunks or []), decode_workspace_bytes=md.decode_workspace_bytes)
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fwd()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                fwd()
            res["graph_ms"], _ = timer.measure(g.replay, a.iters, a.warmup)
        except Exception as e:  # report, do not fail the benchmark
            res["graph_error"] = f"{type(e).__name__}: {e}"
    return res


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError:
        print("bench_layer: torch is not installed; nothing to measure")
        return 0
    if not (smla.cuda_available() and torch.cuda.is_available()):
        print("bench_layer: no usable CUDA GPU (or smla built without CUDA); nothing to measure")
        return 0
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    gdev = torch.Generator(device=dev).manual_seed(a.seed)
    timer = Timer(torch)
    h, K, bs = a.heads, a.topk, a.block_size
    results = dict(device=torch.cuda.get_device_name(), build=smla.build_info(), args=vars(a),
                   steps=[], sweep=[])

    def mk(reqs, hh, kv="fp8_ds_mla"):
        return Step(torch, reqs, hh, K, bs, kv, gen, gdev, dev)

    try:
        # ---- 1. breakdown: one decode step, one prefill step ----
        dec = mk([(a.decode_context, a.decode_sq)] * a.decode_batch, h)
        for mode in ("split", "mixed"):
            r = run_step(torch, timer, dec, h, K, bs, "fp8_ds_mla", mode, dev, a, graph=True)
            r["step"] = f"decode {a.decode_batch} x s_q={a.decode_sq}, context {a.decode_context}"
            results["steps"].append(r)
        del dec
        pre = mk([(0, a.prefill_tokens)], h)
        for mode in ("split", "mixed"):
            r = run_step(torch, timer, pre, h, K, bs, "fp8_ds_mla", mode, dev, a)
            r["step"] = f"prefill 1 x {a.prefill_tokens} new tokens"
            results["steps"].append(r)
        r = run_step(torch, timer, mk([(0, a.prefill_tokens)], h, "bf16"), h, K, bs, "bf16", "auto", dev, a)
        r["step"] = f"prefill 1 x {a.prefill_tokens} new tokens (bf16 cache)"
        results["steps"].append(r)
        del pre

        # ---- 2. mixed vs split sweep ----
        for hh in (int(x) for x in a.sweep_heads.split(",")):
            for ctx in (int(x) for x in a.contexts.split(",")):
                for n in (int(x) for x in a.chunks.split(",")):
                    st = mk([(ctx, n)], hh)
                    row = dict(h=hh, context=ctx, tokens=n)
                    for mode in ("mixed", "split"):
                        r = run_step(torch, timer, st, hh, K, bs, "fp8_ds_mla", mode, dev, a)
                        row[f"{mode}_ms"] = r["total_ms"]
                        row[f"{mode}_parts_ms"] = r["parts_ms"]
                    row["split_speedup"] = row["mixed_ms"] / row["split_ms"]
                    results["sweep"].append(row)
                    del st
                    torch.cuda.empty_cache()
    finally:
        timer.restore()

    # ---- tables ----
    print(f"\nSparseMLAAttention on {results['device']} (fp8_ds_mla unless noted; topk {K}, block {bs})")
    more = ("rest", "untimed", "rest ahead", "host")
    hdr = f"{'step':<44} {'mode':<6} {'total ms':>9} " + " ".join(f"{p:>10}" for p in PARTS + more) \
        + f" {'build ms':>9} {'graph ms':>9} {'TFLOP/s':>8}"
    print(hdr)
    for r in results["steps"]:
        g = r.get("graph_ms")
        print(f"{r['step'][:44]:<44} {r['mode']:<6} {r['total_ms']:>9.3f} "
              + " ".join(f"{r['parts_ms'][p]:>10.3f}" for p in PARTS + more)
              + f" {r['build_host_ms']:>9.3f} {(f'{g:.3f}' if g is not None else '-'):>9} {r['tflops']:>8.1f}")
    print("\nmixed vs split, one prefill chunk (ms; speedup = mixed / split, > 1: split wins)")
    print(f"{'h':>4} {'context':>8} {'tokens':>7} {'mixed':>9} {'split':>9} {'speedup':>8}  split gather ms")
    for row in results["sweep"]:
        print(f"{row['h']:>4} {row['context']:>8} {row['tokens']:>7} {row['mixed_ms']:>9.3f} {row['split_ms']:>9.3f} "
              f"{row['split_speedup']:>8.2f}  {row['split_parts_ms']['gather']:.3f}")
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"\nJSON: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
