#!/usr/bin/env bash
# The GEMM's device run, one command on a fresh H200 machine with nvcc: configure and build the tree
# (`cmake --preset default`: RelWithDebInfo, sm_90a), count HGMMA and local-memory spills in the GEMM's
# SASS, run the GPU tests (`ctest -L gpu`), then bench_gemm for both layouts on the table's shapes (2048^3,
# 4096^3, 8192^3, the LLM up-, down-projection, lm-head and M = 128 decode shapes; 1 s batches, 3 samples
# each), printing the table last. Logs under $OUT. Fits the device's 10-minute limit: the whole run is
# held to 530 s (the tests get what is left after keeping 200 s for the benchmark, which takes about
# 2-3 minutes; the build about 2-4 on 16 cores).
#   usage: [OUT=DIR] bench/gemm/device-gemm.sh [--no-tests] [--quick]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/gemm-out}"
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
tests=1 bench_args="--layout both"
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) tests=0 ;;
    --quick) bench_args="--layout both --quick" ;;
    *) echo "device-gemm.sh: unknown option '$1' (usage: see the top of bench/gemm/device-gemm.sh)"; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
left() { echo $(( t0 + 530 - $(date +%s) )); }  # seconds of the run's budget still left
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu --format=csv |
  tee "$OUT/card.txt"
echo "$(nvcc --version | tail -1); $(git log -1 --format='%h %s' 2>/dev/null)" | tee -a "$OUT/card.txt"
if ! { cmake --preset default >"$OUT/build.log" 2>&1 &&
       cmake --build --preset default -j"$(nproc)" >>"$OUT/build.log" 2>&1; }; then
  echo "BUILD FAILED (errors from $OUT/build.log):"; grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
# ptxas's C7514: a kernel's wgmma serialized (each waits for the one before), which a K loop must never have
echo "ptxas C7514 warnings: $(grep -c C7514 "$OUT/build.log")"
lib=build/kernels/libmp_kernels.a
if command -v cuobjdump >/dev/null && [ -f "$lib" ]; then
  cuobjdump --dump-sass "$lib" >"$OUT/gemm.sass" 2>&1
  echo "SASS of $lib: $(grep -c HGMMA "$OUT/gemm.sass") HGMMA, $(grep -cE '\bLDL|\bSTL' "$OUT/gemm.sass") LDL/STL"
  cuobjdump --dump-resource-usage "$lib" >"$OUT/resource-usage.txt" 2>&1
fi
status=0
if [ $tests = 1 ]; then
  t1=$(date +%s)
  budget=$(( $(left) - 200 ))
  if [ $budget -lt 60 ]; then
    echo "ctest -L gpu: skipped, only $(left) s of the run's budget left after the build" | tee "$OUT/gpu-tests.log"; rc=1
  else
    timeout $budget ctest --test-dir build -L gpu -j4 --timeout 200 --output-on-failure >"$OUT/gpu-tests.log" 2>&1
    rc=$?
  fi
  [ $rc = 0 ] || status=1
  echo "ctest -L gpu: exit $rc in $(( $(date +%s) - t1 )) s: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log")"
  grep -E "^\s+[0-9]+ - .*(Failed|SEGFAULT|Timeout|Exception|Not Run)" "$OUT/gpu-tests.log"
fi
t2=$(date +%s)
bench_s=$(left); [ "$bench_s" -ge 120 ] || bench_s=120  # (timeout 0 would mean no limit)
timeout "$bench_s" ./build/bench/gemm/bench_gemm $bench_args >"$OUT/bench.log" 2>&1 || status=1
echo "bench_gemm $bench_args: $(( $(date +%s) - t2 )) s (rows as they finished, then the table: $OUT/bench.log)"
echo "done in $(( $(date +%s) - t0 )) s"
echo
sed -n '/^| M x N x K/,$p' "$OUT/bench.log" | grep . || tail -20 "$OUT/bench.log"
exit $status
