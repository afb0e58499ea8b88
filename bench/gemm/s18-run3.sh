# Eighteenth session, run 3 (device tool: OUT=$OUT bash bench/gemm/s18-run3.sh): the final code with the
# automatic L2 priorities. Builds the CLI, the GPU tests and bench_gemm; SASS counts; the GPU tests;
# variants-s18-final.txt (default against --l2 none, one build); bench_gemm's table.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe test_kernels_gemm_sm90 test_tile_sm90 test_core_gpu \
    bench_gemm >>"$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
lib=build/kernels/libmp_kernels.a
cuobjdump --dump-sass "$lib" >/tmp/gemm.sass 2>&1
echo "SASS: $(grep -c HGMMA /tmp/gemm.sass) HGMMA, $(grep -cE '\bLDL|\bSTL' /tmp/gemm.sass) LDL/STL, C7514: $(grep -c C7514 "$OUT/build.log")"
cuobjdump --dump-resource-usage "$lib" 2>&1 | grep -A1 "gemm" | grep -oE "REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+ LOCAL:[0-9]+" | sort | uniq -c
timeout 220 ctest --test-dir build -L gpu -j4 --timeout 210 --output-on-failure >"$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$? $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log") ($(( $(date +%s) - t0 )) s)"
grep -E "Failed|\*\*\*|Skipped" "$OUT/gpu-tests.log" | head
./build/tools/metapipe/metapipe info 2>&1 | grep -i -E "l2|name|sms" | head -4
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh bench/gemm/variants-s18-final.txt
echo "lines done $(( $(date +%s) - t0 )) s"
timeout 170 ./build/bench/gemm/bench_gemm --layout both --schedule cooperative --samples 8 >"$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^\|" "$OUT/bench.log" | head -20
echo "all done $(( $(date +%s) - t0 )) s"
