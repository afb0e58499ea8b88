# Eleventh session, run 6 (device tool: OUT=$OUT bash bench/gemm/s11-run6.sh): the ring-depth A/B
# (variants-s11-stages.txt), then scripts/device-check for the GPU tests, the SASS and the benchmarks.
export PATH=$PATH:/usr/local/cuda/bin
OUT=$OUT/ab bash bench/gemm/ab.sh bench/gemm/variants-s11-stages.txt base= cap3=-DMP_GEMM_MAX_STAGES=3
rm -rf build-ab-base build-ab-cap3
OUT=$OUT/check bash scripts/device-check --bench-filter 'bench_gemm|gemm_tutorial' > /dev/null 2>&1; cat $OUT/check/summary.txt
