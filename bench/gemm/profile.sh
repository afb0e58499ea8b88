#!/usr/bin/env bash
# Nsight Compute profile of the GEMM kernels against cuBLAS on the device machine (one call): builds the
# CLI for sm_90a, profiles one launch of each kernel with warp-state and per-instruction (SASS) stall
# sampling, and writes the reports and CSV exports under $OUT.
#   usage: [PROFILES="ours cublas ..."] bench/gemm/profile.sh [M N K [extra metapipe gemm options]]
# PROFILES picks the kernels (default: ours cublas pingpong ours_c2; also ours_compute, ours_data: the
# --compute-only / --data-only diagnostics). BIN: profile that metapipe binary instead of building one.
set -uo pipefail
cd "$(dirname "$0")/../.."
FINAL="${OUT:-/tmp/gemm-profile}"; OUT=/tmp/gemm-profile-work; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
export PATH="$PATH:/usr/local/cuda/bin"
shape="${*:-4096 4096 4096 --bt}"
t0=$(date +%s)
bin="${BIN:-./build/tools/metapipe/metapipe}"
if [ -z "${BIN:-}" ]; then
  cmake --preset default >"$OUT/build.log" 2>&1 && cmake --build --preset default -j"$(nproc)" --target metapipe >>"$OUT/build.log" 2>&1 ||
    { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
sections="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
prof() {  # name, kernel regex, metapipe gemm arguments
  local name=$1 re=$2; shift 2
  timeout 240 ncu -k "regex:$re" --launch-count 1 $sections -f -o "$OUT/$name" $bin gemm "$@" --no-time >"$OUT/$name.ncu.log" 2>&1
  echo "$name: ncu exit $?"
  ncu -i "$OUT/$name.ncu-rep" --page details >"$OUT/$name.details.txt" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/$name.source.csv" 2>"$OUT/$name.source.err" ||
    ncu -i "$OUT/$name.ncu-rep" --page source --csv >"$OUT/$name.source.csv" 2>>"$OUT/$name.source.err"
  grep -E "Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Warp Cycles Per Issued|Executed Ipc A" "$OUT/$name.details.txt" | head -8
  grep -iE "stall|Stall" "$OUT/$name.details.txt" | head -6
}
for p in ${PROFILES:-ours cublas pingpong ours_c2}; do
  case $p in
    ours) prof ours '^kernel$' $shape ;;
    ours_compute) prof ours_compute '^kernel$' $shape --compute-only ;;
    ours_data) prof ours_data '^kernel$' $shape --data-only ;;
    cublas) prof cublas 'nvjet' $shape ;;
    pingpong) prof pingpong 'pingpong_kernel' $shape --schedule pingpong ;;
    ours_c2) prof ours_c2 '^kernel$' $shape --cluster 2 ;;
    *) echo "profile.sh: unknown profile '$p'" ;;
  esac
done
ncu --help 2>&1 | grep -A4 -E "^\s+--page|print-source" >"$OUT/ncu-help.txt"
# the device tool returns at most 8 files: everything goes back as one archive
tar -czf "$FINAL/profile.tgz" -C "$OUT" . && cp "$OUT"/*.details.txt "$FINAL"/ 2>/dev/null
echo "done in $(( $(date +%s) - t0 )) s"
