"""python -m smla demo: one DeepSeek-V3.2-shaped serving step through smla's layer backend.

It writes a paged cache, builds the step's metadata, runs SparseMLAAttention.forward on a mixed batch
(decode requests first, then prefill requests), checks sampled tokens against a float64 NumPy
computation, and prints a short table. On a usable GPU it runs the full model shape with torch; else a
smaller default on the CPU with NumPy.
"""
import argparse
import math
import sys
import time

import ml_dtypes
import numpy as np

import smla

BF16 = ml_dtypes.bfloat16


class Progress:
    def __init__(self, steps):
        self.steps, self.i, self.t0 = steps, 0, None

    def start(self, what):
        self.i += 1
        self.t0 = time.perf_counter()
        print(f"[{self.i}/{self.steps}] {what} ...", end="", flush=True)

    def done(self, extra=""):
        dt = time.perf_counter() - self.t0
        print(f" {dt:.2f} s{(' ' + extra) if extra else ''}", flush=True)
        return dt


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m smla", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run one mixed decode + prefill step and check it")
    d.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    d.add_argument("--heads", type=int, help="query heads (default: 128 on GPU, 64 on CPU)")
    d.add_argument("--topk", type=int, help="top-k per query token (default: 2048)")
    d.add_argument("--decodes", type=int, help="decode requests (default: 64 on GPU, 4 on CPU)")
    d.add_argument("--prefills", type=int, help="prefill requests (default: 2 on GPU, 1 on CPU)")
    d.add_argument("--prefill-len", type=int, help="new tokens per prefill (default: 1024 on GPU, 32 on CPU)")
    d.add_argument("--context", type=int, help="context tokens per request (default: 8192 on GPU, 4096 on CPU)")
    d.add_argument("--kv-cache-dtype", choices=["fp8_ds_mla", "bf16"], default="fp8_ds_mla")
    d.add_argument("--mode", choices=["auto", "mixed", "split"], default="auto")
    d.add_argument("--block-size", type=int, default=64)
    d.add_argument("--check", type=int, default=8, help="query tokens checked against float64 (default 8)")
    d.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.cmd == "demo":
        return demo(args)
    return 2


def demo(a):
    gpu = smla.cuda_available() if a.device == "auto" else a.device == "cuda"
    if gpu and not smla.cuda_available():
        sys.exit("--device cuda: no usable CUDA GPU (or smla built without CUDA)")
    if gpu:
        import torch
    H = a.heads or (128 if gpu else 64)
    K = a.topk or 2048
    nd = a.decodes if a.decodes is not None else (64 if gpu else 4)
    npf = a.prefills if a.prefills is not None else (2 if gpu else 1)
    plen = a.prefill_len or (1024 if gpu else 32)
    ctx = a.context or (8192 if gpu else 4096)
    bs = a.block_size
    rng = np.random.default_rng(a.seed)
    prog = Progress(4)

    # --- the step: decodes (1 new token) first, then prefills (plen new tokens) ---
    R = nd + npf
    q_lens = np.array([1] * nd + [plen] * npf, np.int32)
    seq_lens = np.full(R, ctx, np.int32)  # context incl. this step's tokens
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(qsl[-1])
    blocks_per_req = -(-ctx // bs)
    num_blocks = R * blocks_per_req + 1
    perm = rng.permutation(num_blocks - 1).astype(np.int32)  # blocks scattered in the pool
    block_table = perm[: R * blocks_per_req].reshape(R, blocks_per_req)
    pos = np.concatenate([np.arange(seq_lens[r] - q_lens[r], seq_lens[r]) for r in range(R)]).astype(np.int32)
    req = np.repeat(np.arange(R), q_lens)
    slot_mapping = (block_table[req, pos // bs] * bs + pos % bs).astype(np.int64)
    # the indexer's output: up to K request-local positions <= the token's own position, -1 padded
    topk = np.full((T, K), -1, np.int32)
    for t in range(T):
        n = min(K, int(pos[t]) + 1)
        topk[t, :n] = rng.choice(int(pos[t]) + 1, n, replace=False) if n < pos[t] + 1 else np.arange(n)
    scale = 1.0 / math.sqrt(576)

    prog.start(f"writing the context ({R} requests x {ctx} tokens, {a.kv_cache_dtype} cache)")
    shape = smla.kv_cache_shape(num_blocks, bs, a.kv_cache_dtype)
    cache_np = np.zeros(shape, np.uint8 if a.kv_cache_dtype == "fp8_ds_mla" else BF16)
    all_pos = np.concatenate([np.arange(seq_lens[r] - q_lens[r]) for r in range(R)]).astype(np.int32)
    all_req = np.concatenate([np.full(seq_lens[r] - q_lens[r], r) for r in range(R)])
    ctx_slots = (block_table[all_req, all_pos // bs] * bs + all_pos % bs).astype(np.int64)
    kv_c_ctx = (rng.standard_normal((len(ctx_slots), 512)) * 0.5).astype(BF16)
    k_pe_ctx = (rng.standard_normal((len(ctx_slots), 64)) * 0.5).astype(BF16)
    q = (rng.standard_normal((T, H, 576)) * 0.5).astype(BF16)
    kv_c = (rng.standard_normal((T, 512)) * 0.5).astype(BF16)
    k_pe = (rng.standard_normal((T, 64)) * 0.5).astype(BF16)
    if gpu:
        dev = torch.device("cuda")

        def to(x):
            t = torch.from_numpy(np.ascontiguousarray(x).view(np.uint16) if x.dtype == BF16 else x)
            return (t.view(torch.bfloat16) if x.dtype == BF16 else t).to(dev)
        cache = to(cache_np)
        args = [to(x) for x in (kv_c_ctx, k_pe_ctx, ctx_slots)]
        smla.pack_kv(*args[:2], cache, args[2], kv_cache_dtype=a.kv_cache_dtype)
        qd, kv_cd, k_ped, topkd = (to(x) for x in (q, kv_c, k_pe, topk))
        md_in = [to(x) for x in (qsl, seq_lens, block_table, slot_mapping)]
        torch.cuda.synchronize()
    else:
        cache = cache_np
        smla.pack_kv(kv_c_ctx, k_pe_ctx, cache, ctx_slots, kv_cache_dtype=a.kv_cache_dtype)
        qd, kv_cd, k_ped, topkd = q, kv_c, k_pe, topk
        md_in = [qsl, seq_lens, block_table, slot_mapping]
    prog.done()

    prog.start("building the layer and the step's metadata")
    from smla.layer import SparseMLAAttention
    from smla.metadata import SparseMLAConfig, SparseMLAMetadataBuilder

    cfg = SparseMLAConfig(num_heads=H, kv_cache_dtype=a.kv_cache_dtype, block_size=bs, topk=K, max_model_len=ctx,
                          max_num_seqs=R, max_num_batched_tokens=T, mode=a.mode)  # one for builder and layer
    builder = SparseMLAMetadataBuilder.from_config(cfg)
    attn = SparseMLAAttention.from_config(cfg, scale)
    md = builder.build(*md_in)
    prog.done()

    prog.start(f"forward: {T} tokens x {H} heads x top-{K} ({nd} decodes, {npf} prefills of {plen})")
    out = attn.forward(qd, kv_cd, k_ped, cache, topkd, md)  # warm-up (first call sets up workspaces)
    if gpu:
        torch.cuda.synchronize()
        iters = 5
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(iters):
            out = attn.forward(qd, kv_cd, k_ped, cache, topkd, md)
        ev[1].record()
        torch.cuda.synchronize()
        step = ev[0].elapsed_time(ev[1]) / 1e3 / iters
    else:
        t0 = time.perf_counter()
        out = attn.forward(qd, kv_cd, k_ped, cache, topkd, md)
        step = time.perf_counter() - t0
    prog.done(f"(step {step * 1e3:.2f} ms)")

    prog.start(f"checking {min(a.check, T)} sampled tokens against float64 NumPy")
    out_np = (out.view(torch.uint16).cpu().numpy() if gpu else np.asarray(out).view(np.uint16))
    cache_host = cache.cpu().numpy() if gpu else cache
    sample = np.unique(np.concatenate([rng.choice(T, min(a.check, T), replace=False), [0, T - 1]]))
    worst = 0.0
    for t in sample:
        r = int(req[t])
        sel = topk[t][topk[t] >= 0]
        slots = (block_table[r, sel // bs] * bs + sel % bs).astype(np.int32)
        rows = smla.unpack_kv(cache_host, slots, kv_cache_dtype=a.kv_cache_dtype).astype(np.float64)
        qf = q[t].astype(np.float64)
        s = scale * qf @ rows.T
        p = np.exp(s - s.max(axis=1, keepdims=True))
        ref = (p @ rows[:, :512]) / p.sum(axis=1, keepdims=True)
        got = out_np[t].view(BF16).astype(np.float64)
        worst = max(worst, float(np.max(np.abs(got - ref) / (np.abs(ref) + 1e-2))))
    ok = worst <= 2.01 / 128 * 2
    prog.done("ok" if ok else "MISMATCH")

    flops = 2.0 * T * H * K * (576 + 512)
    rows = [
        ("device", "cuda (" + smla.build_info()["cuda_runtime"] + ")" if gpu else "cpu"),
        ("cache", f"{a.kv_cache_dtype}, {num_blocks} blocks x {bs}"),
        ("batch", f"{nd} decodes + {npf} prefills x {plen} = {T} tokens"),
        ("shape", f"h={H}, topk={K}, d_qk=576, d_v=512"),
        ("mode", attn.mode),
        ("step time", f"{step * 1e3:.3f} ms"),
        ("throughput", f"{flops / step / 1e12:.3f} TFLOP/s"),
        ("max rel. error (sample)", f"{worst:.2e}"),
    ]
    w = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
