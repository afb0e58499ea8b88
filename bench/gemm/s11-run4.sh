# Eleventh session, run 4 (device tool: OUT=$OUT bash bench/gemm/s11-run4.sh): the stream-K GPU tests
# (fixed reducer, whole-tile epilogue), then the stream-K A/B (variants-s11-sk.txt).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake -S . -B build-ab-base -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS= > $OUT/pre.log 2>&1 && cmake --build build-ab-base -j16 --target metapipe test_kernels_gemm_sm90 >> $OUT/pre.log 2>&1 || { tail -30 $OUT/pre.log; exit 1; }
echo "pre-build $(( $(date +%s) - t0 )) s"
timeout 300 ./build-ab-base/tests/kernels/test_kernels_gemm_sm90 --gtest_filter='*StreamK*:*Epilogues*' > $OUT/t-gemm.log 2>&1; echo "gemm tests rc=$?: $(grep -E 'PASSED|FAILED|OK \]' $OUT/t-gemm.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck ./build-ab-base/tools/metapipe/metapipe gemm 2320 2576 400 --stream-k 1 --no-time > $OUT/san.log 2>&1; echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' $OUT/san.log)"
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=$OUT/ab bash bench/gemm/ab.sh bench/gemm/variants-s11-sk.txt base=
