# Thirteenth session, run 1 (device tool: OUT=$OUT bash bench/gemm/s13-run1.sh): GPU tests of the
# K loop unrolled by the ring depth (MP_PIPELINE_STAGE_UNROLL), its instruction count against the default
# (Nsight Compute), and the A/B of bench/gemm/variants-next-unroll.txt.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
( cmake -S . -B build-ab-unr -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_PIPELINE_STAGE_UNROLL=1 > $OUT/pre-unr.log 2>&1 &&
  cmake --build build-ab-unr -j10 --target metapipe test_kernels_gemm_sm90 >> $OUT/pre-unr.log 2>&1 || echo "UNR BUILD FAILED" ) &
( cmake -S . -B build-ab-def -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre-def.log 2>&1 &&
  cmake --build build-ab-def -j6 --target metapipe >> $OUT/pre-def.log 2>&1 || echo "DEF BUILD FAILED" ) &
wait; echo "builds $(( $(date +%s) - t0 )) s"
timeout 200 ./build-ab-unr/tests/kernels/test_kernels_gemm_sm90 > $OUT/t-gemm.log 2>&1; echo "gemm tests rc=$?: $(grep -E '^\[ +(FAILED|PASSED|SKIPPED) ' $OUT/t-gemm.log | tr '\n' ' ')"
m=smsp__inst_executed.sum,sm__cycles_elapsed.max,gpu__time_duration.sum
for v in unr def; do echo "== $v"; timeout 60 ncu -k 'regex:^kernel$' --launch-count 1 --metrics $m ./build-ab-$v/tools/metapipe/metapipe gemm 4096 4096 4096 --bt --no-time 2>&1 | grep -E "inst_exec|cycles|gpu__time"; done
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=/tmp/s13ab1 bash bench/gemm/ab.sh bench/gemm/variants-next-unroll.txt def= unr=-DMP_PIPELINE_STAGE_UNROLL=1
cp /tmp/s13ab1/all.log $OUT/ab-all.log
echo "all done $(( $(date +%s) - t0 )) s"
