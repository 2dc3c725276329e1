#!/usr/bin/env bash
# Issue 17 in one device call, for the dims kernel (sm90d, cuda/attention/sm90/dims_kernel.cuh): build; every
# CUDA suite (tools/gpu_validate.sh's six pytest processes, with TL its time limit); compute-sanitizer
# memcheck, synccheck and racecheck over the dims kernel's small-head tests (SANITIZE=0 skips them); then
# the decode benchmark of sm90d and sm90n over a batch sweep at h = 16 and the issue's shapes, alternated,
# two rounds, and the issue's table under "auto" (BENCH=0 leaves the benchmarks out). Logs under $OUT, with logs.tar.gz of all of them.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -iE "warning|spill" "$OUT/build.log" | grep -v "0 bytes spill" | sort | uniq -c | head -5
el build done
timeout 150 python3 tools/gpu_first_check.py --family sm90d --timeout 120 > "$OUT/first.log" 2>&1
rc=$?; echo "== first check sm90d (rc $rc)"; [ $rc = 0 ] || { grep -E "FAIL|HANG|CRASH" -A3 "$OUT/first.log" | head; exit 1; }
P="timeout ${TL:-240} python3 -m pytest -q -rf --tb=line -p no:cacheprovider -m cuda"
A=tests/test_cuda_attention.py
$P $A -k "decode_grid" > "$OUT/t_attn_decode.log" 2>&1 &
$P $A -k "prefill_grid" > "$OUT/t_attn_prefill.log" 2>&1 &
$P $A tests/test_overflow.py -k "not decode_grid and not prefill_grid" > "$OUT/t_attn_other.log" 2>&1 &
$P tests/test_sparse_mla_decode.py tests/test_sparse_mla_prefill.py > "$OUT/t_ops_attn.log" 2>&1 &
$P tests/test_cuda_memory_ops.py tests/test_pack_kv.py tests/test_unpack_kv.py tests/test_gather_upconvert.py \
   tests/test_convert_topk_indices.py tests/test_merge_attn_states.py tests/test_data_checks.py tests/test_edge.py \
   tests/test_host_path.py > "$OUT/t_mem.log" 2>&1 &
$P tests/test_layer.py tests/test_layer_attend.py tests/test_parallel.py tests/test_metadata.py \
   tests/test_vllm_adapter.py tests/test_bindings.py > "$OUT/t_layer.log" 2>&1 &
wait
el tests done
for f in "$OUT"/t_*.log; do echo "== $(basename "$f"): $(tail -n 1 "$f" | cut -c1-160)"; grep -E "^FAILED" "$f" | cut -c1-220 | head -6; done
if [ "${SANITIZE:-1}" != 0 ]; then
  CS="env PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${TS:-150} compute-sanitizer"
  PA="python3 -m pytest -q -p no:cacheprovider -m cuda $A"
  K="small_heads_decode and sm90d and fp8 and (b1- or b37-)"  # the grid's fp8 points: b = 37 or 1
  $CS --print-limit 20 --tool memcheck $PA -k "$K or odd_scales and sm90d" > "$OUT/s_memcheck.log" 2>&1 &
  $CS --print-limit 20 --tool synccheck $PA -k "$K" > "$OUT/s_synccheck.log" 2>&1 &
  $CS --show-backtrace no --print-limit 100000 --tool racecheck --racecheck-report hazard $PA -k "$K and h3-" \
    > "$OUT/s_racecheck.log" 2>&1 &
  wait
  el sanitizers done
  for f in "$OUT"/s_*.log; do echo "== $(basename "$f"): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$f" | tail -n 2 | tr '\n' ' ')"; done
  # racecheck's hazards by kind and place, here (a long log may be too large to come back from the device)
  grep -E "^========= (Error|Warning):" "$OUT/s_racecheck.log" | sed -E 's/0x[0-9a-f]+/ADDR/g' | sort | uniq -c \
    | sort -rn | head -8
fi
if [ "${BENCH:-1}" != 0 ]; then  # BENCH=0: validation only
SH="--shape 16,1,128 --shape 8,1,128 --shape 3,1,128 --shape 16,2,128 --shape 16,1,64 --shape 16,1,32 --shape 16,1,16 --shape 16,1,8 --shape 16,1,2"
for r in 1 2; do
  for k in sm90d sm90n; do
    echo "== decode $k round $r"
    timeout 120 python3 benchmarks/bench_sparse_mla_decode.py --kernel $k --no-baseline --no-graph --iters 30 $SH \
      --json "$OUT/decode_${k}_$r.json" 2>&1 | grep -v "^#" | tail -n 10
  done
done
echo "== decode auto (the issue's table)"
timeout 120 python3 benchmarks/bench_sparse_mla_decode.py --no-baseline --iters 30 --shape 16,1,128 --shape 32,1,128 \
  --shape 8,1,128 --shape 16,2,128 2>&1 | tail -n 12
el bench done
fi
(cd "$OUT" && tar czf logs.tar.gz ./*.log ./*.json 2>/dev/null)
