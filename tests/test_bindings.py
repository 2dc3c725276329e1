"""The marshalling layer: NumPy and DLPack inputs, ownership, and error messages naming the argument."""
import sys

import ml_dtypes
import numpy as np
import pytest

import smla

BF16 = ml_dtypes.bfloat16


class Producer:
    """A minimal DLPack producer over a NumPy array (CPU), optionally legacy-only (no max_version)."""

    def __init__(self, a, legacy=False):
        self.a = a
        self.legacy = legacy
        self.calls = 0

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, *, stream=None, **kw):
        assert stream is None, "CPU producers must be asked with stream=None"
        self.calls += 1
        if self.legacy and "max_version" in kw:
            raise TypeError("max_version not supported")
        return self.a.__dlpack__(**kw)


def fp8_cache(nb=4, bs=16):
    return np.zeros(smla.kv_cache_shape(nb, bs, "fp8_ds_mla"), np.uint8)


@pytest.mark.parametrize("legacy", [False, True])
def test_dlpack_consumed_once_and_released(legacy):
    cache = fp8_cache()
    slots = np.arange(8, dtype=np.int32)
    prod = Producer(slots, legacy=legacy)
    before = sys.getrefcount(slots)
    out = np.empty((8, 576), np.uint16)
    for _ in range(3):
        smla.unpack_kv(cache, prod, kv_cache_dtype="fp8_ds_mla", out=out)
    # each call exported one capsule (two tries for a legacy producer) and released it exactly once
    assert prod.calls == (6 if legacy else 3)
    assert sys.getrefcount(slots) == before


def test_dlpack_matches_numpy_path():
    rng = np.random.default_rng(0)
    cache = fp8_cache()
    kv_c = rng.standard_normal((20, 512)).astype(BF16)
    k_pe = rng.standard_normal((20, 64)).astype(BF16)
    smla.pack_kv(kv_c, k_pe, cache, np.arange(20, dtype=np.int64), kv_cache_dtype="fp8_ds_mla")
    a = smla.unpack_kv(cache, np.arange(20, dtype=np.int32), kv_cache_dtype="fp8_ds_mla")
    b = smla.unpack_kv(Producer(cache), Producer(np.arange(20, dtype=np.int32)), kv_cache_dtype="fp8_ds_mla",
                       out=np.empty((20, 576), np.uint16))
    assert np.array_equal(a.view(np.uint16), b)


def test_build_info(monkeypatch):
    monkeypatch.delenv("SMLA_CPU_ISA", raising=False)
    info = smla.build_info()
    assert set(info) >= {"cuda", "cuda_runtime", "cuda_archs", "debug", "version", "cpu_isa", "cpu_isa_default"}
    assert info["cpu_isa_default"] in ("portable", "avx2", "avx512", "avx512bf16")
    assert info["cpu_isa"] == info["cpu_isa_default"]  # unset: the default level runs
    monkeypatch.setenv("SMLA_CPU_ISA", "portable")  # every CPU has it
    assert smla.build_info()["cpu_isa"] == "portable"
    assert isinstance(smla.cuda_available(), bool)


def test_kv_cache_shape():
    assert smla.kv_cache_shape(3, 64, "fp8_ds_mla") == (3, 64, 656)
    assert smla.kv_cache_shape(3, 64, "bf16") == (3, 64, 576)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        smla.kv_cache_shape(3, 64, "fp16")


def _unpack(cache=None, slots=None, out=None, dtype="fp8_ds_mla"):
    cache = fp8_cache() if cache is None else cache
    slots = np.arange(4, dtype=np.int32) if slots is None else slots
    out = np.empty((4, 576), BF16) if out is None else out
    return smla.unpack_kv(cache, slots, kv_cache_dtype=dtype, out=out)


BAD = [
    ("not an array", dict(slots=[0, 1, 2, 3]), TypeError, "slots: expected a NumPy array"),
    ("slot dtype", dict(slots=np.arange(4, dtype=np.float32)), TypeError, "slots: expected int32 or int64, got float32"),
    ("slot ndim", dict(slots=np.zeros((4, 1), np.int32)), ValueError, "slots: expected 1 dimensions"),
    ("cache dtype", dict(cache=np.zeros((4, 16, 656), np.float32)), TypeError, "kv_cache: expected uint8"),
    ("cache ndim", dict(cache=np.zeros((64, 656), np.uint8)), ValueError, "kv_cache: expected 3 dimensions"),
    ("cache entry", dict(cache=np.zeros((4, 16, 576), np.uint8)), ValueError, r"kv_cache: expected shape\[2\] == 656"),
    ("cache layout name", dict(dtype="fp4"), ValueError, "kv_cache_dtype"),
    ("bf16 cache as fp8", dict(cache=np.zeros((4, 16, 576), BF16)), TypeError, "kv_cache: expected uint8"),
    ("out dtype", dict(out=np.empty((4, 576), np.float32)), TypeError, "out: expected bfloat16 or uint16, got float32"),
    ("out rows", dict(out=np.empty((5, 576), BF16)), ValueError, r"out: expected shape\[0\] == 4"),
    ("out width", dict(out=np.empty((4, 512), BF16)), ValueError, r"out: expected shape\[1\] == 576"),
    ("out strided", dict(out=np.empty((4, 1152), BF16)[:, ::2]), ValueError, "out: the last dimension must be contiguous"),
    ("cache strided entry", dict(cache=np.zeros((4, 16, 1312), np.uint8)[:, :, ::2]), ValueError, "kv_cache: the last dimension"),
    ("slots strided", dict(slots=np.arange(8, dtype=np.int32)[::2]), ValueError, "slots: expected a C-contiguous"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs_name_the_argument(case):
    _, kw, exc, msg = case
    with pytest.raises(exc, match=msg):
        _unpack(**kw)


def test_read_only_output():
    out = np.empty((4, 576), BF16)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: output array is read-only"):
        _unpack(out=out)
    cache = fp8_cache()
    cache.flags.writeable = False
    with pytest.raises(ValueError, match="kv_cache: output array is read-only"):
        smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 64), BF16), cache, np.arange(2, dtype=np.int32),
                     kv_cache_dtype="fp8_ds_mla")


def test_strided_cache_layers():
    """A cache whose blocks interleave layers (stride(0) > block_size * entry) is addressed correctly."""
    rng = np.random.default_rng(1)
    big = np.zeros((4, 2, 16, 656), np.uint8)
    layer1 = big[:, 1]  # stride(0) = 2 * 16 * 656
    kv_c = rng.standard_normal((64, 512)).astype(BF16)
    k_pe = rng.standard_normal((64, 64)).astype(BF16)
    slots = np.arange(64, dtype=np.int32)
    smla.pack_kv(kv_c, k_pe, layer1, slots, kv_cache_dtype="fp8_ds_mla")
    assert not big[:, 0].any()
    dense = fp8_cache()
    smla.pack_kv(kv_c, k_pe, dense, slots, kv_cache_dtype="fp8_ds_mla")
    assert np.array_equal(layer1, dense)


def test_pack_kv_bad_inputs():
    cache = fp8_cache()
    slots = np.arange(2, dtype=np.int32)
    with pytest.raises(TypeError, match="kv_c: expected bfloat16 or uint16, got float32"):
        smla.pack_kv(np.zeros((2, 512), np.float32), np.zeros((2, 64), BF16), cache, slots, kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match=r"k_pe: expected shape\[1\] == 64"):
        smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 32), BF16), cache, slots, kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match="slot_mapping: has 3 tokens but kv_c has 2"):
        smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 64), BF16), cache, np.arange(3, dtype=np.int32),
                     kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match="scale_rule"):
        smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 64), BF16), cache, slots, kv_cache_dtype="fp8_ds_mla",
                     scale_rule="e8m0")
    # vLLM's [T, 1, 64] k_pe is accepted
    smla.pack_kv(np.zeros((2, 512), BF16), np.zeros((2, 1, 64), BF16), cache, slots, kv_cache_dtype="fp8_ds_mla")


def test_cuda_arrays_without_cuda_raise_cleanly():
    class FakeCuda(Producer):
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, *, stream=None, **kw):
            raise BufferError("fake producer cannot export")

    if smla.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(BufferError, match="fake producer"):
        _unpack(slots=FakeCuda(np.arange(4, dtype=np.int32)))


def _torch_pack_unpack(torch, kv_c, k_pe, wrap=lambda t: t):
    """pack_kv then unpack_kv on torch CPU tensors (each passed through wrap); returns the cache and
    the unpacked rows as NumPy."""
    t_cache = torch.zeros(smla.kv_cache_shape(4, 16, "fp8_ds_mla"), dtype=torch.uint8)
    t_kv_c = torch.from_numpy(kv_c.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    t_k_pe = torch.from_numpy(k_pe.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    smla.pack_kv(wrap(t_kv_c), wrap(t_k_pe), wrap(t_cache), wrap(torch.arange(20, dtype=torch.int32)),
                 kv_cache_dtype="fp8_ds_mla")
    out = torch.empty((20, 576), dtype=torch.bfloat16)
    res = smla.unpack_kv(wrap(t_cache), wrap(torch.arange(20, dtype=torch.int64)), kv_cache_dtype="fp8_ds_mla",
                         out=wrap(out))
    assert res is not None
    return t_cache.numpy(), out.view(torch.int16).numpy().view(np.uint16)


def test_torch_cpu_tensors_through_the_exchange_api(monkeypatch):
    """torch publishes the DLPack C exchange API on its tensor type: its CPU tensors take that path
    (torch's Python-level __dlpack__ is never called) and match NumPy; the same tensors behind a
    plain __dlpack__ producer take the capsule path and match too."""
    torch = pytest.importorskip("torch")
    if not hasattr(type(torch.empty(1)), "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} does not publish __dlpack_c_exchange_api__")
    rng = np.random.default_rng(2)
    cache = fp8_cache()
    kv_c = rng.standard_normal((20, 512)).astype(BF16)
    k_pe = rng.standard_normal((20, 64)).astype(BF16)
    smla.pack_kv(kv_c, k_pe, cache, np.arange(20, dtype=np.int32), kv_cache_dtype="fp8_ds_mla")
    want = smla.unpack_kv(cache, np.arange(20, dtype=np.int32), kv_cache_dtype="fp8_ds_mla").view(np.uint16)

    exported = []
    plain = torch.Tensor.__dlpack__

    def counting(self, *a, **kw):
        exported.append(tuple(self.shape))
        return plain(self, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "__dlpack__", counting)
    got_cache, got = _torch_pack_unpack(torch, kv_c, k_pe)
    assert exported == [], f"torch tensors went through __dlpack__ (shapes {exported}), not the exchange API"
    assert np.array_equal(got_cache, cache) and np.array_equal(got, want)

    got_cache, got = _torch_pack_unpack(torch, kv_c, k_pe, wrap=Producer)
    assert len(exported) == 7  # each of the 4 + 3 arrays once, through the capsule path
    assert np.array_equal(got_cache, cache) and np.array_equal(got, want)

    out = smla.unpack_kv(torch.from_numpy(cache), torch.arange(20, dtype=torch.int64), kv_cache_dtype="fp8_ds_mla")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), want)
    with pytest.raises(TypeError, match="^slots: expected int32 or int64, got float32"):
        smla.unpack_kv(torch.from_numpy(cache), torch.zeros(3), kv_cache_dtype="fp8_ds_mla")


# ---------------------------------------------------------------------------------------------
# the raw bindings: keyword arguments only, as src/smla/_C.pyi lists them
# ---------------------------------------------------------------------------------------------

def _stub_signatures():
    """function name -> (required keyword names, optional keyword names), read from src/smla/_C.pyi."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(smla.__file__).with_name("_C.pyi").read_text())
    sigs = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.args.kwonlyargs:
            names = [a.arg for a in node.args.kwonlyargs]
            sigs[node.name] = ([n for n, d in zip(names, node.args.kw_defaults) if d is None],
                               [n for n, d in zip(names, node.args.kw_defaults) if d is not None])
    return sigs


STUB = _stub_signatures()


@pytest.mark.parametrize("fn", sorted(STUB))
def test_raw_bindings_take_the_keywords_of_the_stub(fn):
    """Every keyword of the stub is known to the C table, the required ones are exactly the stub's, and
    a positional, unknown or missing argument is a TypeError naming the function and the argument."""
    from smla import _C

    f = getattr(_C, fn)
    required, optional = STUB[fn]
    assert required
    with pytest.raises(TypeError, match=rf"^{fn}\(\) takes keyword arguments only \(1 positional given\)$"):
        f(1)
    # names are matched before anything is converted: an unknown one is reported whatever the others are
    with pytest.raises(TypeError, match=rf"^{fn}\(\) got an unexpected keyword argument 'bogus'$"):
        f(**{n: object() for n in required + optional}, bogus=1)
    for missing in required:
        with pytest.raises(TypeError, match=rf"^{fn}\(\) missing required keyword argument '{missing}'$"):
            f(**{n: object() for n in required if n != missing})


def test_raw_binding_scalars_name_themselves():
    from smla import _C

    ws = dict(b=1, s_q=1, h=4, topk=8, kv_cache_dtype="bf16", device=0)
    assert _C.sparse_mla_decode_workspace_size(**ws) == 0 or smla.cuda_available()
    cases = [(dict(h=_C.MAX_HEADS + 1), ValueError, f"h: expected 1 to {_C.MAX_HEADS} heads, got {_C.MAX_HEADS + 1}"),
             (dict(h=0), ValueError, "h: expected 1 to"), (dict(topk=0), ValueError, "topk: expected topk >= 1"),
             (dict(topk=_C.MAX_TOPK + 1), ValueError, "topk: expected at most"),
             (dict(b=-1), ValueError, "b: expected an integer >= 0, got -1"),
             (dict(b=2**64), ValueError, "b: expected an integer from"), (dict(s_q=1.0), TypeError, "s_q: expected an integer, got float"),
             (dict(device=2**31), ValueError, "device: expected an integer from -2147483648 to 2147483647"),
             (dict(kv_cache_dtype=None), TypeError, "kv_cache_dtype: expected a str, got NoneType"),
             (dict(kv_cache_dtype="bf\0"), ValueError, "kv_cache_dtype: expected a str without NUL characters"),
             (dict(kv_cache_dtype="fp8"), ValueError, 'kv_cache_dtype: expected "bf16" or "fp8_ds_mla", got "fp8"')]
    for change, exc, msg in cases:
        with pytest.raises(exc, match="^" + msg.replace("(", r"\(").replace(")", r"\)")):
            _C.sparse_mla_decode_workspace_size(**{**ws, **change})
    cache = fp8_cache()
    args = dict(kv_cache=cache, slots=np.arange(2, dtype=np.int32), out=np.empty((2, 576), BF16),
                kv_cache_dtype="fp8_ds_mla")
    _C.unpack_kv(**args)  # stream left out: the current stream (nothing to ask for NumPy arrays)
    with pytest.raises(ValueError, match=r"^stream: expected a stream handle from 0 to 2\*\*64 - 1$"):
        _C.unpack_kv(**args, stream=-1)
    with pytest.raises(TypeError, match="^stream: expected an integer stream handle, got str$"):
        _C.unpack_kv(**args, stream="0")
    _C.unpack_kv(**args, stream=np.uint64(2**64 - 1))  # anything with __index__
    pre = dict(q=np.zeros((1, 4, 576), BF16), kv=np.zeros((4, 576), BF16), indices=np.zeros((1, 2), np.int32),
               out=np.empty((1, 4, 512), BF16), lse=np.empty((1, 4), np.float32), softmax_scale=0.1,
               precision="high")
    with pytest.raises(TypeError, match="^softmax_scale: expected a real number, got str$"):
        _C.sparse_mla_prefill(**{**pre, "softmax_scale": "0.1"})
    assert _C.PRECISIONS == ("high", "fast")
    for precision in _C.PRECISIONS:
        _C.sparse_mla_prefill(**{**pre, "precision": precision})
    for value, exc, msg in [("medium", ValueError, 'precision: expected "high" or "fast", got "medium"'),
                            ("HIGH", ValueError, 'precision: expected "high" or "fast", got "HIGH"'),
                            (1, TypeError, "precision: expected a str, got int"),
                            (None, TypeError, "precision: expected a str, got NoneType")]:
        with pytest.raises(exc, match=f"^{msg}$"):
            _C.sparse_mla_prefill(**{**pre, "precision": value})
    conv = dict(req_id=np.zeros(2, np.int32), block_table=np.zeros((1, 2), np.int32),
                topk_indices=np.zeros((2, 4), np.int32), block_size=16, out=np.empty((2, 4), np.int32),
                dcp_size=2, dcp_rank=0, interleave=1, compact=True)
    _C.filter_convert_dcp_indices(**{**conv, "compact": 0})
    with pytest.raises(ValueError, match=r"^compact: expected an integer from 0 to 1, got 2$"):
        _C.filter_convert_dcp_indices(**{**conv, "compact": 2})
    for name, value, msg in [("dcp_size", 0, "dcp_size: expected >= 1, got 0"),
                             ("dcp_rank", 2, "dcp_rank: expected 0 <= dcp_rank < dcp_size = 2, got 2"),
                             ("interleave", 0, "interleave: expected >= 1, got 0"),
                             ("block_size", 0, "block_size: expected a positive integer, got 0")]:
        with pytest.raises(ValueError, match=f"^{msg}$"):
            _C.filter_convert_dcp_indices(**{**conv, name: value})


def test_limits_come_from_the_extension():
    from smla import _C

    assert (_C.MAX_HEADS, _C.D_NOPE, _C.D_ROPE, _C.D_QK, _C.D_V, _C.FP8_ENTRY_BYTES) == (128, 512, 64, 576, 512, 656)
    assert (smla.D_NOPE, smla.D_ROPE, smla.D_QK, smla.D_V) == (_C.D_NOPE, _C.D_ROPE, _C.D_QK, _C.D_V)
    assert smla.kv_cache_shape(1, 1, "fp8_ds_mla")[2] == _C.FP8_ENTRY_BYTES
    rng = np.random.default_rng(3)
    h = _C.MAX_HEADS + 1  # refused on the CPU as on CUDA (design.md section 4: h is 1..128)
    with pytest.raises(ValueError, match=f"^q: expected 1 to 128 heads, got {h}$"):
        smla.sparse_mla_decode(rng.standard_normal((1, 1, h, 576)).astype(BF16), fp8_cache(),
                               np.zeros((1, 1, 4), np.int32), softmax_scale=0.1, kv_cache_dtype="fp8_ds_mla")
    with pytest.raises(ValueError, match=f"^q: expected 1 to 128 heads, got {h}$"):
        smla.sparse_mla_prefill(rng.standard_normal((1, h, 576)).astype(BF16), np.zeros((4, 576), BF16),
                                np.zeros((1, 4), np.int32), softmax_scale=0.1)
    out, lse = smla.sparse_mla_decode(rng.standard_normal((1, 1, 128, 576)).astype(BF16), fp8_cache(),
                                      np.zeros((1, 1, 4), np.int32), softmax_scale=0.1, kv_cache_dtype="fp8_ds_mla")
    assert out.shape == (1, 1, 128, 512) and np.isfinite(lse).all()
