# Fourteenth session, run 5 (device tool: OUT=$OUT bash bench/gemm/s14-run5.sh): the A/B of
# bench/gemm/variants-s14-exit.txt (two builds of the CLI, alternating line by line).
t0=$(date +%s)
OUT=/tmp/s14ab5 bash bench/gemm/ab.sh bench/gemm/variants-s14-exit.txt rd= all=-DMP_PIPELINE_EXIT_READ=0
cp /tmp/s14ab5/all.log $OUT/ab-all.log
echo "all done $(( $(date +%s) - t0 )) s"
