#!/usr/bin/env bash
# CI check of the CUDA lowering: `metapipe compile P --emit cuda` for every program of `metapipe list`,
# then one nvcc call compiling all the units for sm_90a with the repository root on the include path.
# usage: cuda_lower_nvcc.sh METAPIPE NVCC REPO_ROOT
set -euo pipefail
metapipe=$1 nvcc=$2 root=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A program's line is its name indented by two spaces; parameters are indented further.
programs=$("$metapipe" list | awk '/^  [a-z_][a-z_0-9]*  / { print $1 }')
[ -n "$programs" ] || { echo "no programs listed by metapipe list" >&2; exit 1; }
units=()
for p in $programs; do
  "$metapipe" compile "$p" --emit cuda > "$work/$p.cu"
  units+=("$p.cu")
done
cd "$work"
"$nvcc" -arch=sm_90a -std=c++20 -I"$root" -c "${units[@]}"
for p in $programs; do
  [ -s "$p.o" ] || { echo "nvcc produced no object for $p" >&2; exit 1; }
done
echo "compiled ${#units[@]} lowered programs for sm_90a: $programs"
