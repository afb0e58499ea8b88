# Fifteenth session, run 5 (device tool: OUT=$OUT bash bench/gemm/s15-run5.sh): variants-s15-threshold.txt
# on the final code (one build of the CLI).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default >"$OUT/build.log" 2>&1 && cmake --build --preset default -j"$(nproc)" --target metapipe \
  >>"$OUT/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
while read -r args; do
  case "$args" in ''|'#'*) continue ;; esac
  printf "%-44s " "$args"
  timeout 60 ./build/tools/metapipe/metapipe gemm $args 2>&1 | grep -oE "ours: .*|cuBLAS: .*|ratio: +[0-9.]+x|FAIL.*|rel err [^,]*" | tr '\n' ' '; echo
done <bench/gemm/variants-s15-threshold.txt
echo "all done $(( $(date +%s) - t0 )) s"
