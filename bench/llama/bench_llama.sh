#!/usr/bin/env bash
# Decode and prefill speed of `metapipe generate` against llama.cpp (PyPI llama-cpp-python, built from
# source in this benchmark's own virtual environment, never a dependency of the project) on the same
# GGUF, the same threads, greedy, the same 256-token prompt and 128 new tokens, measured back to back in
# one run and repeated. Prints a table (ours / llama.cpp / ratio) and the max resident memory of each.
#
#   bench/llama/bench_llama.sh [--threads 2] [--repeat 3] [--model FILE.gguf] [--metapipe PATH]
#
# Environment: MP_BENCH_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/metapipe/bench-llama-venv),
# LLAMA_CPP_PYTHON_SPEC (default "llama-cpp-python"; pip's version syntax, e.g. "llama-cpp-python==0.3.9").
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/metapipe
venv=${MP_BENCH_VENV:-$cache/bench-llama-venv}
spec=${LLAMA_CPP_PYTHON_SPEC:-llama-cpp-python}

threads=2 repeat=3 model="" metapipe=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --metapipe) metapipe=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench_llama.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || model=${METAPIPE_MODEL_DIR:-$cache/models}/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || { echo "bench_llama.sh: no model at $model (run scripts/install-deps)" >&2; exit 1; }
if [ -z "$metapipe" ]; then
  for b in build-cpu build; do
    [ -x "$root/$b/tools/metapipe/metapipe" ] && { metapipe=$root/$b/tools/metapipe/metapipe; break; }
  done
fi
[ -n "$metapipe" ] && [ -x "$metapipe" ] || {
  echo "bench_llama.sh: no metapipe binary (cmake --preset cpu && cmake --build build-cpu --target metapipe)" >&2
  exit 1
}

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  echo "bench_llama.sh: building $spec from source into $venv (several minutes)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # From source, for the vector ISAs a CPU like this one has (AVX-512 with VNNI/VBMI/BF16, AVX2, FMA,
  # F16C), as a user of llama.cpp here would build it. Not GGML_NATIVE: on a CPU that lists AMX but whose
  # kernel does not grant the AMX tile state to processes, -march=native's AMX kernels die with SIGILL on
  # every batch of two or more tokens (prefill). LLAMA_CPP_CMAKE_ARGS overrides the flags; no wheel cache,
  # so a wheel built with other flags is never reused.
  flags=${LLAMA_CPP_CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"}
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$venv/bin/pip" install --no-cache-dir --no-binary llama-cpp-python "$spec" numpy
fi
echo "machine load before the run: $(uptime)"
"$venv/bin/python" "$here/bench_llama.py" --model "$model" --metapipe "$metapipe" --threads "$threads" \
  --repeat "$repeat"
echo "machine load after the run: $(uptime)"
