"""Sixteenth session (runs 4-6, bench/RESULTS.md): split the SMs into the two L2 halves from
l2_partition_probe's latency matrix, and write placement tables (smid block lines) for the GEMM's
MP_EXP_PLACE_FILE (an experiment switch of the branch exp-launch, removed after the runs).
  usage: python3 s16-place.py PROBE_OUT PLACEMENT_LOG OUTDIR"""
import re
import sys

probe, placement, outdir = sys.argv[1:4]
rows = []
for line in open(probe):
    if '|' not in line:
        continue
    a, b = line.split('|')
    a = a.split()
    rows.append((int(a[0]), [int(x) for x in a[1:]], [int(x) for x in b.split()]))
print(f"{len(rows)} SMs probed, {len(rows[0][1])} lines")


def binar(v):
    s = sorted(v)
    med = s[len(s) // 2]
    return [1 if x > med else 0 for x in v], s[len(s) // 4], s[3 * len(s) // 4]


for which, idx in (("round 1", 1), ("round 2", 2)):
    ref, _, _ = binar(rows[0][idx])
    agree = []
    for r in rows:
        bv, lo, hi = binar(r[idx])
        ag = sum(1 for x, y in zip(bv, ref) if x == y) / len(bv)
        agree.append((r[0], ag, lo, hi))
    print(which, "agreement with block 0's SM (smid:agree:q25:q75), first 24 SMs:")
    print(" ".join(f"{s}:{a:.2f}:{lo}:{hi}" for s, a, lo, hi in agree[:24]))
    print(which, "agreement histogram:", sorted(round(a, 1) for _, a, _, _ in agree))
# halves from the second round (each SM has read every line once before it)
ref, _, _ = binar(rows[0][2])
half = {}
for r in rows:
    bv, _, _ = binar(r[2])
    ag = sum(1 for x, y in zip(bv, ref) if x == y) / len(bv)
    half[r[0]] = 0 if ag >= 0.5 else 1
h0 = sorted(s for s in half if half[s] == 0)
h1 = sorted(s for s in half if half[s] == 1)
print("half 0:", len(h0), h0)
print("half 1:", len(h1), h1)
text = open(placement).read()
m = re.search(r"plain launch, \d+ blocks, SM of blocks 2i/2i\+1: ([0-9/ ]+)", text)
order = [int(x) for pair in m.group(1).split() for x in pair.split('/')]
print("plain order:", len(order))
p0 = [s for s in order if half.get(s) == 0]
p1 = [s for s in order if half.get(s) == 1]
# halfn: half 0's SMs (in the hardware's block order) take blocks 0..n0-1, half 1's the rest: each wave's
# works split into two contiguous ranges, one per half (so each B panel is read in one half)
with open(f"{outdir}/place-halfn.txt", "w") as f:
    for i, s in enumerate(p0 + p1):
        f.write(f"{s} {i}\n")
# anti: the halves alternate block by block (every panel read in both halves)
alt = []
for i in range(max(len(p0), len(p1))):
    if i < len(p0):
        alt.append(p0[i])
    if i < len(p1):
        alt.append(p1[i])
with open(f"{outdir}/place-anti.txt", "w") as f:
    for i, s in enumerate(alt):
        f.write(f"{s} {i}\n")
# halfm: blocks whose work sits in M-tiles 0-7 of each 16 (mod 16, the default group_m) go to half 0, so
# that each wave's A panels are read in one half (works are block + 132 j: the set shifts by 4 M-tiles a
# wave and stays 8 consecutive ones)
vb0 = [v for v in range(len(order)) if v % 16 < 8]
vb1 = [v for v in range(len(order)) if v % 16 >= 8]
while len(vb0) > len(p0):
    vb1.append(vb0.pop())
while len(vb1) > len(p1):
    vb0.append(vb1.pop())
with open(f"{outdir}/place-halfm.txt", "w") as f:
    for s, v in zip(p0, vb0):
        f.write(f"{s} {v}\n")
    for s, v in zip(p1, vb1):
        f.write(f"{s} {v}\n")
# plain: the hardware's own order as a table (control for the table lookup itself)
with open(f"{outdir}/place-plain.txt", "w") as f:
    for i, s in enumerate(order):
        f.write(f"{s} {i}\n")
print("tables written")
