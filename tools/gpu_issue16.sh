#!/usr/bin/env bash
# Issue 16's next device calls, ready to run (one device call each; outputs under $OUT):
#   PHASE=ab (default): HEAD against variants of it (VARIANTS="name:NAME=VALUE,NAME=VALUE ..."; default:
#     the two changes the eighth session kept, each switched back: even = SMLA_SM90_SPLIT=256, forward =
#     SMLA_REVERSE_ROWS=0), built side by side (tools/variant_tree.sh); a first check of each
#     variant under a time limit (a hang in new code is reported as such), with SUITE=1 HEAD's whole CUDA
#     suite (tools/gpu_validate.sh), each variant's attention tests (one process at a time: four side by side
#     ran out of device memory), then the prefill benchmark alternating between the trees (h=128 32K full +
#     causal, fast, two rounds; MORE=1: also h=64 in both precisions). About 6-7 minutes.
#   PHASE=trace: a profiling build of this tree (tools/variant_tree.sh's trees carry this script too) and tools/trace_attn.py on the wide and the pair kernel (when
#     each warpgroup passes each point of its schedule).
# Run from the repository root on the device: bash tools/gpu_issue16.sh (PHASE=trace bash ...).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SMLA_CUDA_ARCHS=${SMLA_CUDA_ARCHS:-90a}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ "${PHASE:-ab}" = trace ]; then
  export PYTHONPATH=$PWD/src
  SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  el built
  for k in sm90 sm90p; do
    timeout 60 python3 tools/trace_attn.py --kernel $k --precision fast > "$OUT/trace_$k.txt" 2>&1
    echo "== trace $k (rc $?)"; cat "$OUT/trace_$k.txt"
  done
  el done
  exit 0
fi
# The variants (VARIANTS="name:NAME=VALUE,NAME=VALUE name:..." overrides them)
VARIANTS=${VARIANTS:-"even:SMLA_SM90_SPLIT=256 forward:SMLA_REVERSE_ROWS=0"}
declare -A TR=([head]="$PWD")
names=()
for v in $VARIANTS; do t=${v%%:*}; sw=${v#*:}; names+=("$t")
  bash tools/variant_tree.sh /tmp/$t.tar.gz ${sw//,/ } > /dev/null
  d=/tmp/v_$t; rm -rf "$d"; mkdir -p "$d" && tar xzf /tmp/$t.tar.gz -C "$d"; TR[$t]=$d
done
J=$(( $(nproc) / (1 + ${#names[@]}) )); [ "$J" -lt 1 ] && J=1
for t in head "${names[@]}"; do d=${TR[$t]}
  (cd "$d" && SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "/tmp/i16_build_$t.log" 2>&1 \
     || { echo "BUILD FAIL $t"; grep -m 4 -B 2 -A 4 -E "error|Error" "/tmp/i16_build_$t.log" | cut -c1-300; }) &
done
wait
grep -hE "spill|C75" /tmp/i16_build_*.log | grep -v " 0 bytes spill" | sort | uniq -c | head -5
el built
ok=()
for t in "${names[@]}"; do d=${TR[$t]}  # in parallel: small cases
  (cd "$d" && PYTHONPATH=$d/src timeout 100 python3 tools/gpu_first_check.py --family sm90 --timeout 80 > "/tmp/i16_first_$t.log" 2>&1
   echo $? > "/tmp/first_$t.rc") &
done
wait
for t in "${names[@]}"; do
  rc=$(cat "/tmp/first_$t.rc"); echo "== first check $t: rc $rc"; grep -E "FAIL|HANG|CRASH" "/tmp/i16_first_$t.log" | head -3
  [ "$rc" = 0 ] && ok+=("$t")
done
el "first checks"
# HEAD: the whole CUDA suite (tools/gpu_validate.sh, its build a no-op now); the variants: the attention
# tests, one process at a time (four side by side ran out of device memory on the h=128 s_q=4096 cases)
if [ -n "${SUITE:-}" ]; then OUT=$OUT/validate BENCHES=none bash tools/gpu_validate.sh; el "head suite"; fi  # SUITE=1
A="python3 -m pytest -q -rf --tb=line -p no:cacheprovider -m cuda tests/test_cuda_attention.py"
for t in "${ok[@]}"; do d=${TR[$t]}
  (cd "$d" && PYTHONPATH=$d/src timeout 150 $A -k "prefill or causal or empty_tiles or decode_grid and bf16 or split" \
     > "/tmp/i16_tests_$t.log" 2>&1; echo "== tests $t: $(tail -n 1 "/tmp/i16_tests_$t.log" | cut -c1-160)"; grep -E "^FAILED" "/tmp/i16_tests_$t.log" | head -4)
done
el tests
pb() { local t=$1; shift; echo "-- $t $*: $(cd ${TR[$t]} && PYTHONPATH=${TR[$t]}/src timeout 60 python3 benchmarks/bench_sparse_mla_prefill.py "$@" --no-baseline --iters 10 2>&1 | grep -vE '^#|^ *h ' | awk '{printf "%s | ", $0}')"; }
for i in 1 2; do for t in head "${ok[@]}"; do pb $t --shape 128,32768 --causal --precision fast; done; done
[ -n "${MORE:-}" ] && for t in head "${ok[@]}"; do pb $t --shape 64,32768 --precision both; done  # MORE=1
el done
