#!/usr/bin/env bash
# The attention benchmark's device run, one command on the H200 machine (it needs nvcc, the GPU and, for
# the references, PyTorch): configure with the default preset, build only bench_attention (-j of all
# cores), time our kernels on the FlashAttention-3 protocol shapes, the Llama-3.1-8B prefill and decode,
# and the backward (bench_attention: each shape checked against CPU fp64 on sampled rows first), then
# PyTorch SDPA's cuDNN and flash backends on the same shapes (bench_sdpa.py), printing one table with the
# ratios. Logs and the CSV under $OUT. About 3-4 minutes, the build included. --set decode times only the
# four Llama-3.1-8B decode shapes; --decode-config 'default;bps=3;waves=2' times each decode shape once per
# launch config (kernels/attention.h, AttentionDecodeConfig), each checked first.
#   usage: [OUT=DIR] bench/attention/device-attention.sh [--set protocol|llama|decode|backward|all]
#                                                        [--samples N] [--batch-ms T] [--decode-config LIST]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/attention-out}"
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
set_name=all samples=5 batch_ms=100 decode_config=default
while [ $# -gt 0 ]; do
  case "$1" in
    --set) set_name=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --batch-ms) batch_ms=$2; shift 2 ;;
    --decode-config) decode_config=$2; shift 2 ;;
    *) echo "device-attention.sh: unknown option '$1' (usage: see the top of bench/attention/device-attention.sh)"; exit 2 ;;
  esac
done
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/card.txt"
if ! { cmake --preset default >"$OUT/build.log" 2>&1 &&
       cmake --build build -j"$(nproc)" --target bench_attention >>"$OUT/build.log" 2>&1; }; then
  echo "BUILD FAILED (errors from $OUT/build.log):"; grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s; ptxas C7514 warnings: $(grep -c C7514 "$OUT/build.log")"
./build/bench/attention/bench_attention --set "$set_name" --samples "$samples" --batch-ms "$batch_ms" \
  --decode-config "$decode_config" >"$OUT/ours.csv" 2>"$OUT/ours.err"
status=$?
echo "ours: $(( $(grep -c . "$OUT/ours.csv") - 1 )) shapes, exit $status ($(( $(date +%s) - t0 )) s)"
[ -s "$OUT/ours.err" ] && head -20 "$OUT/ours.err"
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/attention/bench_sdpa.py "$OUT/ours.csv" --samples "$samples" --batch-ms "$batch_ms" |
    tee "$OUT/table.txt"
else
  echo "no PyTorch here: the references are not timed; ours:"; column -s, -t "$OUT/ours.csv"
fi
echo "total: $(( $(date +%s) - t0 )) s"
exit $status
