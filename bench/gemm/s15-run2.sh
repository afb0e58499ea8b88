# Fifteenth session, run 2 (device tool: OUT=$OUT bash bench/gemm/s15-run2.sh): the cluster builds of run 1
# (base, per-warpgroup release) on variants-s15-group.txt (cluster tile groups of single blocks' size).
# Ran on the experiment commit 6c88b45 (branch exp-cluster); its switches were removed after the runs.
export PATH=$PATH:/usr/local/cuda/bin
CW=-DMP_GEMM_CLUSTER_WHOLE=1
OUT=/tmp/s15g bash bench/gemm/ab.sh bench/gemm/variants-s15-group.txt "base=$CW" "wg=$CW -DMP_PIPELINE_CLUSTER_ARRIVE=1"
cp /tmp/s15g/all.log "$OUT/ab-all.log"; cp /tmp/s15g/build-*.log "$OUT"/ 2>/dev/null
