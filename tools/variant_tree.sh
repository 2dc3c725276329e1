#!/usr/bin/env bash
# A tree of HEAD with some compile-time switches set, as a tar.gz for tools/gpu_variants.sh (which builds
# each tree given to it and benchmarks them side by side in one device call):
#   bash tools/variant_tree.sh .whl/split128.tar.gz SMLA_SM90_SPLIT=128 SMLA_SM90_QUEUE_S=1
# Each NAME=VALUE rewrites the `#define NAME <default>` line of the header under cuda/ that defines it
# (e.g. SMLA_SM90_* in sm90/plan.cuh, SMLA_S_CHAINS in sm90/score_tile.cuh); a name defined nowhere is
# an error. In a git checkout the tree is HEAD (uncommitted changes are not included); elsewhere (the
# device machine's copy has no .git) the files as they are.
set -eu
out=${1:?usage: tools/variant_tree.sh OUT.tar.gz NAME=VALUE ...}
shift
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if git rev-parse --git-dir > /dev/null 2>&1; then
  git archive HEAD | tar x -C "$tmp"
else  # a copy without .git (the device machine): the tree as it is, less build outputs
  tar cf - --exclude=./build --exclude='*.so' --exclude=./.whl --exclude=./.gpu --exclude=./.gl . | tar x -C "$tmp"
fi
for kv in "$@"; do
  name=${kv%%=*} value=${kv#*=}
  file=$(grep -rlE "^#define $name [0-9]+" "$tmp/cuda" | head -n 1 || true)
  [ -n "$file" ] || { echo "variant_tree: no '#define $name <number>' under cuda/" >&2; exit 1; }
  sed -i -E "s/^#define $name [0-9]+/#define $name $value/" "$file"
  echo "$name=$value in ${file#"$tmp"/}"
done
mkdir -p "$(dirname "$out")"
tar czf "$out" -C "$tmp" .
