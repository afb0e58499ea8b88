# Twelfth session, run 2 (device tool: OUT=$OUT bash bench/gemm/s12-run2.sh): try_wait's suspend-time
# hint (MP_WAIT_SUSPEND_NS) A/B with power figures, then Nsight Compute of both builds and cuBLAS at
# 6144 x 2816 x 4096 (issued instructions, L2 hit rate, DRAM bytes).
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
OUT=/tmp/s12ab bash bench/gemm/ab.sh bench/gemm/variants-s12-sus.txt def= sus=-DMP_WAIT_SUSPEND_NS=1000000
cp /tmp/s12ab/all.log $OUT/ab-all.log
for v in def sus; do
  p=ours; [ $v = def ] && p="ours cublas"
  OUT=/tmp/s12prof-$v BIN=./build-ab-$v/tools/metapipe/metapipe PROFILES="$p" timeout 150 bash bench/gemm/profile.sh 6144 2816 4096 --bt
  cp /tmp/s12prof-$v/profile.tgz $OUT/prof-$v.tgz
  for f in /tmp/s12prof-$v/*.details.txt; do cp $f $OUT/$v-$(basename $f); done
done
echo "all done $(( $(date +%s) - t0 )) s"
