"""The edges of smla: what any input, thread or producer can do to the binding layer and the Python ops.

- the DLPack exchange-API cache never sends a new type through a dead type's table;
- DLPack deleters written in Python run without the call's exception pending;
- softmax_scale must be finite;
- outputs must have distinct elements and must not overlap any other array of the call (except the
  in-place forms an op documents);
- every bad argument gives TypeError / ValueError / BufferError naming it (a seeded fuzz of every op);
- environment switches: read under the GIL (no crash while another thread writes os.environ) and
  parsed strictly."""
import ctypes
import gc
import os
import random
import re
import subprocess
import sys
import textwrap
import weakref

import ml_dtypes
import numpy as np
import pytest

import smla

BF16 = ml_dtypes.bfloat16


def run_python(code, timeout=120, env=None):
    """Run code in a fresh interpreter that imports the same smla as this one."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=e)


def fp8_cache(nb=4, bs=16):
    return np.zeros(smla.kv_cache_shape(nb, bs, "fp8_ds_mla"), np.uint8)


# ---------------------------------------------------------------------------------------------
# DLPack: the exchange-API cache and deleters
# ---------------------------------------------------------------------------------------------

# A type publishing __dlpack_c_exchange_api__ from ctypes: its export callback records which type's
# table was called and fails (smla then raises BufferError naming the argument).
EXCHANGE_API_TYPES = """
    import ctypes, gc, sys
    import numpy as np
    from smla import _C

    class Header(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p)]

    FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)
    STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)

    class Table(ctypes.Structure):
        _fields_ = [("header", Header), ("allocator", ctypes.c_void_p), ("managed_from_py", ctypes.c_void_p),
                    ("managed_to_py", ctypes.c_void_p), ("dltensor_from_py_object_no_sync", FROM_PY),
                    ("current_work_stream", STREAM)]

    capsule_new = ctypes.pythonapi.PyCapsule_New
    capsule_new.restype = ctypes.py_object
    capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    NAME = b"dlpack_exchange_api"  # the capsule keeps a pointer to it
    calls = []

    def make_type(tag):
        def from_py(obj, out):
            calls.append(tag)
            return -1
        table = Table()
        table.header.major = 1
        table.dltensor_from_py_object_no_sync = FROM_PY(from_py)
        table.current_work_stream = STREAM(lambda t, d, out: -1)
        cap = capsule_new(ctypes.addressof(table), NAME, None)
        return type(f"T{tag}", (), {"__dlpack_c_exchange_api__": cap, "_table": table}), table

    slots = np.arange(4, dtype=np.int32)
    out = np.empty((4, 576), np.uint16)

    def probe(T):
        n = len(calls)
        try:
            _C.unpack_kv(kv_cache=T(), slots=slots, out=out, kv_cache_dtype="fp8_ds_mla", stream=0)
        except BufferError as e:
            assert "kv_cache" in str(e), e
        return calls[n:]
"""


@pytest.mark.parametrize("keep_table", [True, False])
def test_exchange_api_cache_is_not_fooled_by_a_reused_type_address(keep_table):
    """A type dies and a new one is allocated at its address: the new type's instances must go through
    the new type's table. keep_table=True keeps the old table alive (the old cache then calls the wrong
    but live table: a clean failure); False lets it die with its type (the old cache then called freed
    memory; fillers made right after its death take that memory, so a stale call lands in a live table
    that records "stale"). The binding is called directly: the Python layer's cache is tested below."""
    res = run_python(EXCHANGE_API_TYPES + f"""
    T, table = make_type(0)
    if not {keep_table}:
        del table
    assert probe(T) == [0]
    dead = id(T)
    del T
    gc.collect()
    if not {keep_table}:
        # whatever reuses the dead table's memory first: a live table whose callback says "stale"
        fillers = [make_type("stale") for _ in range(4)]
    for i in range(1, 3000):
        U, _ = make_type(i)
        got = probe(U)
        if got != [i]:
            print(f"WRONG: an instance of type {{i}} went through the table of type(s) {{got}}")
            sys.exit(3)
        if id(U) == dead:
            print(f"REUSED at {{i}}")
            break
        del U
        gc.collect()
    else:
        print("NOREUSE")
    """)
    assert res.returncode == 0, res.stdout + res.stderr
    if "NOREUSE" in res.stdout:
        pytest.skip("the allocator never gave a new type the dead type's address")
    assert "REUSED" in res.stdout


def test_ops_do_not_keep_array_types_alive():
    """The Python layer's exchange-API lookup is cached per type without owning the type."""

    def make_wrapper():
        class Wrapper:
            def __init__(self, a):
                self.a = a

            def __dlpack_device__(self):
                return (1, 0)

            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)

        return Wrapper

    W = make_wrapper()
    out = np.empty((4, 576), BF16)
    smla.unpack_kv(W(fp8_cache()), np.arange(4, dtype=np.int32), kv_cache_dtype="fp8_ds_mla", out=out)
    r = weakref.ref(W)
    del W
    # the extension keeps the last type it looked up: another type replaces it
    smla.unpack_kv(make_wrapper()(fp8_cache()), np.arange(4, dtype=np.int32), kv_cache_dtype="fp8_ds_mla",
                   out=out)
    gc.collect()
    assert r() is None


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class PythonDeleterProducer:
    """A DLPack producer written in Python (legacy "dltensor" capsule) over an int32 NumPy array: its
    deleter is a Python function, which records that it ran."""

    def __init__(self, a):
        assert a.dtype == np.int32 and a.flags.c_contiguous
        self.a, self.deleted = a, 0
        self._shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        self._m = DLManagedTensor()
        t = self._m.dl_tensor
        t.data, t.device_type, t.device_id, t.ndim = a.ctypes.data, 1, 0, a.ndim
        t.code, t.bits, t.lanes = 0, 32, 1
        t.shape = self._shape
        self._m.deleter = DELETER(self._delete)

    def _delete(self, m):
        self.deleted += 1

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None, **kw):
        return _capsule_new(ctypes.addressof(self._m), b"dltensor", None)


def test_python_deleter_runs_without_the_pending_error():
    """The call fails on a later argument after a Python-level producer was consumed: its deleter (Python
    code) runs, and the caller sees the real error, not SystemError."""
    slots = PythonDeleterProducer(np.arange(4, dtype=np.int32))
    with pytest.raises(TypeError, match="out: expected bfloat16 or uint16, got float32"):
        smla.unpack_kv(fp8_cache(), slots, kv_cache_dtype="fp8_ds_mla", out=np.empty((4, 576), np.float32))
    assert slots.deleted == 1
    out = smla.unpack_kv(fp8_cache(), slots, kv_cache_dtype="fp8_ds_mla", out=np.empty((4, 576), BF16))
    assert slots.deleted == 2 and out.shape == (4, 576)


# ---------------------------------------------------------------------------------------------
# softmax_scale
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale,text", [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf"),
                                        (3e38, "3e\\+38"), (-2.4e38, "-2.4e\\+38")])
def test_softmax_scale_must_be_finite(scale, text):
    """Non-finite scales, and finite ones whose log2-domain value scale * log2(e) overflows fp32 (the
    kernels' 0 * inf would be NaN), raise."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 4, 576)).astype(BF16)
    idx = rng.integers(0, 64, (1, 2, 8)).astype(np.int32)
    msg = f"softmax_scale: expected a finite number of magnitude at most 2.35e38 .*, got {text}$"
    with pytest.raises(ValueError, match=msg):
        smla.sparse_mla_decode(q, fp8_cache(), idx, softmax_scale=scale, kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match=msg):
        smla.sparse_mla_prefill(q[0], np.zeros((64, 576), BF16), idx[0], softmax_scale=scale)
    with pytest.raises(ValueError, match=msg):  # the extension checks it itself
        smla._C.sparse_mla_prefill(q=q[0], kv=np.zeros((64, 576), BF16), indices=idx[0], out=np.empty((2, 4, 512), BF16),
                                   lse=np.empty((2, 4), np.float32), softmax_scale=scale, precision="high")


def test_softmax_scale_largest_allowed():
    """The largest magnitude the log2 domain holds still runs (and gives no NaN)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 576)).astype(BF16)
    idx = rng.integers(0, 64, (2, 8)).astype(np.int32)
    kv = rng.standard_normal((64, 576)).astype(BF16)
    for scale in (2.35e38, -2.35e38):
        out, lse, ml = smla.sparse_mla_prefill(q, kv, idx, softmax_scale=scale)
        assert not np.isnan(out.astype(np.float32)).any() and not np.isnan(lse).any()


# ---------------------------------------------------------------------------------------------
# outputs: distinct elements, no overlap with the other arrays
# ---------------------------------------------------------------------------------------------

def writable_strided(shape, strides, dtype, nbytes=1 << 16):
    buf = np.zeros(nbytes, np.uint8)
    return np.lib.stride_tricks.as_strided(buf.view(dtype), shape, strides, writeable=True)


def convert_case(n=5, k=8):
    rng = np.random.default_rng(3)
    req = rng.integers(0, 2, n).astype(np.int32)
    bt = np.arange(6, dtype=np.int32).reshape(2, 3)
    return req, bt, rng.integers(-1, 48, (n, k)).astype(np.int32)


def merge_case(n=3, h=4, d=16, heads_pad=0):
    rng = np.random.default_rng(4)
    big = rng.standard_normal((n, h + heads_pad, d)).astype(np.float32)
    ob = rng.standard_normal((n, h, d)).astype(np.float32)
    la, lb = rng.standard_normal((2, n, h)).astype(np.float32)
    return big, ob, la, lb


def test_self_overlapping_outputs_raise():
    slots = np.arange(4, dtype=np.int32)
    stride0 = writable_strided((4, 576), (0, 2), BF16)
    with pytest.raises(ValueError, match=r"out: stride 0 over dimension 0 \(size 4\) makes its elements overlap"):
        smla.unpack_kv(fp8_cache(), slots, kv_cache_dtype="fp8_ds_mla", out=stride0)
    rows_overlap = writable_strided((4, 576), (2 * 100, 2), BF16)
    with pytest.raises(ValueError, match="out: its elements overlap in memory"):
        smla.unpack_kv(fp8_cache(), slots, kv_cache_dtype="fp8_ds_mla", out=rows_overlap)
    # lse may have any strides, but not stride 0 (every head would write the same float)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 4, 576)).astype(BF16)
    idx = rng.integers(0, 64, (1, 2, 8)).astype(np.int32)
    lse = writable_strided((1, 2, 4), (0, 16, 0), np.float32)
    with pytest.raises(ValueError, match=r"lse: stride 0 over dimension 2 \(size 4\)"):
        smla.sparse_mla_decode(q, fp8_cache(), idx, softmax_scale=0.1, kv_cache_dtype="fp8_ds_mla", lse=lse)
    # a cache written in place is an output too
    cache = writable_strided((4, 16, 656), (0, 656, 1), np.uint8)
    with pytest.raises(ValueError, match="kv_cache: stride 0 over dimension 0"):
        smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 64), BF16), cache, np.arange(2, dtype=np.int32),
                     kv_cache_dtype="fp8_ds_mla")
    # stride 0 over a dimension of size 1 is harmless (and what unsqueezed views have)
    out = writable_strided((1, 576), (0, 2), BF16)
    smla.unpack_kv(fp8_cache(), slots[:1], kv_cache_dtype="fp8_ds_mla", out=out)


def test_convert_out_shifted_by_one_column_raises():
    req, bt, tok = convert_case()
    big = np.zeros((5, 9), np.int32)
    big[:, :8] = tok
    with pytest.raises(ValueError, match="out: overlaps topk_indices in memory; pass separate buffers"):
        smla.convert_topk_indices(req, bt, big[:, :8], block_size=16, out=big[:, 1:])
    with pytest.raises(ValueError, match="out: overlaps topk_indices in memory"):
        smla.filter_convert_dcp_indices(req, bt, big[:, :8], block_size=16, dcp_size=2, dcp_rank=0,
                                        out=big[:, 1:])
    flat = np.zeros(45, np.int32)
    with pytest.raises(ValueError, match="valid_counts: overlaps out in memory"):
        smla.convert_topk_indices(req, bt, tok, block_size=16, out=flat[:40].reshape(5, 8), valid_counts=flat[36:41],
                                  return_valid_counts=True)
    # the documented in-place form: out is topk_indices itself
    expect = smla.convert_topk_indices(req, bt, tok, block_size=16)
    same = tok.copy()
    assert smla.convert_topk_indices(req, bt, same, block_size=16, out=same) is same
    np.testing.assert_array_equal(same, expect)
    counts = np.zeros(5, np.int32)
    smla.convert_topk_indices(req, bt, tok, block_size=16, out=big[:, :8], valid_counts=counts,
                              return_valid_counts=True)


def test_merge_out_aliasing_out_a_shifted_by_one_head_raises():
    big, ob, la, lb = merge_case(heads_pad=1)
    oa = big[:, :4]
    with pytest.raises(ValueError, match=r"out: overlaps out_a in memory; pass separate buffers, or out_a itself"):
        smla.merge_attn_states(oa, la, ob, lb, out=big[:, 1:])
    lbig = np.zeros((3, 5), np.float32)
    lbig[:, :4] = la
    with pytest.raises(ValueError, match="out_lse: overlaps lse_a in memory"):
        smla.merge_attn_states(oa, lbig[:, :4], ob, lb, out_lse=lbig[:, 1:])
    with pytest.raises(ValueError, match="out_lse: overlaps out in memory"):
        out = np.empty_like(oa)
        smla.merge_attn_states(oa, la, ob, lb, out=out, out_lse=out[:, :, 0])
    # negative strides: the extent is computed from the lowest to the highest byte
    with pytest.raises(ValueError, match="out: overlaps out_a"):
        smla.merge_attn_states(oa, la, ob, lb, out=big[::-1, 1:])
    # the documented in-place forms: out is out_a or out_b, out_lse is lse_a or lse_b
    e_out, e_lse = smla.merge_attn_states(oa, la, ob, lb)
    a, l = oa.copy(), la.copy()
    smla.merge_attn_states(a, l, ob, lb, out=a, out_lse=l)
    np.testing.assert_array_equal(a, e_out)
    np.testing.assert_array_equal(l, e_lse)
    b, l = ob.copy(), lb.copy()
    smla.merge_attn_states(oa, la, b, l, out=b, out_lse=l)
    np.testing.assert_array_equal(b, e_out)
    # two reversed halves of one buffer do not overlap
    buf = np.zeros((6, 4, 16), np.float32)
    first, second = buf[:3], buf[3:][::-1]
    smla.merge_attn_states(oa, la, ob, lb, out=first, out_lse=np.empty_like(la))
    smla.merge_attn_states(first, la, ob, lb, out=second, out_lse=np.empty_like(la))


def test_strides_beyond_the_address_space_raise():
    """An input whose strides point below address 0 cannot be a real array (the kernel would fault)."""
    big, ob, la, lb = merge_case()
    bad = np.lib.stride_tricks.as_strided(la, (3, 4), (-(2**61), 4))
    with pytest.raises(ValueError, match="lse_a: its strides reach outside the address space"):
        smla.merge_attn_states(big, bad, ob, lb, out_lse=np.empty((3, 4), np.float32))


def test_gather_workspace_aliasing_a_bf16_cache_raises():
    cache = np.zeros(smla.kv_cache_shape(4, 16, "bf16"), BF16)
    bt = np.array([[0, 1]], np.int32)
    lens, starts = np.array([20], np.int32), np.array([0], np.int32)
    with pytest.raises(ValueError, match="workspace: overlaps kv_cache in memory"):
        smla.gather_upconvert(cache, cache.reshape(-1, 576)[32:], bt, lens, starts, kv_cache_dtype="bf16")
    with pytest.raises(ValueError, match="workspace: overlaps block_table in memory"):
        ws = np.zeros((40, 576), BF16)
        smla.gather_upconvert(cache, ws, ws.view(np.int32)[:1, :2], lens, starts, kv_cache_dtype="bf16")
    with pytest.raises(ValueError, match="out: overlaps kv_cache in memory"):
        smla.unpack_kv(cache, np.arange(4, dtype=np.int32), kv_cache_dtype="bf16", out=cache[3, :4])


def test_pack_kv_input_inside_the_cache_raises():
    cache = np.zeros(smla.kv_cache_shape(4, 16, "bf16"), BF16)
    rows = cache.reshape(-1, 576)
    with pytest.raises(ValueError, match="kv_cache: overlaps kv_c in memory"):
        smla.pack_kv(rows[:4, :512], np.zeros((4, 64), BF16), cache, np.arange(8, 12, dtype=np.int32),
                     kv_cache_dtype="bf16")
    with pytest.raises(ValueError, match="kv_cache: overlaps k_pe in memory"):
        smla.pack_kv(np.zeros((4, 512), BF16), rows[:4, 512:], cache, np.arange(8, 12, dtype=np.int32),
                     kv_cache_dtype="bf16")


def test_attention_outputs_overlapping_each_other_raise():
    rng = np.random.default_rng(6)
    q = rng.standard_normal((3, 4, 576)).astype(BF16)
    kv = rng.standard_normal((32, 576)).astype(BF16)
    idx = rng.integers(0, 32, (3, 8)).astype(np.int32)
    lse = np.empty((3, 8), np.float32)
    with pytest.raises(ValueError, match="max_logits: overlaps lse in memory"):
        smla.sparse_mla_prefill(q, kv, idx, softmax_scale=0.1, lse=lse[:, :4], max_logits=lse[:, 3:7])
    with pytest.raises(ValueError, match="max_logits: overlaps lse in memory"):
        smla.sparse_mla_prefill(q, kv, idx, softmax_scale=0.1, lse=lse[:, :4], max_logits=lse[::-1, 3:7])
    with pytest.raises(ValueError, match="out: overlaps q in memory"):
        smla.sparse_mla_prefill(q, kv, idx, softmax_scale=0.1, out=q[:, :, :512])
    # column ranges of one buffer share no byte (the extents overlap, the rows do not)
    _, l, ml = smla.sparse_mla_prefill(q, kv, idx, softmax_scale=0.1, lse=lse[:, :4], max_logits=lse[::-1, 4:])
    _, l2, ml2 = smla.sparse_mla_prefill(q, kv, idx, softmax_scale=0.1)
    np.testing.assert_array_equal(lse[:, :4], l2)
    np.testing.assert_array_equal(lse[::-1, 4:], ml2)


def test_overlap_verdicts_on_random_views_of_one_buffer():
    """out_lse and lse_a as random strided slices (any sign) of one float32 buffer: smla must refuse
    every pair that shares memory (numpy.shares_memory decides exactly), accept every pair whose extents
    are apart, and accept pairs of row-interleaved slices that share no byte."""
    rng = np.random.default_rng(8)
    n, h = 3, 4
    oa, ob = rng.standard_normal((2, n, h, 8)).astype(np.float32)
    lb = rng.standard_normal((n, h)).astype(np.float32)
    parent = np.zeros((12, 14), np.float32)

    def view():
        rs, cs = rng.choice([-2, -1, 1, 2], 2)
        r0 = int(rng.integers(0, 12 - abs(rs) * (n - 1)))
        c0 = int(rng.integers(0, 14 - abs(cs) * (h - 1)))
        rows = r0 + rs * np.arange(n) if rs > 0 else r0 + abs(rs) * (n - 1) + rs * np.arange(n)
        cols = c0 + cs * np.arange(h) if cs > 0 else c0 + abs(cs) * (h - 1) + cs * np.arange(h)
        return parent[rows[0]::rs][:n][:, cols[0]::cs][:, :h]

    accepted_interleaved = 0
    for _ in range(400):
        la, out_lse = view(), view()
        assert la.shape == out_lse.shape == (n, h)
        same = (la.__array_interface__["data"][0] == out_lse.__array_interface__["data"][0]
                and la.strides == out_lse.strides)
        try:
            smla.merge_attn_states(oa, la, ob, lb, out=np.empty((n, h, 8), np.float32), out_lse=out_lse)
            refused = False
        except ValueError as e:
            assert "out_lse: overlaps lse_a in memory" in str(e), e
            refused = True
        if same:
            assert not refused  # in place
        elif np.shares_memory(la, out_lse):
            assert refused
        elif not np.may_share_memory(la, out_lse):
            assert not refused
        elif not refused:
            accepted_interleaved += 1
    assert accepted_interleaved > 0


# ---------------------------------------------------------------------------------------------
# bad arguments: a fuzz over every op
# ---------------------------------------------------------------------------------------------

def _valid_calls():
    """op name -> (function, positional names, keyword names, make(): a fresh dict of valid arguments)."""
    rng = np.random.default_rng(7)

    def bf16(*shape):
        return rng.standard_normal(shape).astype(BF16)

    def i32(*shape, lo=0, hi=8):
        return rng.integers(lo, hi, shape).astype(np.int32)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def convert_args(**extra):
        d = dict(req_id=i32(5, hi=2), block_table=np.arange(6, dtype=np.int32).reshape(2, 3),
                 topk_indices=i32(5, 8, lo=-1, hi=48), block_size=16,
                 prefill_request_ids=np.array([-1, -1, 0, 0, -1], np.int32),
                 prefill_workspace_starts=np.array([100], np.int32), out=np.empty((5, 8), np.int32),
                 valid_counts=np.empty(5, np.int32), stream=None)
        d.update(extra)
        return d

    return {
        "kv_cache_shape": (smla.kv_cache_shape, ["num_blocks", "block_size", "kv_cache_dtype"], [],
                           lambda: dict(num_blocks=4, block_size=16, kv_cache_dtype="fp8_ds_mla")),
        "pack_kv": (smla.pack_kv, ["kv_c", "k_pe", "kv_cache", "slot_mapping"],
                    ["kv_cache_dtype", "scale_rule", "stream"],
                    lambda: dict(kv_c=bf16(4, 512), k_pe=bf16(4, 64), kv_cache=fp8_cache(),
                                 slot_mapping=i32(4, hi=64), kv_cache_dtype="fp8_ds_mla", scale_rule="pow2",
                                 stream=None)),
        "unpack_kv": (smla.unpack_kv, ["kv_cache", "slots"], ["kv_cache_dtype", "out", "stream"],
                      lambda: dict(kv_cache=fp8_cache(), slots=i32(4, hi=64), kv_cache_dtype="fp8_ds_mla",
                                   out=None, stream=None)),
        "gather_upconvert": (smla.gather_upconvert,
                             ["kv_cache", "workspace", "block_table", "seq_lens", "workspace_starts"],
                             ["seq_starts", "kv_cache_dtype", "stream"],
                             lambda: dict(kv_cache=fp8_cache(), workspace=np.empty((40, 576), BF16),
                                          block_table=np.array([[0, 1], [2, 3]], np.int32),
                                          seq_lens=np.array([20, 5], np.int32),
                                          workspace_starts=np.array([0, 20], np.int32),
                                          seq_starts=np.array([0, 3], np.int32), kv_cache_dtype="fp8_ds_mla",
                                          stream=None)),
        "convert_topk_indices": (smla.convert_topk_indices, ["req_id", "block_table", "topk_indices"],
                                 ["block_size", "prefill_request_ids", "prefill_workspace_starts",
                                  "return_valid_counts", "out", "valid_counts", "stream"],
                                 lambda: convert_args(return_valid_counts=True)),
        "filter_convert_dcp_indices": (smla.filter_convert_dcp_indices, ["req_id", "block_table", "topk_indices"],
                                       ["block_size", "dcp_size", "dcp_rank", "interleave", "compact",
                                        "prefill_request_ids", "prefill_workspace_starts", "out", "valid_counts",
                                        "stream"],
                                       lambda: convert_args(dcp_size=2, dcp_rank=1, interleave=2, compact=True)),
        "merge_attn_states": (smla.merge_attn_states, ["out_a", "lse_a", "out_b", "lse_b"],
                              ["out", "out_lse", "stream"],
                              lambda: dict(out_a=f32(3, 4, 16), lse_a=f32(3, 4), out_b=f32(3, 4, 16),
                                           lse_b=f32(3, 4), out=None, out_lse=np.empty((3, 4), np.float32),
                                           stream=None)),
        "sparse_mla_decode_workspace_size": (smla.sparse_mla_decode_workspace_size,
                                             ["b", "s_q", "h", "topk", "kv_cache_dtype"], ["device_id"],
                                             lambda: dict(b=2, s_q=1, h=4, topk=8, kv_cache_dtype="fp8_ds_mla",
                                                          device_id=0)),
        "sparse_mla_decode": (smla.sparse_mla_decode, ["q", "kv_cache", "indices"],
                              ["softmax_scale", "kv_cache_dtype", "topk_length", "attn_sink", "out", "lse",
                               "workspace", "stream", "precision"],
                              lambda: dict(q=bf16(1, 2, 4, 576), kv_cache=fp8_cache(), indices=i32(1, 2, 8, hi=64),
                                           softmax_scale=0.1, kv_cache_dtype="fp8_ds_mla",
                                           topk_length=np.array([[8, 3]], np.int32), attn_sink=f32(4),
                                           out=np.empty((1, 2, 4, 512), BF16), lse=None, workspace=None,
                                           stream=None, precision="fast")),
        "sparse_mla_prefill": (smla.sparse_mla_prefill, ["q", "kv", "indices"],
                               ["softmax_scale", "topk_length", "attn_sink", "out", "lse", "max_logits", "stream",
                                "precision"],
                               lambda: dict(q=bf16(3, 4, 576), kv=bf16(32, 576), indices=i32(3, 8, hi=32),
                                            softmax_scale=0.1, topk_length=np.array([8, 0, 5], np.int32),
                                            attn_sink=f32(4), out=None, lse=np.empty((3, 4), np.float32),
                                            max_logits=None, stream=None, precision="fast")),
    }


VALID_CALLS = _valid_calls()
MUTANTS = ["None", "list", "int", "str", "np.float32", "0-d array", "wrong dtype", "wrong ndim"]


def mutant(kind, value):
    is_arr = isinstance(value, np.ndarray)
    if kind == "None":
        return None
    if kind == "list":
        return [1, 2]
    if kind == "int":
        return 3
    if kind == "str":
        return "x"
    if kind == "np.float32":
        return np.float32(1)
    if kind == "0-d array":
        return np.array(1, value.dtype if is_arr else np.int64)
    if kind == "wrong dtype":
        return np.zeros(value.shape, np.float64) if is_arr else np.zeros(3)
    if kind == "wrong ndim":
        return value[None] if is_arr else np.zeros((2, 2))
    raise AssertionError(kind)


def call(op, args):
    fn, pos, kw, _ = VALID_CALLS[op]
    return fn(*[args[p] for p in pos], **{k: args[k] for k in kw})


def check_outcome(op, args, names):
    """Success, or TypeError / ValueError / BufferError whose message names one of the changed args."""
    try:
        call(op, args)
    except (TypeError, ValueError, BufferError) as e:
        msg = str(e)
        if not any(re.search(rf"\b{n}\b", msg) for n in names):
            pytest.fail(f"{op} with {names} changed: {type(e).__name__}: {msg} (does not name the argument)")
    except Exception as e:  # noqa: BLE001: anything else is the bug this test looks for
        pytest.fail(f"{op} with {names} changed: {type(e).__name__}: {e}")


@pytest.mark.parametrize("op", list(VALID_CALLS))
def test_fuzz_bad_arguments_name_themselves(op):
    """Every argument of every op replaced by each mutant, then 250 seeded pairs of replacements."""
    _, pos, kw, make = VALID_CALLS[op]
    call(op, make())  # the valid call works
    names = pos + kw
    for name in names:
        for kind in MUTANTS:
            args = make()
            args[name] = mutant(kind, args[name])
            check_outcome(op, args, [name])
    rnd = random.Random(f"smla-fuzz-{op}")
    for _ in range(250):
        args = make()
        changed = rnd.sample(names, min(2, len(names)))
        for name in changed:
            args[name] = mutant(rnd.choice(MUTANTS), args[name])
        check_outcome(op, args, changed)


def test_scalar_arguments_are_checked_by_name():
    with pytest.raises(TypeError, match="num_blocks: expected an integer, got str"):
        smla.kv_cache_shape("8", 64, "bf16")
    with pytest.raises(ValueError, match="block_size: expected an integer >= 1, got 0"):
        smla.kv_cache_shape(8, 0, "bf16")
    req, bt, tok = convert_case()
    with pytest.raises(TypeError, match="block_size: expected an integer, got float"):
        smla.convert_topk_indices(req, bt, tok, block_size=16.0)
    with pytest.raises(ValueError, match=r"block_size: expected an integer <= 9223372036854775807"):
        smla.convert_topk_indices(req, bt, tok, block_size=2**70)
    with pytest.raises(ValueError, match="dcp_rank: expected 0 <= dcp_rank < dcp_size = 2, got 2"):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=16, dcp_size=2, dcp_rank=2)
    with pytest.raises(ValueError, match="dcp_size: expected an integer <= 2147483647"):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=16, dcp_size=2**31, dcp_rank=0)
    with pytest.raises(ValueError, match="interleave: expected an integer >= 1, got 0"):
        smla.filter_convert_dcp_indices(req, bt, tok, block_size=16, dcp_size=2, dcp_rank=0, interleave=0)
    with pytest.raises(TypeError, match="softmax_scale: expected a real number, got str"):
        smla.sparse_mla_prefill(np.zeros((1, 4, 576), BF16), np.zeros((4, 576), BF16), np.zeros((1, 2), np.int32),
                                softmax_scale="0.1")
    with pytest.raises(ValueError, match="stream: expected a stream handle"):
        smla.unpack_kv(fp8_cache(), np.arange(2, dtype=np.int32), kv_cache_dtype="bf16", stream=-1)
    with pytest.raises(TypeError, match="scale_rule: expected a str, got NoneType"):
        smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 64), BF16), fp8_cache(), np.arange(2, dtype=np.int32),
                     kv_cache_dtype="fp8_ds_mla", scale_rule=None)
    # numpy integers and 0-d integer arrays are integers
    assert smla.kv_cache_shape(np.int64(2), np.array(16), "bf16") == (2, 16, 576)


def test_one_kv_cache_dtype_alias_table():
    """vLLM's aliases work in every op (the extension only ever sees the canonical names), and the
    metadata / layer code uses the same table."""
    cache = fp8_cache()
    kv_c, k_pe = np.zeros((2, 512), BF16), np.zeros((2, 64), BF16)
    for alias in ("fp8", "fp8_e4m3", "fp8_ds_mla"):
        smla.pack_kv(kv_c, k_pe, cache, np.arange(2, dtype=np.int32), kv_cache_dtype=alias)
    assert smla.kv_cache_shape(1, 2, "auto") == smla.kv_cache_shape(1, 2, "bfloat16") == (1, 2, 576)
    with pytest.raises(ValueError, match='kv_cache_dtype: expected "bf16" or "fp8_ds_mla", got "fp8"'):
        smla._C.unpack_kv(kv_cache=cache, slots=np.arange(2, dtype=np.int32), out=np.empty((2, 576), BF16),
                          kv_cache_dtype="fp8")
    assert smla.metadata.resolve_mode(16, "fp8_e4m3") == "split"
    with pytest.raises(TypeError, match="kv_cache_dtype: expected a str, got list"):
        smla.metadata.resolve_mode(16, ["bf16"])


# ---------------------------------------------------------------------------------------------
# environment switches
# ---------------------------------------------------------------------------------------------

def test_ops_survive_another_thread_writing_os_environ():
    """The kernels once called getenv with the GIL released while another thread's os.environ writes
    moved the environment array (the old code crashed in about half of the runs of this test on a busy
    2-core machine). The writer keeps adding long variables (each addition may move the array), deletes
    some, and sets / deletes SMLA_NUM_THREADS to valid values; MALLOC_PERTURB_ makes glibc fill freed
    memory, so that a read of a moved-away array faults at once."""
    res = run_python("""
        import os, sys, threading, time
        import numpy as np, ml_dtypes
        import smla

        BF16 = ml_dtypes.bfloat16
        sys.setswitchinterval(1e-5)
        rng = np.random.default_rng(0)
        cache = np.zeros(smla.kv_cache_shape(8, 16, "bf16"), BF16)
        kv_c = rng.standard_normal((64, 512)).astype(BF16)
        k_pe = rng.standard_normal((64, 64)).astype(BF16)
        slots = np.arange(64, dtype=np.int32)
        q = rng.standard_normal((2, 1, 4, 576)).astype(BF16)
        idx = rng.integers(0, 128, (2, 1, 8)).astype(np.int32)
        req, bt = np.zeros(64, np.int32), np.arange(8, dtype=np.int32)[None]
        tok = rng.integers(0, 128, (64, 32)).astype(np.int32)
        for k in range(500):
            os.environ[f"SMLA_TEST_BASE_{k}"] = "b"
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                os.environ[f"SMLA_TEST_RACE_{i}"] = "w" * (2000 + i % 37)
                if i % 4 == 3:
                    del os.environ[f"SMLA_TEST_RACE_{i - 1}"]
                if i % 7 == 0:
                    os.environ["SMLA_NUM_THREADS"] = str(1 + i % 2)
                elif i % 7 == 3:
                    os.environ.pop("SMLA_NUM_THREADS", None)
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            smla.pack_kv(kv_c, k_pe, cache, slots, kv_cache_dtype="bf16")
            smla.sparse_mla_decode(q, cache, idx, softmax_scale=0.1, kv_cache_dtype="bf16")
            for _ in range(50):
                smla.convert_topk_indices(req, bt, tok, block_size=16)
        stop.set()
        t.join()
        print("done")
    """, env=dict(os.environ, MALLOC_PERTURB_="165"))
    assert res.returncode == 0 and "done" in res.stdout, (res.returncode, res.stdout, res.stderr[-2000:])


def _op():
    smla.unpack_kv(fp8_cache(), np.arange(2, dtype=np.int32), kv_cache_dtype="fp8_ds_mla")


@pytest.mark.parametrize("var,value", [("SMLA_NUM_THREADS", "abc"), ("SMLA_NUM_THREADS", "0"),
                                       ("SMLA_NUM_THREADS", "99999999999"), ("SMLA_NUM_THREADS", "4x"),
                                       ("SMLA_CPU_ISA", "bogus"), ("SMLA_ATTN_KERNEL", "bogus"),
                                       ("SMLA_ATTN_COMBINE", "fused"), ("SMLA_ATTN_PERSISTENT", "yes")])
def test_malformed_switch_raises_at_the_first_op_and_in_build_info(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=f"^{var}: expected .*, got '{value}'$"):
        _op()
    with pytest.raises(ValueError, match=f"^{var}: expected"):
        smla.build_info()
    monkeypatch.delenv(var)
    _op()


@pytest.mark.parametrize("var", ["SMLA_ATTN_TRACE", "SMLA_ATTN_STAGGER_NS", "SMLA_ATTN_JITTER_NS"])
@pytest.mark.parametrize("value", ["abc", "-1", "12x", "99999999999999999999999"])
def test_trace_switch_of_profiling_builds_is_parsed_strictly(monkeypatch, var, value):
    """SMLA_ATTN_TRACE (a device address for the sm90 kernels' stage timestamps, tools/trace_attn.py) and
    SMLA_ATTN_STAGGER_NS / SMLA_ATTN_JITTER_NS (the CTAs' start spread, sm90/plan.cuh) are read only by profiling builds
    (SMLA_PROFILE_BUILD=1); other builds ignore them."""
    monkeypatch.delenv(var, raising=False)
    profiling = smla.build_info()["ablation"]
    monkeypatch.setenv(var, value)
    if profiling:
        with pytest.raises(ValueError, match=f"^{var}: expected an unsigned 64-bit integer .*, got '{value}'$"):
            _op()
    else:
        _op()
    monkeypatch.setenv(var, "0")
    _op()


def test_build_info_cpu_isa_follows_the_switch(monkeypatch):
    monkeypatch.delenv("SMLA_CPU_ISA", raising=False)
    default = smla.build_info()["cpu_isa_default"]
    assert smla.build_info()["cpu_isa"] == default
    monkeypatch.setenv("SMLA_CPU_ISA", "portable")
    assert smla.build_info()["cpu_isa"] == "portable"
    if default in ("avx2", "avx512", "avx512bf16"):
        monkeypatch.setenv("SMLA_CPU_ISA", "avx2")
        assert smla.build_info()["cpu_isa"] == "avx2"
        monkeypatch.setenv("SMLA_CPU_ISA", "avx2-emulated-bf16")
        assert smla.build_info()["cpu_isa"] == "avx2-emulated-bf16"
    monkeypatch.setenv("SMLA_CPU_ISA", "")
    assert smla.build_info()["cpu_isa"] == default


@pytest.mark.skipif(smla.cuda_available(), reason="checks the machine without a usable GPU")
def test_decode_workspace_size_without_gpu():
    """No usable GPU (a CUDA build on a machine without a driver included): no CUDA decode can run, so
    no workspace, as in a build without CUDA (it raised CudaError from cudaGetDevice before)."""
    assert smla.sparse_mla_decode_workspace_size(128, 2, 128, 2048, "fp8_ds_mla") == 0
    assert smla.sparse_mla_decode_workspace_size(1, 1, 16, 64, "bf16", device_id=3) == 0
