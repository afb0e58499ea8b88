# Eleventh session, run 1 (device tool: OUT=$OUT bash bench/gemm/s11-run1.sh): the store-warp build's GPU tests
# and sanitizer checks, the tile tests, then the A/B of the whole-tile epilogue's store variants.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake -S . -B build-ab-warp -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_GEMM_STORE_WARP=1 > $OUT/pre.log 2>&1 && cmake --build build-ab-warp -j16 --target metapipe test_kernels_gemm_sm90 test_tile_sm90 >> $OUT/pre.log 2>&1 || { tail -30 $OUT/pre.log; exit 1; }
echo "pre-build $(( $(date +%s) - t0 )) s"
timeout 200 ./build-ab-warp/tests/kernels/test_kernels_gemm_sm90 > $OUT/t-gemm-warp.log 2>&1; echo "gemm tests (warp) rc=$?: $(grep -E 'PASSED|FAILED' $OUT/t-gemm-warp.log | head -5 | tr '\n' ' ')"
timeout 100 ./build-ab-warp/tests/tile/test_tile_sm90 > $OUT/t-tile.log 2>&1; echo "tile tests rc=$?: $(grep -E 'PASSED|FAILED' $OUT/t-tile.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck ./build-ab-warp/tools/metapipe/metapipe gemm 1040 2064 528 --epilogue whole --no-time > $OUT/san.log 2>&1; echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|ratio' $OUT/san.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool synccheck ./build-ab-warp/tools/metapipe/metapipe gemm 4112 4880 208 --bt --no-time > $OUT/san2.log 2>&1; echo "synccheck rc=$?: $(grep -E 'ERROR SUMMARY' $OUT/san2.log | tr '\n' ' ')"
echo "tests done $(( $(date +%s) - t0 )) s"
OUT=$OUT/ab bash bench/gemm/ab.sh bench/gemm/variants-s11.txt whole= late=-DMP_GEMM_LATE_STORE=1 warp=-DMP_GEMM_STORE_WARP=1
