#!/usr/bin/env bash
# Issue 17 in one device call: build, the small-head tests (narrow wgmma kernel under "auto", the portable
# kernel), the kernel-family and |V| ~ 10 tests, the grids' h <= 32 points, then the small-head decode and
# prefill benchmarks for the narrow kernel (auto) and the portable one side by side. Logs under $OUT.
# Env: TL (tests' time limit, s); PROFILE=1: instead, a profiling build, tools/ablate.py --small at both
# precisions and Nsight Compute on one h = 16 decode call. (compute-sanitizer on the small-head tests:
# SANITIZE=1 bash tools/gpu_validate.sh.)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ -n "${PROFILE:-}" ]; then  # where the narrow kernel's time goes: ablation (both precisions), then ncu
  SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  el profiling build done
  for p in fast high; do timeout 150 python3 tools/ablate.py --small --precision $p 2>&1 | tee "$OUT/ablate_$p.txt"; done
  N="ncu --clock-control none -k regex:attn_sm90n --launch-skip 2 --launch-count 1 --set full --import-source no"
  SMLA_ATTN_KERNEL=sm90n timeout 150 $N -f -o /tmp/dec python3 benchmarks/bench_sparse_mla_decode.py --shape 16,1,128 \
    --no-graph --precision fast --no-baseline --iters 1 --quick > "$OUT/ncu_dec.log" 2>&1
  ncu -i /tmp/dec.ncu-rep --page details > "$OUT/dec_details.txt" 2>&1
  ncu -i /tmp/dec.ncu-rep --page source --csv --print-source sass > "$OUT/dec_sass.csv" 2>&1
  grep -E "Duration|Throughput|Pipe|Warp Cycles|Issued Warp|L2 Hit|No Eligible|Registers" "$OUT/dec_details.txt" | head -24
  python3 tools/ncu_hot.py "$OUT/dec_sass.csv" 25
  el profile done; exit 0
fi
python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -iE "warning|spill" "$OUT/build.log" | grep -v "0 bytes spill" | head -5
el build done
P="timeout ${TL:-240} python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda"
A=tests/test_cuda_attention.py
$P $A -k "small_heads_decode and auto" -x > "$OUT/t_small_dec_auto.log" 2>&1 &
$P $A -k "small_heads_prefill or kernel_families or large_values" > "$OUT/t_small_other.log" 2>&1 &
$P $A -k "small_heads_decode and portable" > "$OUT/t_small_dec_portable.log" 2>&1 &
$P $A -k "decode_grid and (h8- or h16- or h32-) or prefill_grid and (h16- or h32-) or vs_cpu or all_invalid or split or graph" \
  > "$OUT/t_grids_small.log" 2>&1 &
wait
el tests done
for f in "$OUT"/t_*.log; do echo "== $(basename "$f"): $(tail -n 1 "$f" | cut -c1-200)"; grep -E "^FAILED|^E  " "$f" | cut -c1-220 | head -8; done
SH="--shape 16,1,128 --shape 32,1,128 --shape 8,1,128 --shape 16,2,128 --shape 32,2,128 --shape 16,1,2"
for k in auto portable; do
  timeout 150 python3 benchmarks/bench_sparse_mla_decode.py --kernel $k --no-baseline --no-graph --iters 30 $SH \
    --json "$OUT/decode_$k.json" > "$OUT/decode_$k.log" 2>&1; echo "== decode $k (rc $?)"; grep -v "^# wrote" "$OUT/decode_$k.log" | tail -n 12
done
for p in high fast; do
  timeout 150 python3 benchmarks/bench_sparse_mla_prefill.py --quick --precision $p --shape 16,32768 --shape 32,32768 \
    --json "$OUT/prefill_$p.json" > "$OUT/prefill_$p.log" 2>&1; echo "== prefill $p (rc $?)"; tail -n 6 "$OUT/prefill_$p.log"
done
el bench done
