#!/usr/bin/env bash
# Llama decode on the GPU, on the device machine: builds the metapipe binary (default preset, sm_90a),
# runs `metapipe generate --target cuda` in the three launch modes (per-op, per-layer, megakernel) on
# SmolLM2-135M (the installed GGUF when present, and its shapes with random bf16 weights) and on
# Llama-3.1-8B's shapes (random bf16), each with a KV cache of 1,024 positions: a prompt of about 900
# tokens is prefilled, then 64 tokens are decoded and timed. Then the PyTorch reference (bench_torch.py:
# the same architecture, random bf16 weights, eager and CUDA-graph decode steps at the same context)
# when torch is importable. Prints one table; ratios are against PyTorch with CUDA graphs from the same
# run. Logs under $OUT.
#   usage: [OUT=DIR] bench/llama_gpu/device-llama-gpu.sh [--tests] [--ctx N] [--no-tune]
#                    [--tunes 'LIST;LIST...'] [--only-8b] [--tp]
# --no-tune leaves out the megakernel's --gpu-tune rows; --tunes replaces the default set of them with
# the given --gpu-tune lists (separated by ';'); --only-8b leaves out the SmolLM2 rows. --tp adds
# tensor-parallel rows on Llama-3.1-8B's shapes (per-layer and megakernel): --tp 1 (NCCL, one rank),
# --tp 2 / 4 where the machine has the GPUs, and --tp 2 --tp-local (both shards on one GPU), each
# with its greedy tokens compared against the single-GPU run's.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/llama-gpu-out}"
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
tests=0 ctx=1024 with_tune=1 tunes="" only8b=0 tp=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests=1 ;;
    --ctx) ctx="$2"; shift ;;
    --no-tune) with_tune=0 ;;
    --tunes) tunes="$2"; shift ;;
    --only-8b) only8b=1 ;;
    --tp) tp=1 ;;
    *) echo "device-llama-gpu.sh: unknown option '$1' (usage: see the top of the file)"; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv | tee "$OUT/card.txt"
targets="metapipe"
[ $tests = 1 ] && targets="metapipe test_llama_gpu_sm90"
if ! { cmake --preset default >"$OUT/build.log" 2>&1 &&
       cmake --build build -j16 --target $targets >>"$OUT/build.log" 2>&1; }; then
  echo "BUILD FAILED (errors from $OUT/build.log):"; grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
if [ $tests = 1 ]; then
  ./build/tests/backends/cuda/test_llama_gpu_sm90 >"$OUT/tests.log" 2>&1
  echo "SM90_LlamaGpu: exit $? ($(grep -cE '^\[       OK' "$OUT/tests.log") passed; $OUT/tests.log)"
  grep -E "FAILED|max \|diff\||greedy" "$OUT/tests.log" | head -30
fi

mp=./build/tools/metapipe/metapipe
prompt_tokens=$(( ctx * 7 / 8 ))
text=$(python3 -c "print(('The quick brown fox jumps over the lazy dog. ' * 400)[:$prompt_tokens])")
results="$OUT/results.jsonl"
: >"$results"
run() {  # label, then metapipe generate arguments
  local label="$1"; shift
  local line
  line=$(timeout 120 $mp generate --target cuda --ctx "$ctx" -n 64 --seed 1 --json --quiet "$@" 2>>"$OUT/errors.log" | tail -1)
  if [ -n "$line" ] && [ "${line:0:1}" = "{" ]; then
    echo "{\"label\": \"$label\", \"run\": $line}" >>"$results"
  else
    echo "{\"label\": \"$label\", \"error\": \"see errors.log\"}" >>"$results"
  fi
}
have_gguf=0
$mp generate --target cuda --ctx 64 -n 1 --quiet >/dev/null 2>&1 && have_gguf=1
[ $only8b = 1 ] && have_gguf=0
for mode in per-op per-layer megakernel; do
  [ $have_gguf = 1 ] && run "smollm2-135m GGUF Q4_1 | metapipe $mode" --launch $mode \
    --prompt "$(python3 -c "print('The quick brown fox jumps over the lazy dog. ' * $(( prompt_tokens / 12 )))")"
  [ $only8b = 1 ] || run "smollm2-135m bf16 | metapipe $mode" --launch $mode --shapes smollm2-135m --prompt "$text"
  run "llama3.1-8b bf16 | metapipe $mode" --launch $mode --shapes llama3.1-8b --prompt "$text"
done
if [ $tp = 1 ]; then
  gpus=$(nvidia-smi -L | wc -l)
  for mode in per-layer megakernel; do
    run "llama3.1-8b bf16 | metapipe $mode --tp 1" --launch $mode --shapes llama3.1-8b --prompt "$text" --tp 1
    for n in 2 4; do
      [ "$gpus" -ge $n ] && run "llama3.1-8b bf16 | metapipe $mode --tp $n" --launch $mode --shapes llama3.1-8b \
        --prompt "$text" --tp $n
    done
    run "llama3.1-8b bf16 | metapipe $mode --tp 2 --tp-local" --launch $mode --shapes llama3.1-8b \
      --prompt "$text" --tp 2 --tp-local
  done
fi
# The megakernel with single tuning switches changed, and with all of them at their alternatives
# (docs/llama-gpu.md, "Speed"), to see which change moves the time.
alternatives="min-blocks=4,loads=4,prefetch-kib=all,split=two-per-worker,fetch-ahead=1,stream=4,combine=separate,slices=1"
tune_list=("$alternatives" combine=separate combine=fused slices=1 fetch-ahead=1 min-blocks=3 min-blocks=3,loads=8
           min-blocks=4,loads=4 stream=4 stream=2 min-blocks=2,loads=4 prefetch-kib=0 prefetch-kib=all split=two-per-worker)
[ -n "$tunes" ] && IFS=';' read -r -a tune_list <<<"$tunes"
[ $with_tune = 1 ] || tune_list=()
shape_list="smollm2-135m llama3.1-8b"
[ $only8b = 1 ] && shape_list="llama3.1-8b"
# per-op with the streamed GEMV: its effect without the fused modes' queue.
[ ${#tune_list[@]} -gt 0 ] && run "llama3.1-8b bf16 | metapipe per-op --gpu-tune stream=4" --launch per-op \
  --gpu-tune stream=4 --shapes llama3.1-8b --prompt "$text"
for tune in "${tune_list[@]}"; do
  label="megakernel --gpu-tune $tune"
  [ "$tune" = "$alternatives" ] && label="megakernel, every switch at its alternative"
  for shapes in $shape_list; do
    run "$shapes bf16 | metapipe $label" --launch megakernel --gpu-tune "$tune" --shapes $shapes --prompt "$text"
  done
done
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for shapes in $shape_list; do
    timeout 120 python3 bench/llama_gpu/bench_torch.py --shapes $shapes --ctx "$ctx" 2>>"$OUT/errors.log" |
      while read -r line; do echo "{\"label\": \"$shapes bf16 | torch\", \"torch\": $line}" >>"$results"; done
  done
else
  echo "torch is not importable here: the PyTorch rows are not measured" | tee -a "$OUT/errors.log"
fi

python3 - "$results" "$ctx" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
graph = {}
for r in rows:
    t = r.get("torch")
    if t and t["impl"] == "torch-cuda-graph":
        graph[t["shapes"]] = t["ms_per_token"]
print(f"\nLlama decode, batch 1, KV cache of {sys.argv[2]} positions (ms/token over 64 decoded tokens)")
print(f"| {'model':<22} | {'implementation':<26} | ms/token | tokens/s | launches/token | GB/s | vs torch graph |")
print("|" + "|".join("-" * w for w in (24, 28, 10, 10, 16, 6, 16)) + "|")
for r in rows:
    model, impl = [s.strip() for s in r["label"].split("|")]
    shapes = model.split()[0]
    if "run" in r:
        j = r["run"]
        ms, lpt, bw = j["ms_per_token"], j["launches_per_token"], j["bandwidth_gb_per_s"]
    elif "torch" in r:
        j = r["torch"]
        ms, lpt, bw = j["ms_per_token"], j.get("kernels_per_token"), None
        impl = j["impl"]
    else:
        print(f"| {model:<22} | {impl:<26} | failed (errors.log) |")
        continue
    ratio = f"{graph[shapes] / ms:.2f}x" if shapes in graph and ms else "not measured"
    f = lambda v, p: "-" if v is None else f"{v:.{p}f}"
    print(f"| {model:<22} | {impl:<26} | {f(ms, 3):>8} | {f(1e3 / ms if ms else None, 0):>8} | {f(lpt, 0):>14} | "
          f"{f(bw, 0):>4} | {ratio:>14} |")
# Tensor-parallel rows: their greedy tokens against the single-GPU run of the same mode and shapes.
single = {r["label"]: r["run"]["tokens"] for r in rows if "run" in r and "--tp" not in r["label"]}
for r in rows:
    if "run" not in r or "--tp" not in r["label"]:
        continue
    model, impl = [s.strip() for s in r["label"].split("|")]
    base = f"{model} | {impl.split(' --tp')[0]}"
    if base in single:
        same = r["run"]["tokens"] == single[base]
        print(f"{r['label']}: {r['run']['all_reduces_per_token']} all-reduces per token; tokens "
              f"{'equal' if same else 'DIFFER from'} the single-GPU run's")
EOF
echo "done in $(( $(date +%s) - t0 )) s"
