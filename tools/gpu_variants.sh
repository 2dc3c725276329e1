#!/usr/bin/env bash
# Side-by-side speed of this tree and other states of it in one device call: each argument is a tar.gz
# of a tree (`git archive --format=tar.gz -o .whl/x.tar.gz <commit>`, or tools/variant_tree.sh for this
# tree with compile-time switches set; in an ignored folder the call carries, or made on the device).
# All are built in parallel (a tree that fails to build is reported with its first errors and dropped);
# FIRST=family (e.g. sm90) runs tools/gpu_first_check.py on each other tree under a time limit and drops
# those that fail or hang; TESTS="pytest args" (and TESTS_K, a -k expression) runs those tests on each
# tree, one tree at a time (four test processes side by side ran out of device memory on the h=128
# s_q=4096 prefill cases); then a benchmark (BENCH, default bench_sparse_mla_decode.py) alternates
# between the trees (ARGS, default the small-head decode shapes), twice, its lines (LINES, default 4)
# after each tree's name.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
J=$(( $(nproc) / ($# + 1) )); [ "$J" -lt 1 ] && J=1
trees=("$PWD")
for t in "$@"; do
  d=/tmp/v_$(basename "$t" .tar.gz); rm -rf "$d"; mkdir -p "$d" && tar xzf "$t" -C "$d"; trees+=("$d")
done
for d in "${trees[@]}"; do
  (log="$OUT/build_$(basename "$d").log"
   cd "$d" && SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "$log" 2>&1 \
     || { echo "BUILD FAIL $(basename "$d")"; grep -m 4 -B 2 -A 4 -E "error|Error" "$log" | cut -c1-300; touch "$d/.build_failed"; }) &
done
wait
grep -ihE "spill|C75" "$OUT"/build_*.log | grep -v " 0 bytes spill" | sort | uniq -c | head -8
ok=()
for d in "${trees[@]}"; do
  [ -e "$d/.build_failed" ] && continue
  if [ -n "${FIRST:-}" ] && [ "$d" != "$PWD" ]; then  # small cases, a hang reported as such
    (cd "$d" && PYTHONPATH="$d/src" timeout 100 python3 tools/gpu_first_check.py --family "$FIRST" --timeout 80 \
       > "$OUT/first_$(basename "$d").log" 2>&1)
    rc=$?; echo "== first check $(basename "$d"): rc $rc"
    [ "$rc" = 0 ] || { grep -E "FAIL|HANG|CRASH" "$OUT/first_$(basename "$d").log" | head -3; continue; }
  fi
  ok+=("$d")
done
if [ -n "${TESTS:-}" ]; then
  for d in "${ok[@]}"; do
    (cd "$d" && PYTHONPATH="$d/src" timeout 240 python3 -m pytest -q -rf --tb=line -p no:cacheprovider -m cuda $TESTS \
       -k "${TESTS_K:-}" > "$OUT/tests_$(basename "$d").log" 2>&1
     echo "== tests $(basename "$d"): $(tail -n 1 "$OUT/tests_$(basename "$d").log" | cut -c1-160)"
     grep -E "^FAILED" "$OUT/tests_$(basename "$d").log" | head -4)
  done
fi
BENCH=${BENCH:-bench_sparse_mla_decode.py}
ARGS=${ARGS:---shape 16,1,128 --shape 32,1,128 --shape 8,1,128 --no-graph --no-baseline --iters 30}
for i in 1 2; do
  for d in "${ok[@]}"; do
    echo "== $(basename "$d") (round $i)"
    (cd "$d" && PYTHONPATH="$d/src" timeout 150 python3 "benchmarks/$BENCH" $ARGS 2>&1 | grep -v "^#" | tail -n "${LINES:-4}")
  done
done
