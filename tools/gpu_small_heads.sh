#!/usr/bin/env bash
# Issue 17 in one device call: build, a first check of the fp8 small-head family (FAMILY, default sm90r:
# a hang stops the call), the small-head decode tests under "auto" and FAMILY, the kernel-family, odd-scale and
# |V| ~ 10 tests, the decode grid's h <= 32 points, then the small-head decode benchmark for each of
# KERNELS (default "sm90r sm90n": the register kernel and the narrow one) in turn, two rounds. Logs under $OUT.
# Env: TL (tests' time limit, s), SHAPES (benchmark --shape list), MORE_TESTS=1 (the portable kernel's
# and the prefill small-head tests too), PREFILL=1 (the small-head prefill benchmark); PROFILE=1:
# instead, a profiling build, tools/ablate.py ${ABLATE:---small} at both precisions and Nsight Compute on one
# h = 16 decode call of the NCU_FAMILY kernel (default sm90n, the narrow one). (compute-sanitizer on the small-head tests:
# SANITIZE=1 bash tools/gpu_validate.sh.)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ -n "${PROFILE:-}" ]; then  # where the narrow kernel's time goes: ablation (both precisions), then ncu
  SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  el profiling build done
  for p in fast high; do timeout 150 python3 tools/ablate.py ${ABLATE:---small} --precision $p 2>&1 | tee "$OUT/ablate_$p.txt"; done
  N="ncu --clock-control none -k regex:attn_${NCU_FAMILY:-sm90n} --launch-skip 2 --launch-count 1 --set full --import-source no"
  SMLA_ATTN_KERNEL=${NCU_FAMILY:-sm90n} timeout 150 $N -f -o /tmp/dec python3 benchmarks/bench_sparse_mla_decode.py --shape 16,1,128 \
    --kernel ${NCU_FAMILY:-sm90n} --no-graph --precision fast --no-baseline --iters 1 --quick > "$OUT/ncu_dec.log" 2>&1
  ncu -i /tmp/dec.ncu-rep --page details > "$OUT/dec_details.txt" 2>&1
  ncu -i /tmp/dec.ncu-rep --page source --csv --print-source sass > "$OUT/dec_sass.csv" 2>&1
  grep -E "Duration|Throughput|Pipe|Warp Cycles|Issued Warp|L2 Hit|No Eligible|Registers" "$OUT/dec_details.txt" | head -24
  python3 tools/ncu_hot.py "$OUT/dec_sass.csv" 25
  el profile done; exit 0
fi
python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
grep -iE "warning|spill" "$OUT/build.log" | grep -v "0 bytes spill" | head -5
el build done
# a first check of FAMILY on fp8 small heads among its cases (a hang or fault stops the call here)
timeout 150 python3 tools/gpu_first_check.py --family "${FAMILY:-sm90r}" --timeout 120 > "$OUT/first.log" 2>&1
rc=$?; echo "== first check ${FAMILY:-sm90r} (rc $rc)"; grep -E "FAIL|HANG|CRASH" -A3 "$OUT/first.log" | head -20
[ $rc = 2 ] && { tail -n 20 "$OUT/first.log"; exit 1; }
el first check done
P="timeout ${TL:-240} python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m cuda"
A=tests/test_cuda_attention.py
# two processes at most beside each other (more time out or run out of memory on one GPU)
$P $A -k "small_heads_decode and (auto or ${FAMILY:-sm90r}) or kernel_families or odd_scales or large_values" \
  > "$OUT/t_small_dec.log" 2>&1 &
$P $A -k "decode_grid and (h1- or h3- or h8- or h16- or h20- or h32-) or vs_cpu or all_invalid or split or graph or q_pair" \
  > "$OUT/t_grids_small.log" 2>&1 &
wait
[ -n "${MORE_TESTS:-}" ] && { $P $A -k "small_heads_decode and portable or small_heads_prefill" > "$OUT/t_small_more.log" 2>&1; }
el tests done
for f in "$OUT"/t_*.log; do echo "== $(basename "$f"): $(tail -n 1 "$f" | cut -c1-200)"; grep -E "^FAILED|^E  " "$f" | cut -c1-220 | head -8; done
SH=${SHAPES:-"--shape 16,1,128 --shape 32,1,128 --shape 8,1,128 --shape 16,2,128 --shape 32,2,128 --shape 16,1,2"}
for r in 1 2; do
  for k in ${KERNELS:-sm90r sm90n}; do
    timeout 150 python3 benchmarks/bench_sparse_mla_decode.py --kernel $k --no-baseline --no-graph --iters 30 $SH \
      --json "$OUT/decode_${k}_$r.json" > "$OUT/decode_${k}_$r.log" 2>&1; echo "== decode $k round $r (rc $?)"
    grep -v "^# wrote" "$OUT/decode_${k}_$r.log" | tail -n 10
  done
done
if [ -n "${PREFILL:-}" ]; then
  for p in high fast; do
    timeout 150 python3 benchmarks/bench_sparse_mla_prefill.py --quick --precision $p --shape 16,32768 --shape 32,32768 \
      --json "$OUT/prefill_$p.json" > "$OUT/prefill_$p.log" 2>&1; echo "== prefill $p (rc $?)"; tail -n 6 "$OUT/prefill_$p.log"
  done
fi
el bench done
