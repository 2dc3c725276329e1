"""Side-by-side speed of built trees in ONE process: each tree's extension (DIR/src/smla/_C*.so, built in place,
e.g. by tools/gpu_variants.sh) is loaded as its own module and smla.ops calls it in turn, on the same tensors,
alternating every few calls, so that the card's clock (below its 1.98 GHz maximum under these kernels: 1.76-1.80 GHz
by Nsight Compute's cycles over its durations, issue 16, thirty-ninth and forty-second sessions), the L2's address
mapping and the tensors are the same for every tree. Between
processes the same tree's median moved ~5-10% (issue 16, thirty-ninth session), which hid every change under
~5%; here the trees share one process.

    PYTHONPATH=src python3 tools/ab_prefill.py --tree /tmp/v_a --tree /tmp/v_b [--shape 128,32768 ...]
        [--precision fast] [--kernel sm90p] [--rounds 12] [--iters 3] [--causal]

--env NAME=VALUE (repeatable): one more variant, this process's own smla with that run-time switch set during its calls
(e.g. --env SMLA_ATTN_PERSISTENT=off against the default, no second build). The clock and power during such calls:
tools/clock_study.py (an --smi option here, nvidia-smi polled during each tree's turns, gave too few and lagging
samples to use, forty-second session).

The first tree is this process's own smla (PYTHONPATH); each --tree adds one. Per shape: every round runs each
tree `iters` calls (L2 flushed before each, as benchmarks/bench_sparse_mla_prefill.py does; the trees' order
rotates by round) and prints, per tree, the median over all its calls and the median over rounds of its round
median over the first tree's (its ratio, with the lowest and highest round). --causal: the fresh 2,048-token
causal prompt of that benchmark (h = 128 and 64) and its full twin, and each tree's causal / full.

--peer LIB: another implementation timed beside the trees on the same tensors (named "peer"), a shared library that
exports the C function
    int smla_peer_sparse_prefill(const void *q, const void *kv, const int *idx, void *out, float *lse,
                                 float *max_logits, int s_q, int h, int s_kv, int topk, float sm_scale, void *stream)
(q [s_q, h, 576] and kv [s_kv, 576] bf16, idx [s_q, topk] int32 with -1 invalid, out [s_q, h, 512] bf16, lse and
max_logits [s_q, h] float32, all contiguous device arrays; stream a cudaStream_t; 0 when launched). Its outputs go to
arrays of their own, compared once per shape with this tree's (max |difference| over max |out|). The repository holds
no such library: the issue 16 sessions build one outside it around FlashMLA's sm90 sparse prefill kernel, to measure
the gap in one process rather than two.
"""
import argparse
import ctypes
import glob
import importlib.machinery
import importlib.util
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))


def load_ext(tree, i):
    """The extension module built in tree, as module smla_ab<i>._C (its init looks for PyInit__C)."""
    paths = glob.glob(os.path.join(tree, "src", "smla", "_C*.so"))
    if not paths:
        raise SystemExit(f"ab_prefill: no src/smla/_C*.so in {tree} (build it in place first)")
    name = f"smla_ab{i}._C"
    loader = importlib.machinery.ExtensionFileLoader(name, paths[0])
    spec = importlib.util.spec_from_file_location(name, paths[0], loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load_peer(path):
    """The --peer library's entry point (smla_peer_sparse_prefill, typed)."""
    try:
        fn = ctypes.CDLL(os.path.abspath(path)).smla_peer_sparse_prefill
    except (OSError, AttributeError) as e:
        raise SystemExit(f"ab_prefill: --peer {path}: {e}")
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 4 + [ctypes.c_float, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def peer_call(torch, fn, q, kv, idx, outs, scale):
    """A call of the peer on q, kv, idx into outs (out, lse, max_logits), on torch's current stream (None without a
    peer)."""
    if fn is None:
        return None
    out, lse, ml = outs
    stream = torch.cuda.current_stream().cuda_stream

    def call():
        rc = fn(q.data_ptr(), kv.data_ptr(), idx.data_ptr(), out.data_ptr(), lse.data_ptr(), ml.data_ptr(),
                q.shape[0], q.shape[1], kv.shape[0], idx.shape[1], ctypes.c_float(scale), stream)
        if rc != 0:
            raise SystemExit(f"ab_prefill: the peer returned {rc} (h={q.shape[1]}, topk={idx.shape[1]})")
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="another tree (built in place); repeatable")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="this tree with a run-time switch set during its calls; repeatable")
    ap.add_argument("--shape", action="append", default=[], metavar="H,S_KV[,S_Q]",
                    help="s_q 4096 (the benchmark's) unless given: fewer rows, the first of its indices")
    ap.add_argument("--precision", default="fast", choices=["high", "fast"])
    ap.add_argument("--kernel", default="sm90p")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--causal", action="store_true", help="the causal fresh prompt and its full twin too")
    ap.add_argument("--peer", metavar="LIB", help="a shared library with smla_peer_sparse_prefill (above), timed too")
    args = ap.parse_args()
    os.environ["SMLA_ATTN_KERNEL"] = args.kernel
    import torch
    import smla
    import smla.ops as ops
    import bench_sparse_mla_prefill as B
    from _gpu import event_times_us, flush_buffer

    for e in args.env:
        if "=" not in e:
            raise SystemExit(f"ab_prefill: --env {e!r}: expected NAME=VALUE")
    names = ["this"] + [os.path.basename(os.path.normpath(t)) for t in args.tree] + args.env
    mods = [ops._C] + [load_ext(t, i + 1) for i, t in enumerate(args.tree)] + [ops._C] * len(args.env)
    envs = [None] * (1 + len(args.tree)) + [e.split("=", 1) for e in args.env]
    peer = load_peer(args.peer) if args.peer else None
    if peer:  # the last variant; this process's smla stays loaded during its calls
        names.append("peer")
        mods.append(ops._C)
        envs.append(None)

    def use(v):
        """Variant v's module and switch (the --env names are unset for the others)."""
        ops._C = mods[v]
        for name, _ in (x for x in envs if x):
            os.environ.pop(name, None)
        if envs[v]:
            os.environ[envs[v][0]] = envs[v][1]

    scratch = flush_buffer(torch)
    print(f"# {torch.cuda.get_device_name(0)}; kernel {args.kernel}; precision {args.precision}; trees: "
          + ", ".join(names) + f"; {args.rounds} rounds x {args.iters} calls each, L2 flushed before each call")

    def measure(label, call, pcall=None):
        """Per tree: all its call times (us) and its round medians (pcall: the peer's call, the last variant)."""
        times = [[] for _ in mods]
        rounds = [[] for _ in mods]
        calls = [call] * (len(mods) - 1) + [pcall if peer else call]
        for v in range(len(mods)):  # warm-up: module load, kernel attributes
            use(v)
            calls[v]()
        for r in range(args.rounds):
            for k in range(len(mods)):
                v = (r + k) % len(mods)
                use(v)
                t = event_times_us(torch, calls[v], args.iters, scratch)
                times[v] += t
                rounds[v].append(statistics.median(t))
        use(0)
        base = rounds[0]
        for v, name in enumerate(names):
            rel = sorted(x / y for x, y in zip(rounds[v], base))
            print(f"{label:>22} {name:>14} {statistics.median(times[v]):>9.1f} us   x{statistics.median(rel):.4f}"
                  f" ({rel[0]:.3f}..{rel[-1]:.3f})", flush=True)
        return [statistics.median(t) for t in times]

    def peer_outputs(*outs):
        """The peer's own arrays like this tree's out, lse, max_logits (None without --peer)."""
        return tuple(torch.empty_like(x) for x in outs) if peer else None

    def compare(label, out, pouts):
        """max |peer - this| over max |this| of the last calls' outputs (the same inputs)."""
        if pouts is not None:
            torch.cuda.synchronize()
            d = (pouts[0].float() - out.float()).abs().max().item() / max(out.float().abs().max().item(), 1e-30)
            print(f"{label:>22} {'peer vs this':>14} out max|diff| / max|out| {d:.2e}", flush=True)

    for sh in args.shape:
        parts = sh.split(",")
        dims = [int(x) for x in parts] if len(parts) in (2, 3) and all(x.isdigit() for x in parts) else [0, 0, 0]
        h, s_kv, s_q = (dims + [B.S_Q])[:3]
        if not 1 <= s_q <= B.S_Q:
            raise SystemExit(f"ab_prefill: --shape {sh!r}: expected H,S_KV[,S_Q] with 1 <= S_Q <= {B.S_Q}")
        kv, idx = B.random_kv(torch, s_kv)
        idx = idx[:s_q].contiguous()
        lab = f"h={h} s_kv={s_kv}" + (f" s_q={s_q}" if len(parts) == 3 else "")
        q, out, lse, ml = B.query(torch, torch.Generator(device="cuda").manual_seed(h), s_q, h)
        # every output given: a tree's extension takes only its own "allocate" marker (smla.ops passes its own)
        po = peer_outputs(out, lse, ml)
        measure(lab, lambda: smla.sparse_mla_prefill(
            q, kv, idx, softmax_scale=B.SCALE, out=out, lse=lse, max_logits=ml, precision=args.precision),
            peer_call(torch, peer, q, kv, idx, po, B.SCALE))
        compare(lab, out, po)
        del kv, idx, q, out, lse, ml, po
        torch.cuda.empty_cache()
    if args.causal:
        gen, kv, full, causal = B.causal_inputs(torch)
        for h in B.CAUSAL_HEADS:
            q, out, lse, ml = B.query(torch, gen, B.CAUSAL_S, h)
            po = peer_outputs(out, lse, ml)
            res = {}
            for label, idx in (("causal", causal), ("full", full)):
                res[label] = measure(f"h={h} {label}", lambda idx=idx: smla.sparse_mla_prefill(
                    q, kv, idx, softmax_scale=B.SCALE, out=out, lse=lse, max_logits=ml, precision=args.precision),
                    peer_call(torch, peer, q, kv, idx, po, B.SCALE))
                compare(f"h={h} {label}", out, po)
            print(f"{'h=' + str(h) + ' causal/full':>22} " + "  ".join(
                f"{name} {c / f:.3f}" for name, c, f in zip(names, res["causal"], res["full"])), flush=True)

if __name__ == "__main__":
    main()
