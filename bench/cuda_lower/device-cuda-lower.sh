#!/usr/bin/env bash
# Every registered program through the CUDA lowering (metapipe run PROGRAM --target cuda) at sizes past
# the H200's L2 where the CPU reference check stays affordable; prints the device time of the program's
# kernels and, for the streaming programs, the bandwidth achieved (bytes the IR loads and stores, from
# `metapipe compile`'s work summary, over the device time) and its share of the copy bandwidth measured
# in the same run. Needs the default preset build (build/).
#   usage: bench/cuda_lower/device-cuda-lower.sh [--only REGEX] [--variants [LIST]] [METAPIPE]
# --only: the cases whose program name matches REGEX (grep -E), e.g. 'dotproduct|tpchq6'.
# --variants: the streaming programs only, once per variant of the lowering's speed options
# (docs/cuda-lowering.md, "Speed"), each row labelled with its variant. LIST is ';'-separated, each
# variant a space-separated list of NAME=VALUE for the MP_CUDA_LOWER_* variables ("default": none set;
# NAME one of RING, THREADS, FUSE, BARRIERS, COPY, ROWS, STORE, PREFETCH, PRODUCER, MATH); at most 4. Default list:
# default; RING=off; RING=128; THREADS=256. COPY=cp fills the tile ring with cp.async instead of bulk copies
# (TMA); ROWS=tile, STORE=scalar and PREFETCH=off restore softmax's tile path, the fused StoreTiles' 4-byte
# stores and the inner loops' tile loads without prefetch, e.g. --only 'softmax|outerproduct' --variants
# "default;ROWS=tile;STORE=scalar PREFETCH=off;ROWS=tile STORE=scalar PREFETCH=off". PRODUCER=warp fills
# a ring of bulk copies by a producer warp of its own instead of thread 0 between block barriers (the
# default), e.g. --variants "default;PRODUCER=warp".
set -uo pipefail
cd "$(dirname "$0")/../.."
variants="" only=""
if [ "${1:-}" = "--only" ]; then
  [ $# -ge 2 ] || { echo "device-cuda-lower.sh: --only needs a regular expression"; exit 2; }
  only="$2"; shift 2
fi
if [ "${1:-}" = "--variants" ]; then
  shift
  variants="default;RING=off;RING=128;THREADS=256"
  if [ $# -gt 0 ] && [[ "$1" != */* ]]; then variants="$1"; shift; fi
fi
mp="${1:-./build/tools/metapipe/metapipe}"
[ -x "$mp" ] || { echo "device-cuda-lower.sh: no $mp (build with cmake --preset default first)"; exit 2; }
IFS=';' read -r -a vlist <<<"${variants:-default}"
if [ "${#vlist[@]}" -gt 4 ]; then
  echo "device-cuda-lower.sh: at most 4 variants (each costs an NVRTC compile per program), got ${#vlist[@]}"
  exit 2
fi
for v in "${vlist[@]}"; do
  for a in $v; do
    [ "$a" = default ] && continue
    [[ "$a" =~ ^(RING|THREADS|FUSE|BARRIERS|COPY|ROWS|STORE|PREFETCH|PRODUCER|MATH)=[A-Za-z0-9]+$ ]] || {
      echo "device-cuda-lower.sh: variant '$v': '$a' is not RING=..., THREADS=..., FUSE=..., BARRIERS=..., COPY=..., ROWS=..., STORE=..., PREFETCH=..., PRODUCER=... or MATH=... (or default)"
      exit 2
    }
  done
done
# program | --set arguments | streaming (1: report bandwidth). Tile sizes keep a block's tiles near a
# third of an SM's shared memory, so that blocks on one SM overlap each other's loads and compute
# (tpchq6's four 4096-element tiles: 64 KiB). The streaming programs run a second time at smaller tiles:
# their loads go through the lowering's tile ring (cp.async; bulk copies with COPY=bulk), whose depth
# grows as a tile shrinks (2 slots of 64 KiB, or 3-4 of 16-32 KiB and more blocks per SM); the unit's
# comment says which path and depth.
# Then dotproduct, tpchq6, blackscholes, softmax and outerproduct at four times the size (0.5-1 GB a
# pass): the figures at both sizes separate the per-pass fixed cost from the streaming rate.
cases=(
  "softmax|R=16384 C=1024 mask=1 row_tile=16|1"
  "dotproduct|N=16777216 TS=8192|1"
  "tpchq6|N=16777216 TS=4096|1"
  "blackscholes|N=8388608 TS=4096|1"
  "softmax|R=16384 C=1024 mask=1 row_tile=4|1"
  "dotproduct|N=16777216 TS=2048|1"
  "tpchq6|N=16777216 TS=1024|1"
  "blackscholes|N=8388608 TS=1024|1"
  "dotproduct|N=67108864 TS=8192|1"
  "tpchq6|N=67108864 TS=4096|1"
  "blackscholes|N=33554432 TS=4096|1"
  "softmax|R=65536 C=1024 mask=1 row_tile=16|1"
  "outerproduct|M=16384 N=16384 TM=64 TN=256|1"
  "outerproduct|M=8192 N=8192 TM=64 TN=256|1"
  "matmul|M=1024 N=1024 K=1024 MM=64 NN=64|0"
  "matmul|M=1024 N=1024 K=1024 MM=64 NN=64 dtype=bf16|0"
  "matmul|M=4096 N=4096 K=4096 MM=128 NN=256 dtype=bf16|0"
  "matmul|M=4096 N=4096 K=4096 MM=128 NN=128 dtype=bf16|0"
  "gemm|M=512 N=512 K=512 MM=64 NN=64 KK=64|0"
  "gemm|M=4096 N=4096 K=4096 MM=128 NN=256 KK=64 dtype=bf16|0"
  "flash_attention|S=2048 D=128 BR=64 BC=64|0"
  "flash_attention|S=4096 D=128 BR=128 BC=128 causal=0 p_drop=0 dtype=bf16|0"
  "flash_attention|S=4096 D=128 BR=128 BC=128 causal=1 p_drop=0 dtype=bf16|0"
  "flash_attention|S=4096 D=128 BR=64 BC=128 causal=0 p_drop=0 dtype=bf16|0"
  "flash_attention|S=4096 D=128 BR=64 BC=128 causal=1 p_drop=0 dtype=bf16|0"
  "gda|R=65536 C=32 TR=512|0"
  "kmeans|N=65536 PT=1024|0"
  "llama_decoder||0"
)
# The bf16 matmul and gemm rows take the lowering's wgmma path (the tile layer's pipeline); the 4096^3 ones are
# compared at the end with the hand-written tile GEMM on the same shape (metapipe gemm, B stored K x N as
# the program stores it), timed in batches of about the same length (2 ms) as --repeat's 10 passes.
# The bf16 flash_attention rows at S=4096 take the lowering's wgmma attention pipeline; they are compared
# at the end with the hand-written attention forward on the same shape (metapipe attention, one batch and
# head, d128, causal or not as the row), median of 20 batches.
# The reference of the same run: a device-to-device copy's bandwidth (read + write of 2 GiB), measured
# with PyTorch where $PYTHON (default python3) has it.
py="${PYTHON:-python3}"
copy=$("$py" - 2>/dev/null <<'PY'
import torch
src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best = float("inf")
for _ in range(5):
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    best = min(best, start.elapsed_time(end) / 10)
print(f"{2 * src.numel() * 2 / (best * 1e-3) / 1e9:.0f}")
PY
)
if [ -n "$copy" ]; then
  echo "HBM copy bandwidth (2 GiB read + write, PyTorch): $copy GB/s"
else
  echo "HBM copy bandwidth: not measured (set PYTHON to a Python with PyTorch and CUDA)"
fi
printf "%-16s %-44s %-22s %-6s %12s %12s %8s\n" program sets variant check "device ms" "GB/s" "% copy"
status=0
mm4096=()
fa4096=()
for v in "${vlist[@]}"; do
 envs=()
 for a in $v; do [ "$a" = default ] || envs+=("MP_CUDA_LOWER_$a"); done
 for c in "${cases[@]}"; do
  IFS='|' read -r prog sets stream <<<"$c"
  [ -n "$variants" ] && [ "$stream" != 1 ] && continue
  [ -n "$only" ] && ! grep -qE "$only" <<<"$prog" && continue
  args=()
  for s in $sets; do args+=(--set "$s"); done
  json=$(env "${envs[@]}" "$mp" run "$prog" --target cuda --seed 1 --repeat 20 --json "${args[@]}" 2>&1)
  rc=$?
  ms=$(sed -n 's/.*"target": "cuda", "ok": \(true\|false\), "ms": \([0-9.e+-]*\).*/\2/p' <<<"$json")
  ok=$([ $rc -eq 0 ] && echo ok || echo FAIL)
  [ $rc -eq 0 ] || status=1
  bw="-" share="-"
  if [ "$stream" = 1 ] && [ -n "$ms" ]; then
    bytes=$("$mp" compile "$prog" "${args[@]}" | sed -n 's/.* \([0-9]*\) bytes loaded, \([0-9]*\) bytes stored.*/\1 \2/p')
    bw=$(awk -v b="$bytes" -v ms="$ms" 'BEGIN { split(b, x, " "); printf "%.1f", (x[1] + x[2]) / (ms * 1e6) }')
    [ -n "$copy" ] && share=$(awk -v bw="$bw" -v c="$copy" 'BEGIN { printf "%.0f", 100 * bw / c }')
  fi
  printf "%-16s %-44s %-22s %-6s %12s %12s %8s\n" "$prog" "${sets:-defaults}" "${v// /,}" "$ok" "${ms:--}" "$bw" "$share"
  if [[ "$prog" =~ ^(matmul|gemm)$ ]] && [[ "$sets" == "M=4096 N=4096 K=4096 "*"dtype=bf16" ]] && [ -n "$ms" ]; then
    mm4096+=("$prog ${sets#M=4096 N=4096 K=4096 }|$ms")
  fi
  if [ "$prog" = flash_attention ] && [[ "$sets" == "S=4096 D=128 "*"dtype=bf16" ]] && [ -n "$ms" ]; then
    tiles=$(sed -n 's/.*\(BR=[0-9]* BC=[0-9]*\).*/\1/p' <<<"$sets")
    fa4096+=("$([[ "$sets" == *causal=1* ]] && echo causal || echo full)|$ms|$tiles")
  fi
  [ $rc -eq 0 ] || echo "  $(tail -1 <<<"$json")"
 done
done
declare -A fa_hand
for mask in full causal; do
  flag=()
  [ "$mask" = causal ] && flag=(--causal)
  printf '%s\n' "${fa4096[@]}" | grep -q "^$mask|" || continue
  a=$("$mp" attention --batch 1 --heads 1 --seq 4096 --dim 128 "${flag[@]}" --samples 20 2>&1)
  fa_hand[$mask]=$(sed -n 's/^ours: *\([0-9.]*\) \(ms\|us\).*/\1 \2/p' <<<"$a" | awk '{ print ($2 == "us") ? $1 / 1000 : $1 }')
  echo "hand-written attention forward S=4096 d128 $mask (metapipe attention, 20 batches): ${fa_hand[$mask]:-not timed} ms"
  [ -n "${fa_hand[$mask]}" ] || { echo "  $(tail -2 <<<"$a")"; status=1; }
done
for r in "${fa4096[@]}"; do
  IFS='|' read -r mask ms tiles <<<"$r"
  hand="${fa_hand[$mask]:-}"
  [ -n "$hand" ] || continue
  awk -v m="$mask" -v ms="$ms" -v h="$hand" -v t="$tiles" \
    'BEGIN { printf "lowered flash_attention S=4096 d128 %s bf16 %s: %.4f ms, %.3fx the hand-written attention\n", m, t, ms, h / ms }'
done
if [ "${#mm4096[@]}" -gt 0 ]; then
  g=$("$mp" gemm 4096 4096 4096 --samples 20 --batch-ms 2 2>&1)
  hand=$(sed -n 's/^ours: *\([0-9.]*\) \(ms\|us\).*/\1 \2/p' <<<"$g" | awk '{ print ($2 == "us") ? $1 / 1000 : $1 }')
  echo "hand-written tile GEMM 4096^3 bf16 A*B (metapipe gemm, 20 samples of 2 ms batches): ${hand:-not timed} ms"
  [ -n "$hand" ] || { echo "  $(tail -2 <<<"$g")"; status=1; }
  for r in "${mm4096[@]}"; do
    IFS='|' read -r tiles ms <<<"$r"
    [ -n "$hand" ] && awk -v t="$tiles" -v ms="$ms" -v h="$hand" \
      'BEGIN { printf "lowered 4096^3 %s: %.4f ms, %.0f TFLOP/s, %.3fx the hand-written tile GEMM\n", t, ms, 2 * 4096^3 / (ms * 1e9), h / ms }'
  done
fi
exit $status
