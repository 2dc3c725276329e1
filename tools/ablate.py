"""Where the sm90 attention kernel's time goes: times each ablation variant (a profiling build,
SMLA_PROFILE_BUILD=1, compiles them) at the issue shapes, next to the full kernel. Each variant leaves
one stage out (cuda/attention/sm90/kernel.cuh, ABL bits): 1 global K loads, 2 the S = Q K^T wgmma, 4 the
P V wgmma, 6 both MMA phases, 7 loads and both MMA phases, 8 the fp8 dequant, 16 the P_lo half of P V,
32 everything but the copies (the dims kernel only: its consumers wait for each stage and free it; other
kernels run whole).
Their results are wrong by design; only the times mean anything. --precision is the calls' precision=
(default fast, the recipe compared with FlashMLA; docs/design.md section 4).

    SMLA_PROFILE_BUILD=1 python setup.py build_ext --inplace && python tools/ablate.py [--precision high|fast]
        [--small | --register | --dims | --pair]
"""
import argparse
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "benchmarks")]  # the in-place (profiling) build, the benchmarks
import bench_sparse_mla_decode as bd  # noqa: E402
import bench_sparse_mla_prefill as bp  # noqa: E402
from _gpu import open_gpu, time_us  # noqa: E402

VARIANTS = [0, 1, 2, 4, 6, 7, 8, 16, 32]  # 0 and the list of cuda/attention/sm90/variants.cuh (with_variant)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precision", default="fast", choices=["high", "fast"], help="precision= of the calls")
    ap.add_argument("--small", action="store_true",
                    help="the small-head shapes (h 16 / 32) on the narrow kernel (sm90n) instead of h 64 / 128 on sm90")
    ap.add_argument("--register", action="store_true",
                    help="the small-head decode shapes on the register kernel (sm90r, fp8 only: no prefill shapes)")
    ap.add_argument("--dims", action="store_true",
                    help="the small-head decode shapes on the dims kernel (sm90d, fp8, h <= 16: no prefill shapes)")
    ap.add_argument("--pair", action="store_true",
                    help="the pair kernel (sm90p, bf16 K only: the prefill shapes) instead of the wide one")
    args = ap.parse_args()
    prec = args.precision
    family = ("sm90d" if args.dims else "sm90r" if args.register else "sm90n" if args.small else
              "sm90p" if args.pair else "sm90")
    gpu = open_gpu("ablate", family)
    if gpu is None:
        return 0
    torch, smla = gpu
    variants = [v for v in VARIANTS if v != 32 or args.dims]  # 32 idles only the dims kernel's consumers
    print(f"{'case':<26} " + " ".join(f"{'abl' + str(v):>8}" for v in variants) + f"   (us per call, {prec})")
    small = args.small or args.register or args.dims
    dec = [(16, 1, 128), (32, 1, 128), (16, 2, 128)] if small else [(128, 2, 128), (64, 2, 128), (128, 1, 2)]
    if args.dims:
        dec = [(16, 1, 128), (8, 1, 128), (16, 2, 128)]
    if args.pair:
        dec = []  # the decode cases read an fp8 cache: the wide kernel's
    cache, bt = bd.build_cache(torch, smla, max(b for _, _, b in dec), "fp8_ds_mla") if dec else (None, None)
    for h, s_q, b in dec:
        q = torch.randn((b, s_q, h, 576), device="cuda").to(torch.bfloat16)
        idx = bd.make_indices(torch, bt, b, s_q, seed=1)
        out = torch.empty((b, s_q, h, 512), dtype=torch.bfloat16, device="cuda")
        lse = torch.empty((b, s_q, h), dtype=torch.float32, device="cuda")
        ws = torch.empty(smla.sparse_mla_decode_workspace_size(b, s_q, h, bd.TOPK, "fp8_ds_mla"), dtype=torch.uint8,
                         device="cuda")
        row = []
        for v in variants:
            os.environ["SMLA_ATTN_ABLATE"] = str(v)
            row.append(time_us(torch, lambda: smla.sparse_mla_decode(
                q, cache, idx, softmax_scale=bd.SCALE, kv_cache_dtype="fp8_ds_mla", out=out, lse=lse, workspace=ws,
                precision=prec), 20, 3, True))
        print(f"{f'decode h{h} s_q{s_q} b{b}':<26} " + " ".join(f"{t:>8.1f}" for t in row), flush=True)
    cache = None  # free it before the prefill cases
    torch.cuda.empty_cache()
    for h, s_kv in [] if args.register or args.dims else ([(16, 32768), (32, 32768)] if small else [(128, 32768), (64, 32768)]):
        kv = torch.randn((s_kv, 576), device="cuda").to(torch.bfloat16)
        idx = bp.make_indices(torch, s_kv, seed=2)
        q = torch.randn((bp.S_Q, h, 576), device="cuda").to(torch.bfloat16)
        row = []
        for v in variants:
            os.environ["SMLA_ATTN_ABLATE"] = str(v)
            row.append(time_us(torch, lambda: smla.sparse_mla_prefill(q, kv, idx, softmax_scale=bp.SCALE,
                                                                      precision=prec), 6, 2, True))
        print(f"{f'prefill h{h} s_kv{s_kv}':<26} " + " ".join(f"{t:>8.1f}" for t in row), flush=True)
    os.environ["SMLA_ATTN_ABLATE"] = "0"
    return 0


if __name__ == "__main__":
    sys.exit(main())
