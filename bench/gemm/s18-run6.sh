# Eighteenth session, run 6 (device tool: OUT=$OUT bash bench/gemm/s18-run6.sh): the final tree on a fresh
# machine. Builds the CLI and bench_gemm; the bench/device-benches.txt bench_gemm line (1 s batches, 3 a
# variant, the new defaults); then 4096^3 A·B lines, the default against --l2 none.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe bench_gemm >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 150 ./build/bench/gemm/bench_gemm --layout both --schedule cooperative >"$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"; head -1 "$OUT/bench.log"; grep -E "^\|" "$OUT/bench.log" | tail -14
bash bench/gemm/env-lines.sh bench/gemm/variants-s18-run6.txt
echo "all done $(( $(date +%s) - t0 )) s"
