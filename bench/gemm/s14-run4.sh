# Fourteenth session, run 4 (device tool: OUT=$OUT bash bench/gemm/s14-run4.sh): scripts/device-check on
# the final code (GPU tests, demo, SASS, bench_gemm, gemm_tutorial), then longer medians at 4096^3 with
# the same build (20 samples of ~200 ms each for ours and for cuBLAS, alternating).
t0=$(date +%s)
bash scripts/device-check --bench-filter 'bench_gemm|gemm_tutorial' > $OUT/device-check.out 2>&1
echo "device-check rc=$? $(( $(date +%s) - t0 )) s"
for args in "4096 4096 4096" "4096 4096 4096 --bt" "4096 4096 4096" "4096 4096 4096 --bt" "4096 4096 4096"; do
  printf "%-24s " "$args"
  timeout 60 ./build/tools/metapipe/metapipe gemm $args --samples 20 2>&1 | grep -oE "ours: .*|cuBLAS: .*|ratio: +[0-9.]+x|FAIL.*|rel err [^,]*" | tr '\n' ' '; echo
done
echo "all done $(( $(date +%s) - t0 )) s"
