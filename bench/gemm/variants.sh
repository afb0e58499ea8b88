#!/usr/bin/env bash
# Compare GEMM schedule variants on the device machine in one call: builds the CLI for sm_90a, then runs
# `metapipe gemm` (check, then ours and cuBLAS timed interleaved in one process) for each line of a
# variants file (default: bench/gemm/variants.txt), printing one line per variant (and the timeline
# table of a --trace variant).
#   usage: [CMAKE_ARGS="-DMP_PIPELINE_TRACE=ON"] bench/gemm/variants.sh [FILE]   (--trace variants need it)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gemm-variants}"; mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
list="${1:-bench/gemm/variants.txt}"
t0=$(date +%s)
cmake --preset default ${CMAKE_ARGS:-} >"$OUT/build.log" 2>&1 && cmake --build --preset default -j"$(nproc)" --target metapipe >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" -A3 "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
while read -r args; do
  case "$args" in ''|'#'*) continue ;; esac
  printf "%-52s " "$args"
  timeout 120 ./build/tools/metapipe/metapipe gemm $args >"$OUT/last.log" 2>&1
  rc=$?; tee -a "$OUT/all.log" <"$OUT/last.log" >/dev/null
  if [ $rc != 0 ]; then echo "FAILED (exit $rc): $(tail -2 "$OUT/last.log" | tr '\n' ' ')"; continue; fi
  grep -oE "ours: .*|cuBLAS: .*|ratio: .*|FAIL.*" "$OUT/last.log" | tr '\n' ' '; echo
  case "$args" in *--trace*) sed -n '/^trace:/,$p' "$OUT/last.log" ;; esac  # the timeline table
done <"$list"
echo "done in $(( $(date +%s) - t0 )) s"
