# Seventeenth session, run 5 (device tool: OUT=$OUT bash bench/gemm/s17-fold.sh), on the experiment branch
# exp-fold (MP_EXP_FOLD, not on main: bench/gemm/runs/2026-12-01-s17-fold.patch; bench/RESULTS.md,
# seventeenth session): the GEMM GPU tests with B of A·B loaded through the folded map, then
# variants-s17-fold.txt.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe test_kernels_gemm_sm90 >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
tb=$(find build -name test_kernels_gemm_sm90 -type f | head -1)
MP_EXP_FOLD=1 timeout 150 $tb --gtest_filter='SM90_Gemm.SmallAndOddMultiplesOf16:SM90_Gemm.LargeAndNonSquare:SM90_Gemm.BackToBackChains:SM90_Gemm.Epilogues' >"$OUT/tests-fold.log" 2>&1
echo "tests MP_EXP_FOLD=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests-fold.log" | tr '\n' ' ')"
grep -m5 "Failure\|Expected\|error\|failed" "$OUT/tests-fold.log" | cut -c1-300
echo "tests $(( $(date +%s) - t0 )) s"
bash bench/gemm/env-lines.sh bench/gemm/variants-s17-fold.txt
echo "all done $(( $(date +%s) - t0 )) s"
