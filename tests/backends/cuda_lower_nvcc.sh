#!/usr/bin/env bash
# CI check of the CUDA lowering: `metapipe compile P --emit cuda` for every program of `metapipe list`,
# and for the streaming programs also with the tile ring of cp.async (MP_CUDA_LOWER_COPY=cp) and of bulk copies (at the
# default depth, and the deepest ring with two barriers per iteration), softmax on its tile path
# (MP_CUDA_LOWER_ROWS=tile; by default its rows are in registers), the bulk-copy rings filled by a
# producer warp instead of thread 0 (MP_CUDA_LOWER_PRODUCER=warp), and the previous code of all of them
# (also MP_CUDA_LOWER_STORE=scalar: 4-byte fused stores, MP_CUDA_LOWER_PREFETCH=off), then one nvcc call
# compiling all the units for sm_90a with the repository root on the include path.
# usage: cuda_lower_nvcc.sh METAPIPE NVCC REPO_ROOT
set -euo pipefail
metapipe=$1 nvcc=$2 root=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A program's line is its name indented by two spaces; parameters are indented further.
programs=$("$metapipe" list | awk '/^  [a-z_][a-z_0-9]*  / { print $1 }')
[ -n "$programs" ] || { echo "no programs listed by metapipe list" >&2; exit 1; }
units=()
for p in $programs; do
  "$metapipe" compile "$p" --emit cuda > "$work/$p.cu"
  units+=("$p.cu")
done
for p in dotproduct tpchq6 blackscholes softmax outerproduct; do
  MP_CUDA_LOWER_ROWS=tile MP_CUDA_LOWER_COPY=cp "$metapipe" compile "$p" --emit cuda > "$work/${p}_cp.cu"
  grep -q '// path: tile ring (cp.async)' "$work/${p}_cp.cu" || { echo "${p}_cp.cu: no tile ring of cp.async" >&2; exit 1; }
  units+=("${p}_cp.cu")
  MP_CUDA_LOWER_ROWS=tile MP_CUDA_LOWER_COPY=bulk MP_CUDA_LOWER_RING=4096 MP_CUDA_LOWER_BARRIERS=2 "$metapipe" compile \
    "$p" --emit cuda > "$work/${p}_bulk_deep.cu"
  MP_CUDA_LOWER_ROWS=tile "$metapipe" compile "$p" --emit cuda > "$work/${p}_tile.cu"
  MP_CUDA_LOWER_ROWS=tile MP_CUDA_LOWER_STORE=scalar MP_CUDA_LOWER_PREFETCH=off "$metapipe" compile "$p" --emit cuda \
    > "$work/${p}_scalar.cu"
  MP_CUDA_LOWER_ROWS=tile MP_CUDA_LOWER_PRODUCER=warp "$metapipe" compile "$p" --emit cuda > "$work/${p}_warp.cu"
  units+=("${p}_tile.cu" "${p}_scalar.cu" "${p}_warp.cu")
  grep -q '; filled by a producer warp' "$work/${p}_warp.cu" || { echo "${p}_warp.cu: no producer warp" >&2; exit 1; }
  if grep -q '; filled by a producer warp' "$work/${p}_tile.cu"; then
    echo "${p}_tile.cu: a producer warp without MP_CUDA_LOWER_PRODUCER=warp" >&2
    exit 1
  fi
  for u in "${p}_tile" "${p}_bulk_deep"; do
    grep -q '// path: tile ring (bulk copies (TMA))' "$work/$u.cu" || { echo "$u.cu: no tile ring of bulk copies" >&2; exit 1; }
  done
  units+=("${p}_bulk_deep.cu")
done
# The bf16 matmul on the tile layer's pipeline (the unit includes tile/tile.cuh) at two tile shapes.
for t in "MM=128 NN=256" "MM=64 NN=64"; do
  u="matmul_wgmma_${t// /_}"
  "$metapipe" compile matmul --set dtype=bf16 --set M=512 --set N=512 --set K=512 --set "${t% *}" --set "${t#* }" \
    --emit cuda > "$work/${u//=/}.cu"
  grep -q "// path: the tile layer's pipeline" "$work/${u//=/}.cu" || { echo "$u: not on the tile pipeline" >&2; exit 1; }
  units+=("${u//=/}.cu")
done
# The bf16 flash_attention statement on the tile layer's attention pipeline: d128 with 128 x 128 tiles, no
# mask nor dropout (the bench's shape), and d64 with 64 x 64 tiles, causal, dropout and partial tiles.
for t in "S=4096 D=128 BR=128 BC=128 causal=0 p_drop=0" "S=1000 D=64 BR=64 BC=64 causal=1 p_drop=0.1 mask=1"; do
  u="flash_wgmma_$(echo "$t" | cut -d' ' -f2-4 | tr -d '= ' )"
  sets=()
  for a in $t; do sets+=(--set "$a"); done
  "$metapipe" compile flash_attention --set dtype=bf16 "${sets[@]}" --emit cuda > "$work/$u.cu"
  grep -q "// path: the tile layer's wgmma attention pipeline" "$work/$u.cu" || { echo "$u: not on the attention pipeline" >&2; exit 1; }
  units+=("$u.cu")
done
cd "$work"
# The tile layer's headers need the arch-specific target and relaxed constexpr, as its own build does.
"$nvcc" -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++20 -I"$root" -c "${units[@]}" \
  > nvcc.log 2>&1 || { cat nvcc.log >&2; exit 1; }
cat nvcc.log
# ptxas's C7514: the wgmma of a unit would each wait for the one before (docs/development.md).
if grep -q C7514 nvcc.log; then echo "a lowered unit's wgmma are serialized (ptxas C7514)" >&2; exit 1; fi
for u in "${units[@]}"; do
  [ -s "${u%.cu}.o" ] || { echo "nvcc produced no object for ${u%.cu}" >&2; exit 1; }
done
grep -q '// path: rows in registers' "$work/softmax.cu" || { echo "softmax.cu: not rows in registers" >&2; exit 1; }
echo "compiled ${#units[@]} lowered units for sm_90a: $programs, the streaming ones with bulk copies, the wgmma matmul and attention"
