"""Host time of one smla call, per op and per array library, and where it goes (issue 18).

For each op (sparse_mla_decode b=2 h=128 topk=2048 fp8, sparse_mla_prefill s_q=4 h=128, convert_topk_indices
2 x 2048, pack_kv 2 tokens fp8, merge_attn_states 2 x 128 x 512 bf16) and each library (torch CUDA, CuPy CUDA (bf16 as raw uint16 bits; merge in float32),
torch CUDA behind a plain __dlpack__ producer without the exchange API, NumPy CPU), with the outputs given
and with smla allocating them:

  total    the public call (smla.<op>)
  python   total - binding: the Python wrapper (stream choice, allocation of missing outputs)
  binding  smla._C.<op> called directly with the same arrays (keyword parsing, DLPack import, checks,
           the device guard and the launch)
  launch   binding - binding on an empty batch (b = 0 / no tokens: everything but the kernel launch)

Host time = wall time of a burst of 100 back-to-back calls / 100, median of 21 bursts, the GPU drained
between bursts (outside the timing), so that a full launch queue never turns GPU time into host time. The
issue's original figure (2000 back-to-back calls, which backs the queue up once the GPU is slower than
the host) is printed for decode too, with torch's own costs as a reference: its Python current_stream(),
torch.empty / new_empty, and the two DLPack exchange-API functions the binding calls (a tensor view per
array, the current-stream query once a call; exchange_api_costs). NumPy rows run on an empty batch (the CPU
kernel's own time is not host overhead).

    python3 tools/host_overhead.py [--json FILE] [--libs torch,cupy,plain,numpy]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import smla
from smla import _C
from smla._arrays import launch_stream

BURST, BURSTS = 100, 21
B, H, TOPK, NB, BS = 2, 128, 2048, 64, 64


class Plain:
    """A DLPack producer without the C exchange API (only __dlpack__ / __dlpack_device__)."""

    def __init__(self, a):
        self.a = a
        self.shape = a.shape
        self.dtype = a.dtype

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def library(name):
    """(make(shape, dtype name, fill), sync) for one library; None when it is not usable here."""
    if name == "numpy":
        import ml_dtypes

        dts = dict(bf16=ml_dtypes.bfloat16, f32=np.float32, i32=np.int32, u8=np.uint8)
        return (lambda shape, dt, fill=0: np.full(shape, fill, dts[dt])), (lambda: None)
    if name in ("torch", "plain"):
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        dts = dict(bf16=torch.bfloat16, f32=torch.float32, i32=torch.int32, u8=torch.uint8)
        wrap = Plain if name == "plain" else (lambda a: a)
        return (lambda shape, dt, fill=0: wrap(torch.full(shape, fill, dtype=dts[dt], device="cuda"))), \
            torch.cuda.synchronize
    if name == "cupy":
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
        except Exception:
            return None
        dts = dict(bf16=cupy.uint16, f32=cupy.float32, i32=cupy.int32, u8=cupy.uint8)  # bf16 as raw bits

        def mk(shape, dt, fill=0):
            return cupy.full(shape, fill, dtype=dts[dt])

        mk.raw_bf16 = True
        return mk, cupy.cuda.runtime.deviceSynchronize
    raise ValueError(name)


def lib_bf16_is_raw(mk):
    return getattr(mk, "raw_bf16", False)


def cases(mk, n):
    """op -> (public call with outputs given, the same with smla allocating, direct _C call); n = batch
    (0: the empty batch)."""
    cache = mk(smla.kv_cache_shape(NB, BS, "fp8_ds_mla"), "u8")
    q = mk((n, 1, H, 576), "bf16")
    idx = mk((n, 1, TOPK), "i32", 5)
    out, lse = mk((n, 1, H, 512), "bf16"), mk((n, 1, H), "f32")
    ws_size = smla.sparse_mla_decode_workspace_size(max(n, 1), 1, H, TOPK, "fp8_ds_mla")
    ws = mk((max(ws_size, 1),), "u8")
    s = launch_stream(q, None, "q")
    # keywords written out, as at a call site (a ** of a dict costs a dict merge per call)
    r = {"sparse_mla_decode": (
        lambda: smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla", out=out,
                                       lse=lse, workspace=ws),
        lambda: smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla"),
        lambda: _C.sparse_mla_decode(q=q, kv_cache=cache, indices=idx, topk_length=None, attn_sink=None, out=out,
                                     lse=lse, workspace=ws, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla",
                                     precision="high", stream=s))}
    sq = 2 * n
    pq, kv, pidx = mk((sq, H, 576), "bf16"), mk((4096, 576), "bf16"), mk((sq, TOPK), "i32", 5)
    pout, plse, pml = mk((sq, H, 512), "bf16"), mk((sq, H), "f32"), mk((sq, H), "f32")
    r["sparse_mla_prefill"] = (
        lambda: smla.sparse_mla_prefill(pq, kv, pidx, softmax_scale=0.04, out=pout, lse=plse, max_logits=pml),
        lambda: smla.sparse_mla_prefill(pq, kv, pidx, softmax_scale=0.04),
        lambda: _C.sparse_mla_prefill(q=pq, kv=kv, indices=pidx, topk_length=None, attn_sink=None, out=pout,
                                      lse=plse, max_logits=pml, softmax_scale=0.04, precision="high", stream=s))
    req, bt, tok, cout = mk((n,), "i32"), mk((4, 32), "i32", 1), mk((n, TOPK), "i32", 5), mk((n, TOPK), "i32")
    r["convert_topk_indices"] = (
        lambda: smla.convert_topk_indices(req, bt, tok, block_size=BS, out=cout),
        lambda: smla.convert_topk_indices(req, bt, tok, block_size=BS),
        lambda: _C.convert_topk_indices(req_id=req, block_table=bt, topk_indices=tok, block_size=BS, num_blocks=None,
                                        prefill_request_ids=None, prefill_workspace_starts=None, out=cout,
                                        valid_counts=None, stream=s))
    kv_c, k_pe, slots = mk((n, 512), "bf16"), mk((n, 64), "bf16"), mk((n,), "i32", 3)
    r["pack_kv"] = (
        lambda: smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla"), None,
        lambda: _C.pack_kv(kv_c=kv_c, k_pe=k_pe, kv_cache=cache, slot_mapping=slots, kv_cache_dtype="fp8_ds_mla",
                           scale_rule="pow2", stream=s))
    mdt = "f32" if lib_bf16_is_raw(mk) else "bf16"  # merge takes float dtypes only (CuPy has no bf16)
    oa, ob, la, lb = mk((n, H, 512), mdt), mk((n, H, 512), mdt), mk((n, H), "f32"), mk((n, H), "f32")
    mo, ml = mk((n, H, 512), mdt), mk((n, H), "f32")
    r["merge_attn_states"] = (
        lambda: smla.merge_attn_states(oa, la, ob, lb, out=mo, out_lse=ml),
        lambda: smla.merge_attn_states(oa, la, ob, lb),
        lambda: _C.merge_attn_states(out_a=oa, lse_a=la, out_b=ob, lse_b=lb, out=mo, out_lse=ml, stream=s))
    return r


def host_us(f, sync, burst=BURST, bursts=BURSTS):
    for _ in range(20):
        f()
    sync()
    per = []
    for _ in range(bursts):
        t0 = time.perf_counter()
        for _ in range(burst):
            f()
        per.append((time.perf_counter() - t0) / burst * 1e6)
        sync()
    return statistics.median(per)


def exchange_api_costs(torch, sync):
    """Host time of the two torch DLPack exchange-API functions the binding calls per CUDA call: the
    current-stream query (once a call) and the non-owning tensor view (once per array argument), each called
    through ctypes less the same ctypes call (same prototype, arguments made once) of libc's labs, which
    returns at once; {} when torch publishes no table."""
    import ctypes

    cap = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if cap is None:
        return {}
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = get(cap, b"dlpack_exchange_api")
    # header {u32 major, u32 minor, void *prev}, then five function pointers (csrc/python/dlpack.h)
    fn = [ctypes.c_void_p.from_address(table + 16 + 8 * k).value for k in range(5)]
    labs = ctypes.cast(ctypes.CDLL(None).labs, ctypes.c_void_p).value
    stream_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
    view_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)
    out = ctypes.create_string_buffer(256)  # room for a DLTensor or a stream handle
    p = ctypes.addressof(out)
    x = torch.empty((2, 1, H, 576), dtype=torch.bfloat16, device="cuda")
    ws, wr = stream_t(fn[4]), stream_t(labs)
    vs, vr = view_t(fn[3]), view_t(labs)
    return dict(work_stream=host_us(lambda: ws(2, 0, p), sync) - host_us(lambda: wr(2, 0, p), sync),
                tensor_view=host_us(lambda: vs(x, p), sync) - host_us(lambda: vr(x, p), sync))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libs", default="torch,cupy,plain,numpy")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    print(f"# smla {getattr(smla, '__file__', '')}; build {_C.build_info().get('cuda_runtime')}")
    for name in ("torch", "cupy"):
        try:
            mod = __import__(name)
            t = mod.Tensor if name == "torch" else mod.ndarray
            print(f"# {name} {mod.__version__}: __dlpack_c_exchange_api__ {hasattr(t, '__dlpack_c_exchange_api__')}")
        except ImportError:
            pass
    print(f"{'lib':<6} {'op':<21} {'given us':>9} {'python':>7} {'binding':>8} {'launch':>7} {'alloc us':>9}")
    for lib in args.libs.split(","):
        got = library(lib)
        if got is None:
            print(f"{lib:<6} (not usable here)")
            continue
        mk, sync = got
        full = cases(mk, 0 if lib == "numpy" else B)
        empty = cases(mk, 0)
        for op, (given, alloc, direct) in full.items():
            t = host_us(given, sync)
            d = host_us(direct, sync)
            e = host_us(empty[op][2], sync)
            # smla allocates with the caller's framework: a plain DLPack producer has none (pass out=)
            a = host_us(alloc, sync) if alloc and lib != "plain" else float("nan")
            rows.append(dict(lib=lib, op=op, given_us=t, binding_us=d, binding_empty_us=e, alloc_us=a))
            print(f"{lib:<6} {op:<21} {t:>9.2f} {t - d:>7.2f} {d:>8.2f} {d - e:>7.2f} {a:>9.2f}", flush=True)
        if lib == "torch":
            import torch

            x = torch.empty(1, device="cuda")
            ref = dict(current_stream=host_us(lambda: torch.cuda.current_stream(), sync),
                       empty_cuda=host_us(lambda: torch.empty((2, 1, H, 512), dtype=torch.bfloat16, device="cuda"),
                                          sync),
                       new_empty=host_us(lambda: x.new_empty((2, 1, H, 512)), sync),
                       decode_2000=host_us(full["sparse_mla_decode"][0], sync, burst=2000, bursts=3),
                       **exchange_api_costs(torch, sync))
            rows.append(dict(lib="torch", op="reference", **ref))
            print("# torch reference: " + ", ".join(f"{k} {v:.2f} us" for k, v in ref.items()) +
                  " (decode_2000: the issue's 2000 back-to-back calls, GPU-bound once the launch queue fills)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
