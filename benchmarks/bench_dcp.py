"""Decode context parallelism (smla.parallel.dcp_decode) across the GPUs of one host, against one GPU.

    torchrun --nproc-per-node N benchmarks/bench_dcp.py [--batch 128 --heads 128 --context 131072 ...]

Every rank builds the same random step from the same seed (a paged cache of `batch` requests of
`context` tokens, q, and top-k request-local positions), keeps only its shard of the cache
(owner of position g: (g // interleave) % N), and runs dcp_decode: its share of the sparse decode,
then the lse all-gather and the all-reduce of the rescaled outputs over NCCL. Rank 0 also runs the
whole step on its one GPU (convert_topk_indices + sparse_mla_decode), which is the baseline and the
reference every rank's result is checked against. Prints a table and one JSON line (--json also
writes it to a file). NVLink multicast (NVLS / symmetric-memory multicast) stays off.
"""
import argparse
import json
import os
import sys
import time

USAGE = """bench_dcp.py runs under torchrun, one process per GPU, e.g.

    torchrun --nproc-per-node 2 benchmarks/bench_dcp.py
    torchrun --nproc-per-node 8 benchmarks/bench_dcp.py --kv-cache-dtype bf16 --interleave 64

(no torch.distributed environment found: RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR are unset)"""

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128, help="requests (one query token each)")
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--context", type=int, default=131072, help="tokens per request")
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--interleave", type=int, default=1)
    p.add_argument("--kv-cache-dtype", default="fp8_ds_mla", choices=["fp8_ds_mla", "bf16"])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the JSON result to this file (rank 0)")
    p.add_argument("--cpu", action="store_true",
                   help="smoke test without GPUs: CPU kernels, gloo (use small --batch/--heads/--context)")
    return p.parse_args()


def main():
    args = parse_args()
    if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        print(USAGE)
        return 0
    # NVLink multicast must stay off on the machines this runs on: set before NCCL initialises.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

    import torch
    import torch.distributed as dist

    import smla
    from smla.parallel import dcp_decode, dcp_local_decode, split_cache_by_owner

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from reference import LSE_ABS, LSE_REL, OUT_ABS, OUT_COS, OUT_REL  # docs/design.md section 4 tolerances

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        if not torch.cuda.is_available() or not smla.cuda_available():
            print("bench_dcp.py needs one CUDA GPU per rank and smla built with CUDA (--cpu: smoke test)",
                  file=sys.stderr)
            return 2
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)

    def sync():
        if not args.cpu:
            torch.cuda.synchronize()
    rank, world = dist.get_rank(), dist.get_world_size()
    cd, b, h, ctx, topk, bs, il = (args.kv_cache_dtype, args.batch, args.heads, args.context, args.topk,
                                   args.block_size, args.interleave)
    scale = 576 ** -0.5

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    # ---- the same step on every rank ----
    log(f"building {b} x {ctx} tokens ({cd}) on {world} rank(s) ...")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    blocks_per_req = -(-ctx // bs)
    num_blocks = b * blocks_per_req
    block_table = torch.randperm(num_blocks, generator=gen, device=dev).view(b, blocks_per_req).int()
    seq_lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    cache = torch.zeros(smla.kv_cache_shape(num_blocks, bs, cd),
                        dtype=torch.uint8 if cd == "fp8_ds_mla" else torch.bfloat16, device=dev)
    pos = torch.arange(ctx, device=dev)
    for r in range(b):
        kv_c = torch.randn(ctx, 512, generator=gen, device=dev).bfloat16()
        k_pe = torch.randn(ctx, 64, generator=gen, device=dev).bfloat16()
        slots = (block_table[r, pos // bs].long() * bs + pos % bs).int()
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
    del kv_c, k_pe, slots
    q = torch.randn(b, 1, h, 576, generator=gen, device=dev).bfloat16()
    idx = torch.rand(b, ctx, generator=gen, device=dev).topk(min(topk, ctx), dim=1).indices.int()
    req_id = torch.arange(b, dtype=torch.int32, device=dev)

    (local_cache, local_bt, _), = split_cache_by_owner(cache, block_table, seq_lens, dcp_size=world,
                                                      interleave=il, ranks=[rank])
    if rank != 0:
        del cache
    sync()
    if not args.cpu:
        torch.cuda.empty_cache()

    def timed(fn):
        """Mean ms per call over --iters calls after --warmup (CUDA events; wall clock with --cpu)."""
        for _ in range(args.warmup):
            fn()
        sync()
        if args.cpu:
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            return (time.perf_counter() - t0) * 1e3 / args.iters
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / args.iters

    def rank_max(ms):
        t = torch.tensor([ms], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # ---- one GPU, the whole step (rank 0) ----
    ref_out = torch.empty(b, 1, h, 512, dtype=torch.bfloat16, device=dev)
    ref_lse = torch.empty(b, 1, h, dtype=torch.float32, device=dev)
    single_ms = None
    if rank == 0:
        def single():
            slots = smla.convert_topk_indices(req_id, block_table, idx, block_size=bs)
            return smla.sparse_mla_decode(q, cache, slots.view(b, 1, -1), softmax_scale=scale, kv_cache_dtype=cd,
                                          out=ref_out, lse=ref_lse)
        single()
        single_ms = timed(single)
        del cache
    dist.barrier(**({} if args.cpu else {"device_ids": [local_rank]}))
    dist.broadcast(ref_out, src=0)
    dist.broadcast(ref_lse, src=0)

    # ---- DCP ----
    kw = dict(block_size=bs, softmax_scale=scale, kv_cache_dtype=cd, dcp_size=world, dcp_rank=rank, interleave=il)
    args_dcp = (q, local_cache, idx, req_id, local_bt)
    local_ms = rank_max(timed(lambda: dcp_local_decode(*args_dcp, **kw)))

    def check(out, lse, comm):
        """This rank's result against the one-GPU step, with docs/design.md's tolerances widened by the bf16
        rounding of the partial outputs (2**-8 of sum_r w_r |o_r|, summed over ranks; bf16 sums add
        `world` more such roundings) and of the one-GPU output itself (2**-8 |e|): where the ranks'
        contributions cancel, that rounding is large next to the result (see tests/test_parallel.py).
        The angle between the results may be twice that of docs/design.md's cosine tolerance (both round) plus
        |rounding| / |expected|; lse keeps docs/design.md's tolerances."""
        p_out, p_lse = dcp_local_decode(*args_dcp, **kw)
        w = torch.exp(p_lse - lse)
        w = torch.where(torch.isnan(w), 0.0, w)
        rounding = w[..., None] * p_out.float().abs() * 2.0**-8
        dist.all_reduce(rounding)
        rounding = rounding.double() * (1 + (world if comm == "bfloat16" else 0))
        a, e = out.double(), ref_out.double()
        bound = torch.clamp(OUT_REL * e.abs(), min=OUT_ABS) + 2.0**-8 * e.abs()
        bound += rounding
        err = (a - e).abs()
        cos_diff = 1 - (a * e).sum() / (a.norm() * e.norm())
        angle = 2 * (2 * OUT_COS) ** 0.5 + float(rounding.norm() / e.norm())
        cos_tol = angle**2 / 2
        lse_bad = torch.where(torch.isfinite(ref_lse),
                              (lse - ref_lse).abs() > torch.clamp(LSE_REL * ref_lse.abs(), min=LSE_ABS),
                              lse != ref_lse)
        stats = torch.tensor([float(not bool(torch.isfinite(a).all() and (err <= bound).all()
                                              and cos_diff <= cos_tol and not lse_bad.any())),
                              float(err.max()), float(cos_diff), float((err / bound).max()), cos_tol],
                             dtype=torch.float64, device=dev)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        return {"ok": stats[0].item() == 0, "max_abs": stats[1].item(), "cos_diff": stats[2].item(),
                "max_err_over_bound": stats[3].item(), "cos_tol": stats[4].item()}

    results = {}
    for comm in ("float32", "bfloat16"):
        fn = lambda: dcp_decode(*args_dcp, **kw, comm_dtype=getattr(torch, comm))  # noqa: E731
        out, lse = fn()
        ms = rank_max(timed(fn))
        results[comm] = (ms, check(out, lse, comm))
    dist.destroy_process_group()

    if rank == 0:
        res = {
            "bench": "dcp_decode", "world": world, "batch": b, "heads": h, "context": ctx, "topk": topk,
            "block_size": bs, "interleave": il, "kv_cache_dtype": cd, "iters": args.iters,
            "single_gpu_ms": single_ms, "dcp_local_ms": local_ms,
            "dcp_ms": {k: v[0] for k, v in results.items()},
            "speedup": {k: single_ms / v[0] for k, v in results.items()},
            "check": {k: v[1] for k, v in results.items()},
            "device": "cpu" if args.cpu else torch.cuda.get_device_name(dev), "smla": smla.__version__, "torch": torch.__version__,
        }
        print(f"\nDCP sparse MLA decode: b={b} h={h} context={ctx} topk={topk} {cd} interleave={il}, "
              f"{world} x {res['device']}")
        print(f"{'step':<34}{'ms':>10}{'vs 1 GPU':>10}  check")
        print(f"{'1 GPU (convert + decode)':<34}{single_ms:>10.4f}{1.0:>10.2f}  reference")
        print(f"{f'{world} GPUs, local share only':<34}{local_ms:>10.4f}{single_ms / local_ms:>10.2f}  -")
        for comm, (ms, chk) in results.items():
            ok = "ok" if chk["ok"] else "FAILED"
            print(f"{f'{world} GPUs, dcp_decode ({comm} sum)':<34}{ms:>10.4f}{single_ms / ms:>10.2f}  {ok} "
                  f"(max abs {chk['max_abs']:.2e}, cos diff {chk['cos_diff']:.2e})")
        line = json.dumps(res)
        print(line)
        if args.json:
            with open(args.json, "w") as f:
                f.write(line + "\n")
        return 0 if all(v[1]["ok"] for v in results.values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
