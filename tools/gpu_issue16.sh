#!/usr/bin/env bash
# Issue 16's next device calls, ready to run (one device call each; outputs under $OUT):
#   PHASE=ab (default): HEAD against the switched-off variants of the wide bf16 kernel - split (WG0 128
#     of O's columns, SMLA_SM90_SPLIT=128), queue (the same plus SMLA_SM90_QUEUE_S=1) and fold (queue plus
#     SMLA_SM90_FOLD_SCALE=1) - and of the pair kernel (pairpf: its K rows with the 256-byte L2 prefetch,
#     SMLA_SM90_PAIR_PREFETCH=1), built side by side (tools/variant_tree.sh); a first check of each
#     variant under a time limit (a hang in new code is reported as such), the attention tests on HEAD and each variant, then the prefill benchmark alternating
#     between the trees (h=128 32K full + causal, fast; with MORE=1 also h=64 in both precisions; the pair
#     kernel, HEAD against pairpf, h=128 32K fast). About 8-9 minutes.
#   PHASE=trace: a profiling build of HEAD and tools/trace_attn.py on the wide and the pair kernel (when
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
bash tools/variant_tree.sh /tmp/split.tar.gz SMLA_SM90_SPLIT=128 > /dev/null
bash tools/variant_tree.sh /tmp/queue.tar.gz SMLA_SM90_SPLIT=128 SMLA_SM90_QUEUE_S=1 > /dev/null
bash tools/variant_tree.sh /tmp/fold.tar.gz SMLA_SM90_SPLIT=128 SMLA_SM90_QUEUE_S=1 SMLA_SM90_FOLD_SCALE=1 > /dev/null
bash tools/variant_tree.sh /tmp/pairpf.tar.gz SMLA_SM90_PAIR_PREFETCH=1 > /dev/null
declare -A TR=([head]="$PWD")
for t in split queue fold pairpf; do d=/tmp/v_$t; rm -rf "$d"; mkdir -p "$d" && tar xzf /tmp/$t.tar.gz -C "$d"; TR[$t]=$d; done
J=$(( $(nproc) / 5 )); [ "$J" -lt 1 ] && J=1
for t in head split queue fold pairpf; do d=${TR[$t]}
  (cd "$d" && SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "/tmp/i16_build_$t.log" 2>&1 \
     || { echo "BUILD FAIL $t"; tail -20 "/tmp/i16_build_$t.log"; }) &
done
wait
grep -hE "spill|C75" /tmp/i16_build_*.log | grep -v " 0 bytes spill" | sort | uniq -c | head -5
el built
ok=()
for t in split queue fold pairpf; do d=${TR[$t]}  # in parallel: small cases
  fam=sm90; [ $t = pairpf ] && fam=sm90p
  (cd "$d" && PYTHONPATH=$d/src timeout 100 python3 tools/gpu_first_check.py --family $fam --timeout 80 > "/tmp/i16_first_$t.log" 2>&1
   echo $? > "/tmp/first_$t.rc") &
done
wait
for t in split queue fold pairpf; do
  rc=$(cat "/tmp/first_$t.rc"); echo "== first check $t: rc $rc"; grep -E "FAIL|HANG|CRASH" "/tmp/i16_first_$t.log" | head -3
  [ "$rc" = 0 ] && [ $t != pairpf ] && ok+=("$t")
  [ "$rc" = 0 ] && [ $t = pairpf ] && PAIR_OK=1
done
el "first checks"  # logs: /tmp/i16_*.log (stdout has their summaries)
A="python3 -m pytest -q -rf --tb=line -p no:cacheprovider -m cuda tests/test_cuda_attention.py"
for t in head "${ok[@]}"; do d=${TR[$t]}  # head too: its wide kernels' epilogue code changed since it last ran
  (cd "$d" && PYTHONPATH=$d/src timeout 150 $A -k "prefill or causal or empty_tiles or decode_grid and bf16 or split" \
     > "/tmp/i16_tests_$t.log" 2>&1; echo "== tests $t: $(tail -n 1 "/tmp/i16_tests_$t.log" | cut -c1-160)"; grep -E "^FAILED" "/tmp/i16_tests_$t.log" | head -4) &
done
wait
el tests
pb() { local t=$1; shift; echo "-- $t $*: $(cd ${TR[$t]} && PYTHONPATH=${TR[$t]}/src timeout 60 python3 benchmarks/bench_sparse_mla_prefill.py "$@" --no-baseline --iters 10 2>&1 | grep -vE '^#|^ *h ' | awk '{printf "%s | ", $0}')"; }
for i in 1 2; do for t in head "${ok[@]}"; do pb $t --shape 128,32768 --causal --precision fast; done; done
[ -n "${MORE:-}" ] && for t in head "${ok[@]}"; do pb $t --shape 64,32768 --precision both; done  # MORE=1
if [ -n "${PAIR_OK:-}" ]; then
  for i in 1 2; do for t in head pairpf; do pb $t --shape 128,32768 --precision fast --kernel sm90p; done; done
fi
el done
