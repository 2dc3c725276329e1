#!/usr/bin/env bash
# Side-by-side speed of this tree and earlier states of it in one device call: each argument is a
# tar.gz of a tree (`git archive --format=tar.gz -o .whl/x.tar.gz <commit>`, in an ignored folder the
# call carries); all are built in parallel, then a benchmark (BENCH, default bench_sparse_mla_decode.py)
# alternates between them (ARGS, default the small-head decode shapes), twice. TESTS="pytest args" (and
# TESTS_K, a -k expression) also runs those tests on every tree first.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
J=$(( $(nproc) / ($# + 1) )); [ "$J" -lt 1 ] && J=1
trees=("$PWD")
for t in "$@"; do
  d=/tmp/v_$(basename "$t" .tar.gz); mkdir -p "$d" && tar xzf "$t" -C "$d"; trees+=("$d")
done
for d in "${trees[@]}"; do
  (cd "$d" && SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "$OUT/build_$(basename "$d").log" 2>&1 \
     || tail -20 "$OUT/build_$(basename "$d").log") &
done
wait
grep -ihE "spill" "$OUT"/build_*.log | grep -v " 0 bytes spill" | sort | uniq -c | head -8
if [ -n "${TESTS:-}" ]; then  # on every tree, in parallel
  for d in "${trees[@]}"; do
    (cd "$d" && PYTHONPATH="$d/src" timeout 240 python3 -m pytest -q -p no:cacheprovider -m cuda $TESTS -k "${TESTS_K:-}" \
       > "$OUT/tests_$(basename "$d").log" 2>&1; echo "== tests $(basename "$d"): $(tail -n 1 "$OUT/tests_$(basename "$d").log")") &
  done
  wait
fi
BENCH=${BENCH:-bench_sparse_mla_decode.py}
ARGS=${ARGS:---shape 16,1,128 --shape 32,1,128 --shape 8,1,128 --no-graph --no-baseline --iters 30}
for i in 1 2; do
  for d in "${trees[@]}"; do
    echo "== $(basename "$d") (round $i)"
    (cd "$d" && PYTHONPATH="$d/src" timeout 150 python3 "benchmarks/$BENCH" $ARGS 2>&1 | grep -v "^#" | tail -n 4)
  done
done
