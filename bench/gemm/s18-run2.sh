# Eighteenth session, run 2 (device tool: OUT=$OUT bash bench/gemm/s18-run2.sh), at commit 27f4ed4: build
# the CLI with the L2 priorities as a schedule option (--l2), Nsight Compute's DRAM and L2 bytes of one 4096^3 A·B launch for
# three more combinations, then variants-s18-l2b.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
bin=./build/tools/metapipe/metapipe
met=sm__cycles_elapsed.max,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum
for v in "--l2 first,first,first" "--l2 normal,first,first" "--l2 last,last,first" "--group-m 32" "--group-m 32 --l2 none"; do
  timeout 120 ncu -k "regex:^kernel$" --launch-count 1 --metrics $met $bin gemm 4096 4096 4096 --no-time $v \
    >"$OUT/ncu.txt" 2>&1
  echo "ncu $v exit $?: $(grep -E "dram__bytes|lts__t_bytes|hit_rate|cycles_elapsed|duration" "$OUT/ncu.txt" | awk '{print $1, $(NF-1), $NF}' | tr '\n' ' ')"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh bench/gemm/variants-s18-l2b.txt
echo "all done $(( $(date +%s) - t0 )) s"
