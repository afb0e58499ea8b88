# Thirteenth session, run 3 (device tool: OUT=$OUT bash bench/gemm/s13-run3.sh): a second bench_gemm run
# on the default (unrolled) kernels, then the A/B of variants-s13-unroll.txt against the rolled loop.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
( cmake -S . -B build-ab-unr -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre-unr.log 2>&1 &&
  cmake --build build-ab-unr -j10 --target metapipe bench_gemm >> $OUT/pre-unr.log 2>&1 || echo "UNR BUILD FAILED" ) &
( cmake -S . -B build-ab-roll -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_FLAGS=-DMP_PIPELINE_STAGE_UNROLL=0 > $OUT/pre-roll.log 2>&1 &&
  cmake --build build-ab-roll -j6 --target metapipe >> $OUT/pre-roll.log 2>&1 || echo "ROLL BUILD FAILED" ) &
wait; echo "builds $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
timeout 240 ./build-ab-unr/bench/gemm/bench_gemm --layout both --schedule cooperative --samples 12 > $OUT/bench.log 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -A16 "^| M x N" $OUT/bench.log
OUT=/tmp/s13ab3 bash bench/gemm/ab.sh bench/gemm/variants-s13-unroll.txt unr= roll=-DMP_PIPELINE_STAGE_UNROLL=0
cp /tmp/s13ab3/all.log $OUT/ab-all.log
echo "all done $(( $(date +%s) - t0 )) s"
