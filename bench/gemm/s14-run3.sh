# Fourteenth session, run 3 (device tool: OUT=$OUT bash bench/gemm/s14-run3.sh): GPU tests of the build
# that prefetches the tensor maps (K::prefetch), then the A/B of bench/gemm/variants-s14-prefetch.txt.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
( cmake -S . -B build-ab-pf -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre-pf.log 2>&1 &&
  cmake --build build-ab-pf -j10 --target metapipe test_kernels_gemm_sm90 test_tile_sm90 test_core_gpu >> $OUT/pre-pf.log 2>&1 || echo "PF BUILD FAILED" ) &
( cmake -S . -B build-ab-nopf -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_PIPELINE_PREFETCH=0 > $OUT/pre-nopf.log 2>&1 &&
  cmake --build build-ab-nopf -j6 --target metapipe >> $OUT/pre-nopf.log 2>&1 || echo "NOPF BUILD FAILED" ) &
wait; echo "builds $(( $(date +%s) - t0 )) s"
timeout 200 ctest --test-dir build-ab-pf -L gpu -j4 --timeout 190 --output-on-failure > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$?: $(grep -E 'tests passed|tests failed' $OUT/gpu-tests.log)"; grep -E "Failed|\*\*\*" $OUT/gpu-tests.log | head
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=/tmp/s14ab3 bash bench/gemm/ab.sh bench/gemm/variants-s14-prefetch.txt pf= nopf=-DMP_PIPELINE_PREFETCH=0
cp /tmp/s14ab3/all.log $OUT/ab-all.log
echo "all done $(( $(date +%s) - t0 )) s"
