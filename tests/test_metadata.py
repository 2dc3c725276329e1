"""smla.metadata: vLLM's split / chunk cases and random steps against a plain-Python model; the
SparseMLAConfig that the builder and the layer share."""
import dataclasses

import numpy as np
import pytest

from smla.config import MAX_HEADS, PRECISIONS
from smla.metadata import (
    MIN_HEADS_FOR_SPLIT,
    SparseMLAConfig,
    SparseMLAMetadataBuilder,
    req_id_per_token,
    resolve_mode,
    split_decodes_and_prefills,
    split_prefill_chunks,
)


# =============================================================================================
# plain-Python models
# =============================================================================================

def model_split(qlens, threshold, uniform):
    """vLLM's rules, one request at a time."""
    n, tot = len(qlens), sum(qlens)
    if n == 0:
        return 0, 0, 0, 0
    if max(qlens) <= threshold and (not uniform or threshold <= 1):
        return n, 0, tot, 0
    if qlens[0] > threshold:
        return 0, n, 0, tot
    if uniform and all(q in (qlens[0], 0) for q in qlens):
        return n, 0, tot, 0
    d = 0
    while d < n and (qlens[d] == qlens[0] if uniform else qlens[d] <= threshold):
        d += 1
    dt = sum(qlens[:d])
    return d, n - d, dt, tot - dt


def model_chunks(seq_lens, ws):
    chunks, cur, total = [], [], 0
    for i, s in enumerate(seq_lens):
        if cur and total + s > ws:
            chunks.append((cur[0], cur[-1] + 1))
            cur, total = [], 0
        cur.append(i)
        total += s
    if cur:
        chunks.append((cur[0], cur[-1] + 1))
    return chunks


# =============================================================================================
# vLLM's cases
# =============================================================================================

def test_split_requires_uniform_decodes():  # test_flashmla_common_metadata_requires_uniform_decodes
    assert split_decodes_and_prefills([0, 1, 3, 6], decode_threshold=128, require_uniform=True) == (1, 2, 1, 5)
    assert split_decodes_and_prefills(np.array([0, 1, 3, 6]), decode_threshold=128) == (3, 0, 6, 0)


@pytest.mark.parametrize("qsl,threshold,uniform,expected", [
    ([0, 1, 2, 3], 1, False, (3, 0, 3, 0)),
    ([0, 1, 2, 7], 1, False, (2, 1, 2, 5)),
    ([0, 5, 6], 1, False, (0, 2, 0, 6)),
    ([0, 2, 4, 5, 9], 2, False, (3, 1, 5, 4)),
    ([0, 2, 4, 5, 9], 2, True, (2, 2, 4, 5)),
    ([0, 3, 6, 6], 4, True, (3, 0, 6, 0)),       # zero-token padding request: all decodes
    ([0, 1, 1, 5], 1, False, (2, 1, 1, 4)),
    ([0], 1, False, (0, 0, 0, 0)),
    ([0, 0, 0], 1, True, (2, 0, 0, 0)),
])
def test_split_cases(qsl, threshold, uniform, expected):
    assert split_decodes_and_prefills(qsl, decode_threshold=threshold, require_uniform=uniform) == expected
    assert model_split(list(np.diff(qsl)), threshold, uniform) == expected


@pytest.mark.parametrize("seq_lens,ws,expected", [
    ([2, 3, 4, 2], 5, [(0, 2), (2, 3), (3, 4)]),
    ([5, 5, 5], 5, [(0, 1), (1, 2), (2, 3)]),
    ([1, 1, 1], 10, [(0, 3)]),
    ([4, 4, 4], 100, [(0, 3)]),
    ([], 5, []),
    ([0, 0, 3, 0], 3, [(0, 4)]),
])
def test_split_prefill_chunks_cases(seq_lens, ws, expected):
    assert split_prefill_chunks(np.array(seq_lens, np.int32), ws) == expected
    assert model_chunks(seq_lens, ws) == expected


def test_split_prefill_chunks_offset_and_too_long():
    assert split_prefill_chunks([2, 3, 4, 2], 5, request_offset=3) == [(3, 5), (5, 6), (6, 7)]
    with pytest.raises(ValueError, match="does not fit"):
        split_prefill_chunks([2, 6], 5)


def test_req_id_per_token():
    np.testing.assert_array_equal(req_id_per_token([0, 2, 2, 5]), [0, 0, 2, 2, 2])
    empty = req_id_per_token(np.array([0]))
    assert empty.shape == (0,) and empty.dtype == np.int32
    assert req_id_per_token([0, 3]).dtype == np.int32
    with pytest.raises(ValueError, match=r"^query_start_loc: .*non-decreasing"):
        req_id_per_token([0, 3, 2])


def test_resolve_mode():
    assert resolve_mode(16, "fp8_ds_mla") == "split"
    assert resolve_mode(16, "fp8_ds_mla", "mixed") == "mixed"
    assert resolve_mode(MIN_HEADS_FOR_SPLIT, "fp8_ds_mla") == "split"
    assert resolve_mode(128, "fp8_ds_mla", "mixed") == "mixed"
    assert resolve_mode(16, "fp8_ds_mla", "split") == "split"
    assert resolve_mode(128, "bf16", "split") == "bf16"
    assert resolve_mode(128, "auto") == "bf16"
    with pytest.raises(ValueError, match=r"^mode: .*'fast'"):
        resolve_mode(16, "fp8_ds_mla", "fast")
    with pytest.raises(ValueError, match=r"^kv_cache_dtype: .*'int8'"):
        resolve_mode(16, "int8")


# =============================================================================================
# configuration
# =============================================================================================

CONFIG = dict(num_heads=64, kv_cache_dtype="fp8_ds_mla", block_size=16, topk=32, max_model_len=512,
              max_num_seqs=16, max_num_batched_tokens=256)


def test_config_validated_once():
    cfg = SparseMLAConfig(**dict(CONFIG, num_heads=np.int64(MAX_HEADS), block_size=np.array(64),
                                 kv_cache_dtype="fp8_e4m3"))
    assert (cfg.num_heads, cfg.block_size, cfg.kv_cache_dtype, cfg.mode) == (MAX_HEADS, 64, "fp8_ds_mla", "split")
    assert type(cfg.num_heads) is int and type(cfg.block_size) is int
    assert cfg.max_blocks == 8 and SparseMLAConfig(**dict(CONFIG, max_model_len=513)).max_blocks == 33
    assert cfg == SparseMLAConfig(**dict(CONFIG, num_heads=MAX_HEADS, block_size=64, mode="split"))
    assert hash(cfg) == hash(dataclasses.replace(cfg))  # usable as a dict key by a serving stack
    bf16 = SparseMLAConfig(**dict(CONFIG, kv_cache_dtype="auto", mode="mixed"))
    assert (bf16.kv_cache_dtype, bf16.mode) == ("bf16", "bf16")
    assert dataclasses.replace(bf16, topk=64).mode == "bf16"  # a resolved mode is accepted back
    assert dataclasses.replace(cfg, mode="mixed").mode == "mixed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.topk = 64
    with pytest.raises(TypeError):
        SparseMLAConfig(64, "fp8_ds_mla", 16, 32, 512, 16, 256)  # keywords only: eight numbers in a row mix up
    assert cfg.differences(cfg) == ""
    other = dataclasses.replace(cfg, topk=64, mode="mixed")
    assert cfg.differences(other) == "topk: 32 vs 64, mode: 'split' vs 'mixed'"
    # precision is the layers' choice: the metadata is the same, so it takes no part in comparisons
    assert cfg.precision == "high" and SparseMLAConfig(**CONFIG, precision="fast").precision == "fast"
    fast = dataclasses.replace(cfg, precision="fast")
    assert fast == cfg and hash(fast) == hash(cfg) and cfg.differences(fast) == ""
    assert PRECISIONS == ("high", "fast")


CONFIG_REJECTS = [  # (field, value, exception, message)
    ("num_heads", 0, ValueError, r"^num_heads: expected an integer >= 1, got 0"),
    ("num_heads", MAX_HEADS + 1, ValueError, rf"^num_heads: expected an integer <= {MAX_HEADS}"),
    ("num_heads", 16.0, TypeError, r"^num_heads: expected an integer, got float"),
    ("num_heads", "16", TypeError, r"^num_heads: expected an integer, got str"),
    ("block_size", 0, ValueError, r"^block_size: expected an integer >= 1"),
    ("topk", None, TypeError, r"^topk: expected an integer, got NoneType"),
    ("topk", -1, ValueError, r"^topk: expected an integer >= 1"),
    ("max_model_len", 0, ValueError, r"^max_model_len: expected an integer >= 1"),
    ("max_num_seqs", 2**31, ValueError, r"^max_num_seqs: expected an integer <= 2147483647"),
    ("max_num_batched_tokens", np.float32(8), TypeError, r"^max_num_batched_tokens: expected an integer"),
    ("kv_cache_dtype", "int8", ValueError, r"^kv_cache_dtype: expected \"bf16\" or \"fp8_ds_mla\", got 'int8'"),
    ("kv_cache_dtype", 8, TypeError, r"^kv_cache_dtype: expected a str, got int"),
    ("mode", "fast", ValueError, r"^mode: expected one of \('auto', 'mixed', 'split'\), got 'fast'"),
    ("mode", "bf16", ValueError, r"^mode: expected one of"),  # "bf16" is a bf16 cache's plan only
    ("mode", None, TypeError, r"^mode: expected a str, got NoneType"),
    ("precision", "medium", ValueError, r'^precision: expected "high" or "fast", got "medium"$'),
    ("precision", None, TypeError, r"^precision: expected a str, got NoneType$"),
    ("precision", 1, TypeError, r"^precision: expected a str, got int$"),
]


@pytest.mark.parametrize("name,value,exc,msg", CONFIG_REJECTS, ids=[f"{c[0]}={c[1]!r}" for c in CONFIG_REJECTS])
def test_config_rejects(name, value, exc, msg):
    with pytest.raises(exc, match=msg):
        SparseMLAConfig(**dict(CONFIG, **{name: value}))
    if name not in ("num_heads", "precision"):  # the builder takes the same fields, validated by the same code
        with pytest.raises(exc, match=msg):
            SparseMLAMetadataBuilder(**dict(CONFIG, **{name: value}))


def test_builder_from_config():
    cfg = SparseMLAConfig(**CONFIG)
    b = SparseMLAMetadataBuilder.from_config(cfg, decode_threshold=np.int32(2), prefill_workspace_rows=100,
                                             device="cpu")
    assert b.config is cfg and b.decode_threshold == 2 and b._prefill_ws.shape == (100, 576)
    assert SparseMLAMetadataBuilder(**CONFIG).config == cfg
    md = b.build(np.array([0, 2, 4]), np.array([3, 9]), np.zeros((2, 2), np.int32), np.arange(4))
    assert md.config is cfg and md.decode_shape == (2, 2)
    with pytest.raises(TypeError, match=r"^config: expected a SparseMLAConfig, got dict"):
        SparseMLAMetadataBuilder.from_config(CONFIG)
    for kw, exc, msg in ((dict(decode_threshold=0), ValueError, r"^decode_threshold: expected an integer >= 1"),
                         (dict(decode_threshold="1"), TypeError, r"^decode_threshold: expected an integer"),
                         (dict(prefill_workspace_rows=0), ValueError,
                          r"^prefill_workspace_rows: expected an integer >= 1")):
        with pytest.raises(exc, match=msg):
            SparseMLAMetadataBuilder.from_config(cfg, **kw)


# =============================================================================================
# builder
# =============================================================================================

def make_builder(**kw):
    args = dict(num_heads=64, block_size=16, topk=32, max_model_len=512, max_num_seqs=16,
                max_num_batched_tokens=256, kv_cache_dtype="fp8_ds_mla", mode="split")
    args.update(kw)
    return SparseMLAMetadataBuilder(**args)


def test_builder_excludes_zero_token_decode_padding():
    # test_flashmla_fp8_metadata_excludes_zero_token_decode_padding: 6 decodes x 110 tokens
    b = make_builder(max_num_seqs=8, max_num_batched_tokens=1024, decode_threshold=128, max_model_len=1024)
    qsl = np.array([0, 110, 220, 330, 440, 550, 660, 660], np.int32)
    seq_lens = np.array([200, 300, 400, 500, 600, 700, 0], np.int32)
    bt = np.arange(7 * 64, dtype=np.int32).reshape(7, 64)
    md = b.build(qsl, seq_lens, bt, np.arange(660, dtype=np.int64))
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens) == (6, 0, 660, 0)
    assert md.decode_query_len == 110 and md.decode_shape == (6, 110)
    assert md.prefill_request_ids is None and md.chunks == []


def test_builder_workspace_starts_rebased_per_chunk():
    # vLLM's example: seq_lens [10,15,20,5] in chunks [(0,2),(2,4)]: starts [0,10,25,45] -> [0,10,0,20]
    b = make_builder(prefill_workspace_rows=30)
    qsl = np.array([0, 1, 4, 9, 12, 15], np.int32)  # one decode, four prefills
    seq_lens = np.array([7, 10, 15, 20, 5], np.int32)
    bt = np.arange(5 * 4, dtype=np.int32).reshape(5, 4)
    md = b.build(qsl, seq_lens, bt, np.arange(15))
    assert (md.num_decodes, md.num_prefills, md.first_prefill_req) == (1, 4, 1)
    np.testing.assert_array_equal(md.prefill_workspace_starts, [0, 10, 0, 20])
    assert [(c.req_start, c.req_end, c.token_start, c.token_end, c.num_rows) for c in md.chunks] == \
        [(0, 2, 1, 9, 25), (2, 4, 9, 15, 25)]
    np.testing.assert_array_equal(md.chunks[1].workspace_starts, [0, 20])
    np.testing.assert_array_equal(md.chunks[1].seq_lens, [20, 5])
    np.testing.assert_array_equal(md.chunks[1].block_table[:, :4], bt[3:5])
    np.testing.assert_array_equal(md.prefill_request_ids, [-1, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert md.prefill_workspace.shape == (30, 576)


def test_builder_block_table_tail_reset():
    b = make_builder(kv_cache_dtype="bf16")
    wide = np.full((3, 20), 7, np.int32)
    b.build(np.array([0, 1, 2, 3]), np.array([5, 5, 5]), wide, np.arange(3))
    narrow = np.arange(4 * 3, dtype=np.int32).reshape(4, 3)
    md = b.build(np.array([0, 1, 2, 3, 4]), np.array([5, 5, 5, 5]), narrow, np.arange(4))
    assert md.block_table.shape == (4, 32)
    np.testing.assert_array_equal(md.block_table[:, :3], narrow)
    assert (md.block_table[:, 3:] == -1).all()


def test_builder_padded_decode_step():
    b = make_builder(decode_threshold=2)
    qsl = np.array([0, 2, 4, 6], np.int32)
    slots = np.array([3, 4, 5, 6, 7, 8, -1, -1], np.int64)  # 2 padding tokens
    md = b.build(qsl, np.array([9, 9, 9], np.int32), np.zeros((3, 2), np.int32), slots)
    assert md.num_tokens == 6 and md.num_padded_tokens == 8
    assert md.decode_shape == (4, 2)
    np.testing.assert_array_equal(md.req_id_per_token, [0, 0, 1, 1, 2, 2, 0, 0])
    np.testing.assert_array_equal(md.slot_mapping, slots)


BUILDER_REJECTS = {  # the bad argument each case names, and what the message says about it
    "reqs": r"^query_start_loc: 17 requests exceed max_num_seqs",
    "tokens": r"^slot_mapping: 300 tokens exceed max_num_batched_tokens",
    "seq_lens": r"^seq_lens: expected \[2\]",
    "short_seq": r"^seq_lens: .*query length <= seq_len",
    "width": r"^block_table: .*\(2, 33\)",
    "slots": r"^slot_mapping: expected \[T >= 3\]",
}


@pytest.mark.parametrize("bad", list(BUILDER_REJECTS))
def test_builder_rejects(bad):
    b = make_builder()
    qsl, sl = np.array([0, 1, 3]), np.array([4, 5])
    bt, slots = np.zeros((2, 4), np.int32), np.arange(3)
    if bad == "reqs":
        qsl, sl, bt = np.arange(18), np.full(17, 4), np.zeros((17, 4), np.int32)
        slots = np.arange(17)
    elif bad == "tokens":
        qsl, slots = np.array([0, 1, 300]), np.arange(300)
    elif bad == "seq_lens":
        sl = np.array([4])
    elif bad == "short_seq":
        sl = np.array([4, 1])
    elif bad == "width":
        bt = np.zeros((2, 33), np.int32)
    elif bad == "slots":
        slots = np.arange(2)
    with pytest.raises(ValueError, match=BUILDER_REJECTS[bad]):
        b.build(qsl, sl, bt, slots)


def test_builder_rejects_non_arrays():
    b = make_builder()
    qsl, sl, bt, slots = np.array([0, 1, 3]), np.array([4, 5]), np.zeros((2, 4), np.int32), np.arange(3)
    for i, name in enumerate(("seq_lens", "block_table", "slot_mapping")):
        args = [qsl, sl, bt, slots]
        args[1 + i] = args[1 + i].tolist()
        with pytest.raises(TypeError, match=rf"^{name}: expected a NumPy array"):
            b.build(*args)
    with pytest.raises(TypeError, match=r"^query_start_loc: expected an array, got NoneType"):
        b.build(None, sl, bt, slots)
    with pytest.raises(TypeError, match=r"^query_start_loc: expected an integer array, got float64"):
        b.build(qsl.astype(np.float64), sl, bt, slots)
    with pytest.raises(ValueError, match=r"^block_table: expected 2 dimensions"):
        b.build(qsl, sl, bt[0], slots)
    md = b.build(qsl.tolist(), sl, bt, slots, seq_lens_cpu=sl.tolist())  # host offsets may be lists
    assert md.num_tokens == 3


def random_step(rng, max_seqs, max_tokens, max_len, threshold, block_size, pad=0):
    """A batch ordered decodes (uniform length <= threshold) then prefills."""
    nd = int(rng.integers(0, max_seqs + 1))
    dq = int(rng.integers(1, threshold + 1))
    np_ = int(rng.integers(0, max_seqs - nd + 1))
    qlens = [dq] * nd + [int(rng.integers(1, 40)) for _ in range(np_)]
    while sum(qlens) + pad > max_tokens:
        qlens.pop()
    seq_lens = [q + int(rng.integers(0, max_len - q + 1)) for q in qlens]
    qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    width = int(rng.integers(-(-max(seq_lens, default=1) // block_size), -(-max_len // block_size) + 1))
    bt = rng.integers(0, 1000, (len(qlens), width)).astype(np.int32)
    slots = rng.integers(0, 10000, int(qsl[-1]) + pad).astype(np.int64)
    return qsl, np.array(seq_lens, np.int32), bt, slots


@pytest.mark.parametrize("seed", range(12))
def test_builder_random_steps(seed):
    rng = np.random.default_rng(seed)
    threshold = [1, 4, 64][seed % 3]
    ws_rows = int(rng.integers(300, 2000))
    b = make_builder(decode_threshold=threshold, prefill_workspace_rows=ws_rows, max_model_len=300)
    for _ in range(4):  # several steps through the same buffers
        qsl, seq_lens, bt, slots = random_step(rng, 16, 256, 300, threshold, 16)
        md = b.build(qsl, seq_lens, bt, slots)
        qlens = [int(v) for v in np.diff(qsl)]
        R, T = len(qlens), int(qsl[-1])
        nd_req, P, ndt, npt = model_split(qlens, threshold, True)
        dql = qlens[0] if nd_req else 0
        assert (md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens) == (P, ndt, npt)
        assert md.first_prefill_req == nd_req and md.decode_query_len == dql
        assert md.num_decodes == (ndt // dql if dql else 0)
        rid = [r for r in range(R) for _ in range(qlens[r])]
        np.testing.assert_array_equal(md.req_id_per_token, rid)
        np.testing.assert_array_equal(md.slot_mapping, slots)
        np.testing.assert_array_equal(md.seq_lens, seq_lens)
        np.testing.assert_array_equal(md.query_start_loc, qsl)
        np.testing.assert_array_equal(md.block_table[:, :bt.shape[1]], bt)
        assert (md.block_table[:, bt.shape[1]:] == -1).all()
        assert md.indices.shape == (T, 32) and md.lse_scratch.shape == (T, 64)
        if P == 0:
            assert md.prefill_request_ids is None and md.chunks == []
            continue
        pids = [-1] * ndt + [p for p in range(P) for _ in range(qlens[nd_req + p])]
        np.testing.assert_array_equal(md.prefill_request_ids, pids)
        p_sl = [int(s) for s in seq_lens[nd_req:]]
        bounds = model_chunks(p_sl, ws_rows)
        assert [(c.req_start, c.req_end) for c in md.chunks] == bounds
        starts = []
        for s, e in bounds:
            starts += [sum(p_sl[s:i]) for i in range(s, e)]
        np.testing.assert_array_equal(md.prefill_workspace_starts, starts)
        covered = []
        for c in md.chunks:
            assert c.num_rows == sum(p_sl[c.req_start:c.req_end]) <= ws_rows
            assert c.token_start == qsl[nd_req + c.req_start] and c.token_end == qsl[nd_req + c.req_end]
            np.testing.assert_array_equal(c.block_table[:, :bt.shape[1]], bt[nd_req + c.req_start:nd_req + c.req_end])
            np.testing.assert_array_equal(c.seq_lens, p_sl[c.req_start:c.req_end])
            covered += list(range(c.token_start, c.token_end))
        assert covered == list(range(ndt, T))


def test_builder_mixed_mode_makes_no_prefill_plan():
    b = make_builder(num_heads=16, mode="mixed", device="cpu")
    assert b.mode == "mixed" and b._prefill_ws is None
    md = b.build(np.array([0, 1, 5]), np.array([3, 9]), np.zeros((2, 2), np.int32), np.arange(5))
    assert md.mode == "mixed" and md.prefill_workspace is None and md.chunks == []
    assert md.prefill_request_ids is None and md.prefill_workspace_starts is None
    assert (md.num_decodes, md.num_prefills) == (1, 1)
    assert md.decode_workspace_bytes == 0  # CPU


def test_metadata_goes_stale_at_the_next_build():
    b = make_builder()
    step = (np.array([0, 1, 5]), np.array([3, 9]), np.zeros((2, 2), np.int32), np.arange(5))
    md = b.build(*step)
    copy = dataclasses.replace(md)
    assert not md.stale and not copy.stale and md.step == 1
    with pytest.raises(ValueError, match="^query_start_loc"):  # rejected before any buffer changes
        b.build(np.array([0, 2, 1]), *step[1:])
    assert not md.stale
    md2 = b.build(*step)
    assert md.stale and copy.stale and not md2.stale and md2.step == 2


def test_builder_split_padded_prefill_step_rejected():
    b = make_builder()
    with pytest.raises(ValueError, match=r"^slot_mapping: a padded step"):
        b.build(np.array([0, 1, 5]), np.array([3, 9]), np.zeros((2, 2), np.int32), np.arange(7))
    md = make_builder(mode="mixed").build(np.array([0, 1, 5]), np.array([3, 9]), np.zeros((2, 2), np.int32),
                                          np.arange(7))
    assert (md.num_tokens, md.num_padded_tokens) == (5, 7)  # mixed mode runs padded prefill steps


def test_builder_device_query_start_loc_cpu():
    b = make_builder(device="cpu")
    assert b.framework == "numpy" and not b.is_cuda and b._prefill_ws.shape == (2560, 576)
    md = b.build(np.array([0, 1, 2]), np.array([3, 4]), np.zeros((2, 1), np.int32), np.arange(2),
                 query_start_loc_cpu=[0, 1, 2], seq_lens_cpu=[3, 4])
    assert md.decode_shape == (2, 1) and md.chunks == []
    np.testing.assert_array_equal(md.query_start_loc, [0, 1, 2])


def test_builder_empty_step():
    b = make_builder()
    md = b.build(np.array([0], np.int32), np.zeros(0, np.int32), np.zeros((0, 4), np.int32),
                 np.zeros(0, np.int64))
    assert (md.num_reqs, md.num_padded_tokens, md.num_decodes, md.num_prefills) == (0, 0, 0, 0)
    assert md.decode_shape == (0, 0) and md.chunks == []
    for name, shape in [("req_id_per_token", (0,)), ("slot_mapping", (0,)), ("seq_lens", (0,)),
                        ("query_start_loc", (1,)), ("block_table", (0, 32)), ("indices", (0, 32))]:
        a = getattr(md, name)
        assert a.shape == shape and a.dtype == np.int32, (name, a.shape, a.dtype)
    assert md.query_start_loc[0] == 0
