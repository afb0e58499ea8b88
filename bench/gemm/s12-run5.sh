# Twelfth session, run 5 (device tool: OUT=$OUT bash bench/gemm/s12-run5.sh): the ring-address A/B, then
# scripts/device-check on the final tree (GPU tests, SASS, demo, bench_gemm and the tutorial).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
OUT=/tmp/s12ab5 bash bench/gemm/ab.sh bench/gemm/variants-s12-ring.txt hoist= remat=-DMP_PIPELINE_REMAT_RING=1
cp /tmp/s12ab5/all.log $OUT/ab-all.log
echo "ab done $(( $(date +%s) - t0 )) s"
OUT=/tmp/dc timeout 420 scripts/device-check --bench-filter 'bench_gemm|gemm_tutorial' > $OUT/device-check.txt 2>&1
echo "device-check rc=$? $(( $(date +%s) - t0 )) s"
cp /tmp/dc/summary.txt /tmp/dc/bench.log /tmp/dc/gpu-tests.log $OUT/ 2>/dev/null
tail -60 /tmp/dc/summary.txt
