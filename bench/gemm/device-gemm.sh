#!/usr/bin/env bash
# The GEMM's own device run (one call): build the GEMM targets for sm_90a, dump SASS evidence, run the
# GPU tests, the CLI and the benchmark. Logs under $OUT.  usage: bench/gemm/device-gemm.sh [--no-tests] [--bench ARGS]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gemm-out}"; mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
tests=1; sweep=0; bench=1; bench_args="--layout both --schedule cooperative"
while [ $# -gt 0 ]; do case "$1" in --no-tests) tests=0;; --sweep) sweep=1;; --no-bench) bench=0;; --bench) bench_args="$2"; shift;; esac; shift; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/card.txt"
t0=$(date +%s)
# Build from a copy holding only the layers the GEMM needs, so other layers' work in progress in the same
# tree cannot break this run (the CLI gets only its frame and the gemm command).
src=/tmp/gemm-src; rm -rf $src; mkdir -p $src/tests $src/bench $src/tools/metapipe
cp -r CMakeLists.txt CMakePresets.json cmake core tile kernels $src/
cp -r tests/CMakeLists.txt tests/core tests/tile tests/kernels $src/tests/
cp -r bench/CMakeLists.txt bench/gemm $src/bench/
cp tools/metapipe/{CMakeLists.txt,cli.cpp,cli.h,main.cpp,demo_builtin.cpp,cmd_demo.cpp,cmd_info.cpp,cmd_gemm.cpp} $src/tools/metapipe/
[ -d docs/gemm_steps ] && mkdir -p $src/docs && cp -r docs/gemm_steps $src/docs/ && cp docs/CMakeLists.txt $src/docs/ 2>/dev/null
cmake -S $src -B build-gemm -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMP_BUILD_BENCH=ON -DMP_BUILD_TUTORIAL=ON >"$OUT/build.log" 2>&1 &&
  cmake --build build-gemm -j"$(nproc)" >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
lib=build-gemm/kernels/libmp_kernels.a
cuobjdump --dump-sass "$lib" >"$OUT/gemm.sass" 2>&1
echo "SASS: $(grep -c HGMMA "$OUT/gemm.sass") HGMMA, $(grep -cE '\bLDL|\bSTL' "$OUT/gemm.sass") LDL/STL lines in $lib"
cuobjdump --dump-resource-usage "$lib" 2>&1 | grep -A1 "gemm_kernel" | grep -oE "Function [^:]*|REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+|SHARED:[0-9]+" | paste - - - - - | head -8
if [ $tests = 1 ]; then
  for t in build-gemm/tests/tile/test_tile_sm90 build-gemm/tests/kernels/test_kernels_gemm_sm90; do
    timeout 400 $t --gtest_brief=1 >"$OUT/$(basename $t).log" 2>&1; echo "$(basename $t): exit $? $(grep -E 'PASSED|FAILED' "$OUT/$(basename $t).log" | head -3 | tr '\n' ' ')"
    grep -B2 -A8 "Failure" "$OUT/$(basename $t).log" | head -40
  done
fi
timeout 60 ./build-gemm/tools/metapipe/metapipe gemm 4096 4096 4096 --bt
[ $bench = 1 ] && timeout 120 ./build-gemm/docs/gemm_steps/gemm_tutorial 2>&1 | tee "$OUT/tutorial.log"
./build-gemm/tools/metapipe/metapipe info
[ $bench = 1 ] && timeout 120 ./build-gemm/tools/metapipe/metapipe demo
[ $bench = 1 ] && timeout 300 ./build-gemm/bench/gemm/bench_gemm $bench_args 2>&1 | tee "$OUT/bench.log"
if [ $sweep = 1 ]; then  # schedule variants and repeats (run-to-run spread)
  g=./build-gemm/tools/metapipe/metapipe
  while read -r args; do
    printf "%-58s " "$args"; timeout 60 $g gemm $args --samples 30 | grep -E "^ratio|^check" | grep -oE "ratio:.*|FAIL.*" | tr '\n' ' '; echo
  done <<'LIST'
4096 4096 4096 --bt
4096 4096 4096 --bt
4096 4096 4096 --bt --no-persistent
8192 8192 8192 --bt
LIST
fi
