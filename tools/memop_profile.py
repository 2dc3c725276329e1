"""Run one memory op on the bench_memory_ops shape a few times, for Nsight Compute (issue 18):
    ncu -k regex:convert_kernel --launch-skip 2 --launch-count 1 --set full python tools/memop_profile.py convert
ops: convert (convert_topk_indices, 4096 x 2048), dcp (filter_convert_dcp_indices, world 4), pack (pack_kv fp8,
131072 tokens on random slots)."""
import sys

import torch

import smla


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "convert"
    g = torch.Generator(device="cuda").manual_seed(0)
    if what in ("convert", "dcp"):
        n, k, r, ctx, bs = 4096, 2048, 8, 32768, 64
        dcp = 4 if what == "dcp" else 1
        m = ctx // bs * dcp
        bt = torch.randperm(r * m, generator=g, device="cuda").to(torch.int32).view(r, m)
        req = torch.randint(0, r, (n,), generator=g, device="cuda", dtype=torch.int32)
        tok = torch.randint(0, ctx, (n, k), generator=g, device="cuda", dtype=torch.int32)
        tok[:, 3 * k // 4:] = -1
        out, cnt = torch.empty_like(tok), torch.empty((n,), dtype=torch.int32, device="cuda")
        for _ in range(4):
            if dcp > 1:
                smla.filter_convert_dcp_indices(req, bt, tok, block_size=bs, dcp_size=dcp, dcp_rank=dcp - 1, out=out,
                                                valid_counts=cnt)
            else:
                smla.convert_topk_indices(req, bt, tok, block_size=bs, return_valid_counts=True, out=out,
                                          valid_counts=cnt)
    else:
        t = 131072
        nb = t // 64 + 2
        kv = (torch.randn((t, 512), generator=g, device="cuda") * 3).to(torch.bfloat16)
        pe = torch.randn((t, 64), generator=g, device="cuda").to(torch.bfloat16)
        slots = torch.randperm(nb * 64, generator=g, device="cuda")[:t]
        cache = torch.zeros((nb, 64, 656), dtype=torch.uint8, device="cuda")
        for _ in range(4):
            smla.pack_kv(kv, pe, cache, slots, kv_cache_dtype="fp8_ds_mla")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
