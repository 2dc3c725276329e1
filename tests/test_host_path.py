"""The host path of the ops (issue 18): the launch stream chosen per array type (the DLPack exchange API's
current stream for torch, CuPy's current stream, the caller's stream= for a plain __dlpack__ producer),
the per-type caches of the Python layer, and outputs allocated with the caller's framework. The CUDA
tests queue the inputs behind a long kernel on a non-default stream and check that every op waits for
them: an op launched on another stream reads the poisoned inputs and fails the comparison."""
import gc
import os
import sys

import ml_dtypes
import numpy as np
import pytest

import smla
from smla import _arrays

sys.path.insert(0, os.path.dirname(__file__))

BF16 = ml_dtypes.bfloat16


class Plain:
    """A DLPack producer without the C exchange API; records the stream each export was asked for."""

    def __init__(self, a):
        self.a = a
        self.shape = a.shape
        self.dtype = a.dtype
        self.streams = []

    def __dlpack__(self, *, stream=None, **kw):
        self.streams.append(stream)
        return self.a.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


# ---------------------------------------------------------------------------------------------
# CPU: stream rules and the per-type caches
# ---------------------------------------------------------------------------------------------

def test_launch_stream_rules():
    a = np.zeros(4, np.int32)
    assert _arrays.launch_stream(a) == 0
    assert _arrays.launch_stream(Plain(a)) == 0  # a CPU producer without the exchange API
    assert _arrays.launch_stream(a, 7) == 7
    assert _arrays.launch_stream(Plain(a), np.uint64(9)) == 9
    with pytest.raises(TypeError, match="^stream: expected an integer stream handle, got str$"):
        _arrays.launch_stream(a, "0")
    with pytest.raises(ValueError, match=r"^stream: expected a stream handle from 0 to 2\*\*64 - 2, got -1$"):
        _arrays.launch_stream(a, -1)
    with pytest.raises(TypeError, match="^q: expected a NumPy array or an object with __dlpack__, got list$"):
        _arrays.launch_stream([1], None, "q")
    torch = pytest.importorskip("torch")
    t = torch.zeros(4)
    want = _arrays.STREAM_CURRENT if hasattr(torch.Tensor, "__dlpack_c_exchange_api__") else 0
    assert _arrays.launch_stream(t) == want


def test_per_type_cache_serves_each_type_its_own_value():
    """Types die and new ones take their addresses: each instance gets its own type's value, and dead
    types leave the cache."""
    made = []
    cache = _arrays._PerType(lambda x, name: (made.append(type(x).tag), type(x).tag)[1])
    seen_ids = set()
    reused = False
    for batch in range(20):  # types in batches of 100: one garbage collection per batch frees them
        types = [type(f"T{i}", (), {"tag": i}) for i in range(100 * batch, 100 * batch + 100)]
        for T in types:
            assert cache.get(T(), "x") == T.tag
            assert cache.get(T(), "x") == T.tag  # the second lookup is served from the cache
            reused |= id(T) in seen_ids
        seen_ids.update(id(T) for T in types)
        del types, T
        gc.collect()
    assert made == list(range(2000))
    assert len(cache._d) == 0  # entries of dead types were dropped
    if not reused:
        pytest.skip("the allocator never gave a new type a dead type's address")


def test_allocation_uses_the_callers_framework():
    q = np.zeros((2, 1, 4, 576), BF16)
    cache = np.zeros(smla.kv_cache_shape(4, 16, "fp8_ds_mla"), np.uint8)
    idx = np.full((2, 1, 8), -1, np.int32)
    out, lse = smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.1, kv_cache_dtype="fp8")
    assert isinstance(out, np.ndarray) and out.dtype == BF16 and out.shape == (2, 1, 4, 512)
    assert lse.dtype == np.float32 and lse.shape == (2, 1, 4) and np.all(np.isneginf(lse))
    torch = pytest.importorskip("torch")
    tq, tcache, tidx = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16), torch.from_numpy(cache), \
        torch.from_numpy(idx)
    out, lse = smla.sparse_mla_decode(tq, tcache, tidx, softmax_scale=0.1, kv_cache_dtype="fp8_ds_mla")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 1, 4, 512)
    assert lse.dtype == torch.float32 and out.device == tq.device
    with pytest.raises(ValueError, match='^kv_cache_dtype: expected "bf16" or "fp8_ds_mla", got \'fp9\'$'):
        smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.1, kv_cache_dtype="fp9")
    with pytest.raises(TypeError, match="^kv_cache_dtype: expected a str, got list$"):
        smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.1, kv_cache_dtype=["bf16"])
    with pytest.raises(TypeError, match="^softmax_scale: expected a real number, got str$"):
        smla.sparse_mla_decode(q, cache, idx, softmax_scale="0.1", kv_cache_dtype="bf16")


def _small_cases(rng):
    """NumPy arguments of one small call of each op that writes outputs, without the outputs."""
    nb, bs = 4, 16
    cache = np.zeros(smla.kv_cache_shape(nb, bs, "fp8_ds_mla"), np.uint8)
    kv = rng.standard_normal((nb * bs, 576)).astype(BF16)
    smla.pack_kv(kv[:, :512], kv[:, 512:], cache, np.arange(nb * bs, dtype=np.int32), kv_cache_dtype="fp8_ds_mla")
    q = rng.standard_normal((2, 1, 4, 576)).astype(BF16)
    return dict(
        sparse_mla_decode=dict(q=q, kv_cache=cache, indices=rng.integers(-1, nb * bs, (2, 1, 8)).astype(np.int32),
                               softmax_scale=0.1, kv_cache_dtype="fp8_ds_mla", precision="high"),
        sparse_mla_prefill=dict(q=q[:, 0], kv=kv, indices=rng.integers(-1, nb * bs, (2, 8)).astype(np.int32),
                                softmax_scale=0.1, precision="high"),
        convert_topk_indices=dict(req_id=np.array([0, 1, 0], np.int32),
                                  block_table=np.arange(8, dtype=np.int32).reshape(2, 4),
                                  topk_indices=rng.integers(-1, 64, (3, 20)).astype(np.int32), block_size=16),
        merge_attn_states=dict(out_a=rng.standard_normal((3, 4, 8)).astype(np.float16),
                               lse_a=rng.standard_normal((3, 4)).astype(np.float32),
                               out_b=rng.standard_normal((3, 4, 8)).astype(np.float16),
                               lse_b=rng.standard_normal((3, 4)).astype(np.float32)),
        unpack_kv=dict(kv_cache=cache, slots=np.array([3, -1, 70, 5], np.int32), kv_cache_dtype="fp8_ds_mla"))


# the outputs of each op (the raw binding's keyword names) and what the extension makes of them
_MADE = dict(sparse_mla_decode=dict(out=((2, 1, 4, 512), BF16), lse=((2, 1, 4), np.float32)),
             sparse_mla_prefill=dict(out=((2, 4, 512), BF16), lse=((2, 4), np.float32),
                                     max_logits=((2, 4), np.float32)),
             convert_topk_indices=dict(out=((3, 20), np.int32), valid_counts=((3,), np.int32)),
             merge_attn_states=dict(out=((3, 4, 8), np.float16), out_lse=((3, 4), np.float32)),
             unpack_kv=dict(out=((4, 576), BF16)))


@pytest.mark.parametrize("op", sorted(_MADE))
def test_outputs_made_by_the_extension(op):
    """An output passed as _C.ALLOCATE is made by the binding (NumPy here: PyArray_SimpleNew), has the
    op's shape and dtype, and holds what the op writes into outputs the caller gives."""
    from smla import _C

    args = _small_cases(np.random.default_rng(7))[op]
    fn = getattr(_C, op)
    made = fn(**args, **{k: _C.ALLOCATE for k in _MADE[op]})
    assert isinstance(made, tuple) and len(made) == len(_MADE[op])
    given = {k: np.full(shape, 99, dt) for k, (shape, dt) in _MADE[op].items()}
    back = fn(**args, **given)
    for (name, (shape, dt)), m, g, b in zip(_MADE[op].items(), made, given.values(), back):
        assert b is g, name  # the caller's array is returned as it is
        assert isinstance(m, np.ndarray) and m.shape == shape and m.dtype == np.dtype(dt), name
        assert m.flags.c_contiguous
        np.testing.assert_array_equal(m.view(np.uint8), g.view(np.uint8), err_msg=name)
    # the public function returns the same as the raw binding
    pub = {"sparse_mla_decode": lambda: smla.sparse_mla_decode(args["q"], args["kv_cache"], args["indices"],
                                                              softmax_scale=0.1, kv_cache_dtype="fp8"),
           "sparse_mla_prefill": lambda: smla.sparse_mla_prefill(args["q"], args["kv"], args["indices"],
                                                                softmax_scale=0.1),
           "convert_topk_indices": lambda: smla.convert_topk_indices(
               args["req_id"], args["block_table"], args["topk_indices"], block_size=16, return_valid_counts=True),
           "merge_attn_states": lambda: smla.merge_attn_states(args["out_a"], args["lse_a"], args["out_b"],
                                                              args["lse_b"]),
           "unpack_kv": lambda: (smla.unpack_kv(args["kv_cache"], args["slots"], kv_cache_dtype="fp8_ds_mla"),)}[op]()
    for p, g in zip(pub, given.values()):
        np.testing.assert_array_equal(p.view(np.uint8), g.view(np.uint8))


def test_allocate_token_rules():
    """ALLOCATE is an output's value only; a framework without an allocator is told to pass the output,
    and the public functions then allocate it themselves with that framework."""
    from smla import _C

    args = _small_cases(np.random.default_rng(8))["convert_topk_indices"]
    assert _C.can_allocate(args["req_id"]) and not _C.can_allocate(Plain(args["req_id"]))
    assert not _C.can_allocate([1, 2]) and not _C.can_allocate(None)
    bad = dict(args, topk_indices=_C.ALLOCATE)
    with pytest.raises(TypeError, match="^topk_indices: expected a NumPy array or an object with __dlpack__, got object$"):
        _C.convert_topk_indices(**bad, out=_C.ALLOCATE)
    plain = {k: Plain(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    with pytest.raises(TypeError, match="^out: smla cannot allocate it for a Plain array .*: pass it$"):
        _C.convert_topk_indices(**plain, out=_C.ALLOCATE)
    out, cnt = smla.convert_topk_indices(plain["req_id"], plain["block_table"], plain["topk_indices"], block_size=16,
                                         return_valid_counts=True)
    want, want_cnt = smla.convert_topk_indices(args["req_id"], args["block_table"], args["topk_indices"],
                                               block_size=16, return_valid_counts=True)
    assert isinstance(out, np.ndarray) and np.array_equal(out, want) and np.array_equal(cnt, want_cnt)
    # an output that is left out (None) stays absent: no counts are made
    assert _C.convert_topk_indices(**args, out=_C.ALLOCATE)[1] is None
    # a shape error names the input before anything is allocated
    with pytest.raises(ValueError, match="^q: expected 4 dimensions, got 3$"):
        d = _small_cases(np.random.default_rng(9))["sparse_mla_decode"]
        _C.sparse_mla_decode(**dict(d, q=d["q"][0]), out=_C.ALLOCATE, lse=_C.ALLOCATE)


@pytest.mark.cuda
def test_cuda_outputs_made_through_the_exchange_api():
    """torch CUDA arrays: the binding makes the outputs (and the split decode's workspace) with torch's
    allocator, on the arrays' device; the results equal those written into given outputs."""
    torch = pytest.importorskip("torch")
    if not smla.cuda_available() or not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from smla import _C

    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no DLPack exchange API")
    assert _C.can_allocate(torch.zeros(1, device="cuda"))
    rng = np.random.default_rng(10)
    nb, bs = 64, 64
    cache = np.zeros(smla.kv_cache_shape(nb, bs, "fp8_ds_mla"), np.uint8)
    kv = (rng.standard_normal((nb * bs, 576)) * 2).astype(BF16)
    smla.pack_kv(kv[:, :512], kv[:, 512:], cache, np.arange(nb * bs, dtype=np.int32), kv_cache_dtype="fp8_ds_mla")
    q = rng.standard_normal((2, 1, 128, 576)).astype(BF16)
    idx = rng.integers(-1, nb * bs, (2, 1, 2048)).astype(np.int32)

    def dev(a):
        t = torch.from_numpy(a.view(np.int16) if a.dtype == np.dtype(BF16) else a).cuda()
        return t.view(torch.bfloat16) if a.dtype == np.dtype(BF16) else t

    tq, tcache, tidx = dev(q), dev(cache), dev(idx)
    out, lse = smla.sparse_mla_decode(tq, tcache, tidx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla")
    assert out.is_cuda and out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 1, 128, 512) and out.is_contiguous()
    assert lse.is_cuda and lse.dtype == torch.float32 and tuple(lse.shape) == (2, 1, 128)
    ws = smla.sparse_mla_decode_workspace_size(2, 1, 128, 2048, "fp8_ds_mla")
    assert ws > 0  # b = 2 splits the top-k: the binding made a workspace too
    g_out, g_lse = torch.empty_like(out), torch.empty_like(lse)
    smla.sparse_mla_decode(tq, tcache, tidx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla", out=g_out, lse=g_lse,
                           workspace=torch.empty(ws, dtype=torch.uint8, device="cuda"))
    assert torch.equal(out.view(torch.int16), g_out.view(torch.int16)) and torch.equal(lse, g_lse)
    pq, pidx = tq[:, 0].contiguous(), tidx[:, 0, :64].contiguous()
    po, pl, pm = smla.sparse_mla_prefill(pq, dev(kv), pidx, softmax_scale=0.04)
    assert po.is_cuda and tuple(po.shape) == (2, 128, 512) and pm.dtype == torch.float32
    req, bt = dev(np.array([0, 1], np.int32)), dev(np.arange(2 * nb, dtype=np.int32).reshape(2, nb) % nb)
    tok = dev(rng.integers(-1, nb * bs, (2, 300)).astype(np.int32))
    c_out, c_cnt = smla.convert_topk_indices(req, bt, tok, block_size=bs, return_valid_counts=True)
    d_out, d_cnt = smla.filter_convert_dcp_indices(req, bt, tok, block_size=bs, dcp_size=2, dcp_rank=1)
    want = smla.convert_topk_indices(req.cpu().numpy(), bt.cpu().numpy(), tok.cpu().numpy(), block_size=bs,
                                     return_valid_counts=True)
    assert c_out.is_cuda and np.array_equal(c_out.cpu().numpy(), want[0]) and np.array_equal(c_cnt.cpu().numpy(), want[1])
    assert d_out.is_cuda and d_cnt.dtype == torch.int32 and tuple(d_cnt.shape) == (2,)
    oa, ob = dev(rng.standard_normal((3, 4, 8)).astype(np.float32)), dev(rng.standard_normal((3, 4, 8)).astype(np.float32))
    la, lb = dev(rng.standard_normal((3, 4)).astype(np.float32)), dev(rng.standard_normal((3, 4)).astype(np.float32))
    mo, ml = smla.merge_attn_states(oa, la, ob, lb)
    wo, wl = smla.merge_attn_states(*(x.cpu().numpy() for x in (oa, la, ob, lb)))
    assert mo.is_cuda and np.array_equal(mo.cpu().numpy(), wo) and np.array_equal(ml.cpu().numpy(), wl)
    u = smla.unpack_kv(tcache, dev(np.array([3, -1, 70], np.int32)), kv_cache_dtype="fp8_ds_mla")
    assert u.is_cuda and tuple(u.shape) == (3, 576) and u.dtype == torch.bfloat16


@pytest.mark.cuda
@pytest.mark.parametrize("given", ["none", "outputs"])
def test_cuda_memory_made_for_another_stream_is_held_by_the_current_one(given):
    """stream= names a stream other than torch's current one: what the binding makes (outputs, the split
    decode's workspace) comes from torch's pool of the current stream, so the current stream must wait for
    the launch before it reuses that memory; with everything given, it is not held up."""
    torch = pytest.importorskip("torch")
    if not smla.cuda_available() or not torch.cuda.is_available():
        pytest.skip("no CUDA")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no DLPack exchange API")
    nb, bs = 64, 64
    cache = torch.zeros(smla.kv_cache_shape(nb, bs, "fp8_ds_mla"), dtype=torch.uint8, device="cuda")
    q = torch.randn((2, 1, 128, 576), device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, nb * bs, (2, 1, 2048), dtype=torch.int32, device="cuda")
    ws = smla.sparse_mla_decode_workspace_size(2, 1, 128, 2048, "fp8_ds_mla")
    assert ws > 0
    kw = {}
    if given == "outputs":
        kw = dict(out=torch.empty((2, 1, 128, 512), dtype=torch.bfloat16, device="cuda"),
                  lse=torch.empty((2, 1, 128), device="cuda"), workspace=torch.empty(ws, dtype=torch.uint8, device="cuda"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s on the side stream, ahead of the decode
    out, lse = smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla",
                                      stream=side.cuda_stream, **kw)
    held = not torch.cuda.current_stream().query()
    busy = not side.query()  # the sleep still runs: the premise of the check above
    torch.cuda.synchronize()
    want_out, want_lse = smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.04, kv_cache_dtype="fp8_ds_mla")
    assert torch.equal(out.view(torch.int16), want_out.view(torch.int16)) and torch.equal(lse, want_lse)
    if not busy:
        pytest.skip("the side stream was done before the check (kernels serialized, as under compute-sanitizer)")
    assert held == (given == "none")


@pytest.mark.cuda
def test_cuda_cupy_outputs_made_by_the_python_layer():
    """CuPy publishes no exchange-API allocator: the Python layer makes the outputs with CuPy (bf16 as
    ml_dtypes' bfloat16 where CuPy takes it, else raw uint16 bits), on the arrays' device."""
    cp = pytest.importorskip("cupy")
    if not smla.cuda_available():
        pytest.skip("no CUDA")
    from smla import _C

    args = _small_cases(np.random.default_rng(11))
    d = args["sparse_mla_decode"]
    dq = cp.asarray(d["q"].view(np.uint16))
    assert not _C.can_allocate(dq)
    dcache, didx = cp.asarray(d["kv_cache"]), cp.asarray(d["indices"])
    # the same GPU kernel into outputs the caller gives (the CPU kernel sums in another order: not bitwise)
    want_out, want_lse = cp.zeros((2, 1, 4, 512), cp.uint16), cp.zeros((2, 1, 4), cp.float32)
    smla.sparse_mla_decode(dq, dcache, didx, softmax_scale=0.1, kv_cache_dtype="fp8", out=want_out, lse=want_lse,
                           workspace=cp.zeros(max(1, smla.sparse_mla_decode_workspace_size(2, 1, 4, 8, "fp8")), cp.uint8))
    for _ in range(2):  # the second call takes the bf16 dtype found by the first
        out, lse = smla.sparse_mla_decode(dq, dcache, didx, softmax_scale=0.1, kv_cache_dtype="fp8")
        assert isinstance(out, cp.ndarray) and out.shape == (2, 1, 4, 512) and out.dtype.itemsize == 2
        assert out.device.id == dq.device.id
        np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint16), cp.asnumpy(want_out))
        np.testing.assert_array_equal(cp.asnumpy(lse), cp.asnumpy(want_lse))
    c = args["convert_topk_indices"]
    out, cnt = smla.convert_topk_indices(*(cp.asarray(c[k]) for k in ("req_id", "block_table", "topk_indices")),
                                         block_size=16, return_valid_counts=True)
    want = smla.convert_topk_indices(c["req_id"], c["block_table"], c["topk_indices"], block_size=16,
                                     return_valid_counts=True)
    assert isinstance(out, cp.ndarray) and np.array_equal(cp.asnumpy(out), want[0])
    assert np.array_equal(cp.asnumpy(cnt), want[1])


# ---------------------------------------------------------------------------------------------
# CUDA: every op waits for inputs written on the caller's non-default stream
# ---------------------------------------------------------------------------------------------

def _inputs(rng):
    """NumPy inputs of one small case of each op, and their CPU results."""
    r = {}
    nb, bs = 8, 64
    cache = np.zeros((nb, bs, 656), np.uint8)
    kv_c = (rng.standard_normal((40, 512)) * 3).astype(BF16)
    k_pe = rng.standard_normal((40, 64)).astype(BF16)
    slots = rng.permutation(nb * bs)[:40].astype(np.int32)
    smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla")
    r["pack"] = (kv_c, k_pe, slots, cache)
    req = rng.integers(0, 3, 6).astype(np.int32)
    bt = rng.permutation(3 * 8).astype(np.int32).reshape(3, 8)
    tok = rng.integers(-1, 8 * bs, (6, 300)).astype(np.int32)
    r["convert"] = (req, bt, tok, smla.convert_topk_indices(req, bt, tok, block_size=bs, return_valid_counts=True),
                    smla.filter_convert_dcp_indices(req, bt, tok, block_size=bs, dcp_size=3, dcp_rank=1))
    oa, ob = (rng.standard_normal((5, 16, 512)).astype(np.float32) for _ in range(2))
    la, lb = (rng.standard_normal((5, 16)).astype(np.float32) for _ in range(2))
    r["merge"] = (oa, la, ob, lb, smla.merge_attn_states(oa, la, ob, lb))
    q = rng.standard_normal((2, 1, 64, 576)).astype(BF16)
    idx = rng.integers(-1, nb * bs, (2, 1, 256)).astype(np.int32)
    r["decode"] = (q, cache, idx)
    return r


class Lib:
    """torch / plain (torch tensors behind Plain, stream= given) / cupy: device copies written on a busy
    non-default stream, and the op called in that stream's context."""

    def __init__(self, name):
        self.name = name
        self.plains = []
        if name == "cupy":
            self.cp = pytest.importorskip("cupy")
            self.stream = self.cp.cuda.Stream(non_blocking=True)
        else:
            self.torch = pytest.importorskip("torch")
            self.stream = self.torch.cuda.Stream()

    def handle(self):
        return self.stream.ptr if self.name == "cupy" else self.stream.cuda_stream

    def busy(self):
        """A long kernel on the stream, so that a copy queued behind it lands late."""
        if self.name == "cupy":
            x = self.cp.ones((2048, 2048), self.cp.float32)
            for _ in range(6):
                x = x @ x / 2048
        else:
            x = self.torch.ones(4096, 4096, device="cuda")
            for _ in range(6):
                x = x @ x / 4096

    def late(self, a):
        """A device array of a's values, poisoned now and written on the busy stream."""
        raw = a.view(np.uint16) if a.dtype == np.dtype(BF16) else a
        poison = 0x55 if raw.dtype.kind == "u" else -7
        if self.name == "cupy":
            d = self.cp.full(raw.shape, poison, raw.dtype)
            d.set(raw)  # on the current (busy) stream
            return d
        t = self.torch
        src = t.from_numpy(raw.view(np.int16) if raw.dtype == np.uint16 else raw).pin_memory()
        d = t.full(src.shape, poison, dtype=src.dtype, device="cuda")
        d.copy_(src, non_blocking=True)
        if a.dtype == np.dtype(BF16):
            d = d.view(t.bfloat16)
        if self.name == "plain":
            d = Plain(d)
            self.plains.append(d)
        return d

    def host(self, x):
        x = x.a if isinstance(x, Plain) else x
        if self.name == "cupy":
            return self.cp.asnumpy(x)
        t = self.torch
        t.cuda.synchronize()
        if x.dtype == t.bfloat16:
            x = x.view(t.int16)
        return x.cpu().numpy()

    def context(self):
        return self.stream if self.name == "cupy" else self.torch.cuda.stream(self.stream)


@pytest.mark.cuda
@pytest.mark.parametrize("lib", ["torch", "plain", "cupy"])
def test_every_op_waits_for_inputs_on_the_callers_stream(lib, monkeypatch):
    L = Lib(lib)
    rng = np.random.default_rng(18)
    r = _inputs(rng)
    kw = dict(stream=L.handle()) if lib == "plain" else {}  # Plain has no framework stream to ask
    exported = []
    if lib == "torch":  # the exchange API path: torch's Python __dlpack__ is never called
        real = L.torch.Tensor.__dlpack__
        monkeypatch.setattr(L.torch.Tensor, "__dlpack__", lambda self, *a, **k: exported.append(1) or real(self, *a, **k))
    with L.context():
        if lib == "cupy":
            assert _arrays.launch_stream(L.cp.zeros(1)) == L.handle()
        kv_c, k_pe, slots, want_cache = r["pack"]
        L.busy()
        cache = L.late(np.zeros_like(want_cache))
        smla.pack_kv(L.late(kv_c), L.late(k_pe), cache, L.late(slots), kv_cache_dtype="fp8_ds_mla", **kw)
        got_cache = cache
        req, bt, tok, (w_out, w_cnt), (d_out, d_cnt) = r["convert"]
        L.busy()
        out, cnt = smla.convert_topk_indices(L.late(req), L.late(bt), L.late(tok), block_size=64,
                                             return_valid_counts=True, out=L.late(np.zeros_like(tok)),
                                             valid_counts=L.late(np.zeros_like(w_cnt)), **kw)
        L.busy()
        dout, dcnt = smla.filter_convert_dcp_indices(L.late(req), L.late(bt), L.late(tok), block_size=64, dcp_size=3,
                                                     dcp_rank=1, out=L.late(np.zeros_like(tok)),
                                                     valid_counts=L.late(np.zeros_like(d_cnt)), **kw)
        oa, la, ob, lb, (m_out, m_lse) = r["merge"]
        L.busy()
        mout, mlse = smla.merge_attn_states(L.late(oa), L.late(la), L.late(ob), L.late(lb),
                                            out=L.late(np.zeros_like(oa)), out_lse=L.late(np.zeros_like(la)), **kw)
        q, dcache, idx = r["decode"]
        ws = smla.sparse_mla_decode_workspace_size(2, 1, 64, 256, "fp8_ds_mla")
        dec_out = L.late(np.zeros((2, 1, 64, 512), BF16))
        dec_lse = L.late(np.zeros((2, 1, 64), np.float32))
        L.busy()
        smla.sparse_mla_decode(L.late(q), L.late(dcache), L.late(idx), softmax_scale=0.05, kv_cache_dtype="fp8_ds_mla",
                               out=dec_out, lse=dec_lse, workspace=L.late(np.zeros(max(ws, 1), np.uint8)), **kw)
    assert np.array_equal(L.host(got_cache), want_cache)
    assert np.array_equal(L.host(out), w_out) and np.array_equal(L.host(cnt), w_cnt)
    assert np.array_equal(L.host(dout), d_out) and np.array_equal(L.host(dcnt), d_cnt)
    assert np.array_equal(L.host(mout), m_out) and np.array_equal(L.host(mlse), m_lse, equal_nan=True)
    # decode: the same kernel on the default stream, inputs long settled, gives the same bits
    D = Lib(lib)
    ref_out = D.late(np.zeros((2, 1, 64, 512), BF16))
    ref_lse = D.late(np.zeros((2, 1, 64), np.float32))
    args = [D.late(q), D.late(dcache), D.late(idx)]
    D.host(ref_out)  # settle
    smla.sparse_mla_decode(*args, softmax_scale=0.05, kv_cache_dtype="fp8_ds_mla", out=ref_out, lse=ref_lse,
                           workspace=D.late(np.zeros(max(ws, 1), np.uint8)), **({"stream": 0} if lib == "plain" else {}))
    assert np.array_equal(L.host(dec_out), D.host(ref_out))
    assert np.array_equal(L.host(dec_lse), D.host(ref_lse), equal_nan=True)
    if lib == "torch" and hasattr(L.torch.Tensor, "__dlpack_c_exchange_api__"):
        assert exported == [], "torch tensors went through __dlpack__, not the exchange API"
    if lib == "plain":
        # every array was exported once, for the caller's stream
        assert [p.streams for p in L.plains] == [[L.handle()]] * len(L.plains)
