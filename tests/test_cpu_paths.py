"""Every CPU instruction-set path (SMLA_CPU_ISA, csrc/cpu/cpu_features.h) against the float64 oracle,
and the threaded paths (SMLA_NUM_THREADS) of the attention kernel.

The binding reads SMLA_CPU_ISA at every call, so each test sets it for its own calls, and the `path`
fixture checks that smla.build_info() reports the level the next op runs. A path this CPU lacks is
skipped (forcing it runs the best level below it, which test_missing_level_runs_the_best_below
checks). "avx2-emulated-bf16" is a test hook: the avx512bf16 attention code (bf16 pairs for the
scores) at AVX2 width with vdpbf16ps emulated, so that its logic runs on CPUs without AVX512_BF16.

Attention is checked against the oracle with docs/design.md's tolerances, and
test_attention_paths_compute_differently shows that the levels really run different code;
pack_kv, gather_upconvert and convert_topk_indices must give the same bytes on every path (they run
the existing byte-exact tests of those ops once per path, plus inputs aimed at the vector code's edge
cases)."""
import functools
import itertools
import os
import platform
import sys

import numpy as np
import pytest

import smla

sys.path.insert(0, os.path.dirname(__file__))
import reference as ref  # noqa: E402
import test_convert_topk_indices as tconv  # noqa: E402
import test_gather_upconvert as tgather  # noqa: E402
import test_pack_kv as tpack  # noqa: E402
import test_sparse_mla_decode as tdec  # noqa: E402
import test_sparse_mla_prefill as tpre  # noqa: E402

LEVELS = ["portable", "avx2", "avx512", "avx512bf16"]


def _cpu_flags():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = _cpu_flags()
NEEDS = {
    "portable": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avx2-emulated-bf16": {"avx2", "fma", "f16c"},
    "avx512": {"avx2", "fma", "f16c", "avx512f"},
    "avx512bf16": {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"},
}
ATTN_PATHS = ["portable", "avx2", "avx2-emulated-bf16", "avx512", "avx512bf16"]
MEM_PATHS = ["portable", "avx2", "avx512"]  # pack / convert reuse the avx2 code at the AVX-512 levels
GATHER_PATHS = MEM_PATHS + ["avx512bf16"]  # its AVX-512BW dequant (power-of-two tiles in 16-bit lanes)


def best_level():
    return max((lv for lv in LEVELS if NEEDS[lv] <= FLAGS), key=LEVELS.index)


@pytest.fixture
def path(request, monkeypatch):
    name = request.param
    missing = NEEDS[name] - FLAGS
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}")
    monkeypatch.setenv("SMLA_CPU_ISA", name)
    assert smla.build_info()["cpu_isa"] == name, "build_info() must name the level the next op runs"
    return name


def attn_paths():
    return pytest.mark.parametrize("path", ATTN_PATHS, indirect=True)


def mem_paths(paths=MEM_PATHS):
    return pytest.mark.parametrize("path", paths, indirect=True)


# ---------------------------------------------------------------------------------------------
# attention: the core cases of tests/test_sparse_mla_decode.py and _prefill.py once per path
# ---------------------------------------------------------------------------------------------

DECODE_CASES = [  # cd, b, s_q, h, topk, block_size, tl_mode, sink_mode, strided_q
    ("fp8_ds_mla", 1, 1, 128, 2048, 64, "none", "none", False),   # one row: split over threads
    ("bf16", 1, 2, 128, 2048, 61, "rand", "mixed", True),
    ("fp8_ds_mla", 3, 1, 16, 2048, 16, "rand", "finite", False),  # 3 rows on 2 threads: split
    ("bf16", 4, 3, 16, 100, 16, "full", "+inf", False),
    ("fp8_ds_mla", 2, 2, 33, 130, 64, "rand", "mixed", True),     # heads not a multiple of a vector
    ("bf16", 5, 1, 1, 64, 1, "zero", "-inf", False),
    ("fp8_ds_mla", 3, 2, 64, 1, 16, "none", "none", False),
    ("fp8_ds_mla", 2, 1, 127, 300, 16, "rand", "none", False),
    ("bf16", 6, 2, 8, 77, 16, "rand", "mixed", False),
]


@attn_paths()
@pytest.mark.parametrize("precision", ["high", "fast"])
@pytest.mark.parametrize("cd,b,s_q,h,topk,bs,tl_mode,sink_mode,strided_q", DECODE_CASES,
                         ids=[f"{c[0]}-b{c[1]}-sq{c[2]}-h{c[3]}-topk{c[4]}" for c in DECODE_CASES])
def test_decode(path, precision, cd, b, s_q, h, topk, bs, tl_mode, sink_mode, strided_q):
    c = tdec.make_decode_case(cd, b, s_q, h, topk, bs, seed=b * 100 + h, tl_mode=tl_mode, sink_mode=sink_mode)
    if strided_q:
        c["q"] = tdec.strided(c["q"], np.random.default_rng(h))
    out, lse = tdec.run_decode(c, precision=precision)
    tdec.check_against_ref(c, out, lse, precision=precision)


@attn_paths()
@pytest.mark.parametrize("scale", [1e-3, 4.0])
@pytest.mark.parametrize("cd", tdec.CACHE_DTYPES)
def test_decode_softmax_scale(path, cd, scale):
    tdec.test_decode_softmax_scale(cd, scale)


@attn_paths()
@pytest.mark.parametrize("cd", tdec.CACHE_DTYPES)
def test_decode_single_row_is_exact(path, cd):
    tdec.test_decode_single_row_is_exact(cd)


@attn_paths()
@pytest.mark.parametrize("cd", tdec.CACHE_DTYPES)
def test_decode_all_invalid(path, cd):
    tdec.test_decode_all_invalid(cd, "finite")


@attn_paths()
@pytest.mark.parametrize("cd", tdec.CACHE_DTYPES)
def test_decode_interleaved_cache_and_out_views(path, cd):
    tdec.test_decode_interleaved_cache_and_out_views(cd)


PREFILL_CASES = [  # s_q, h, s_kv, topk, tl_mode, sink_mode, layout
    (62, 128, 1840, 256, "rand", "mixed", "plain"),
    (5, 16, 32, 2048, "none", "finite", "strided"),
    (40, 64, 592, 128, "full", "none", "3d"),
    (3, 3, 128, 128, "rand", "-inf", "plain"),
]


@attn_paths()
@pytest.mark.parametrize("precision", ["high", "fast"])
@pytest.mark.parametrize("s_q,h,s_kv,topk,tl_mode,sink_mode,layout", PREFILL_CASES,
                         ids=[f"sq{c[0]}-h{c[1]}-skv{c[2]}-topk{c[3]}" for c in PREFILL_CASES])
def test_prefill(path, precision, s_q, h, s_kv, topk, tl_mode, sink_mode, layout):
    c = tpre.make_prefill_case(s_q, h, s_kv, topk, seed=s_q + h, tl_mode=tl_mode, sink_mode=sink_mode,
                               kv_layout=layout)
    out, lse, ml = tpre.run_prefill(c, precision=precision)
    tpre.check_against_ref(c, out, lse, ml, precision=precision)


@attn_paths()
@pytest.mark.parametrize("cd", tdec.CACHE_DTYPES)
def test_decode_precisions_large_values(path, cd):
    """Both precisions with latent values of magnitude ~10 and odd valid-row counts (a chunk's last row
    pairs with the zero row): "high" within high's rule, "fast" (P rounded to bf16 on the bf16 levels)
    within fast's; lse the same bits."""
    c = tdec.make_decode_case(cd, 2, 3, 20, 157, 16, seed=7, tl_mode="rand", sink_mode="finite", v_scale=10.0)
    out, lse = tdec.run_decode(c, precision="fast")
    tdec.check_against_ref(c, out, lse, precision="fast")
    out_h, lse_h = tdec.run_decode(c, precision="high")
    tdec.check_against_ref(c, out_h, lse_h, precision="high")
    tdec.assert_fast_runs_bf16_p(out, out_h)
    np.testing.assert_array_equal(lse, lse_h)


# ---------------------------------------------------------------------------------------------
# threads: every way of cutting rows and top-k lists over threads, at the best level
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("rows", [(1, 1), (1, 3), (5, 1)])
@pytest.mark.parametrize("cd", tdec.CACHE_DTYPES)
def test_decode_threads(monkeypatch, cd, rows, threads):
    """b * s_q rows on 1..6 threads: whole rows per thread, rows split into parts merged by lse, and
    more threads than cores (both precisions)."""
    monkeypatch.setenv("SMLA_NUM_THREADS", str(threads))
    b, s_q = rows
    c = tdec.make_decode_case(cd, b, s_q, 32, 2048, 64, seed=threads, tl_mode="rand", sink_mode="mixed",
                              all_invalid_frac=0.0)
    for precision in ("high", "fast"):
        out, lse = tdec.run_decode(c, precision=precision)
        tdec.check_against_ref(c, out, lse, precision=precision)


def test_split_rows_with_few_valid_indices(monkeypatch):
    """A row split over threads where some parts see no valid index (they merge as the identity)."""
    monkeypatch.setenv("SMLA_NUM_THREADS", "4")
    c = tdec.make_decode_case("fp8_ds_mla", 1, 1, 16, 2048, 16, seed=9, tl_mode="none", sink_mode="finite",
                              all_invalid_frac=0.0)
    c["indices"][0, 0, 3:] = -1  # only the first part has valid rows
    out, lse = tdec.run_decode(c)
    tdec.check_against_ref(c, out, lse)


# ---------------------------------------------------------------------------------------------
# SMLA_CPU_ISA handling
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _isa_case():
    """A prefill case whose outputs show each level's arithmetic: many query rows and heads (so that
    some out element lands on a different side of a bf16 rounding), a small scale (a flat softmax:
    every P value is a full fp32 number) and max_logits, which is one fp32 score."""
    return tpre.make_prefill_case(64, 128, 64, 64, seed=3, tl_mode="none", sink_mode="none", all_invalid_frac=0.0,
                                  scale=1e-3)


@functools.lru_cache(maxsize=None)
def _isa_ref():
    return tpre.ref_prefill(_isa_case())


def _isa_bits(monkeypatch, value, check=False):
    """out, lse and max_logits bits of _isa_case() with SMLA_CPU_ISA = value (None: unset), on one
    thread; with check, also against the oracle."""
    if value is None:
        monkeypatch.delenv("SMLA_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("SMLA_CPU_ISA", value)
    monkeypatch.setenv("SMLA_NUM_THREADS", "1")
    out, lse, ml = tpre.run_prefill(_isa_case())
    if check:
        ref.check_prefill(out, lse, ml, *_isa_ref(), name=f"SMLA_CPU_ISA={value}")
    return [out.view(np.uint16), lse.view(np.uint32), ml.view(np.uint32)]


# Pairs of paths whose arithmetic differs, so that on _isa_case() some output bits must differ:
DIFFERENT_PATHS = [
    # separate multiply and add (baseline x86-64 has no FMA) vs FMA: the exp2 polynomial and P*V round
    # differently (the scores do not: bf16 products are exact in fp32 and both sum them in d order)
    ("portable", "avx2"),
    ("portable", "avx512"),
    # scores summed one product at a time in d order vs by bf16 pairs (odd element first), so each
    # score, hence max_logits, rounds differently
    ("avx2", "avx2-emulated-bf16"),
    ("avx512", "avx512bf16"),
]
# avx2 and avx512 are not in the list: they sum every score and every P*V column in the same order
# (one head per vector lane, d or t sequential), so their bits agree and only build_info() tells
# them apart. Threads do not matter either: top-k 64 is never split, each row is one thread's.


@pytest.mark.parametrize("a,b", DIFFERENT_PATHS, ids=[f"{a}-vs-{b}" for a, b in DIFFERENT_PATHS])
def test_attention_paths_compute_differently(monkeypatch, a, b):
    """SMLA_CPU_ISA really switches the attention kernel: two paths whose arithmetic differs give
    different bits somewhere on a large case, and each stays within the oracle's tolerance."""
    for name in (a, b):
        missing = NEEDS[name] - FLAGS
        if missing:
            pytest.skip(f"this CPU lacks {', '.join(sorted(missing))} (needed by {name})")
    bits = {}
    for name in (a, b):
        bits[name] = _isa_bits(monkeypatch, name, check=True)
        assert smla.build_info()["cpu_isa"] == name
    differ = [int((x != y).sum()) for x, y in zip(bits[a], bits[b])]
    assert sum(differ) > 0, (f"SMLA_CPU_ISA={a} and {b} gave the same bits in out, lse and max_logits: "
                             "one of them did not run its own code")


@pytest.mark.parametrize("path", ATTN_PATHS, indirect=True)
def test_bf16_subnormal_inputs(request, path):
    """q or K elements that are bf16 subnormals (below 2^-126) are values like any other: next to a
    large partner their product is of order 1 and moves the score. vdpbf16ps treats subnormal
    inputs as zero (DAZ, whatever MXCSR says), so the avx512bf16 level drops those products."""
    if path == "avx512bf16":
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="vdpbf16ps flushes bf16 subnormal inputs to zero (DAZ): the avx512bf16 "
                                "level drops their products from the scores"))
    c = tpre.make_prefill_case(8, 16, 128, 64, seed=13, tl_mode="none", sink_mode="none", all_invalid_frac=0.0)
    rng = np.random.default_rng(13)
    q, kv = c["q"].view(np.uint16), c["kv"].view(np.uint16)
    live = kv[:, 0] != 0x7FC0  # rows some index reads (the others are NaN)
    n = int(live.sum())
    # dim 575: q subnormal (2^-127 .. 2^-126), K about +-2^126; dim 574: the other way round
    q[..., 575] = rng.integers(0x0040, 0x0080, q.shape[:-1])
    kv[live, 575] = rng.choice(np.array([0x7E80, 0xFE80, 0x7EC0, 0xFEC0], np.uint16), n)
    q[..., 574] = rng.choice(np.array([0x7E80, 0xFE80], np.uint16), q.shape[:-1])
    kv[live, 574] = rng.integers(0x0040, 0x0080, n) | rng.choice(np.array([0, 0x8000]), n)
    out, lse, ml = tpre.run_prefill(c)
    tpre.check_against_ref(c, out, lse, ml)


# ---------------------------------------------------------------------------------------------
# SMLA_CPU_ISA parsing: unknown values raise, empty / "default" run the default level, a level
# the CPU lacks runs the best one below it
# ---------------------------------------------------------------------------------------------

def _decode_once(out):
    c = tdec.make_decode_case("fp8_ds_mla", 2, 1, 16, 256, 16, seed=3)
    return tdec.run_decode(c, out=out)


@pytest.mark.parametrize("value", ["bogus", "AVX2", "Portable", " avx2", "avx2 ", "avx-512", "avx512_bf16",
                                   "avx2,avx512", "0", "1", "none", "auto", "avx2-emulated", "default "])
def test_unknown_isa_raises(monkeypatch, value):
    """An unknown or misspelt SMLA_CPU_ISA is an error naming the variable, at every op and at
    build_info(), and the op writes nothing (the variable is read before any work)."""
    monkeypatch.setenv("SMLA_CPU_ISA", value)
    with pytest.raises(ValueError, match=r"^SMLA_CPU_ISA: "):
        smla.build_info()
    out = np.full((2, 1, 16, 512), 7.0, tdec.BF16)
    with pytest.raises(ValueError, match=r"^SMLA_CPU_ISA: "):
        _decode_once(out=out)
    assert (out.astype(np.float32) == 7.0).all()


@pytest.mark.parametrize("value", [None, "", "default"])
def test_default_isa_spellings(monkeypatch, value):
    """Unset, empty and "default" all run the default level: build_info() names it and the op gives
    the bits of that level asked for by name."""
    default = smla.build_info()["cpu_isa_default"]
    want = _isa_bits(monkeypatch, default)
    got = _isa_bits(monkeypatch, value)
    info = smla.build_info()
    assert info["cpu_isa"] == info["cpu_isa_default"] == default
    for x, y, what in zip(got, want, ["out", "lse", "max_logits"]):
        np.testing.assert_array_equal(x, y, err_msg=f"{what}: SMLA_CPU_ISA={value!r} vs {default!r}")


@pytest.mark.parametrize("name", ["avx2", "avx2-emulated-bf16", "avx512", "avx512bf16"])
def test_missing_level_runs_the_best_below(monkeypatch, name):
    """A level this CPU lacks runs the best level it has (the levels nest, so that is the best one
    below the level asked for; the test hook falls back like avx2): build_info() names that level and
    the op gives its bits."""
    if NEEDS[name] <= FLAGS:
        pytest.skip(f"this CPU has every feature {name} needs: there is no level to fall back from")
    best = best_level()
    want = _isa_bits(monkeypatch, best)
    got = _isa_bits(monkeypatch, name)
    assert smla.build_info()["cpu_isa"] == best
    for x, y, what in zip(got, want, ["out", "lse", "max_logits"]):
        np.testing.assert_array_equal(x, y, err_msg=f"{what}: SMLA_CPU_ISA={name} on a CPU whose best level is {best}")


def test_default_isa(monkeypatch):
    """The default level is the best one the CPU has, except that avx512bf16 gives way to avx512 where
    vdpbf16ps is measured to be slow (csrc/cpu/cpu_features.c); SMLA_CPU_ISA does not change it."""
    default, best = smla.build_info()["cpu_isa_default"], best_level()
    monkeypatch.setenv("SMLA_CPU_ISA", "portable")
    assert smla.build_info()["cpu_isa_default"] == default
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert default == "portable"
        return
    assert default == best or (best == "avx512bf16" and default == "avx512"), (default, best)


# ---------------------------------------------------------------------------------------------
# pack_kv / gather_upconvert / convert_topk_indices: byte-exact on every path
# ---------------------------------------------------------------------------------------------

@mem_paths()
def test_pack_kv(path):
    for cd, rule, sd in itertools.product(tpack.CACHE_DTYPES, tpack.RULES, [np.int32, np.int64]):
        tpack.test_matches_reference(cd, rule, sd)
    for rule in tpack.RULES:
        tpack.test_saturation_never_nan(rule)
    tpack.test_pow2_zero_tile_and_336()
    tpack.test_pow2_336_byte()
    tpack.test_signed_zero_and_legacy_floor()
    tpack.test_nan_and_inf_elements()
    tpack.test_strided_inputs()


@mem_paths()
@pytest.mark.parametrize("rule", tpack.RULES)
def test_pack_kv_every_magnitude(path, rule):
    """Tiles from 2^-133 to the bf16 maximum (subnormal results, every scale exponent), many threads'
    worth of tokens, and duplicate slots (the last token wins)."""
    rng = np.random.default_rng(7)
    t, nb, bs = 3000, 40, 64
    mag = 2.0 ** rng.integers(-133, 128, size=(t, 4, 1))
    x = rng.standard_normal((t, 4, 128)) * mag
    x[rng.random(x.shape) < 0.01] = 0.0
    kv_c = ref.bf16_rne(np.clip(x, -3.3e38, 3.3e38).reshape(t, 512))
    k_pe = ref.rand_bf16((t, 64), rng)
    slots = rng.integers(-5, nb * bs, t).astype(np.int64)
    cache = tpack.new_cache(nb, bs, "fp8_ds_mla")
    expected = tpack.pack_both(kv_c, k_pe, cache, slots, "fp8_ds_mla", rule)
    tpack.assert_bytes_equal(cache, expected)


@mem_paths(GATHER_PATHS)
def test_gather_upconvert(path):
    for cd in ["fp8_ds_mla", "bf16"]:
        tgather.test_vllm_seq_starts_cases(cd)
        for s in (False, True):
            tgather.test_random_requests_and_invalid_entries(cd, s)
    tgather.test_int32_extremes_never_fault()
    tgather.test_strided_workspace_and_block_table()


@mem_paths(GATHER_PATHS)
def test_gather_every_scale(path):
    """Rows whose tile scales are not powers of two (rounded path), subnormal / zero / huge / Inf / NaN
    scales (scalar path) and NaN bytes: the same bits as the oracle (any NaN equals any NaN)."""
    rng = np.random.default_rng(8)
    nb, bs = 8, 16
    cache = np.zeros(ref.kv_cache_shape(nb, bs, "fp8_ds_mla"), np.uint8)
    t = nb * bs
    cache.reshape(t, -1)[:, :512] = rng.integers(0, 256, (t, 512), dtype=np.uint8)
    special = np.array([0.0, -0.0, 1e-45, 1e-40, 1.17549435e-38, 2.0 ** -117, 2.0 ** -118, 2.0 ** 119,
                        2.0 ** 120, 3e38, np.inf, -np.inf, np.nan, -2.0, 1.3e-3, 7.7e-4], np.float32)
    scales = np.where(rng.random((t, 4)) < 0.5, rng.choice(special, (t, 4)),
                      (rng.random((t, 4)) * 2.0 ** rng.integers(-20, 20, (t, 4))).astype(np.float32))
    cache.reshape(t, -1)[:, 512:528] = scales.astype(np.float32).view(np.uint8).reshape(t, 16)
    cache.reshape(t, -1)[:, 528:] = rng.integers(0, 256, (t, 128), dtype=np.uint8)
    bt = rng.permutation(nb).astype(np.int32).reshape(2, 4)
    lens = np.array([4 * bs, 3 * bs + 5], np.int32)
    starts = np.array([0, 4 * bs], np.int32)
    tgather.run_both(cache, "fp8_ds_mla", int(lens.sum()), bt, lens, starts)


@mem_paths(GATHER_PATHS)
def test_gather_pow2_scales(path):
    """Power-of-two tile scales over their whole exact range (2^-117 .. 2^119, the 16-bit-lane dequant of
    the avx512bf16 level) and just outside it, positive and negative, with every byte value (NaN, zero,
    -0, subnormal, normal) at every position of a 32-byte group: the same bits as the oracle."""
    rng = np.random.default_rng(9)
    nb, bs = 16, 16
    t = nb * bs
    cache = np.zeros(ref.kv_cache_shape(nb, bs, "fp8_ds_mla"), np.uint8)
    rows = cache.reshape(t, -1)
    rows[:, :512] = (np.arange(t * 512) * 7 % 256).reshape(t, 512).astype(np.uint8)  # every byte at every offset
    rows[t // 2:, :512] = rng.integers(0, 256, (t - t // 2, 512), dtype=np.uint8)
    k = rng.integers(-117, 120, (t, 4))
    k[:8] = [[-117, 119, -118, 120], [0, -13, 8, -1], [119, 119, -117, -117], [-126, 127, 1, 2]] * 2
    scales = np.ldexp(np.float32(1.0), k).astype(np.float32)
    scales[rng.random((t, 4)) < 0.1] *= -1
    rows[:, 512:528] = scales.view(np.uint8).reshape(t, 16)
    rows[:, 528:] = rng.integers(0, 256, (t, 128), dtype=np.uint8)
    bt = np.arange(nb, dtype=np.int32).reshape(1, nb)
    lens, starts = np.array([t], np.int32), np.array([0], np.int32)
    tgather.run_both(cache, "fp8_ds_mla", t, bt, lens, starts)


@mem_paths()
def test_convert_topk_indices(path):
    for bs, k in itertools.product([1, 16, 64, 128], [1, 128, 384, 2048]):
        tconv.test_paged_matches_reference(bs, k)
    tconv.test_every_int32_value_class()
    tconv.test_prefill_workspace_rows()
    tconv.test_valid_prefix_counts()
    tconv.test_out_buffers_and_in_place()
    tconv.test_dcp_block_table_and_prefill_rows()


@mem_paths()
@pytest.mark.parametrize("bs", [3, 61, 1000, 1000003, 2 ** 30, 2 ** 31 - 1])
def test_convert_division_and_overflow_edges(path, bs):
    """Block sizes that are not powers of two (the vector path divides by a reciprocal and corrects),
    positions on block boundaries, block ids around INT32_MAX / block_size where the slot stops
    fitting int32, and prefill rows whose workspace row would overflow."""
    rng = np.random.default_rng(bs % 1000)
    r, mb, n, k = 4, 64, 12, 203
    edge = (2 ** 31 - 1) // bs
    bt = rng.choice(np.array([edge - 1, edge, edge + 1, 0, 1, -1, 2 ** 31 - 1, -(2 ** 31)], np.int64)
                    .clip(-(2 ** 31), 2 ** 31 - 1), (r, mb)).astype(np.int32)
    blocks = rng.integers(0, mb + 2, (n, k))
    offs = rng.choice(np.array([0, 1, bs - 1, bs // 2]), (n, k))
    tok = np.clip(blocks * bs + offs, -(2 ** 31), 2 ** 31 - 1)
    tok[rng.random((n, k)) < 0.05] = -1
    tok[rng.random((n, k)) < 0.02] = 2 ** 31 - 1
    tok = tok.astype(np.int32)
    req = rng.integers(-1, r + 1, n).astype(np.int32)
    tconv.convert(req, bt, tok, bs)
    pre = np.where(rng.random(n) < 0.5, rng.integers(0, 3, n), -1).astype(np.int32)
    ws = np.array([0, 2 ** 31 - 1000, -7], np.int32)
    tconv.convert(req, bt, tok, bs, prefill_request_ids=pre, prefill_workspace_starts=ws)
