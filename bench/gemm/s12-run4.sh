# Twelfth session, run 4 (device tool: OUT=$OUT bash bench/gemm/s12-run4.sh): GPU tests of the
# per-step descriptor build, its instruction count (Nsight Compute), and its A/B against the old build.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
( cmake -S . -B build-ab-new -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre.log 2>&1 &&
  cmake --build build-ab-new -j12 --target metapipe test_kernels_gemm_sm90 test_tile_sm90 >> $OUT/pre.log 2>&1 || echo "NEW BUILD FAILED" ) &
( cmake -S . -B build-ab-old -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_WGMMA_DESC_EACH=1 > $OUT/pre-old.log 2>&1 &&
  cmake --build build-ab-old -j4 --target metapipe >> $OUT/pre-old.log 2>&1 || echo "OLD BUILD FAILED" ) &
wait; echo "builds $(( $(date +%s) - t0 )) s"
timeout 150 ./build-ab-new/tests/kernels/test_kernels_gemm_sm90 --gtest_filter='*SmallAndOdd*:*LargeAndNonSquare*:*EverySchedule*:*PingPong*:*SplitKAndSmallM*' > $OUT/t-gemm.log 2>&1; echo "gemm tests rc=$?: $(grep -E '^\[ +(OK|FAILED|PASSED|SKIPPED) ' $OUT/t-gemm.log | tr '\n' ' ')"
timeout 60 ./build-ab-new/tests/tile/test_tile_sm90 > $OUT/t-tile.log 2>&1; echo "tile tests rc=$?: $(grep -E 'PASSED|FAILED' $OUT/t-tile.log | tr '\n' ' ')"
m=smsp__inst_executed.sum,sm__cycles_elapsed.max,gpu__time_duration.sum
for v in new old; do echo "== $v"; timeout 60 ncu -k 'regex:^kernel$' --launch-count 1 --metrics $m ./build-ab-$v/tools/metapipe/metapipe gemm 4096 4096 4096 --bt --no-time 2>&1 | grep -E "inst_exec|cycles|gpu__time"; done
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=/tmp/s12ab4 bash bench/gemm/ab.sh bench/gemm/variants-s12-desc.txt new= old=-DMP_WGMMA_DESC_EACH=1
cp /tmp/s12ab4/all.log $OUT/ab-all.log
echo "all done $(( $(date +%s) - t0 )) s"
