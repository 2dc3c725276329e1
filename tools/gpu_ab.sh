#!/usr/bin/env bash
# Side-by-side speed of this tree and an earlier commit in one device call (the same GPU, clocks and
# state): builds both in parallel, then alternates the quick attention benchmarks. Prepare the base on the
# development machine, in an ignored folder that the device call carries (e.g. `carry: [".whl"]`):
#   git archive --format=tar.gz -o .whl/base.tar.gz <commit>
# and run `bash tools/gpu_ab.sh .whl/base.tar.gz` there. The base must have the src/ layout.
set -u
cd "$(dirname "$0")/.."
BASE_TAR=${1:?usage: tools/gpu_ab.sh base.tar.gz}
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
mkdir -p /tmp/base && tar xzf "$BASE_TAR" -C /tmp/base
(cd /tmp/base && SMLA_NVCC_JOBS=7 python3 setup.py build_ext --inplace -j 7 > "$OUT/base_build.log" 2>&1) &
SMLA_NVCC_JOBS=9 python3 setup.py build_ext --inplace -j 9 > "$OUT/build.log" 2>&1
wait
bench() {  # $1: new|base, $2: script
  local d=$PWD; [ "$1" = base ] && d=/tmp/base
  echo "== $1 $2"
  (cd "$d" && PYTHONPATH="$d/src" timeout "${TB:-90}" python3 "benchmarks/$2" --quick 2>&1 | grep -v "^#" | tail -8)
}
for i in 1 2; do bench new bench_sparse_mla_prefill.py; bench base bench_sparse_mla_prefill.py; done
bench new bench_sparse_mla_decode.py; bench base bench_sparse_mla_decode.py
