"""First check of a kernel family on the GPU, before the full suite: a few prefill, bf16 and fp8 decode cases
against the float64 oracle in a child process with a time limit, so that a hang or a fault is
reported as such and the calling script can stop early.

    python3 tools/gpu_first_check.py [--family sm90p] [--timeout 60]
Exit status: 0 all passed, 1 a case failed, 2 a case hung or crashed.
"""
import argparse
import os
import subprocess
import sys

CASES = [  # (kind, h, s_q, s_kv or topk, topk, tl_mode)
    ("prefill", 64, 5, 128, 128, "none"), ("prefill", 128, 13, 1840, 256, "rand"),
    ("prefill", 64, 7, 4096, 2048, "zero"), ("prefill", 100, 9, 700, 320, "rand"),
    ("prefill", 16, 11, 8192, 2048, "none"), ("prefill", 64, 3, 64, 64, "none"),
    ("prefill", 128, 1056, 8192, 2048, "rand"),  # 2,112 CTAs: every SM busy (a hang that few CTAs do not show)
    ("decode", 64, 2, 0, 300, "rand"), ("decode", 128, 1, 0, 2048, "none"),
    ("decode8", 16, 1, 0, 2048, "none"), ("decode8", 3, 2, 0, 300, "rand"), ("decode8", 32, 1, 0, 2112, "zero"),
    ("decode8", 20, 3, 0, 64, "rand"),
]

CHILD = r'''
import sys
sys.path.insert(0, "tests")
import torch
import test_cuda_attention as T
for kind, h, s_q, n, topk, tl in CASES:
    for prec in ("high", "fast"):
        name = f"{kind} h{h} s_q{s_q} n{n} topk{topk} tl={tl} {prec}"
        print("run  ", name, flush=True)
        try:
            if kind == "prefill":
                c = T.prefill_case(s_q, h, n, topk, seed=7, tl_mode=tl, sink_mode="mixed")
                rows = None if s_q <= 64 else torch.arange(0, s_q, s_q // 16, device=c["q"].device)
                out_ref, lse_ref, ml_ref, out_abs = T.prefill_oracle(c, rows=rows, return_abs=True)
                out, lse, ml = T.run_prefill(c, precision=prec)
                torch.cuda.synchronize()
                if rows is not None:  # the oracle of a few rows (the kernel ran on all)
                    out, lse, ml = out[rows], lse[rows], ml[rows]
                T.check_prefill(out, lse, ml, out_ref, lse_ref, ml_ref, name=name, precision=prec, out_abs=out_abs)
            else:
                cd = "bf16" if kind == "decode" else "fp8_ds_mla"
                c = T.decode_case(cd, 3, s_q, h, topk, 64, seed=8, tl_mode=tl, sink_mode="mixed", strided_q=True)
                out_ref, lse_ref, out_abs = T.decode_oracle(c, return_abs=True)
                out, lse = T.run_decode(c, precision=prec)
                torch.cuda.synchronize()
                T.check_decode(out, lse, out_ref, lse_ref, name=name, precision=prec, out_abs=out_abs)
            print("ok   ", name, flush=True)
        except AssertionError as e:
            print("FAIL ", name, str(e)[:400], flush=True)
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="sm90p")
    ap.add_argument("--timeout", type=float, default=150.0)
    args = ap.parse_args()
    env = dict(os.environ, SMLA_ATTN_KERNEL=args.family)
    try:
        r = subprocess.run([sys.executable, "-c", f"CASES = {CASES!r}\n" + CHILD], env=env, capture_output=True,
                           text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(out + "\nHANG (the last 'run' line above)")
        return 2
    print(r.stdout)
    if r.returncode != 0:
        print("CRASH:", "\n".join(r.stderr.strip().splitlines()[-6:]))
        return 2
    return 1 if "FAIL " in r.stdout else 0


if __name__ == "__main__":
    sys.exit(main())
