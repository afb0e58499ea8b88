# Sixteenth session, run 6 (device tool: OUT=$OUT bash bench/gemm/s16-run6.sh), on the experiment branch
# (exp-launch, whose MP_EXP_* switches were removed after the runs; runs 4 and 5 ran earlier states of
# the probe, which failed: bench/RESULTS.md): the L2-half probe, placement tables from it
# (s16-place.py), then variants-s16-half.txt.
# (The line loop, inline when it ran, is now bench/gemm/env-lines.sh.)
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/l2probe bench/gemm/l2_partition_probe.cu &
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe cluster_occupancy >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
wait
echo "build $(( $(date +%s) - t0 )) s"
./build/bench/gemm/cluster_occupancy >"$OUT/placement.log" 2>&1
/tmp/l2probe >/tmp/probe.txt 2>&1 || { echo "probe failed"; tail -3 /tmp/probe.txt; }; head -c 400 /tmp/probe.txt; echo
mkdir -p /tmp/pl && python3 bench/gemm/s16-place.py /tmp/probe.txt "$OUT/placement.log" /tmp/pl 2>&1 | tee "$OUT/halves.txt" | cut -c1-900
cp /tmp/pl/*.txt "$OUT/" 2>/dev/null
bash bench/gemm/env-lines.sh bench/gemm/variants-s16-half.txt
echo "all done $(( $(date +%s) - t0 )) s"
