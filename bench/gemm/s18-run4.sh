# Eighteenth session, run 4 (device tool: OUT=$OUT bash bench/gemm/s18-run4.sh): why run 3's bench_gemm
# table and its 1 s lines differ at 4096^3. Builds the CLI and bench_gemm; variants-s18-batch.txt; then
# bench_gemm's A·B rows twice, with its default ~200 ms batches and with 1 s batches.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe bench_gemm >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh bench/gemm/variants-s18-batch.txt
echo "lines done $(( $(date +%s) - t0 )) s"
timeout 100 ./build/bench/gemm/bench_gemm --layout kn --schedule cooperative --samples 8 >"$OUT/bench-200.log" 2>&1
echo "bench 200 ms rc=$?"; grep -E "^\|" "$OUT/bench-200.log" | tail -7
timeout 150 ./build/bench/gemm/bench_gemm --layout kn --schedule cooperative --samples 3 --batch-ms 1000 >"$OUT/bench-1000.log" 2>&1
echo "bench 1 s rc=$?"; grep -E "^\|" "$OUT/bench-1000.log" | tail -7
echo "all done $(( $(date +%s) - t0 )) s"
