#!/usr/bin/env bash
# Whole-suite GPU validation in one call (device time is scarce): build for sm_90a + sm_80 with every
# core, run every CUDA test in parallel pytest processes, then the quick benchmarks. Logs under $OUT.
# Env: TL / TB time limits (tests / each benchmark), DEMO=1, BENCHES="a.py args;b.py" (none: no benchmark), ABLATE=1 (a
# profiling build, SMLA_PROFILE_BUILD=1, and tools/ablate.py after the benchmarks: where the time goes),
# SANITIZE=1 (compute-sanitizer memcheck, synccheck and racecheck on the attention tests, after the tests;
# racecheck's hazards summarised by source line: docs/design.md section 1 says which are expected).
# Each device call pays ~1.5-2 min of machine start: put build, tests, benchmarks and ablation in one.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
if [ -n "${ABLATE:-}" ]; then export SMLA_PROFILE_BUILD=1; fi
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -iE "warning|spill" "$OUT/build.log" | grep -v "0 bytes spill" | head -5
el build done
P="bash tools/deadline.sh ${TL:-200} python3 -m pytest -q -rf --tb=line -p no:cacheprovider -m cuda"
A=tests/test_cuda_attention.py
$P $A -k "decode_grid" > "$OUT/t_attn_decode.log" 2>&1 &
$P $A -k "prefill_grid" > "$OUT/t_attn_prefill.log" 2>&1 &  # the grids run each case at both precisions
$P $A tests/test_overflow.py -k "not decode_grid and not prefill_grid" > "$OUT/t_attn_other.log" 2>&1 &
$P tests/test_sparse_mla_decode.py tests/test_sparse_mla_prefill.py > "$OUT/t_ops_attn.log" 2>&1 &
$P tests/test_cuda_memory_ops.py tests/test_pack_kv.py tests/test_unpack_kv.py tests/test_gather_upconvert.py \
   tests/test_convert_topk_indices.py tests/test_merge_attn_states.py tests/test_data_checks.py tests/test_edge.py \
   tests/test_host_path.py > "$OUT/t_mem.log" 2>&1 &
$P tests/test_layer.py tests/test_layer_attend.py tests/test_parallel.py tests/test_metadata.py > "$OUT/t_layer.log" 2>&1 &
wait  # the sanitizers after the tests, not beside them: side by side their device memory and the test
      # processes' ran out (cudaErrorMemoryAllocation, reported as sanitizer errors and failed tests)
el tests done
if [ -n "${SANITIZE:-}" ]; then
  # torch's caching allocator off: each tensor its own cudaMalloc, so memcheck sees every array's bounds
  # (inside a cached block an overrun is not an error) and no process hoards freed memory
  CS="bash tools/deadline.sh ${TL:-200} env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer"
  PA="python3 -m pytest -q -p no:cacheprovider -m cuda $A"
  $CS --print-limit 20 --tool memcheck $PA -k "vs_cpu_and_reference or all_invalid or split or graph or small_heads and auto and (b5 or sq62)" \
    > "$OUT/s_memcheck.log" 2>&1 &
  $CS --print-limit 20 --tool synccheck $PA -k "vs_cpu_and_reference or all_invalid or split" > "$OUT/s_synccheck.log" 2>&1 &
  $CS --show-backtrace no --print-limit 100000 --tool racecheck --racecheck-report hazard $PA \
    -k "vs_cpu_and_reference and fp8_ds_mla and (128 or 100) or all_invalid or small_heads and auto and (b5 or sq62)" \
    > "$OUT/s_racecheck.log" 2>&1 &
  wait
  el sanitizers done
fi
for f in "$OUT"/s_*.log; do
  [ -e "$f" ] || continue
  echo "== $(basename "$f"): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$f" | tail -n 1)"
  grep -m 6 -E "^========= +(Invalid|Program hit|Barrier|Race|Missing|Uninitialized)" "$f"  # the first errors themselves
  grep -E "^=========     (Read|Write) Thread" "$f" | sed -E 's/Thread \([0-9,]*\)/Thread/; s/\+0x[0-9a-f]*//' | cut -c1-160 \
    | sort | uniq -c | sort -rn | head -n 6
done
[ -e "$OUT/s_racecheck.log" ] && gzip -f "$OUT/s_racecheck.log"  # one block of lines per hazard
for f in "$OUT"/t_*.log; do echo "== $(basename "$f"): $(tail -n 1 "$f" | cut -c1-200)"; grep -E "^FAILED" "$f" | cut -c1-220 | head -8; done
[ -n "${DEMO:-}" ] && { bash tools/deadline.sh 90 python3 -m smla demo > "$OUT/demo.log" 2>&1; echo "== demo (rc $?)"; tail -n 12 "$OUT/demo.log"; }
IFS=';' read -r -a BENCHES <<< "${BENCHES:-bench_sparse_mla_decode.py --quick;bench_sparse_mla_prefill.py --quick;bench_memory_ops.py --quick;bench_layer.py}"
[ "${BENCHES:-}" = none ] && BENCHES=()  # BENCHES=none: tests only
for b in "${BENCHES[@]}"; do
  set -- $b
  bash tools/deadline.sh "${TB:-100}" python3 "benchmarks/$1" "${@:2}" --json "$OUT/${1%.py}.json" > "$OUT/${1%.py}.log" 2>&1
  echo "== $1 (rc $?)"; grep -v "^#" "$OUT/${1%.py}.log" | tail -n 24
done
el bench done
if [ -n "${ABLATE:-}" ]; then
  bash tools/deadline.sh 200 python3 tools/ablate.py > "$OUT/ablate.txt" 2>&1; echo "== ablate (rc $?)"; cat "$OUT/ablate.txt"
fi
