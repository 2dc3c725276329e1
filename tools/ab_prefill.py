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
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", default=[], help="another tree (built in place); repeatable")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="this tree with a run-time switch set during its calls; repeatable")
    ap.add_argument("--shape", action="append", default=[], metavar="H,S_KV")
    ap.add_argument("--precision", default="fast", choices=["high", "fast"])
    ap.add_argument("--kernel", default="sm90p")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--causal", action="store_true", help="the causal fresh prompt and its full twin too")
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

    def measure(label, call):
        """Per tree: all its call times (us) and its round medians."""
        times = [[] for _ in mods]
        rounds = [[] for _ in mods]
        for v in range(len(mods)):  # warm-up: module load, kernel attributes
            use(v)
            call()
        for r in range(args.rounds):
            for k in range(len(mods)):
                v = (r + k) % len(mods)
                use(v)
                t = event_times_us(torch, call, args.iters, scratch)
                times[v] += t
                rounds[v].append(statistics.median(t))
        use(0)
        base = rounds[0]
        for v, name in enumerate(names):
            rel = sorted(x / y for x, y in zip(rounds[v], base))
            print(f"{label:>22} {name:>14} {statistics.median(times[v]):>9.1f} us   x{statistics.median(rel):.4f}"
                  f" ({rel[0]:.3f}..{rel[-1]:.3f})", flush=True)
        return [statistics.median(t) for t in times]

    for sh in args.shape:
        h, s_kv = (int(x) for x in sh.split(","))
        kv, idx = B.random_kv(torch, s_kv)
        q, out, lse, ml = B.query(torch, torch.Generator(device="cuda").manual_seed(h), B.S_Q, h)
        # every output given: a tree's extension takes only its own "allocate" marker (smla.ops passes its own)
        measure(f"h={h} s_kv={s_kv}", lambda: smla.sparse_mla_prefill(
            q, kv, idx, softmax_scale=B.SCALE, out=out, lse=lse, max_logits=ml, precision=args.precision))
        del kv, idx, q, out, lse, ml
        torch.cuda.empty_cache()
    if args.causal:
        gen, kv, full, causal = B.causal_inputs(torch)
        for h in B.CAUSAL_HEADS:
            q, out, lse, ml = B.query(torch, gen, B.CAUSAL_S, h)
            res = {}
            for label, idx in (("causal", causal), ("full", full)):
                res[label] = measure(f"h={h} {label}", lambda idx=idx: smla.sparse_mla_prefill(
                    q, kv, idx, softmax_scale=B.SCALE, out=out, lse=lse, max_logits=ml, precision=args.precision))
            print(f"{'h=' + str(h) + ' causal/full':>22} " + "  ".join(
                f"{name} {c / f:.3f}" for name, c, f in zip(names, res["causal"], res["full"])), flush=True)

if __name__ == "__main__":
    main()
