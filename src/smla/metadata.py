"""Per-step batch metadata for the sparse MLA layer, with vLLM's semantics (docs/design.md section 6).

A step's batch is ordered decodes first, then prefills. `SparseMLAMetadataBuilder` is made once per
model from the model's SparseMLAConfig: it allocates every reusable buffer at construction (sized by
max_num_seqs / max_num_batched_tokens / topk / max_model_len) and `build()` fills them for one step
and returns a `SparseMLAMetadata`, a plain record of the step whose arrays are views of those
buffers. The next `build()` overwrites them and marks the record stale, so a metadata object is
valid until the next build (as in vLLM).

All host work of a step happens in build(), never in the layer's forward: the split counts,
req_id_per_token and (split mode with prefills) the prefill request ids, chunk-relative workspace
starts and chunks are computed with NumPy from host copies of query_start_loc (and of seq_lens for
the chunks), then uploaded (torch: through pinned staging buffers with non-blocking copies);
block_table, seq_lens, query_start_loc and slot_mapping are copied device-to-device (or uploaded)
into the builder's own buffers, so a captured CUDA graph keeps reading the same addresses with the
same shapes. Given device arrays only, build() copies query_start_loc to the host, and seq_lens too
for a split step with prefills: each copy synchronises with the device. Pass `query_start_loc_cpu=`
/ `seq_lens_cpu=` (what a serving stack already has) to avoid them; then build() does not
synchronise (it may wait for the upload of two steps before, see _put).

Scratch shared by every layer of the model also lives here (converted indices, lse / max_logits scratch, the
decode kernel's split-top-k workspace sized for the largest step at allocation, the split mode's bf16 prefill
workspace), so a decode step through SparseMLAAttention allocates nothing. `workspace_specs` names them with
their shapes and byte sizes, and the `workspaces=` keyword takes caller-owned arrays in their place, so a host
framework can own and count that memory; SparseMLAMetadata.with_workspaces (and the layer's attend(...,
workspaces=)) takes them for one call, for a framework that hands its buffers out at each use.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _arrays
from ._arrays import host_ints as _host
from .config import D_QK, MIN_HEADS_FOR_SPLIT, SparseMLAConfig, expect_config, resolve_mode
from .ops import _I32_MAX, _int, _shape, sparse_mla_decode_workspace_size

__all__ = ["MIN_HEADS_FOR_SPLIT", "PrefillChunk", "WorkspaceSpec", "SparseMLAConfig", "SparseMLAMetadata",
           "SparseMLAMetadataBuilder", "req_id_per_token", "resolve_mode", "split_decodes_and_prefills",
           "split_prefill_chunks"]

PREFILL_WORKSPACE_FACTOR = 5  # vLLM get_prefill_workspace_size: 5 * max_model_len rows of 576 bf16

# An array of any framework smla accepts: NumPy, or any DLPack producer (torch, CuPy, ...); host index
# arguments may also be lists.
Array = Any


# =============================================================================================
# host-side helpers (vLLM's functions, on NumPy)
# =============================================================================================

def req_id_per_token(query_start_loc: Array) -> np.ndarray:
    """int32 [qsl[-1] - qsl[0]]: token t belongs to request r where qsl[r] <= t < qsl[r+1]."""
    qsl = _host(query_start_loc, "query_start_loc").reshape(-1)
    lens = np.diff(qsl)
    if qsl.shape[0] < 1 or (lens < 0).any():
        raise ValueError("query_start_loc: expected a non-decreasing array of R+1 offsets")
    return np.repeat(np.arange(lens.shape[0], dtype=np.int32), lens)


def split_decodes_and_prefills(query_start_loc: Array, *, decode_threshold: int = 1,
                               require_uniform: bool = False) -> tuple[int, int, int, int]:
    """(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens) of a batch ordered decodes
    first (vLLM's split_decodes_and_prefills). A request is a decode iff its query length <=
    decode_threshold; with require_uniform the decodes must all have the first request's length
    (a longer or shorter one starts the prefills), and a batch whose lengths are all that length or
    0 (zero-token CUDA-graph padding) is all decodes."""
    decode_threshold = _int(decode_threshold, "decode_threshold", 0)
    qsl = _host(query_start_loc, "query_start_loc").reshape(-1)
    num_reqs = qsl.shape[0] - 1
    if num_reqs <= 0:
        return 0, 0, 0, 0
    num_tokens = int(qsl[-1] - qsl[0])
    qlen = np.diff(qsl)
    if qlen.max() <= decode_threshold and (not require_uniform or decode_threshold <= 1):
        return num_reqs, 0, num_tokens, 0
    if qlen[0] > decode_threshold:
        return 0, num_reqs, 0, num_tokens
    if require_uniform:
        if np.all((qlen == qlen[0]) | (qlen == 0)):
            return num_reqs, 0, num_tokens, 0
        is_prefill = qlen != qlen[0]
    else:
        is_prefill = qlen > decode_threshold
    if not is_prefill.any():
        return num_reqs, 0, num_tokens, 0
    first = int(np.argmax(is_prefill))
    num_decode_tokens = int(qsl[first] - qsl[0])
    return first, num_reqs - first, num_decode_tokens, num_tokens - num_decode_tokens


def split_prefill_chunks(seq_lens: Array, workspace_size: int, request_offset: int = 0) -> list[tuple[int, int]]:
    """Greedy [(start, end), ...] of consecutive requests whose seq_lens sum to <= workspace_size
    (vLLM's split_prefill_chunks); every seq_len must fit on its own."""
    workspace_size = _int(workspace_size, "workspace_size", 0)
    request_offset = _int(request_offset, "request_offset", 0)
    sl = _host(seq_lens, "seq_lens").reshape(-1)
    if (sl > workspace_size).any():
        i = int(np.argmax(sl > workspace_size))
        raise ValueError(f"seq_lens[{i}] = {int(sl[i])} does not fit a prefill workspace of "
                         f"{workspace_size} rows")
    chunks, i, n = [], 0, sl.shape[0]
    while i < n:
        start, total = i, 0
        while i < n and total + int(sl[i]) <= workspace_size:
            total += int(sl[i])
            i += 1
        chunks.append((start + request_offset, i + request_offset))
    return chunks


# =============================================================================================
# metadata
# =============================================================================================

@dataclass
class PrefillChunk:
    """Prefill requests [req_start, req_end) (counted among the prefills) whose whole sequences fit
    the workspace together; their query tokens are [token_start, token_end) of the step."""
    req_start: int
    req_end: int
    token_start: int
    token_end: int
    num_rows: int               # workspace rows used: sum of the chunk's seq_lens
    block_table: object         # view [n, max_blocks] int32
    seq_lens: object            # view [n] int32
    workspace_starts: object    # view [n] int32, chunk-relative (first request at row 0)
    seq_lens_cpu: np.ndarray

    @property
    def tokens(self) -> slice:
        return slice(self.token_start, self.token_end)


class WorkspaceSpec(NamedTuple):
    """One scratch buffer of the builder: a C-contiguous array of `shape` and `dtype` (nbytes bytes)."""
    shape: tuple
    dtype: str
    nbytes: int


_PER_TOKEN = ("indices", "lse", "max_logits")  # workspaces of [max_num_batched_tokens, ...] rows
_ITEMSIZE = {"bfloat16": 2, "float32": 4, "int32": 4, "uint8": 1}


class _BuildToken:
    """Shared by one build()'s metadata (and any copy of it) and its builder, which sets `stale` at
    its next build(): the metadata's arrays are views of buffers that build overwrites. A flag, not
    a builder reference, so the metadata stays a plain record."""
    __slots__ = ("stale",)

    def __init__(self) -> None:
        self.stale = False


@dataclass
class SparseMLAMetadata:
    """One step's metadata: a plain record (no builder reference; nothing is computed on access).
    Array fields are views of the builder's buffers."""
    config: SparseMLAConfig     # the builder's configuration (the layer checks it is its own)
    num_reqs: int
    num_tokens: int             # query tokens of the requests: query_start_loc[-1]
    num_padded_tokens: int      # T = len(slot_mapping) >= num_tokens (CUDA-graph padding)
    max_query_len: int
    # vLLM's split (require_uniform=True); num_decodes excludes zero-token padding requests
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    first_prefill_req: int      # request index of prefill 0
    decode_query_len: int       # uniform query length of the decodes (0: none)
    decode_shape: tuple         # (b, s_q) of the split-mode decode call over tokens [0, b*s_q)
    query_start_loc_cpu: np.ndarray
    seq_lens_cpu: Optional[np.ndarray]  # when known on the host
    query_start_loc: object     # [R+1] int32
    seq_lens: object            # [R] int32
    block_table: object         # [R, max_blocks] int32; columns past the caller's width hold -1
    slot_mapping: object        # [T] int32
    req_id_per_token: object    # [T] int32; padding tokens read request 0
    # the split-mode prefill plan, made by build(): None / [] without a split step's prefills
    prefill_request_ids: object = None       # [T] int32: -1 for decode tokens, p for prefill p
    prefill_seq_lens: object = None          # [P] int32
    prefill_workspace_starts: object = None  # [P] int32, chunk-relative
    chunks: list = field(default_factory=list)  # PrefillChunk, in token order
    # scratch owned by the builder, shared by every layer that uses this metadata
    prefill_workspace: object = None         # [W, 576] bf16 (split mode) or None
    prefill_workspace_rows: int = 0
    indices: object = None                   # [T, topk] int32: converted indices
    lse_scratch: object = None               # [T, h] f32
    max_logits_scratch: object = None        # [T, h] f32
    decode_workspace: object = None          # uint8 [>= decode_workspace_bytes] or None
    decode_workspace_bytes: int = 0          # what this step's decode call needs (the config's mode)
    # (b, s_q, indices [b, s_q, topk], lse_scratch [b, s_q, h]) when the step's decode call covers all T
    # tokens (the layer's views for it, made once per step instead of once per layer); else None
    decode_views: Optional[tuple] = None
    workspace_specs: Optional[dict] = None   # the builder's workspace_specs (with_workspaces checks by them)
    per_call: frozenset = frozenset()        # scratch the caller hands to each attend (None fields here)
    step: int = 0                            # the builder's build count
    _token: _BuildToken = field(default_factory=_BuildToken, repr=False, compare=False)

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def is_decode_only(self) -> bool:
        return self.num_prefills == 0

    @property
    def stale(self) -> bool:
        """True once the builder has built another step (this record's arrays are overwritten)."""
        return self._token.stale

    # the record's field for each workspace name; lse is forward's scratch
    _WORKSPACE_FIELDS = {"indices": "indices", "lse": "lse_scratch", "max_logits": "max_logits_scratch",
                         "prefill_workspace": "prefill_workspace", "decode_workspace": "decode_workspace"}

    def with_workspaces(self, workspaces: dict) -> "SparseMLAMetadata":
        """A copy of this step's record whose scratch is `workspaces` ({name: array}, any subset of
        the builder's workspace_specs, checked as the builder's workspaces= are: an array that does
        not fit raises naming workspaces['name']), for a host framework that hands its buffers out at
        each use (vLLM's workspace manager). The copy goes stale with this record; the builder's own
        buffers are unchanged. Also SparseMLAAttention.attend(..., workspaces=)."""
        specs = self.workspace_specs
        if specs is None:
            raise ValueError("workspaces: this metadata has no workspace specs (not made by build())")
        _check_names(workspaces, specs)
        ref = self.slot_mapping  # a view of a builder buffer: the builder's framework and device
        ref_dev = _arrays.device(ref)
        ws = {name: _check_workspace(name, x, specs[name], ref_dev) for name, x in workspaces.items()}
        new = copy.copy(self)  # a field-for-field copy (dataclasses.replace re-runs __init__: ~4x the time)
        for name, x in ws.items():  # per-token scratch viewed to the step's T rows, as build() does
            setattr(new, self._WORKSPACE_FIELDS[name], x[:self.num_padded_tokens] if name in _PER_TOKEN else x)
        if self.decode_views is not None and ("indices" in ws or "lse" in ws):
            new.decode_views = _decode_views(new, *self.decode_views[:2])
        new.per_call = self.per_call - ws.keys()
        return new


def _decode_views(md, b, s):
    """md.decode_views for a decode call [b, s] over all of md's T tokens (None without such a call)."""
    if b * s != md.num_padded_tokens or b * s == 0 or md.indices is None:
        return None
    h = md.config.num_heads
    return (b, s, md.indices.reshape(b, s, md.config.topk), None if md.lse_scratch is None else
            md.lse_scratch.reshape(b, s, h))


def _rows(buf, n):
    """buf's first n rows; None (a buffer handed in per call) stays None."""
    return None if buf is None else buf[:n]


def _check_names(workspaces, specs):
    if not isinstance(workspaces, dict):
        raise TypeError(f"workspaces: expected a dict of arrays, got {type(workspaces).__name__}")
    for name in workspaces:
        if name not in specs:
            raise ValueError(f"workspaces: no buffer {name!r} in this configuration (expected names "
                             f"among {sorted(specs)})")


_WS_LABELS = {}  # name -> "workspaces['name']", the label of its errors


def _check_workspace(name, x, spec, ref_dev):
    """x, the caller's workspaces[name], checked against its spec and the builder's device ref_dev (a
    DLPack (type, id)); viewed to the spec's rows. Shared by the builder's workspaces= and attend's
    per-call workspaces= (which smla.vllm calls for every layer of every step: keep it cheap)."""
    what = _WS_LABELS.get(name) or _WS_LABELS.setdefault(name, f"workspaces[{name!r}]")
    _arrays.check_array(x, what)
    shape, want = tuple(map(int, x.shape)), spec.shape
    if len(shape) != len(want) or shape[1:] != want[1:] or shape[0] < want[0]:
        raise ValueError(f"{what}: expected [{want[0]}{''.join(f', {s}' for s in want[1:])}] (at least "
                         f"{want[0]} rows, {spec.nbytes} bytes), got {list(shape)}")
    if _arrays.dtype_name(x) != spec.dtype:
        raise TypeError(f"{what}: expected {spec.dtype}, got {_arrays.dtype_name(x)}")
    if _arrays.device(x, what) != ref_dev:
        raise ValueError(f"{what}: expected an array on the builder's device {ref_dev} "
                         f"(DLPack type, id), got {_arrays.device(x, what)}")
    if not _arrays.is_c_contiguous(x):  # kernels take flat rows
        raise ValueError(f"{what}: expected a C-contiguous array, got strides {_arrays.strides_elems(x)} "
                         "(elements)")
    return x[:want[0]]


# =============================================================================================
# framework plumbing for the builder's buffers
# =============================================================================================

def _ref_array(device, framework):
    """A zero-size array that _arrays.empty allocates next to: NumPy for the CPU, torch or CuPy on
    CUDA. `device` may also be an array of the wanted framework and device."""
    if device is not None and not isinstance(device, (str, int)) and hasattr(device, "__dlpack_device__"):
        return device[:0] if hasattr(device, "shape") and len(device.shape) else device
    if isinstance(device, np.ndarray) or device is None or (isinstance(device, str) and device == "cpu"):
        return np.empty(0, np.int32)
    dev_str = str(device)
    if dev_str == "cpu":
        return np.empty(0, np.int32)
    if framework in (None, "torch"):
        try:
            import torch
        except ImportError:
            if framework == "torch":
                raise
        else:
            dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
            if dev.type != "cuda":
                raise ValueError(f"device: expected 'cpu' or a CUDA device, got {device!r}")
            return torch.empty(0, dtype=torch.int32, device=dev)
    if framework not in (None, "cupy"):
        raise ValueError(f"framework: expected 'torch' or 'cupy', got {framework!r}")
    import cupy

    idx = device if isinstance(device, int) else (int(dev_str.split(":")[1]) if ":" in dev_str else 0)
    with cupy.cuda.Device(idx):
        return cupy.empty(0, dtype=cupy.int32)


def _copy(dst, src):
    """dst[...] = src across frameworks (casts the dtype; host sources are uploaded)."""
    fw = _arrays.framework(dst)
    if fw == "numpy":
        if _arrays.framework(src) not in ("numpy",) and _arrays.is_cuda(src):
            raise ValueError("a CUDA array was passed to a CPU (NumPy) metadata builder")
        dst[...] = np.asarray(src) if _arrays.framework(src) != "other" else np.from_dlpack(src)
    elif fw == "torch":
        import torch

        sfw = _arrays.framework(src)
        if sfw == "numpy":
            src = torch.from_numpy(np.ascontiguousarray(src))
        elif sfw != "torch":
            src = torch.from_dlpack(src)
        dst.copy_(src)
    else:
        import cupy

        dst[...] = cupy.asarray(src)


def _fill(dst, value):
    dst[...] = value


def _prefill_rows(config, prefill_workspace_rows):
    """The split mode's workspace rows: the caller's, else vLLM's 5 * max_model_len."""
    if prefill_workspace_rows is None:
        return PREFILL_WORKSPACE_FACTOR * config.max_model_len
    return _int(prefill_workspace_rows, "prefill_workspace_rows", 1, _I32_MAX)


def _device_id(device):
    """The CUDA device id of a builder's `device` argument, None for the CPU."""
    if device is None or (isinstance(device, str) and device == "cpu") or isinstance(device, np.ndarray):
        return None
    if isinstance(device, int):
        return _int(device, "device", 0)
    if hasattr(device, "__dlpack_device__"):
        return _arrays.device(device, "device")[1] if _arrays.is_cuda(device, "device") else None
    dev = str(device)
    if dev == "cpu":
        return None
    if dev.split(":")[0] != "cuda":
        raise ValueError(f"device: expected 'cpu' or a CUDA device, got {device!r}")
    return int(dev.split(":")[1]) if ":" in dev else 0


def _decode_workspace_size(config, b, s_q, device_id):
    """Bytes the CUDA decode kernel wants for [b, s_q] on device_id."""
    if b <= 0 or s_q <= 0:
        return 0
    return int(sparse_mla_decode_workspace_size(b, s_q, config.num_heads, config.topk, config.kv_cache_dtype,
                                                device_id=device_id))


def _max_decode_workspace(config, decode_threshold, device_id):
    """Largest decode workspace over every decode shape a step can use ([t, 1] for mixed / bf16 and
    for attend over any token range, [b, s_q] uniform decodes for split), so the buffer is allocated
    once and never moves under a captured graph."""
    T = config.max_num_batched_tokens
    best = max(_decode_workspace_size(config, t, 1, device_id) for t in range(1, T + 1))
    if config.mode == "split":
        for s in range(2, min(decode_threshold, T) + 1):
            for b in range(1, min(config.max_num_seqs, T // s) + 1):
                best = max(best, _decode_workspace_size(config, b, s, device_id))
    return best


class SparseMLAMetadataBuilder:
    """Owns every reusable buffer of the sparse MLA layer and fills them per step (module docstring).

    The configuration: the SparseMLAConfig fields as keywords, or one config object through
    from_config (then hand the same object to SparseMLAAttention.from_config); `config` holds it.
    device: where the buffers live: "cpu" (NumPy), "cuda" / "cuda:N" / torch.device / int (torch,
    or CuPy with framework="cupy" or when torch is missing), or an array whose framework and device
    to use; allocated here. None: allocated by the first build(), next to its block_table.
    In "split" mode build() plans the prefill chunks and the builder allocates the bf16 prefill
    workspace (prefill_workspace_rows, default 5 * max_model_len rows).
    decode_threshold: vLLM's reorder threshold (query length <= it: a decode; decodes must be
    uniform, require_uniform=True as in vLLM's FlashMLA sparse backend).
    workspaces: {name: array} of caller-owned scratch buffers used in place of the builder's own
    (names, shapes and dtypes from workspace_specs; any subset; each C-contiguous, on the builder's
    device, with at least the spec's rows). Unnamed ones are allocated here as before. A name given
    None is neither allocated nor held: the caller hands that buffer to every attend(...,
    workspaces=) (a framework that lends its buffers per use, such as vLLM's workspace manager, so
    the memory is not held twice)."""

    def __init__(self, *, num_heads: int, block_size: int, topk: int, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int, kv_cache_dtype: str, mode: str = "auto", decode_threshold: int = 1,
                 prefill_workspace_rows: Optional[int] = None, device: Any = None,
                 framework: Optional[str] = None, workspaces: Optional[dict] = None) -> None:
        self._setup(SparseMLAConfig(num_heads=num_heads, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
                                    topk=topk, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens, mode=mode),
                    decode_threshold, prefill_workspace_rows, device, framework, workspaces)

    @classmethod
    def from_config(cls, config: SparseMLAConfig, *, decode_threshold: int = 1,
                    prefill_workspace_rows: Optional[int] = None, device: Any = None,
                    framework: Optional[str] = None, workspaces: Optional[dict] = None
                    ) -> SparseMLAMetadataBuilder:
        """The builder of a model whose layers are made with SparseMLAAttention.from_config(config, ...)."""
        builder = cls.__new__(cls)
        builder._setup(expect_config(config), decode_threshold, prefill_workspace_rows, device, framework,
                       workspaces)
        return builder

    @staticmethod
    def workspace_specs(config: SparseMLAConfig, *, device: Any = "cpu", decode_threshold: int = 1,
                        prefill_workspace_rows: Optional[int] = None) -> dict[str, WorkspaceSpec]:
        """{name: WorkspaceSpec(shape, dtype, nbytes)} of the scratch a builder of this configuration
        uses, all shared by every layer of the model (pass them back through workspaces=):

        - "indices" [T, topk] int32: the converted top-k indices;
        - "lse", "max_logits" [T, h] float32: lse when the caller asks for none, the prefill kernel's
          max_logits;
        - "prefill_workspace" [W, 576] bfloat16 (split mode): the upconverted prefill sequences;
        - "decode_workspace" [bytes] uint8 (CUDA, when the decode kernel splits top-k): the largest
          decode call's workspace; device: "cpu", "cuda[:N]", an int or a CUDA array of that device.

        T is max_num_batched_tokens, h num_heads; decode_threshold and prefill_workspace_rows as
        the constructor takes them."""
        config = expect_config(config)
        T, h = config.max_num_batched_tokens, config.num_heads
        rows = _prefill_rows(config, prefill_workspace_rows)
        shapes = {"indices": ((T, config.topk), "int32"), "lse": ((T, h), "float32"),
                  "max_logits": ((T, h), "float32")}
        if config.mode == "split":
            shapes["prefill_workspace"] = ((rows, D_QK), "bfloat16")
        dev = _device_id(device)
        nbytes = 0 if dev is None else _max_decode_workspace(
            config, _int(decode_threshold, "decode_threshold", 1, _I32_MAX), dev)
        if nbytes > 0:
            shapes["decode_workspace"] = ((nbytes,), "uint8")
        return {name: WorkspaceSpec(shape, dt, int(np.prod(shape)) * _ITEMSIZE[dt])
                for name, (shape, dt) in shapes.items()}

    def _setup(self, config, decode_threshold, prefill_workspace_rows, device, framework, workspaces):
        self.config = config
        self.decode_threshold = _int(decode_threshold, "decode_threshold", 1, _I32_MAX)
        self.prefill_workspace_rows = _prefill_rows(config, prefill_workspace_rows)
        if workspaces is not None and not isinstance(workspaces, dict):
            raise TypeError(f"workspaces: expected a dict of arrays, got {type(workspaces).__name__}")
        self._workspaces = dict(workspaces or {})
        self._per_call = frozenset(name for name, x in self._workspaces.items() if x is None)
        self._framework_hint = framework
        self._step = 0
        self._token = _BuildToken()
        self._ref = None
        if device is not None:
            self._allocate(_ref_array(device, framework))

    @property
    def mode(self) -> str:
        return self.config.mode

    def __repr__(self) -> str:
        return f"SparseMLAMetadataBuilder({self.config}, decode_threshold={self.decode_threshold})"

    # ---- buffers ---------------------------------------------------------------------------

    def _allocate(self, ref):
        cfg = self.config
        self._ref = ref
        self._staging = {}
        self.framework = _arrays.framework(ref)
        self.is_cuda = self.framework != "numpy" and _arrays.is_cuda(ref)
        self.device_id = _arrays.device(ref)[1] if self.is_cuda else 0
        S, T = cfg.max_num_seqs, cfg.max_num_batched_tokens
        emp = lambda shape, dt: _arrays.empty(ref, shape, dt)  # noqa: E731
        self._qsl = _arrays.zeros(ref, (S + 1,), "int32")
        self._seq_lens = _arrays.zeros(ref, (S,), "int32")
        self._block_table = emp((S, cfg.max_blocks), "int32")
        _fill(self._block_table, -1)
        self._bt_dirty = 0  # widest caller block table copied so far (columns to reset to -1)
        self._slots = emp((T,), "int32")  # int32 holds every slot of a cache below 2**31 tokens
        _fill(self._slots, -1)
        self._req_id = _arrays.zeros(ref, (T,), "int32")
        self._req_id_host = np.zeros(T, np.int32)
        self._prefill_req = emp((T,), "int32")
        self._prefill_req_host = np.full(T, -1, np.int32)
        self._ws_starts = _arrays.zeros(ref, (S,), "int32")
        # the scratch of workspace_specs: the caller's arrays where given, else allocated here
        specs = self.workspace_specs(cfg, device=self.device_id if self.is_cuda else "cpu",
                                     decode_threshold=self.decode_threshold,
                                     prefill_workspace_rows=self.prefill_workspace_rows)
        self._specs = specs
        _check_names(self._workspaces, specs)
        ws = {name: self._workspace(name, spec, ref) for name, spec in specs.items()}
        self._indices, self._lse, self._max_logits = ws["indices"], ws["lse"], ws["max_logits"]
        self._prefill_ws = ws.get("prefill_workspace")
        self._decode_ws = ws.get("decode_workspace")
        has_decode_ws = self._decode_ws is not None or "decode_workspace" in self._per_call
        self.max_decode_workspace_bytes = specs["decode_workspace"].nbytes if has_decode_ws else 0

    def _workspace(self, name, spec, ref):
        """The caller's buffer `name` checked against its spec (viewed to the spec's rows), else a new one;
        None for one the caller hands to each attend."""
        if name in self._per_call:
            return None
        x = self._workspaces.get(name)
        return _arrays.empty(ref, spec.shape, spec.dtype) if x is None else _check_workspace(name, x, spec,
                                                                                           _arrays.device(ref))

    def _put(self, buf, n, src):
        """buf[:n] (or buf[:R, :M] for n = (R, M)) = src. Host data for a torch CUDA buffer goes
        through a pinned staging buffer with a non-blocking copy (a pageable copy would wait for the
        stream); each buffer has two staging slots, and a slot is reused only once the copy that read
        it has run (its event), so build() runs at most two steps ahead of the GPU."""
        dst = buf[:n[0], :n[1]] if isinstance(n, tuple) else buf[:n]
        host = isinstance(src, (np.ndarray, list, tuple))
        if not (host and self.is_cuda and self.framework == "torch"):
            _copy(dst, src)
            return
        import torch

        src = np.asarray(src, dtype=np.int32)
        ring = self._staging.setdefault(id(buf), [[None, None], [None, None], 0])
        i = ring[2]
        ring[2] ^= 1
        stage, event = ring[i]
        if stage is None:
            stage = torch.empty(buf.numel(), dtype=torch.int32, pin_memory=True)
            event = torch.cuda.Event()
            ring[i] = [stage, event]
        else:
            event.synchronize()  # the copy that last read this slot has run
        view = stage[:src.size]
        view.numpy()[...] = src.reshape(-1)
        dst.copy_(view.view(src.shape), non_blocking=True)
        event.record()

    def _allocate_like(self, x):
        """First build() of a builder made without a device: buffers next to x."""
        if isinstance(x, np.ndarray) or not _arrays.is_cuda(x):
            self._allocate(np.empty(0, np.int32))
        else:
            self._allocate(x[:0] if _arrays.framework(x) in ("torch", "cupy") else
                           _ref_array(f"cuda:{_arrays.device(x)[1]}", self._framework_hint))

    def decode_workspace_size(self, b: int, s_q: int) -> int:
        """Bytes the CUDA decode kernel wants for [b, s_q] on this builder's device (0 on the CPU)."""
        if self._ref is None or not self.is_cuda:
            return 0
        return _decode_workspace_size(self.config, b, s_q, self.device_id)

    # ---- build -----------------------------------------------------------------------------

    def build(self, query_start_loc: Array, seq_lens: Array, block_table: Array, slot_mapping: Array, *,
              query_start_loc_cpu: Optional[Array] = None, seq_lens_cpu: Optional[Array] = None
              ) -> SparseMLAMetadata:
        """Metadata of one step, with everything the layer's forward needs planned here (split mode:
        the prefill chunks). query_start_loc [R+1] (qsl[0] = 0), seq_lens [R] (context plus this
        step's tokens), block_table [R' >= R, M <= ceil(max_model_len / block_size)], slot_mapping
        [T >= qsl[-1]] (tokens past qsl[-1] are CUDA-graph padding: they read request 0, and give
        them slot -1 so that nothing is written). The optional host copies avoid device->host
        copies (module docstring). Marks the previous step's metadata stale."""
        cfg = self.config
        if self._ref is None:
            self._allocate_like(block_table)
        qsl_h = _host(query_start_loc_cpu if query_start_loc_cpu is not None else query_start_loc,
                      "query_start_loc").reshape(-1)
        R = qsl_h.shape[0] - 1
        if R < 0 or (R > 0 and qsl_h[0] != 0) or (np.diff(qsl_h) < 0).any():
            raise ValueError("query_start_loc: expected non-decreasing offsets starting at 0")
        if R > cfg.max_num_seqs:
            raise ValueError(f"query_start_loc: {R} requests exceed max_num_seqs={cfg.max_num_seqs}")
        nt = int(qsl_h[-1]) if R > 0 else 0
        T = _shape(slot_mapping, "slot_mapping", 1, "[T]")[0]
        if T < nt:
            raise ValueError(f"slot_mapping: expected [T >= {nt}] (query_start_loc[-1]), got {[T]}")
        if T > cfg.max_num_batched_tokens:
            raise ValueError(f"slot_mapping: {T} tokens exceed max_num_batched_tokens="
                             f"{cfg.max_num_batched_tokens}")
        if _shape(seq_lens, "seq_lens", 1, f"[{R}]") != (R,):
            raise ValueError(f"seq_lens: expected [{R}], got {list(seq_lens.shape)}")
        bt_shape = _shape(block_table, "block_table", 2, "[R, M]")
        if bt_shape[0] < R or bt_shape[1] > cfg.max_blocks:
            raise ValueError(f"block_table: expected [>= {R}, <= {cfg.max_blocks}], got {bt_shape}")
        M = bt_shape[1]
        qlen = np.diff(qsl_h)

        first_prefill, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
            qsl_h, decode_threshold=self.decode_threshold, require_uniform=True)
        split_prefills = cfg.mode == "split" and num_prefills > 0
        if split_prefills and T != nt:
            raise ValueError("slot_mapping: a padded step (T > query_start_loc[-1]) must be decode-only "
                             "in split mode")
        sl_h = None
        if seq_lens_cpu is not None or isinstance(seq_lens, np.ndarray) or split_prefills:
            # the chunks need seq_lens on the host: a device array is copied here (synchronises)
            sl_h = _host(seq_lens_cpu if seq_lens_cpu is not None else seq_lens, "seq_lens").reshape(-1)
            if sl_h.shape[0] != R:
                raise ValueError(f"seq_lens_cpu: expected [{R}], got {list(sl_h.shape)}")
            if ((sl_h < qlen) | (sl_h > cfg.max_model_len)).any():
                raise ValueError("seq_lens: every request needs query length <= seq_len <= max_model_len")

        dql = int(qlen[0]) if first_prefill > 0 else 0
        num_decodes = num_decode_tokens // dql if dql > 0 else 0  # zero-token padding excluded
        if num_prefills == 0:
            # decode-only: the decode call covers every token, padding included (fixed graph shape)
            decode_shape = (T // dql, dql) if dql > 0 and T % dql == 0 else (T, 1 if T else 0)
        else:
            decode_shape = (num_decodes, dql) if num_decodes else (0, 0)

        # ---- device buffers ----
        self._put(self._qsl, R + 1, qsl_h.astype(np.int32) if query_start_loc_cpu is not None
                  or isinstance(query_start_loc, (list, tuple)) else query_start_loc)
        if R:
            self._put(self._seq_lens, R, seq_lens)
            if M:
                self._put(self._block_table, (R, M), block_table[:R])
            if self._bt_dirty > M:
                _fill(self._block_table[:, M:self._bt_dirty], -1)
            self._bt_dirty = M
        h = self._req_id_host
        h[:nt] = np.repeat(np.arange(R, dtype=np.int32), qlen)
        h[nt:T] = 0  # padding tokens read request 0 (vLLM zero-fills)
        if T:
            self._put(self._slots, T, slot_mapping)
            self._put(self._req_id, T, h[:T])
        self._step += 1
        self._token.stale = True  # the previous step's views now show this step
        self._token = _BuildToken()

        b, s = decode_shape if cfg.mode == "split" else (T, 1)
        md = SparseMLAMetadata(
            config=cfg, num_reqs=R, num_tokens=nt, num_padded_tokens=T,
            max_query_len=int(qlen.max()) if R else 0, num_decodes=num_decodes, num_prefills=num_prefills,
            num_decode_tokens=num_decode_tokens, num_prefill_tokens=num_prefill_tokens,
            first_prefill_req=first_prefill, decode_query_len=dql, decode_shape=decode_shape,
            query_start_loc_cpu=qsl_h, seq_lens_cpu=sl_h,
            query_start_loc=self._qsl[:R + 1], seq_lens=self._seq_lens[:R],
            block_table=self._block_table[:R], slot_mapping=self._slots[:T],
            req_id_per_token=self._req_id[:T], prefill_workspace=self._prefill_ws,
            prefill_workspace_rows=self.prefill_workspace_rows,
            indices=_rows(self._indices, T), lse_scratch=_rows(self._lse, T),
            max_logits_scratch=_rows(self._max_logits, T), decode_workspace=self._decode_ws,
            decode_workspace_bytes=self.decode_workspace_size(b, s),
            workspace_specs=self._specs, per_call=self._per_call,
            step=self._step, _token=self._token)
        md.decode_views = _decode_views(md, b, s)
        if split_prefills:
            self._plan_prefill(md)
        return md

    def _plan_prefill(self, md: SparseMLAMetadata) -> None:
        """Fill md's split-mode prefill fields on the host: per-token prefill request ids,
        chunk-relative workspace starts and the chunks (part of build(), so forward has no host work)."""
        qsl_h, f, P, T = md.query_start_loc_cpu, md.first_prefill_req, md.num_prefills, md.num_padded_tokens
        p_sl = md.seq_lens_cpu[f:f + P]
        ids = self._prefill_req_host
        ids[:T] = -1
        ids[qsl_h[f]:qsl_h[f + P]] = np.repeat(np.arange(P, dtype=np.int32), np.diff(qsl_h[f:f + P + 1]))
        self._put(self._prefill_req, T, ids[:T])

        starts = np.zeros(P, np.int64)
        starts[1:] = np.cumsum(p_sl[:-1])
        for s, e in split_prefill_chunks(p_sl, self.prefill_workspace_rows):
            starts[s:e] -= starts[s]  # chunk-relative rows (vLLM rebases in place)
            md.chunks.append(PrefillChunk(
                req_start=s, req_end=e, token_start=int(qsl_h[f + s]), token_end=int(qsl_h[f + e]),
                num_rows=int(p_sl[s:e].sum()), block_table=self._block_table[f + s:f + e],
                seq_lens=self._seq_lens[f + s:f + e], workspace_starts=self._ws_starts[s:e],
                seq_lens_cpu=p_sl[s:e].copy()))
        self._put(self._ws_starts, P, starts)
        md.prefill_request_ids = self._prefill_req[:T]
        md.prefill_seq_lens = self._seq_lens[f:f + P]
        md.prefill_workspace_starts = self._ws_starts[:P]
