#!/usr/bin/env bash
# A copy of the working tree with some compile-time switches set, as a tar.gz for tools/gpu_variants.sh (which builds
# each tree given to it and benchmarks them side by side in one device call):
#   bash tools/variant_tree.sh .whl/even.tar.gz SMLA_SM90_SPLIT=256 SMLA_REVERSE_ROWS=0
# Each NAME=VALUE rewrites the `#define NAME <default>` line of the header under cuda/ that defines it
# (e.g. SMLA_SM90_* in sm90/plan.cuh, SMLA_S_CHAINS in sm90/score_tile.cuh); a name defined nowhere is
# an error. The tree is the working tree as it is.
set -eu
out=${1:?usage: tools/variant_tree.sh OUT.tar.gz NAME=VALUE ...}
shift
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the tree as it is (uncommitted changes included), less build outputs: the device machine's copy carries
# a .git whose HEAD is not the working tree's (git archive HEAD there built stale trees)
tar cf - --exclude=./build --exclude='*.so' --exclude=./.whl --exclude=./.gpu --exclude=./.gl --exclude=./.git --exclude=__pycache__ . | tar x -C "$tmp"
for kv in "$@"; do
  name=${kv%%=*} value=${kv#*=}
  file=$(grep -rlE "^#define $name [0-9]+" "$tmp/cuda" | head -n 1 || true)
  [ -n "$file" ] || { echo "variant_tree: no '#define $name <number>' under cuda/" >&2; exit 1; }
  sed -i -E "s/^#define $name [0-9]+/#define $name $value/" "$file"
  echo "$name=$value in ${file#"$tmp"/}"
done
mkdir -p "$(dirname "$out")"
tar czf "$out" -C "$tmp" .
