#!/usr/bin/env bash
# One GPU session in one command (device time is scarce): build in place with every core, then run the
# stages named on the command line. Logs and JSON go to $OUT (default /tmp/smla-out).
#   tools/gpu_run.sh build tests bench           # typical
#   stages: build, tests (all CUDA tests), test:<pytest args>, bench:<script args>, sanitize, demo
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SMLA_NVCC_JOBS=${SMLA_NVCC_JOBS:-$(nproc)}
status=0
for stage in "$@"; do
  echo "=== $stage ($(date +%T))"
  case "$stage" in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
      python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; exit 1; }
      grep -E "warning|spill|error" "$OUT/build.log" | grep -v "^ptxas info" | head -n 20
      python3 -c "import smla; print(smla.build_info(), smla.cuda_available())" ;;
    tests)
      python3 -m pytest -q -m cuda -rs tests 2>&1 | tee "$OUT/tests.log" | tail -n 40 || status=1 ;;
    test:*)
      python3 -m pytest -q ${stage#test:} 2>&1 | tee -a "$OUT/tests.log" | tail -n 40 || status=1 ;;
    bench:*)
      set -- ${stage#bench:}
      python3 "$@" 2>&1 | tee -a "$OUT/bench.log" | tail -n 40 || status=1 ;;
    sanitize)
      compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x -m cuda tests/test_cuda_memory_ops.py 2>&1 \
        | tee "$OUT/memcheck.log" | tail -n 15 || status=1 ;;
    demo)
      python3 -m smla demo 2>&1 | tee "$OUT/demo.log" || status=1 ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit $status
