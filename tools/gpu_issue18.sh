#!/usr/bin/env bash
# Issue 18 in one device call: build this tree and a base tree side by side, run the CUDA tests of the
# host path and the memory ops on this tree, then measure both trees in the same call (host time per op,
# memory-op bandwidth, the pack_kv scatter diagnosis, the layer decode step and, with DECODE=1, the few-row
# decodes whose split merge may be fused: base, this tree with SMLA_ATTN_COMBINE=kernel, this tree). Logs under $OUT.
#   [FULL=1] [QUICK_TESTS=1] [EXTRA='dir ...'] [SCATTER=' '] [LAYER=0] [DECODE=1] bash tools/gpu_issue18.sh BASE_DIR [tests|bench|all]
set -u
cd "$(dirname "$0")/.."
NEW=$PWD; BASE=$(cd "${1:?usage: tools/gpu_issue18.sh BASE_DIR [tests|bench|all]}" && pwd); WHAT=${2:-all}
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
J=$(( $(nproc) / (2 + $(echo ${EXTRA:-} | wc -w)) ))
(cd "$BASE" && SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "$OUT/base_build.log" 2>&1) &
for x in ${EXTRA:-}; do
  (cd "$x" && SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "$OUT/build_$(basename $x).log" 2>&1) &
done
SMLA_NVCC_JOBS=$J python3 setup.py build_ext --inplace -j $J > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
wait
el builds done
if [ "$WHAT" != bench ]; then
  P="timeout ${TL:-300} python3 -m pytest -q -rf --tb=short -p no:cacheprovider"
  export PYTHONPATH=$NEW/src
  $P -m cuda tests/test_cuda_memory_ops.py tests/test_convert_topk_indices.py > "$OUT/t_mem.log" 2>&1 &
  $P -m cuda tests/test_pack_kv.py tests/test_unpack_kv.py tests/test_gather_upconvert.py tests/test_merge_attn_states.py \
     tests/test_data_checks.py tests/test_edge.py tests/test_host_path.py > "$OUT/t_host.log" 2>&1 &
  [ -n "${QUICK_TESTS:-}" ] || $P tests/test_bindings.py tests/test_layer.py tests/test_parallel.py tests/test_sparse_mla_decode.py \
     tests/test_sparse_mla_prefill.py > "$OUT/t_ops.log" 2>&1 &
  for x in ${EXTRA:-}; do  # the memory-op tests on each extra tree too
    (cd "$x" && PYTHONPATH=$x/src $P -m cuda tests/test_cuda_memory_ops.py tests/test_convert_topk_indices.py \
       > "$OUT/t_mem_$(basename $x).log" 2>&1) &
  done
  if [ -n "${FULL:-}" ]; then
    $P -m cuda tests/test_cuda_attention.py tests/test_layer_attend.py tests/test_vllm_adapter.py > "$OUT/t_attn.log" 2>&1 &
  fi
  wait
  for f in "$OUT"/t_*.log; do echo "== $(basename "$f"): $(tail -n 1 "$f" | cut -c1-200)"; grep -E "^FAILED|Error" "$f" | cut -c1-300 | head -12; done
  el tests done
fi
[ "$WHAT" = tests ] && exit 0
run() {  # $1: new|base, rest: command (from the tree's root)
  local d=$NEW; [ "$1" = base ] && d=$BASE; shift
  (cd "$d" && PYTHONPATH="$d/src" timeout "${TB:-120}" "$@")
}
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/launch_cost tools/launch_cost.cu 2>/dev/null \
  && { echo "== launch_cost"; /tmp/launch_cost | tee "$OUT/launch_cost.log"; }
for i in 1 2; do  # host timings on this machine drift between runs: alternate the trees
  for t in new base; do
    echo "== host_overhead $t ($i)"
    run $t python3 "$NEW/tools/host_overhead.py" --json "$OUT/host_${t}_$i.json" 2>&1 | tee "$OUT/host_${t}_$i.log"
  done
done
el host done
for t in new base ${EXTRA:-}; do  # EXTRA: more trees (directories) to measure here
  echo "== bench_memory_ops --quick $t"
  if [ "$t" = new ] || [ "$t" = base ]; then
    run $t python3 benchmarks/bench_memory_ops.py --quick --json "$OUT/mem_$(basename $t).json" > "$OUT/mem_$(basename $t).log" 2>&1
  else
    (cd "$t" && PYTHONPATH="$PWD/src" timeout 120 python3 benchmarks/bench_memory_ops.py --quick --json "$OUT/mem_x.json" > "$OUT/mem_$(basename $t).log" 2>&1)
  fi
  grep -v "^#" "$OUT/mem_$(basename $t).log" | head -20
done
el mem done
for t in ${SCATTER:-new}; do
  echo "== pack_kv_scatter $t"; run $t python3 "$NEW/tools/pack_kv_scatter.py" 2>&1 | tee "$OUT/scatter_$t.log"
done
el scatter done
if [ -n "${DECODE:-}" ]; then
  D="python3 benchmarks/bench_sparse_mla_decode.py --no-baseline --precision both --iters 30 --shape 128,1,2 --shape 64,1,2 --shape 16,1,2 --shape 128,1,16"
  for i in 1 2; do
    echo "== decode base ($i)"; run base $D 2>&1 | grep -v "^#"
    echo "== decode new, SMLA_ATTN_COMBINE=kernel ($i)"; run new env SMLA_ATTN_COMBINE=kernel $D 2>&1 | grep -v "^#"
    echo "== decode new ($i)"; run new $D 2>&1 | grep -v "^#"
  done
  el decode done
fi
[ "${LAYER:-1}" = 0 ] && exit 0
for t in new base; do
  echo "== bench_layer $t"
  run $t python3 benchmarks/bench_layer.py --chunks 4096 --contexts 0 --sweep-heads 128 --json "$OUT/layer_$t.json" \
    > "$OUT/layer_$t.log" 2>&1; grep -v "^#" "$OUT/layer_$t.log" | head -12
done
el all done
