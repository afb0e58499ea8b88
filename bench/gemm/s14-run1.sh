# Fourteenth session, run 1 (device tool: OUT=$OUT bash bench/gemm/s14-run1.sh): GPU tests of the leaner
# K step (tile/pipeline.cuh, MP_PIPELINE_LEAN), its instruction count against the thirteenth session's
# (Nsight Compute), then the A/B of bench/gemm/variants-s14-lean.txt (three builds, alternating).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
( cmake -S . -B build-ab-lean -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre-lean.log 2>&1 &&
  cmake --build build-ab-lean -j8 --target metapipe test_kernels_gemm_sm90 test_tile_sm90 test_core_gpu >> $OUT/pre-lean.log 2>&1 || echo "LEAN BUILD FAILED" ) &
( cmake -S . -B build-ab-old -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_PIPELINE_LEAN=0 > $OUT/pre-old.log 2>&1 &&
  cmake --build build-ab-old -j4 --target metapipe >> $OUT/pre-old.log 2>&1 || echo "OLD BUILD FAILED" ) &
( cmake -S . -B build-ab-bo -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_PIPELINE_BACKOFF_NS=200 > $OUT/pre-bo.log 2>&1 &&
  cmake --build build-ab-bo -j4 --target metapipe >> $OUT/pre-bo.log 2>&1 || echo "BO BUILD FAILED" ) &
wait; echo "builds $(( $(date +%s) - t0 )) s"
timeout 200 ctest --test-dir build-ab-lean -L gpu -j4 --timeout 190 --output-on-failure > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$?: $(grep -E 'tests passed|tests failed' $OUT/gpu-tests.log)"; grep -E "Failed|\*\*\*" $OUT/gpu-tests.log | head
m=smsp__inst_executed.sum,sm__cycles_elapsed.max,gpu__time_duration.sum
for v in lean old bo; do echo "== $v"; timeout 60 ncu -k 'regex:^kernel$' --launch-count 1 --metrics $m ./build-ab-$v/tools/metapipe/metapipe gemm 4096 4096 4096 --no-time 2>&1 | grep -E "inst_exec|cycles|gpu__time"; done
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=/tmp/s14ab1 bash bench/gemm/ab.sh bench/gemm/variants-s14-lean.txt lean= old=-DMP_PIPELINE_LEAN=0 bo=-DMP_PIPELINE_BACKOFF_NS=200
cp /tmp/s14ab1/all.log $OUT/ab-all.log
echo "all done $(( $(date +%s) - t0 )) s"
