#!/usr/bin/env bash
# Runs every line of a variants file whose variants differ in environment switches, not in builds (the
# counterpart of ab.sh): each line is `tag | VAR=value ... | metapipe gemm arguments`, run with the CLI
# of ./build. Prints one line per variant (its plan, power, times, ratio and error); the whole output of
# each goes to $OUT/all.log.
#   usage: OUT=DIR bench/gemm/env-lines.sh FILE
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 1 ] || { sed -n '6p' "$0"; exit 2; }
OUT="${OUT:-/tmp/gemm-env}"; mkdir -p "$OUT"
while IFS='|' read -r tag envs args; do
  case "$tag" in ''|'#'*) continue ;; esac
  printf "%-8s %-46s " "$tag" "$args"
  echo "== $tag | $envs | $args" >>"$OUT/all.log"
  env $envs timeout 60 ./build/tools/metapipe/metapipe gemm $args >"$OUT/last.log" 2>&1; rc=$?
  cat "$OUT/last.log" >>"$OUT/all.log"
  [ $rc = 0 ] || { echo "FAILED rc=$rc $(tail -2 "$OUT/last.log" | tr '\n' ' ')"; continue; }
  grep -oE "plan: .*|power: .*|ours: .*|cuBLAS: .*|ratio: +[0-9.]+x|FAIL.*|rel err [^,]*" "$OUT/last.log" |
    tr '\n' ' '
  echo
done <"$1"
