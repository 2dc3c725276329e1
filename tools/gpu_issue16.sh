#!/usr/bin/env bash
# Issue 16's device calls, one call each (outputs under $OUT):
#   PHASE=ab (default): this tree against copies of it with compile-time switches set (VARIANTS="name:
#     NAME=VALUE,NAME=VALUE ..."; default: the two changes the eighth session kept, each switched back:
#     even = SMLA_SM90_SPLIT=256, forward = SMLA_REVERSE_ROWS=0; tools/variant_tree.sh), compared by
#     tools/gpu_variants.sh: built side by side, a first check of each copy, the attention tests of each
#     tree, then the prefill benchmark alternating (h=128 32K full + causal, "fast"; ARGS overrides).
#     SUITE=1 first runs this tree's whole CUDA suite (tools/gpu_validate.sh). About 5-6 minutes.
#   PHASE=trace: a profiling build of this tree and tools/trace_attn.py on the wide and the pair kernel
#     (when each warpgroup passes each point of its schedule); in a copy made by tools/variant_tree.sh
#     (which carries this script) it traces that copy.
# Run from the repository root on the device: bash tools/gpu_issue16.sh (PHASE=trace bash ...).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SMLA_CUDA_ARCHS=${SMLA_CUDA_ARCHS:-90a}
if [ "${PHASE:-ab}" = trace ]; then
  export PYTHONPATH=$PWD/src
  SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  for k in sm90 sm90p; do
    timeout 60 python3 tools/trace_attn.py --kernel $k --precision fast > "$OUT/trace_$k.txt" 2>&1
    echo "== trace $k (rc $?)"; cat "$OUT/trace_$k.txt"
  done
  exit 0
fi
if [ -n "${SUITE:-}" ]; then OUT=$OUT/validate BENCHES=none bash tools/gpu_validate.sh; fi
tars=()
for v in ${VARIANTS:-"even:SMLA_SM90_SPLIT=256 forward:SMLA_REVERSE_ROWS=0"}; do
  t=${v%%:*} sw=${v#*:}
  bash tools/variant_tree.sh "/tmp/i16/$t.tar.gz" ${sw//,/ } > /dev/null && tars+=("/tmp/i16/$t.tar.gz")
done
FIRST=sm90 TESTS=tests/test_cuda_attention.py TESTS_K="prefill or causal or empty_tiles or decode_grid and bf16 or split" \
  BENCH=bench_sparse_mla_prefill.py LINES=12 \
  ARGS=${ARGS:-"--shape 128,32768 --causal --precision fast --no-baseline --iters 10"} bash tools/gpu_variants.sh "${tars[@]}"
