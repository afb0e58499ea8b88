# Sixteenth session, run 3 (device tool: OUT=$OUT bash bench/gemm/s16-run3.sh), on the experiment branch
# exp-launch: variants-s16-place.txt (one build), the work placement by SM, clock and energy per variant.
# Ran on the experiment commits of the branch exp-launch (55b6a63..); its switches MP_EXP_LAUNCH_CLUSTER,
# MP_EXP_PAIR_SPREAD were removed after the runs (bench/RESULTS.md, sixteenth session).
# (The line loop, inline when it ran, is now bench/gemm/env-lines.sh.)
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh bench/gemm/variants-s16-place.txt
echo "all done $(( $(date +%s) - t0 )) s"
