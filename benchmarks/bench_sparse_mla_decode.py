"""Benchmark smla.sparse_mla_decode (CUDA) against a plain PyTorch gather + bmm + softmax baseline.

Shapes (issues 5/6): h in {128, 64} x s_q in {1, 2} x b in {2, 64, 128, 256}, and h in {16, 32} with
b = 128; topk = 2048; every request owns 32K cached tokens of an fp8_ds_mla cache (block_size 64,
blocks shuffled, packed with smla.pack_kv); each query token picks 2048 distinct random positions of
its request. TFLOP/s counts 2 * b * s_q * h * topk * (576 + 512); "uniq GB/s" is the bytes of the
distinct cache rows the step reads (656 B each) over the time, and "vs HBM" is the time over the time
those bytes take at 4.3 TB/s (the measured H200 copy rate). Times are medians of CUDA-event-timed
calls after a warm-up, with the L2 flushed before each call unless --no-flush. Outputs and the
workspace are preallocated, as a serving step would.

    python benchmarks/bench_sparse_mla_decode.py [--quick] [--json out.json] [--no-baseline]
        [--shape H,S_Q,B ...] [--splits 1,4,16] [--cache-dtype bf16] [--kernel portable|sm90]
"""
import sys
import time

from _gpu import attention_parser, start_attention, time_us, write_json  # benchmarks/_gpu.py (scripts run from this folder)

HBM_BYTES_PER_S = 4.3e12
CTX = 32768
TOPK = 2048
BLOCK = 64
FP8_ENTRY = 656
SCALE = 576 ** -0.5


def parse():
    ap = attention_parser(__doc__, 50, 15, "H,S_Q,B")
    ap.add_argument("--cache-dtype", default="fp8_ds_mla", choices=["fp8_ds_mla", "bf16"])
    ap.add_argument("--splits", default="",
                    help="comma-separated split caps to sweep, e.g. 1,4,8,16: the workspace passed holds "
                         "that many splits' partials (the launcher uses min(plan, cap)); default: the plan")
    return ap.parse_args()


def shapes(quick):
    if quick:
        return [(128, 2, 128), (128, 1, 2), (64, 1, 64), (16, 1, 128), (32, 1, 128)]
    out = [(h, s_q, b) for h in (128, 64) for s_q in (1, 2) for b in (2, 64, 128, 256)]
    out += [(h, s_q, 128) for h in (16, 32) for s_q in (1, 2)]
    return out


def build_cache(torch, smla, n_req, cd):
    """n_req requests x 32K tokens on shuffled blocks; returns (cache, block_table[n_req, 512])."""
    nblk = CTX // BLOCK
    num_blocks = n_req * nblk
    gen = torch.Generator(device="cuda").manual_seed(0)
    perm = torch.randperm(num_blocks, generator=gen, device="cuda")
    bt = perm.view(n_req, nblk)
    entry = FP8_ENTRY if cd == "fp8_ds_mla" else 576
    dt = torch.uint8 if cd == "fp8_ds_mla" else torch.bfloat16
    cache = torch.empty((num_blocks, BLOCK, entry), dtype=dt, device="cuda")
    tokens = n_req * CTX
    chunk = 1 << 20
    for t0 in range(0, tokens, chunk):
        t1 = min(tokens, t0 + chunk)
        tok = torch.arange(t0, t1, device="cuda")
        req, pos = tok // CTX, tok % CTX
        slots = bt[req, pos // BLOCK] * BLOCK + pos % BLOCK
        kv_c = torch.randn((t1 - t0, 512), generator=gen, device="cuda").to(torch.bfloat16)
        k_pe = torch.randn((t1 - t0, 64), generator=gen, device="cuda").to(torch.bfloat16)
        smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype=cd)
    torch.cuda.synchronize()
    return cache, bt


def make_indices(torch, bt, b, s_q, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = b * s_q
    pos = torch.rand((rows, CTX), generator=gen, device="cuda").argsort(1)[:, :TOPK]
    req = (torch.arange(rows, device="cuda") // s_q)[:, None]
    slots = bt[req, pos // BLOCK] * BLOCK + pos % BLOCK
    return slots.to(torch.int32).view(b, s_q, TOPK)


def baseline(torch, q, cache, idx, cd):
    """Plain PyTorch: gather (and dequantise) the rows, bmm, fp32 softmax, bmm. All indices valid."""
    b, s_q, h, _ = q.shape
    rows = b * s_q
    flat = cache.view(-1, cache.shape[-1])
    g = flat[idx.view(rows, TOPK).long()]
    if cd == "fp8_ds_mla":
        vals = g[..., :512].contiguous().view(torch.float8_e4m3fn).float()
        sc = g[..., 512:528].contiguous().view(torch.float32)
        nope = (vals.view(rows, TOPK, 4, 128) * sc[..., None]).view(rows, TOPK, 512).to(torch.bfloat16)
        k = torch.cat([nope, g[..., 528:].contiguous().view(torch.bfloat16)], -1)
    else:
        k = g
    s = torch.bmm(q.view(rows, h, 576), k.transpose(1, 2)).float() * SCALE
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).to(torch.bfloat16)
    out = torch.bmm(p, k[..., :512])
    return out.view(b, s_q, h, 512), lse.view(b, s_q, h)


def main():
    args = parse()
    gpu = start_attention("bench_sparse_mla_decode", args, 50, 15)
    if gpu is None:
        return 0
    torch, smla, iters = gpu
    warmup = 3 if args.quick else 10
    flush = not args.no_flush
    cd = args.cache_dtype
    todo = [tuple(int(v) for v in sh.split(",")) for sh in args.shape] or shapes(args.quick)
    caps = [int(v) for v in args.splits.split(",") if v] or [0]
    t0 = time.time()
    cache, bt = build_cache(torch, smla, max(b for _, _, b in todo), cd)
    dev = torch.cuda.get_device_properties(0)
    print(f"# {dev.name}, {dev.multi_processor_count} SMs; kernel {args.kernel}; cache {cd} {cache.numel() * cache.element_size() / 2**30:.1f}"
          f" GiB built in {time.time() - t0:.1f} s; topk {TOPK}, context {CTX} tokens/request, "
          f"{'L2 flushed' if flush else 'L2 warm'}, median of {iters}")
    hdr = (f"{'h':>4} {'s_q':>4} {'b':>4} {'cap':>4} {'time_us':>9} {'TFLOP/s':>8} {'uniqGB/s':>9} {'vsHBM':>6} "
           f"{'splits_ws_MB':>12} {'torch_us':>9} {'speedup':>8} {'max|d|':>8}")
    print(hdr)
    results = []
    for (h, s_q, b), cap in ((sh, c) for sh in todo for c in caps):
        gen = torch.Generator(device="cuda").manual_seed(h * 1000 + b * 10 + s_q)
        q = torch.randn((b, s_q, h, 576), generator=gen, device="cuda").to(torch.bfloat16)
        idx = make_indices(torch, bt, b, s_q, seed=b * 7 + s_q)
        out = torch.empty((b, s_q, h, 512), dtype=torch.bfloat16, device="cuda")
        lse = torch.empty((b, s_q, h), dtype=torch.float32, device="cuda")
        ws_bytes = smla.sparse_mla_decode_workspace_size(b, s_q, h, TOPK, cd)
        if cap > 0:  # partials of at most `cap` splits (fp32 O and lse per split; cap 1: no split)
            ws_bytes = min(ws_bytes, cap * b * s_q * h * (512 + 1) * 4) if cap > 1 else 0
        ws = torch.empty(max(ws_bytes, 0), dtype=torch.uint8, device="cuda")

        def run():
            smla.sparse_mla_decode(q, cache, idx, softmax_scale=SCALE, kv_cache_dtype=cd, out=out, lse=lse,
                                   workspace=ws)

        us = time_us(torch, run, iters, warmup, flush)
        flops = 2.0 * b * s_q * h * TOPK * (576 + 512)
        uniq = int(torch.unique(idx).numel()) * (FP8_ENTRY if cd == "fp8_ds_mla" else 1152)
        rec = dict(op="sparse_mla_decode", cache_dtype=cd, h=h, s_q=s_q, b=b, split_cap=cap, topk=TOPK, time_us=us,
                   tflops=flops / us * 1e-6, unique_bytes=uniq, unique_gbps=uniq / us * 1e-3,
                   vs_hbm=us / (uniq / HBM_BYTES_PER_S * 1e6), workspace_bytes=ws_bytes, flush_l2=flush)
        if not args.no_baseline:
            ob, lb = baseline(torch, q, cache, idx, cd)
            run()
            torch.cuda.synchronize()
            rec["max_abs_diff"] = float((out.float() - ob.float()).abs().max())
            rec["lse_max_abs_diff"] = float((lse - lb).abs().max())
            del ob, lb
            try:
                bus = time_us(torch, lambda: baseline(torch, q, cache, idx, cd), max(3, iters // 5), 2, flush)
                rec["torch_us"] = bus
                rec["speedup"] = bus / us
            except torch.cuda.OutOfMemoryError:
                rec["torch_us"] = None
            torch.cuda.empty_cache()
        results.append(rec)
        tus = rec.get("torch_us")
        t_txt = f"{tus:.1f}" if tus else "-"
        s_txt = f"{tus / us:.1f}x" if tus else "-"
        print(f"{h:>4} {s_q:>4} {b:>4} {cap if cap else '-':>4} {us:>9.1f} {rec['tflops']:>8.1f} {rec['unique_gbps']:>9.0f} "
              f"{rec['vs_hbm']:>6.2f} {ws_bytes / 2**20:>12.1f} {t_txt:>9} {s_txt:>8} "
              f"{rec.get('max_abs_diff', float('nan')):>8.3g}", flush=True)
    write_json(args.json, torch, args.kernel, iters, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
