# Fifteenth session, run 3 (device tool: OUT=$OUT bash bench/gemm/s15-run3.sh): stream-K over the last
# partial wave (MP_GEMM_SK_LASTWAVE) against the default build, variants-s15-sk.txt.
export PATH=$PATH:/usr/local/cuda/bin
# Ran on the experiment commit 3de1e95 (branch exp-sk: the switch MP_GEMM_SK_LASTWAVE); the policy it led to
# is the default since (GemmSchedule::stream_k).
OUT=/tmp/s15sk bash bench/gemm/ab.sh bench/gemm/variants-s15-sk.txt base= skl=-DMP_GEMM_SK_LASTWAVE=1
cp /tmp/s15sk/all.log "$OUT/ab-all.log"
