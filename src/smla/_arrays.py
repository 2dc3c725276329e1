"""Framework plumbing for the Python layer: which library owns an array, its device, the launch
stream, and output allocation with the caller's own framework (numpy / torch / cupy)."""
from __future__ import annotations

import operator
import weakref
from typing import Any

import numpy as np
import ml_dtypes

# What the ops take for an array: a NumPy array or any object with __dlpack__ (torch, CuPy, JAX, ...).
Array = Any

_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13

_NUMPY_DTYPES = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
}


def framework(x):
    """'numpy', 'torch', 'cupy' or 'other'."""
    if isinstance(x, np.ndarray):
        return "numpy"
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    return "other"


def check_array(x, name="array"):
    """TypeError naming the argument unless x is a NumPy array or has __dlpack__ (the extension's rule)."""
    if not (isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")):
        raise TypeError(f"{name}: expected a NumPy array or an object with __dlpack__, got {type(x).__name__}")


def device(x, name="array"):
    """(dlpack device type, device id); NumPy arrays are (1, 0)."""
    if isinstance(x, np.ndarray):
        return (_DL_CPU, 0)
    if framework(x) == "torch" and x.is_cuda:
        return (_DL_CUDA, x.get_device())  # what its __dlpack_device__ says, without its checks' cost
    check_array(x, name)
    if not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"{name}: a {type(x).__name__} has __dlpack__ but no __dlpack_device__")
    t, i = x.__dlpack_device__()
    return (int(t), int(i))


def _is_cuda_dlpack(x, name="array"):
    return device(x, name)[0] in (_DL_CUDA, _DL_CUDA_MANAGED)


def _cuda_rule(x, name):
    """How to tell whether an array of type(x) is on CUDA: a constant, or a function of the array."""
    fw = framework(x)
    if fw == "numpy":
        return False
    if fw == "torch":
        return lambda a, name: a.is_cuda
    if fw == "cupy":
        return True
    check_array(x, name)
    return _is_cuda_dlpack


def is_cuda(x, name="array"):
    r = _CUDA_RULES.get(x, name)
    return r if type(r) is bool else r(x, name)


# Passed to the extension to mean "ask the array's framework for its current stream" through the DLPack
# C exchange API (no Python round trip); see csrc/python/binding.c.
STREAM_CURRENT = 0xFFFFFFFFFFFFFFFF


class _PerType:
    """type -> a value computed once per type, looked up in one dict access by id(type) (a
    WeakKeyDictionary lookup builds a weak reference per call, ~0.3 us on the hot path). The entry keeps
    only a weak reference to its type: it neither keeps the caller's types alive nor serves a dead
    type's answer to a new type at the same address (the weak reference is checked, and its callback
    drops the entry)."""

    def __init__(self, make):
        self._make = make  # make(x, name) -> value for type(x); may raise (then nothing is cached)
        self._d = {}

    def get(self, x, name):
        t = type(x)
        e = self._d.get(id(t))
        if e is not None and e[0]() is t:
            return e[1]
        v = self._make(x, name)
        k = id(t)
        d = self._d
        try:
            ref = weakref.ref(t, lambda r, k=k, d=d: d.pop(k, None) if d.get(k, (None,))[0] is r else None)
        except TypeError:  # a type that cannot be weakly referenced: not cached
            return v
        d[k] = (ref, v)
        return v


def _torch_current_stream(x):
    import torch

    return int(torch.cuda.current_stream(x.device).cuda_stream) if x.is_cuda else 0


def _cupy_current_stream(x):
    import cupy

    return int(cupy.cuda.get_current_stream().ptr)


def _stream_rule(x, name):
    """How to find the default launch stream of arrays of type(x): an int (the same for every array of
    the type: 0 for NumPy, STREAM_CURRENT for exchange-API types, whose current stream the extension
    asks for itself) or a function of the array (the framework's current stream, from Python)."""
    if isinstance(x, np.ndarray):
        return 0
    check_array(x, name)
    t = type(x)
    if hasattr(t, "__dlpack_c_exchange_api__"):
        return STREAM_CURRENT
    fw = framework(x)
    if fw == "torch":
        return _torch_current_stream
    if fw == "cupy":
        return _cupy_current_stream
    return 0  # another DLPack producer: the legacy default stream


_STREAM_RULES = _PerType(_stream_rule)
_CUDA_RULES = _PerType(_cuda_rule)


def strides_elems(x):
    """Element strides of a torch / NumPy / CuPy array."""
    if framework(x) == "torch":
        return tuple(int(s) for s in x.stride())
    return tuple(int(s) // x.dtype.itemsize for s in x.strides)


def c_contiguous(shape, strides):
    """Whether element strides describe a C-contiguous layout of shape (extents of 1 may have any
    stride, as in NumPy and torch)."""
    want = 1
    for n, st in zip(reversed(shape), reversed(strides)):
        if n > 1 and st != want:
            return False
        want *= n
    return True


def is_c_contiguous(x):
    """c_contiguous for x, from the framework's own flag where it has one (no strides tuple built)."""
    fw = framework(x)
    if fw in ("numpy", "cupy"):
        return bool(x.flags.c_contiguous)
    if fw == "torch":
        return bool(x.is_contiguous())
    return c_contiguous(tuple(map(int, x.shape)), strides_elems(x))


_DTYPE_NAMES = {}  # (array type, dtype) -> name: str(dtype) costs microseconds, a lookup far less


def dtype_name(x):
    """x's dtype as one of _NUMPY_DTYPES' names (torch's 'torch.bfloat16' -> 'bfloat16'); CuPy's raw
    bf16 bits (uint16) count as 'bfloat16', as every op accepts them."""
    key = (type(x), x.dtype)
    name = _DTYPE_NAMES.get(key)
    if name is None:
        name = str(x.dtype).removeprefix("torch.")
        if name == "uint16" and framework(x) == "cupy":
            name = "bfloat16"
        _DTYPE_NAMES[key] = name
    return name


def launch_stream(x, stream=None, name="array"):
    """The stream handle to launch on: the caller's `stream=`, else the current stream of the framework
    that owns x (`name` in messages: torch / cupy), else 0 (the legacy default stream). One dict lookup
    per call for exchange-API types and NumPy."""
    if stream is None:
        r = _STREAM_RULES.get(x, name)
        return r if type(r) is int else r(x)
    check_array(x, name)
    try:
        s = operator.index(stream)
    except TypeError:
        raise TypeError(f"stream: expected an integer stream handle, got {type(stream).__name__}") from None
    if not 0 <= s < STREAM_CURRENT:
        raise ValueError(f"stream: expected a stream handle from 0 to 2**64 - 2, got {s}")
    return s


def _empty_numpy(ref, shape, dtype):
    return np.empty(shape, _NUMPY_DTYPES[dtype])


_TORCH_DTYPES = {}


def _empty_torch(ref, shape, dtype):
    dt = _TORCH_DTYPES.get(dtype)
    if dt is None:
        import torch

        dt = _TORCH_DTYPES[dtype] = getattr(torch, dtype)
    return ref.new_empty(shape, dtype=dt)  # ref's device; no autograd history to keep


_CUPY_BF16 = []  # the dtype CuPy makes bf16 outputs with, found once: ml_dtypes' bfloat16 or raw uint16 bits


def _empty_cupy(ref, shape, dtype):
    import cupy

    dt = _NUMPY_DTYPES[dtype]
    if dtype == "bfloat16":
        if not _CUPY_BF16:  # a CuPy without bf16 raises here: once, not per call
            try:
                cupy.empty((0,), dtype=dt)
                _CUPY_BF16.append(dt)
            except (TypeError, ValueError):
                _CUPY_BF16.append(np.dtype(np.uint16))  # raw bf16 bits, accepted by every op
        dt = _CUPY_BF16[0]
    dev = ref.device.id
    if dev == cupy.cuda.runtime.getDevice():  # the usual case: no device switch
        return cupy.empty(shape, dtype=dt)
    with cupy.cuda.Device(dev):
        return cupy.empty(shape, dtype=dt)


def _empty_other(ref, shape, dtype):
    if not is_cuda(ref):
        return np.empty(shape, _NUMPY_DTYPES[dtype])
    raise TypeError(
        f"cannot allocate an output for a {type(ref).__module__}.{type(ref).__name__} array on CUDA: "
        "pass out= (and lse=, etc.) explicitly"
    )


def _c_allocates(x, name):
    from . import _C

    return bool(_C.can_allocate(x))


_C_ALLOCATES = _PerType(_c_allocates)


def c_allocates(x, name="array"):
    """Whether the extension can allocate outputs like x itself (outputs passed as _C.ALLOCATE): NumPy
    arrays, and types whose DLPack exchange API has an allocator (torch). One dict lookup per call."""
    return _C_ALLOCATES.get(x, name)


_ALLOCATORS = _PerType(lambda x, name: {"numpy": _empty_numpy, "torch": _empty_torch, "cupy": _empty_cupy,
                                         "other": _empty_other}[framework(x)])


def empty(ref, shape, dtype):
    """An uninitialised array of `shape` and `dtype` ('bfloat16', 'float32', 'int32', 'uint8') made by
    the framework that owns `ref`, on ref's device."""
    shape = tuple(map(int, shape))
    if dtype not in _NUMPY_DTYPES:
        raise TypeError(f"cannot allocate an output of dtype {dtype}: expected one of {sorted(_NUMPY_DTYPES)}")
    return _ALLOCATORS.get(ref, "array")(ref, shape, dtype)


def zeros(ref, shape, dtype):
    """Like empty, filled with zeros."""
    a = empty(ref, shape, dtype)
    a[...] = 0
    return a


def host_ints(x, name, dtype=np.int64):
    """A NumPy copy (or view) of an integer array of any framework, or of a list: the host index
    arithmetic of the metadata and DCP helpers. A CUDA array is copied to the host, which
    synchronises with its stream."""
    if x is None:
        raise TypeError(f"{name}: expected an array, got NoneType")
    fw = "list" if isinstance(x, (list, tuple)) else framework(x)
    if fw == "torch":
        a = x.detach().cpu().numpy()
    elif fw == "cupy":
        import cupy

        a = cupy.asnumpy(x)
    elif fw in ("numpy", "list"):
        a = np.asarray(x)
    else:
        check_array(x, name)
        a = np.from_dlpack(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got {a.dtype}")
    return a.astype(dtype, copy=False)
