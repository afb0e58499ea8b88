# Thirteenth session, run 4 (device tool: OUT=$OUT bash bench/gemm/s13-run4.sh): compute-sanitizer on the
# unrolled K loop (now the default) and on the kernels whose shared-memory carve changed with it
# (ping-pong, clusters), partial tiles throughout.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo > $OUT/pre.log 2>&1 && cmake --build build -j16 --target metapipe >> $OUT/pre.log 2>&1 || echo "BUILD FAILED"
echo "build $(( $(date +%s) - t0 )) s"
san() {  # tool, gemm args
  local tool=$1; shift
  timeout 100 compute-sanitizer --tool $tool ./build/tools/metapipe/metapipe gemm "$@" --no-time > $OUT/san.log 2>&1
  echo "$tool rc=$? [$*]: $(grep -E 'ERROR SUMMARY|rel err|not supported|error:' $OUT/san.log | head -3 | tr '\n' ' ')"
  cat $OUT/san.log >> $OUT/san-all.log
}
san memcheck 1040 2064 528 --epilogue whole
san memcheck 1040 2064 528 --bt
san memcheck 1040 2064 528 --schedule pingpong
san memcheck 2064 1040 528 --bt --cluster 2
san memcheck 128 4096 4096 --bt
san memcheck 1040 2064 528 --out f32
san synccheck 4112 4880 208 --bt
san synccheck 1040 2064 528 --schedule pingpong
san racecheck 528 1040 208 --bt
echo "all done $(( $(date +%s) - t0 )) s"
