#!/usr/bin/env bash
# Side-by-side speed of this tree and other states of it in one device call: each argument is a tar.gz
# of a tree (`git archive --format=tar.gz -o .whl/x.tar.gz <commit>`, or tools/variant_tree.sh for this
# tree with compile-time switches set; in an ignored folder the call carries, or made on the device).
# All are built in parallel (a tree that fails to build is reported with its first errors and dropped);
# FIRST=family (e.g. sm90) runs tools/gpu_first_check.py on each other tree under a time limit and drops
# those that fail or hang; TESTS="pytest args" (and TESTS_K, a -k expression) runs those tests on each
# tree, one tree at a time (four test processes side by side ran out of device memory on the h=128
# s_q=4096 prefill cases; TEST_BASE=0 leaves out this tree's); then a benchmark (BENCH, default bench_sparse_mla_decode.py) alternates
# between the trees (ARGS, default the small-head decode shapes), ROUNDS times (default 2), its lines (LINES, default 4)
# after each tree's name. REBUILD="globs": see below (a faster build when only some objects differ).
# NCU="H,S_KV:PREC ..." (e.g. "128,32768:fast 64,32768:high"): then each prefill shape's kernel durations per tree by
# Nsight Compute, with each launch's SM cycles (so a change of clock shows apart from a change of work; NCU_KERNEL,
# default sm90p; NCU_LAUNCHES launches, default 6), the precise A/B: six launches of one
# tree agree within ~0.3%, where the benchmark's CUDA-event medians move 5-10% between processes (issue 16, fortieth
# session, benchmarks/README.md). tools/ab_prefill.py compares the built trees in one process instead.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
D="$PWD/tools/deadline.sh"  # time limits that hold when a process cannot be ended (a GPU kernel that never finishes)
J=$(( $(nproc) / ($# + 1) )); [ "$J" -lt 1 ] && J=1
trees=("$PWD")
for t in "$@"; do
  d=/tmp/v_$(basename "$t" .tar.gz); rm -rf "$d"; mkdir -p "$d" && tar xzf "$t" -C "$d"; trees+=("$d")
done
build_tree() {  # build_tree DIR JOBS
  local d=$1 log="$OUT/build_$(basename "$1").log"
  (cd "$d" && SMLA_NVCC_JOBS=$2 python3 setup.py build_ext --inplace -j "$2" > "$log" 2>&1) \
    || { echo "BUILD FAIL $(basename "$d")"; grep -m 4 -B 2 -A 4 -E "error|Error" "$log" | cut -c1-300; touch "$d/.build_failed"; }
}
if [ -n "${REBUILD:-}" ]; then
  # Only the CUDA objects named by REBUILD (globs of object names, e.g. "*pair_bf16*") differ between the trees:
  # this tree is built first, each other tree starts from a copy of its build folder with every other object
  # marked up to date, so it compiles only those (and relinks).
  build_tree "$PWD" "$(nproc)"
  for d in "${trees[@]:1}"; do
    rm -rf "$d/build" && cp -a "$PWD/build" "$d/build"
    (set -f; for g in $REBUILD; do find "$d/build" -name "$g.o" -delete; done)  # set -f: the globs are find's
    find "$d/build" -name '*.o' -exec touch {} + ; find "$d/build" -name nvcc_flags.txt -exec touch {} +
  done
  for d in "${trees[@]:1}"; do build_tree "$d" "$J" & done
else
  for d in "${trees[@]}"; do build_tree "$d" "$J" & done
fi
wait
grep -ihE "spill|C75" "$OUT"/build_*.log | grep -v " 0 bytes spill" | sort | uniq -c | head -8
ok=()
if [ -n "${FIRST:-}" ]; then  # the other trees' first checks side by side (a hang reported as such), then their results
  for d in "${trees[@]:1}"; do
    [ -e "$d/.build_failed" ] && continue
    (cd "$d" && PYTHONPATH="$d/src" bash "$D" 110 python3 tools/gpu_first_check.py --family "$FIRST" --timeout 90 \
       > "$OUT/first_$(basename "$d").log" 2>&1; echo $? > "$d/.first_rc") &
  done
  wait  # each under its deadline: this wait ends by then
fi
for d in "${trees[@]}"; do
  [ -e "$d/.build_failed" ] && continue
  if [ -n "${FIRST:-}" ] && [ "$d" != "$PWD" ]; then
    rc=$(cat "$d/.first_rc" 2>/dev/null || echo none); echo "== first check $(basename "$d"): rc $rc"
    [ "$rc" = 0 ] || { grep -E "FAIL|HANG|CRASH" "$OUT/first_$(basename "$d").log" | head -3; continue; }
  fi
  ok+=("$d")
done
if [ -n "${TESTS:-}" ]; then
  for d in "${ok[@]}"; do
    [ "${TEST_BASE:-1}" = 0 ] && [ "$d" = "$PWD" ] && continue  # TEST_BASE=0: the other trees' tests only
    (cd "$d" && PYTHONPATH="$d/src" bash "$D" 240 python3 -m pytest -q -rf --tb=line -p no:cacheprovider -m cuda $TESTS \
       -k "${TESTS_K:-}" > "$OUT/tests_$(basename "$d").log" 2>&1
     echo "== tests $(basename "$d"): $(tail -n 1 "$OUT/tests_$(basename "$d").log" | cut -c1-160)"
     grep -E "^FAILED" "$OUT/tests_$(basename "$d").log" | head -4)
  done
fi
BENCH=${BENCH:-bench_sparse_mla_decode.py}
ARGS=${ARGS:---shape 16,1,128 --shape 32,1,128 --shape 8,1,128 --no-graph --no-baseline --iters 30}
for i in $(seq 1 "${ROUNDS:-2}"); do
  for d in "${ok[@]}"; do
    echo "== $(basename "$d") (round $i)"
    (cd "$d" && PYTHONPATH="$d/src" bash "$D" 150 python3 "benchmarks/$BENCH" $ARGS > "$OUT/bench.log" 2>&1)
    grep -v "^#" "$OUT/bench.log" | tail -n "${LINES:-4}"  # from a file: a hung process would hold a pipe open
  done
done
K=${NCU_KERNEL:-sm90p} NL=${NCU_LAUNCHES:-6}
for spec in ${NCU:-}; do
  sh=${spec%%:*} prec=${spec#*:}
  for d in "${ok[@]}"; do
    (cd "$d" && PYTHONPATH="$d/src" bash "$D" 90 ncu --clock-control none -k "regex:attn_$K" --launch-skip 2 --launch-count "$NL" \
       --metrics gpu__time_duration.sum,sm__cycles_elapsed.max python3 benchmarks/bench_sparse_mla_prefill.py --shape "$sh" \
       --kernel "$K" --precision "$prec" --no-baseline --iters "$NL" > "$OUT/ncu.log" 2>&1)
    echo "ncu $K $prec $sh $(basename "$d") ms: $(grep -E "gpu__time_duration" "$OUT/ncu.log" | awk '{print $NF}' | sort -n | tr '\n' ' ')" \
      "M cycles: $(grep -E "sm__cycles_elapsed" "$OUT/ncu.log" | awk '{gsub(",", "", $NF); printf "%.2f ", $NF / 1e6}')"
  done
done
