# Seventeenth session, runs 1, 3 and 4 (device tool: OUT=$OUT bash bench/gemm/s17-tall.sh FILE P...), on
# the experiment branch exp-nc3, whose MP_EXP_TALL switch (192 x 256 tiles under the self-fed pipeline)
# is not on main: its last state (run 4's) is bench/gemm/runs/2026-12-01-s17-selffed.patch, and runs 1-3
# ran earlier states of its tile/pipeline_selffed.cuh (bench/RESULTS.md, seventeenth session). Builds
# the CLI and the GEMM GPU tests, runs three of the tests with MP_EXP_TALL=P for each P (the tall tiles
# forced, P panels of 192 rows), then the lines of FILE (bench/gemm/env-lines.sh).
#   run 1: bench/gemm/variants-s17-tall.txt 1 16 1000
#   run 3: bench/gemm/variants-s17-tall3.txt 1
#   run 4: bench/gemm/variants-s17-tall4.txt 1
list=$1; shift
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe test_kernels_gemm_sm90 >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
tb=$(find build -name test_kernels_gemm_sm90 -type f | head -1)
for P in "$@"; do
  MP_EXP_TALL=$P timeout 120 $tb --gtest_filter='SM90_Gemm.SmallAndOddMultiplesOf16:SM90_Gemm.LargeAndNonSquare:SM90_Gemm.BackToBackChains' >"$OUT/tests-tall$P.log" 2>&1
  echo "tests MP_EXP_TALL=$P rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests-tall$P.log" | tr '\n' ' ')"
  grep -m5 "Failure\|Expected\|error" "$OUT/tests-tall$P.log" | cut -c1-300
done
echo "tests $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh "$list"
echo "all done $(( $(date +%s) - t0 )) s"
