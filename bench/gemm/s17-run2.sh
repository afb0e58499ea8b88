# Seventeenth session, run 2 (device tool: OUT=$OUT bash bench/gemm/s17-run2.sh), on the experiment branch
# exp-nc3 (see env-tests-lines.sh): Nsight Compute of the default kernel and the self-fed 192-row kernel (tall0,
# tall16) at 4096^3 A·B, one launch each, then variants-s17-tall2.txt.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default -DMP_BUILD_BENCH=ON >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
bin=./build/tools/metapipe/metapipe
met=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__cycles_elapsed.max,lts__t_bytes.sum,dram__bytes_read.sum
prof() {  # name, kernel regex, env, args
  local name=$1 re=$2 envs=$3; shift 3
  env $envs timeout 200 ncu -k "regex:$re" --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --metrics $met -f -o /tmp/$name $bin gemm "$@" --no-time >/tmp/$name.log 2>&1
  echo "$name: ncu exit $?"
  ncu -i /tmp/$name.ncu-rep --page details >"$OUT/prof-$name.txt" 2>&1
  grep -E "Duration|Elapsed Cycles|SM Frequency|hmma|inst_executed|lts__t_bytes|dram__bytes|Warp Cycles Per Issued|Issued Warp" "$OUT/prof-$name.txt" | head -12
}
prof dflt '^kernel$' "" 4096 4096 4096
prof tall0 'kernel_selffed' "MP_EXP_TALL=0" 4096 4096 4096
prof tall16 'kernel_selffed' "MP_EXP_TALL=16" 4096 4096 4096
echo "profiles $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
bash bench/gemm/env-lines.sh bench/gemm/variants-s17-tall2.txt
echo "all done $(( $(date +%s) - t0 )) s"
