#!/usr/bin/env bash
# Where the sm90 attention kernel's time goes, in one device call: a profiling build (ablation variants
# compiled in), tools/ablate.py (time of each stage by leaving it out), tools/trace_attn.py (when each
# warpgroup passes each point of its schedule), then Nsight Compute's full set
# on one launch each of decode (h=128 b=128 s_q=2, fp8) and prefill (h=128 s_kv=32K): the .ncu-rep
# files, the details page, and the per-instruction (SASS) warp-stall samples as CSV. Output in $OUT.
# PRECISION=fast (default; the recipe compared with FlashMLA) or high: the calls' precision=.
# KERNEL=auto (default) | sm90 | sm90p | sm90n: the kernel family profiled (the benchmarks' --kernel;
# sm90p: the ablation's --pair, and decode stays on auto: the pair kernel reads bf16 K only).
# tools/ncu_hot.py also splits the waits by mbarrier.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/smla-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
SMLA_PROFILE_BUILD=1 python3 setup.py build_ext --inplace -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -iE "warning" "$OUT/build.log" | head -5
P=${PRECISION:-fast}
AB=""; [ "${KERNEL:-}" = sm90p ] && AB=--pair  # the pair kernel: its prefill shapes
timeout 240 python3 tools/ablate.py --precision "$P" $AB 2>&1 | tee "$OUT/ablate.txt"
TK=${KERNEL:-sm90}; [ "$TK" = auto ] && TK=sm90  # stage timestamps (the bf16 wide or pair kernel)
if [ "$TK" = sm90 ] || [ "$TK" = sm90p ]; then
  timeout 120 python3 tools/trace_attn.py --kernel "$TK" --precision "$P" 2>&1 | tee "$OUT/trace.txt"
fi
N="ncu --clock-control none -k regex:attn_sm90 --launch-skip 2 --launch-count 1 --set full --import-source no"
for c in "decode:bench_sparse_mla_decode.py --shape 128,2,128 --no-graph" "prefill:bench_sparse_mla_prefill.py --shape 128,32768"; do
  n=${c%%:*}; set -- ${c#*:}
  K=${KERNEL:-auto}; [ "$n" = decode ] && [ "$K" = sm90p ] && K=auto  # the pair kernel reads bf16 K only
  timeout 150 $N -f -o "/tmp/$n" python3 "benchmarks/$1" "${@:2}" --kernel "$K" --precision "$P" --no-baseline --iters 1 --quick \
    > "$OUT/ncu_$n.log" 2>&1
  ncu -i "/tmp/$n.ncu-rep" --page details > "$OUT/${n}_details.txt" 2>&1
  ncu -i "/tmp/$n.ncu-rep" --page source --csv --print-source sass > "$OUT/${n}_sass.csv" 2>&1
  echo "== $n"; grep -E "Duration|Throughput|Pipe|Warp Cycles|Issued Warp|Achieved Occupancy|L2 Hit|No Eligible" "$OUT/${n}_details.txt" | head -24
  python3 tools/ncu_hot.py "$OUT/${n}_sass.csv" 12
done
rm -f "$OUT/build.log"
