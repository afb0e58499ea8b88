# Twelfth session, run 3 (device tool: OUT=$OUT bash bench/gemm/s12-run3.sh): DRAM bytes and L2 hit rate
# (Nsight Compute metrics, one launch each) of ours with several tile orders and of cuBLAS, then the timed
# A/B of the orders.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
OUT=/tmp/s12ab bash bench/gemm/ab.sh bench/gemm/variants-s12-order.txt def= > $OUT/ab.txt 2>&1
cp /tmp/s12ab/all.log $OUT/ab-all.log
bin=./build-ab-def/tools/metapipe/metapipe
m=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,sm__cycles_elapsed.max,smsp__inst_executed.sum
prof() {  # label, kernel regex, gemm args
  local l=$1 re=$2; shift 2
  echo "== $l: $*"
  timeout 60 ncu -k "regex:$re" --launch-count 1 --metrics $m $bin gemm "$@" --no-time 2>&1 | grep -E "dram__|lts__|gpu__time|sm__cycles|inst_executed"
}
for s in "6144 2816 4096 --bt" "4096 4096 4096 --bt" "4096 14336 4096 --bt"; do
  prof cublas nvjet $s
  for gm in 16 1 4 8 32; do prof "ours group-m $gm" '^kernel$' $s --group-m $gm; done
done > $OUT/ncu.txt 2>&1
cat $OUT/ab.txt
echo "all done $(( $(date +%s) - t0 )) s"
