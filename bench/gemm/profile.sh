#!/usr/bin/env bash
# Nsight Compute profile of the GEMM kernel against cuBLAS on the device machine (one call): builds
# bench_gemm for sm_90a, profiles one launch of each kernel with warp-state and per-instruction (SASS)
# stall sampling, and returns the reports and CSV exports as one profile.tgz under $OUT.
#   usage: [PROFILES="ours cublas ..."] [BIN=path/to/bench_gemm] bench/gemm/profile.sh [M,N,K [bench_gemm options]]
# PROFILES picks the kernels (default: ours cublas; also ours_compute, ours_data: the --compute-only /
# --data-only diagnostics). BIN: profile that bench_gemm instead of building one.
set -uo pipefail
cd "$(dirname "$0")/../.."
FINAL="${OUT:-build/gemm-profile}"
work="$(mktemp -d)"
mkdir -p "$FINAL"
export PATH="$PATH:/usr/local/cuda/bin"
shape="${1:-4096,4096,4096}"
shift || true
t0=$(date +%s)
bin="${BIN:-./build/bench/gemm/bench_gemm}"
if [ -z "${BIN:-}" ]; then
  cmake --preset default >"$work/build.log" 2>&1 && cmake --build --preset default -j"$(nproc)" --target bench_gemm >>"$work/build.log" 2>&1 ||
    { echo "BUILD FAILED"; tail -30 "$work/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
sections="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
prof() {  # name, kernel regex, extra bench_gemm arguments
  local name=$1 re=$2; shift 2
  timeout 240 ncu -k "regex:$re" --launch-count 1 $sections -f -o "$work/$name" \
    "$bin" --shape "$shape" --samples 1 --batch-ms 1 "$@" >"$work/$name.ncu.log" 2>&1
  echo "$name: ncu exit $?"
  ncu -i "$work/$name.ncu-rep" --page details >"$work/$name.details.txt" 2>&1
  ncu -i "$work/$name.ncu-rep" --page source --csv --print-source sass >"$work/$name.source.csv" 2>"$work/$name.source.err" ||
    ncu -i "$work/$name.ncu-rep" --page source --csv >"$work/$name.source.csv" 2>>"$work/$name.source.err"
  grep -E "Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Warp Cycles Per Issued|Executed Ipc A" "$work/$name.details.txt" | head -8
  grep -iE "stall" "$work/$name.details.txt" | head -6
}
for p in ${PROFILES:-ours cublas}; do
  case $p in
    ours) prof ours '^kernel$' "$@" ;;
    ours_compute) prof ours_compute '^kernel$' --compute-only "$@" ;;
    ours_data) prof ours_data '^kernel$' --data-only "$@" ;;
    cublas) prof cublas 'nvjet' "$@" ;;
    *) echo "profile.sh: unknown profile '$p' (ours, ours_compute, ours_data, cublas)" ;;
  esac
done
# the device tool returns at most 8 files: everything goes back as one archive
tar -czf "$FINAL/profile.tgz" -C "$work" . && cp "$work"/*.details.txt "$FINAL"/ 2>/dev/null
rm -rf "$work"
echo "done in $(( $(date +%s) - t0 )) s"
