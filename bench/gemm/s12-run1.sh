# Twelfth session, run 1 (device tool: OUT=$OUT bash bench/gemm/s12-run1.sh): the MP_GEMM_CLUSTER_WHOLE
# build's GPU tests and sanitizer checks, its A/B against the default in the same build, then Nsight
# Compute of ours and cuBLAS at 6144 x 2816 x 4096 (L2 hit rate, DRAM bytes).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
( cmake -S . -B build-ab-cw -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_GEMM_CLUSTER_WHOLE=1 > $OUT/pre.log 2>&1 &&
  cmake --build build-ab-cw -j10 --target metapipe test_kernels_gemm_sm90 >> $OUT/pre.log 2>&1 || echo "CW BUILD FAILED" ) &
( cmake --preset default > $OUT/pre-default.log 2>&1 && cmake --build --preset default -j6 --target metapipe >> $OUT/pre-default.log 2>&1 || echo "DEFAULT BUILD FAILED" ) &
wait
echo "pre-build $(( $(date +%s) - t0 )) s"; grep -c "error" $OUT/pre.log
timeout 120 ./build-ab-cw/tests/kernels/test_kernels_gemm_sm90 --gtest_filter='*Epilogues*:*EverySchedule*' > $OUT/t-gemm-cw.log 2>&1; echo "gemm tests (cw) rc=$?: $(grep -E '^\[ +(OK|FAILED|PASSED|SKIPPED) ' $OUT/t-gemm-cw.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck ./build-ab-cw/tools/metapipe/metapipe gemm 1040 2064 528 --cluster 2 --epilogue whole --no-time > $OUT/san.log 2>&1; echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|rel err' $OUT/san.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool synccheck ./build-ab-cw/tools/metapipe/metapipe gemm 4112 4880 208 --bt --cluster 2 --epilogue whole --no-time > $OUT/san2.log 2>&1; echo "synccheck rc=$?: $(grep -E 'ERROR SUMMARY' $OUT/san2.log | tr '\n' ' ')"
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=$OUT/ab bash bench/gemm/ab.sh bench/gemm/variants-next-cluster-whole.txt cw=-DMP_GEMM_CLUSTER_WHOLE=1
echo "ab done $(( $(date +%s) - t0 )) s"
OUT=$OUT/prof PROFILES="ours cublas" timeout 200 bash bench/gemm/profile.sh 6144 2816 4096 --bt
echo "all done $(( $(date +%s) - t0 )) s"
