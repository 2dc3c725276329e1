"""Host-side cost of one smla call on torch CUDA tensors (the Python layer + binding + launch), for the
DLPack exchange-API fast path. Run on a GPU machine: python3 tools/host_overhead.py"""
import time, torch, smla
dev = "cuda"
b, s_q, h, topk = 2, 1, 128, 2048
cache = torch.zeros(smla.kv_cache_shape(2048, 64, "fp8_ds_mla"), dtype=torch.uint8, device=dev)
q = torch.randn(b, s_q, h, 576, device=dev).to(torch.bfloat16)
idx = torch.randint(0, 2048 * 64, (b, s_q, topk), dtype=torch.int32, device=dev)
out = torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device=dev); lse = torch.empty(b, s_q, h, device=dev)
ws = torch.empty(smla.sparse_mla_decode_workspace_size(b, s_q, h, topk, "fp8_ds_mla"), dtype=torch.uint8, device=dev)
f = lambda: smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla", out=out, lse=lse, workspace=ws)
for _ in range(20): f()
torch.cuda.synchronize()
n = 2000; t0 = time.perf_counter()
for _ in range(n): f()
t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
print(f"host time per sparse_mla_decode call (b=2, h=128, out/lse/workspace given): {(t1-t0)/n*1e6:.1f} us issue, {(t2-t0)/n*1e6:.1f} us incl. drain")
rid = torch.zeros(2, dtype=torch.int32, device=dev); bt = torch.zeros(2, 8, dtype=torch.int32, device=dev); o2 = torch.empty(2, topk, dtype=torch.int32, device=dev)
h2 = lambda: smla.convert_topk_indices(rid, bt, idx.view(-1, topk), block_size=64, out=o2)
for _ in range(20): h2()
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(n): h2()
t1 = time.perf_counter(); torch.cuda.synchronize()
print(f"host time per convert_topk_indices call (out given): {(t1-t0)/n*1e6:.1f} us")
