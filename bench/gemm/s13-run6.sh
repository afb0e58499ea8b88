# Thirteenth session, run 6 (device tool: OUT=$OUT bash bench/gemm/s13-run6.sh): the GEMM tutorial's
# single-launch timing (one launch after a synchronisation, near the maximum clock: the regime of the
# reference figures in ../shared/BENCHMARKING.md) at 8192^3 and the up-projection, besides 4096^3.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre.log 2>&1 && cmake --build build -j16 --target gemm_tutorial >> $OUT/pre.log 2>&1 || echo "BUILD FAILED"
echo "build $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
for s in "8192 8192 8192" "4096 14336 4096" "4096 4096 4096"; do
  timeout 60 ./build/docs/gemm_steps/gemm_tutorial $s > $OUT/tut.log 2>&1; echo "rc=$? $s"; grep -E "^\| (5|6|cuBLAS)" $OUT/tut.log
  cat $OUT/tut.log >> $OUT/tut-all.log
done
echo "all done $(( $(date +%s) - t0 )) s"
