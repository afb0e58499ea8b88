# Fourteenth session, run 6 (device tool: OUT=$OUT bash bench/gemm/s14-run6.sh): which kernel cuBLAS runs
# at 4096^3 A·B and A·Bᵀ, and its cycles, instructions and DRAM reads against ours (Nsight Compute, one
# launch each at its fixed clock).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake -S . -B build-ncu -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre.log 2>&1 &&
  cmake --build build-ncu -j16 --target metapipe >> $OUT/pre.log 2>&1 || echo "BUILD FAILED"
echo "build $(( $(date +%s) - t0 )) s"
m=sm__cycles_elapsed.max,smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
for args in "4096 4096 4096" "4096 4096 4096 --bt"; do
  echo "== $args"
  timeout 60 ncu -k 'regex:^kernel$|nvjet|sm90' --launch-count 3 --metrics $m ./build-ncu/tools/metapipe/metapipe gemm $args --no-time 2>&1 |
    grep -E "^  [a-z_].*\(|sm__cycles|inst_executed|dram__bytes|hit_rate" | cut -c1-160
done
echo "all done $(( $(date +%s) - t0 )) s"
