"""Per-CTA fixed cost and per-tile cost of the sparse prefill kernels (issue 16): the time of one call at
h=128, s_q=4096, s_kv=32768 for top-k 64 .. 2048 (1 .. 32 K tiles per CTA, random valid indices) and with
every index -1 (no tile runs: the index scan, Q and the epilogue only), then a least-squares line
per-wave time = F + n * t over n tiles. One CTA per SM, so waves = ceil(CTAs / SMs); F is what a CTA
pays besides its tiles (the tile scan, Q and the first tile with nothing to overlap them, the epilogue),
which sets the causal fresh-prompt ratio (16.5 t + F) / (32 t + F) (benchmarks/README.md, issue 16).
--part-sms instead times one call of s_q = 4 .. 264 query rows (2 s_q CTAs: from a few SMs busy to four waves),
top-k 2048, L2 warm: how much faster a CTA is when fewer SMs gather from L2 at the same time.

    PYTHONPATH=src python3 tools/cta_cost.py [--precision fast|high] [--kernel auto|sm90|sm90p] [--part-sms]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from _gpu import open_gpu, time_us as events_us  # noqa: E402

S_Q, H, S_KV = 4096, 128, 32768
TOPKS = (64, 128, 256, 512, 1024, 2048)


def fit(points):
    """Least-squares (F, t) of y = F + n t over (n, y) points."""
    n = [p[0] for p in points]
    y = [p[1] for p in points]
    mn, my = sum(n) / len(n), sum(y) / len(y)
    t = sum((a - mn) * (b - my) for a, b in zip(n, y)) / sum((a - mn) ** 2 for a in n)
    return my - t * mn, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", default="fast", choices=["fast", "high"])
    ap.add_argument("--kernel", default="auto", choices=["auto", "sm90", "sm90p"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--part-sms", action="store_true", help="the time of one call with part of the SMs busy")
    args = ap.parse_args()
    gpu = open_gpu("cta_cost", args.kernel)
    if gpu is None:
        return 0
    torch, smla = gpu

    g = torch.Generator(device="cuda").manual_seed(1)
    kv = torch.randn((S_KV, 576), generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn((S_Q, H, 576), generator=g, device="cuda").to(torch.bfloat16)
    out = torch.empty((S_Q, H, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((S_Q, H), dtype=torch.float32, device="cuda")
    ml = torch.empty((S_Q, H), dtype=torch.float32, device="cuda")
    full = torch.rand((S_Q, S_KV), generator=g, device="cuda").argsort(1)[:, :max(TOPKS)].to(torch.int32)

    def time_us(idx):  # median of --iters calls, L2 flushed before each
        return events_us(torch, lambda: smla.sparse_mla_prefill(q, kv, idx, softmax_scale=0.04, out=out, lse=lse,
                                                                max_logits=ml, precision=args.precision),
                         args.iters, 2, True)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.part_sms:
        print(f"# {torch.cuda.get_device_name(0)}, {sms} SMs; kernel {args.kernel}, precision {args.precision}; "
              f"h={H} s_kv={S_KV} top-k 2048; median of {max(args.iters, 50)}, L2 warm")
        for s_q in (4, 8, 16, 33, 66, 132, 264):
            qs, os_, idx = q[:s_q].contiguous(), out[:s_q], full[:s_q].contiguous()
            us = events_us(torch, lambda: smla.sparse_mla_prefill(qs, kv, idx, softmax_scale=0.04, out=os_,
                                                                  precision=args.precision),
                           max(args.iters, 50), 5, False)
            ctas = s_q * (H // 64)
            print(f"s_q {s_q:4d}: {ctas:4d} CTAs ({ctas / sms:.2f} x the SMs) {us:8.1f} us a call, "
                  f"{us / -(-ctas // sms):7.1f} us a wave")
        return 0
    waves = -(-(S_Q * (H // 64)) // sms)
    print(f"# {torch.cuda.get_device_name(0)}, {sms} SMs; kernel {args.kernel}, precision {args.precision}; "
          f"h={H} s_q={S_Q} s_kv={S_KV}; {waves} waves of one CTA per SM; median of {args.iters}, L2 flushed")
    print(f"{'topk':>6} {'tiles':>6} {'us':>9} {'us/wave':>8}")
    points = []
    for topk in TOPKS:
        us = time_us(full[:, :topk].contiguous())
        points.append((topk // 64, us / waves))
        print(f"{topk:6d} {topk // 64:6d} {us:9.1f} {us / waves:8.2f}")
    for topk in (64, 2048):
        us = time_us(torch.full((S_Q, topk), -1, dtype=torch.int32, device="cuda"))
        print(f"{topk:6d} {'none':>6} {us:9.1f} {us / waves:8.2f}  (every index -1)")
    f_all, t_all = fit(points)
    f_big, t_big = fit(points[-3:])
    print(f"# fit over all: F = {f_all:.2f} us per CTA, t = {t_all:.3f} us per tile; over 8..32 tiles: "
          f"F = {f_big:.2f}, t = {t_big:.3f}; causal fresh prompt by the line: "
          f"{(16.5 * t_big + f_big) / (32 * t_big + f_big):.3f}")


if __name__ == "__main__":
    sys.exit(main())
