#!/usr/bin/env bash
# A/B of GEMM build switches on the device machine in one call: builds bench_gemm once per variant (each in
# its own build folder, in parallel), then runs every line of FILE with each build in turn, so that the
# builds alternate line by line under the same clock and temperature. Each line is a bench_gemm argument
# list (each row checked against fp64, then ours and cuBLAS timed alternately in one process: the ratio is
# within that process). Prints the table rows of each (line, variant).
#   usage: bench/gemm/ab.sh FILE NAME=CUDA_FLAGS [NAME=CUDA_FLAGS ...]
#   e.g.:  bench/gemm/ab.sh lines.txt unrolled= rolled=-DMP_PIPELINE_STAGE_UNROLL=0
#          (lines.txt: "--shape 4096,4096,4096 --layout both" and the like, one per line)
# Environment: CMAKE_ARGS (extra configure arguments for every build, e.g. -DMP_PIPELINE_TRACE=ON for
# --trace lines), OUT (where the logs go; default build/gemm-ab).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n '7,9p' "$0"; exit 2; }
list="$1"; shift
OUT="${OUT:-build/gemm-ab}"; mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
t0=$(date +%s)
names=()
jobs_each=$(( $(nproc) / $# )); [ "$jobs_each" -ge 1 ] || jobs_each=1
for v in "$@"; do
  name="${v%%=*}" flags="${v#*=}"
  names+=("$name")
  ( cmake -S . -B "build-ab-$name" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CUDA_FLAGS=$flags" ${CMAKE_ARGS:-} \
      >"$OUT/build-$name.log" 2>&1 &&
    cmake --build "build-ab-$name" -j"$jobs_each" --target bench_gemm >>"$OUT/build-$name.log" 2>&1 ||
    echo "BUILD FAILED: $name (see $OUT/build-$name.log)" ) &
done
wait
echo "builds: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
while read -r args; do
  case "$args" in ''|'#'*) continue ;; esac
  for name in "${names[@]}"; do
    echo "== $name: $args" | tee -a "$OUT/all.log"
    timeout 300 "./build-ab-$name/bench/gemm/bench_gemm" $args >"$OUT/last.log" 2>&1
    rc=$?; cat "$OUT/last.log" >>"$OUT/all.log"
    if [ $rc != 0 ]; then echo "FAILED (exit $rc): $(tail -2 "$OUT/last.log" | tr '\n' ' ')"; continue; fi
    grep -E "^  \| " "$OUT/last.log"
  done
done <"$list"
echo "done in $(( $(date +%s) - t0 )) s"
