#!/usr/bin/env bash
# One device call for an experiment behind environment switches: builds the CLI (./build) and, when
# switches are given, the GEMM GPU tests, runs the tests named by TESTS once under each VAR=VALUE (a
# switch that forces a new kernel path must still pass them), then every line of FILE through
# bench/gemm/env-lines.sh.
#   usage: OUT=DIR [TESTS=gtest-filter] bench/gemm/env-tests-lines.sh FILE [VAR=VALUE ...]
# The seventeenth session's runs, on experiment branches whose code is not on main (its last states:
# bench/gemm/runs/2026-12-01-s17-selffed.patch and 2026-12-01-s17-fold.patch; bench/RESULTS.md):
#   run 1:    bench/gemm/variants-s17-tall.txt MP_EXP_TALL=1 MP_EXP_TALL=16 MP_EXP_TALL=1000
#   runs 3-4: bench/gemm/variants-s17-tall3.txt (tall4.txt) MP_EXP_TALL=1
#   run 5:    TESTS=(the default filter):SM90_Gemm.Epilogues, bench/gemm/variants-s17-fold.txt MP_EXP_FOLD=1
# (They ran as two scripts with these steps, s17-tall.sh and s17-fold.sh, made into this one after.)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n '6p' "$0"; exit 2; }
list=$1; shift
OUT="${OUT:-/tmp/gemm-env}"; mkdir -p "$OUT"
TESTS="${TESTS:-SM90_Gemm.SmallAndOddMultiplesOf16:SM90_Gemm.LargeAndNonSquare:SM90_Gemm.BackToBackChains}"
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe ${1:+test_kernels_gemm_sm90} >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
tb=$(find build -name test_kernels_gemm_sm90 -type f | head -1)
for sw in "$@"; do
  log="$OUT/tests-${sw//[^A-Za-z0-9_]/_}.log"
  env "$sw" timeout 150 "$tb" --gtest_filter="$TESTS" >"$log" 2>&1
  echo "tests $sw rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tr '\n' ' ')"
  grep -m5 "Failure\|Expected\|error\|failed" "$log" | cut -c1-300
done
echo "tests $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh "$list"
echo "all done $(( $(date +%s) - t0 )) s"
