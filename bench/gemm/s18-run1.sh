# Eighteenth session, run 1 (device tool: OUT=$OUT bash bench/gemm/s18-run1.sh), at commit 7f9c02f, where the
# L2 priorities were the environment switch MP_EXP_L2 (A + 4 B + 16 C; 0 none, 1 evict_first, 2 evict_last;
# now `metapipe gemm --l2`): build, the GEMM GPU tests under two settings, variants-s18-l2.txt, then
# Nsight Compute's DRAM and L2 bytes of one 4096^3 A·B launch under four of them.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
bash bench/gemm/env-tests-lines.sh bench/gemm/variants-s18-l2.txt MP_EXP_L2=22 MP_EXP_L2=41
bin=./build/tools/metapipe/metapipe
met=sm__cycles_elapsed.max,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum
for h in 0 16 18 22; do
  MP_EXP_L2=$h timeout 120 ncu -k "regex:^kernel$" --launch-count 1 --metrics $met $bin gemm 4096 4096 4096 --no-time \
    >"$OUT/ncu-l2-$h.txt" 2>&1
  echo "ncu MP_EXP_L2=$h exit $?: $(grep -E "dram__bytes|lts__t_bytes|hit_rate|cycles_elapsed|duration" "$OUT/ncu-l2-$h.txt" | awk '{print $1, $(NF-1), $NF}' | tr '\n' ' ')"
done
echo "all done $(( $(date +%s) - t0 )) s"
