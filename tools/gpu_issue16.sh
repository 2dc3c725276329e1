#!/usr/bin/env bash
# Issue 16's device calls, one call each (outputs under $OUT):
#   PHASE=ab (default): this tree against copies of it with compile-time switches set (VARIANTS="name:
#     NAME=VALUE,NAME=VALUE ..."; default: the two changes the eighth session kept, each switched back:
#     even = SMLA_SM90_SPLIT=256, forward = SMLA_REVERSE_ROWS=0; tools/variant_tree.sh), compared by
#     tools/gpu_variants.sh: built side by side, a first check of each copy, the attention tests of each
#     tree, then the prefill benchmark alternating (h=128 32K full + causal, "fast"; ARGS overrides).
#     SUITE=1 first runs this tree's whole CUDA suite (tools/gpu_validate.sh). About 5-6 minutes.
#   PHASE=ncu: Nsight Compute on one h=128 32K "fast" prefill launch of the wide kernel of this tree and of each
#     VARIANTS copy, and of this tree's pair kernel: shared-memory bank traffic, tensor pipe, L2 (below).
#   PHASE=trace: a profiling build of this tree and tools/trace_attn.py on the wide and the pair kernel
#     (when each warpgroup passes each point of its schedule); in a copy made by tools/variant_tree.sh
#     (which carries this script) it traces that copy.
#   PHASE=grid: a profiling build of a copy of this tree tracing a mid-run wave (TRACE_CTA0, default 3960; about
#     2.5 minutes on 16 cores); for the wide and the pair kernel and each start spread of SPREADS
#     ("first-wave spread:per-CTA jitter" in ns, default "0:0 80000:0 0:4000"; SMLA_ATTN_STAGGER_NS /
#     SMLA_ATTN_JITTER_NS, sm90/plan.cuh), tools/trace_attn.py's whole-grid rows (how crowded the CTA starts are) and
#     its prologue / epilogue rows, then the prefill benchmark (h=128 / 64 32K "fast") alternating over the spreads,
#     two rounds. One build for all: the spreads are run-time settings there. GRID_SWITCHES="NAME=VALUE ...": more
#     compile-time switches of that copy (tools/variant_tree.sh), e.g. SMLA_TRACE_LIGHT=1.
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
if [ "${PHASE:-ab}" = grid ]; then
  # in a copy whose stage traces record a mid-run wave (SMLA_TRACE_CTA0, default 3960: the 31st of h=128 32K)
  bash tools/variant_tree.sh /tmp/i16_grid.tar.gz SMLA_TRACE_CTA0="${TRACE_CTA0:-3960}" ${GRID_SWITCHES:-} > /dev/null || exit 1
  rm -rf /tmp/i16_grid && mkdir -p /tmp/i16_grid && tar xzf /tmp/i16_grid.tar.gz -C /tmp/i16_grid && cd /tmp/i16_grid
  export PYTHONPATH=$PWD/src
  SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  SP=${SPREADS:-0:0 80000:0 0:4000}
  for k in sm90p sm90; do
    for sp in $SP; do
      echo "== trace $k, spread $sp"
      timeout 60 python3 tools/trace_attn.py --kernel $k --precision fast --stagger-ns "${sp%%:*}" --jitter-ns "${sp#*:}" \
        > "$OUT/grid_${k}_${sp/:/_}.txt" 2>&1
      grep -E "^grid|prologue|^epilogue WG[01] |whole CTA|period" "$OUT/grid_${k}_${sp/:/_}.txt"
    done
  done
  for i in 1 2; do
    for k in sm90p sm90; do
      for sp in $SP; do
        echo "== bench $k, spread $sp (round $i)"
        SMLA_ATTN_STAGGER_NS=${sp%%:*} SMLA_ATTN_JITTER_NS=${sp#*:} timeout 60 python3 benchmarks/bench_sparse_mla_prefill.py \
          --shape 128,32768 --shape 64,32768 --precision fast --no-baseline --iters 10 --kernel $k 2>&1 | grep -v "^#" | sed -n 2,3p
      done
    done
  done
  exit 0
fi
# The VARIANTS copies of this tree (tools/variant_tree.sh) as /tmp/i16/<name>.tar.gz, their names in `vnames`.
make_variants() {
  vnames=()
  for v in "$@"; do
    t=${v%%:*} sw=${v#*:}
    bash tools/variant_tree.sh "/tmp/i16/$t.tar.gz" ${sw//,/ } > /dev/null && vnames+=("$t")
  done
}
if [ "${PHASE:-ab}" = ncu ]; then
  # Nsight Compute on one h=128 s_kv=32K "fast" prefill launch of this tree's wide kernel, its pair kernel and
  # each VARIANTS copy's wide kernel: the speed-of-light, memory and compute sections (shared-memory
  # bank reads / writes, tensor pipe, L2), then the same launch with the shared-memory and L2 metrics
  # asked for by name (a second run: a metric this ncu lacks fails only that one; the gmma pipe's own
  # metric, sm__pipe_tensor_op_gmma_cycles_active, is n/a on the H200's ncu).
  export PYTHONPATH=$PWD/src
  trees=("main:$PWD")
  make_variants ${VARIANTS:-}
  for t in "${vnames[@]}"; do
    rm -rf "/tmp/v_$t"; mkdir -p "/tmp/v_$t" && tar xzf "/tmp/i16/$t.tar.gz" -C "/tmp/v_$t" && trees+=("$t:/tmp/v_$t")
  done
  for tr in "${trees[@]}"; do
    (cd "${tr#*:}" && python3 setup.py build_ext --inplace -j $(( $(nproc) / ${#trees[@]} )) > "$OUT/build_${tr%%:*}.log" 2>&1 \
      || echo "BUILD FAIL ${tr%%:*}") &
  done
  wait
  M=l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_elapsed.avg
  runs=()
  for tr in "${trees[@]}"; do runs+=("${tr%%:*}:${tr#*:}:sm90"); done
  runs+=("main-pair:$PWD:sm90p")
  for r in "${runs[@]}"; do
    IFS=: read -r name dir kern <<< "$r"
    B="python3 benchmarks/bench_sparse_mla_prefill.py --shape 128,32768 --kernel $kern --precision fast --no-baseline --iters 1"
    (cd "$dir" && PYTHONPATH=$dir/src timeout 200 ncu --clock-control none -k regex:attn_sm90 --launch-skip 2 --launch-count 1 \
       --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
       $B > "$OUT/ncu_$name.txt" 2>&1)
    echo "== $name ($kern)"; grep -E "Duration|Throughput|Shared|Pipe|Bank|Elapsed Cycles|Hit Rate" "$OUT/ncu_$name.txt" | head -30
    (cd "$dir" && PYTHONPATH=$dir/src timeout 200 ncu --clock-control none -k regex:attn_sm90 --launch-skip 2 --launch-count 1 \
       --metrics "$M" $B > "$OUT/ncum_$name.txt" 2>&1)
    grep -E "l1tex__|sm__|lts__|ERROR" "$OUT/ncum_$name.txt" | head -10
  done
  exit 0
fi
if [ -n "${SUITE:-}" ]; then OUT=$OUT/validate BENCHES=none bash tools/gpu_validate.sh; fi
make_variants ${VARIANTS:-"even:SMLA_SM90_SPLIT=256 forward:SMLA_REVERSE_ROWS=0"}
tars=()
for t in "${vnames[@]}"; do tars+=("/tmp/i16/$t.tar.gz"); done
# KERNEL=sm90p: the pair kernel's variants (its first check, its prefill tests with SMLA_ATTN_KERNEL set, the
# selection the thirteenth session ran on it; ARGS then need --kernel sm90p); e.g. KERNEL=sm90p
# VARIANTS="c1:SMLA_S_CHAINS=1" ARGS="--shape 128,32768 --kernel sm90p --precision both
# --no-baseline --iters 10" bash tools/gpu_issue16.sh
TK="prefill or causal or empty_tiles or decode_grid and bf16 or split"
if [ -n "${KERNEL:-}" ]; then export SMLA_ATTN_KERNEL=$KERNEL; TK="prefill or causal or empty_tiles or split"; fi
FIRST=${KERNEL:-sm90} TESTS=tests/test_cuda_attention.py TESTS_K="$TK" \
  BENCH=bench_sparse_mla_prefill.py LINES=12 \
  ARGS=${ARGS:-"--shape 128,32768 --causal --precision fast --no-baseline --iters 10"} bash tools/gpu_variants.sh "${tars[@]}"
