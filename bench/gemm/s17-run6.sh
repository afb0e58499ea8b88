# Seventeenth session, run 6 (device tool: OUT=$OUT bash bench/gemm/s17-run6.sh), on the experiment branch
# exp-nc3 in run 4's state: where the self-fed pipeline's warps stall, from Nsight Compute's per-SASS
# stall samples of one launch of tall0 (the default's tiling through the self-fed pipeline) and of the
# default kernel, 4096^3 A·B; the 30 most sampled instructions of each.
export PATH=$PATH:/usr/local/cuda/bin; t0=$(date +%s)
cmake --preset default >"$OUT/build.log" 2>&1 &&
  cmake --build --preset default -j"$(nproc)" --target metapipe >>"$OUT/build.log" 2>&1 ||
  { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
for v in tall0 dflt; do
  if [ $v = tall0 ]; then e=MP_EXP_TALL=0; re=kernel_selffed; else e=X=1; re='^kernel$'; fi
  env $e timeout 100 ncu -k "regex:$re" --launch-count 1 --section SourceCounters --section WarpStateStats \
    -f -o /tmp/$v ./build/tools/metapipe/metapipe gemm 4096 4096 4096 --no-time >/tmp/$v.log 2>&1
  echo "$v: ncu exit $? $(( $(date +%s) - t0 )) s"
  ncu -i /tmp/$v.ncu-rep --page source --csv --print-source sass >/tmp/$v.csv 2>/dev/null
  python3 - /tmp/$v.csv <<'PY' | tee "$OUT/stalls-$v.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
h = next(i for i, r in enumerate(rows) if any("Sampling" in c for c in r))
head = rows[h]; body = rows[h + 1:]
col = next(i for i, c in enumerate(head) if "Warp Stall Sampling (All" in c)
src = next(i for i, c in enumerate(head) if c in ("Source", "SASS"))
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
tot = sum(num(r[col]) for r in body if len(r) > col)
print("total samples", tot)
for r in sorted((r for r in body if len(r) > col), key=lambda r: -num(r[col]))[:30]:
    print(f"{num(r[col]) / tot * 100:5.1f}%  {r[src][:110]}")
PY
done
echo "all done $(( $(date +%s) - t0 )) s"
