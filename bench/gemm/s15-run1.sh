# Fifteenth session, run 1 (device tool: OUT=$OUT bash bench/gemm/s15-run1.sh): four builds at once
# (trace, base, per-warpgroup release, no multicast; all with MP_GEMM_CLUSTER_WHOLE), then the timelines
# of variants-s15-trace.txt and the A/B of variants-s15-cluster.txt.
# Ran on the experiment commit 6c88b45 (branch exp-cluster); its switches were removed after the runs.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
CW=-DMP_GEMM_CLUSTER_WHOLE=1
build() {
  cmake -S . -B "build-ab-$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CUDA_FLAGS=$2" >"$OUT/pre-$1.log" 2>&1 &&
    cmake --build "build-ab-$1" -j4 --target metapipe >>"$OUT/pre-$1.log" 2>&1 || echo "$1: BUILD FAILED"
}
build tr "$CW -DMP_PIPELINE_TRACE=1" & build base "$CW" & build wg "$CW -DMP_PIPELINE_CLUSTER_ARRIVE=1" &
build nomc "$CW -DMP_GEMM_CLUSTER_NOMC=1" & wait
echo "builds $(( $(date +%s) - t0 )) s"
OUT=/tmp/s15tr bash bench/gemm/ab.sh bench/gemm/variants-s15-trace.txt "tr=$CW -DMP_PIPELINE_TRACE=1"
cp /tmp/s15tr/all.log "$OUT/trace-all.log"
OUT=/tmp/s15ab bash bench/gemm/ab.sh bench/gemm/variants-s15-cluster.txt "base=$CW" \
  "wg=$CW -DMP_PIPELINE_CLUSTER_ARRIVE=1" "nomc=$CW -DMP_GEMM_CLUSTER_NOMC=1"
cp /tmp/s15ab/all.log "$OUT/ab-all.log"
echo "all done $(( $(date +%s) - t0 )) s"
