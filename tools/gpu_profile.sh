#!/usr/bin/env bash
# Nsight Compute summary of the attention kernels at the issue shapes (decode h=128 b=128 s_q=2, prefill
# h=128 s_kv=32K): one profiled launch each, speed-of-light, memory and warp-stall sections. Logs in $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
N="ncu --clock-control none -k regex:attn_sm90 --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy"
$N python3 benchmarks/bench_sparse_mla_decode.py --shape 128,2,128 --no-baseline --iters 1 --quick > "$OUT/ncu_decode.txt" 2>&1
$N python3 benchmarks/bench_sparse_mla_prefill.py --shape 128,32768 --no-baseline --iters 1 --quick > "$OUT/ncu_prefill.txt" 2>&1
for f in "$OUT"/ncu_*.txt; do echo "== $f"; grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|Achieved Occupancy|Registers|L2 Hit|L1/TEX Hit" "$f" | head -30; done
