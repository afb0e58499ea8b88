#!/usr/bin/env python3
"""Differential check of `metapipe systolic` against SCALE-Sim v2 on random layers and configs.

Not run by CI (it needs SCALE-Sim): pip install scalesim==2.0.2 into a virtual environment, then
    python3 tests/systolic/scalesim_diff.py --python VENV/bin/python --metapipe build/tools/metapipe/metapipe \
        --seed 1 --cases 30 --mode CALC --size small
Every case writes a config and a topology, runs both tools, and compares the three reports byte for byte.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys

SIZES = {  # array sides, max GEMM side, max IFMAP side, max filters
    'tiny': ([1, 2, 3], 70, 24, 20),
    'small': ([2, 3, 4, 5, 6, 8, 16], 70, 24, 20),
    'big': ([2, 3, 4, 7, 8, 12, 16, 32], 200, 40, 40),
}
REPORTS = ['COMPUTE_REPORT', 'BANDWIDTH_REPORT', 'DETAILED_ACCESS_REPORT']


def case_files(rng, name, mode, size):
    sides, gmax, imax, fmax = SIZES[size]
    cfg = '\n'.join([
        '[general]', f'run_name = {name}', '', '[architecture_presets]',
        f'ArrayHeight: {rng.choice(sides)}', f'ArrayWidth: {rng.choice(sides)}',
        f'IfmapSramSzkB: {rng.choice([1, 2, 4, 64])}', f'FilterSramSzkB: {rng.choice([1, 2, 4, 64])}',
        f'OfmapSramSzkB: {rng.choice([1, 2, 4, 64])}', 'IfmapOffset: 0', 'FilterOffset: 10000000',
        'OfmapOffset: 20000000', f"Dataflow : {rng.choice(['ws', 'os', 'is'])}",
        f'Bandwidth : {rng.choice([1, 2, 5, 10, 32])}', '', '[run_presets]', f'InterfaceBandwidth: {mode}', ''])
    gemm = rng.random() < 0.4
    rows = []
    for layer in range(rng.choice([1, 2])):
        if gemm:
            rows.append(f'L{layer}, {rng.randint(1, gmax)}, {rng.randint(1, gmax)}, {rng.randint(1, gmax)},')
        else:
            h, w = rng.randint(3, imax), rng.randint(3, imax)
            kind = 'DP' if size == 'big' and rng.random() < 0.2 else 'L'
            rows.append(f'{kind}{layer}, {h}, {w}, {rng.randint(1, min(h, 5))}, {rng.randint(1, min(w, 5))}, '
                        f'{rng.randint(1, 6)}, {rng.randint(1, fmax)}, {rng.randint(1, 3)},')
    head = 'Layer, M, N, K,' if gemm else ('Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, '
                                         'Channels, Num Filter, Strides,')
    return cfg, head + '\n' + '\n'.join(rows) + '\n', 'gemm' if gemm else 'conv'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--python', required=True, help='a Python with scalesim 2.0.2 installed')
    ap.add_argument('--metapipe', required=True, help='the metapipe binary')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--cases', type=int, default=20)
    ap.add_argument('--mode', choices=['CALC', 'USER'], default='CALC')
    ap.add_argument('--size', choices=sorted(SIZES), default='small')
    ap.add_argument('--dir', default='/tmp/scalesim_diff')
    a = ap.parse_args()
    rng = random.Random(a.seed)
    base = os.path.join(a.dir, f'seed{a.seed}')
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    compared = bad = 0
    for i in range(a.cases):
        name = f'c{i}'
        cfg, topo, kind = case_files(rng, name, a.mode, a.size)
        cfg_path, topo_path = os.path.join(base, name + '.cfg'), os.path.join(base, name + '.csv')
        open(cfg_path, 'w').write(cfg)
        open(topo_path, 'w').write(topo)
        try:
            ref = subprocess.run([a.python, '-m', 'scalesim.scale', '-c', cfg_path, '-t', topo_path, '-i', kind,
                                  '-p', os.path.join(base, 'ref')], capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            print(name, 'SCALE-Sim timed out; skipped')
            continue
        if not os.path.exists(os.path.join(base, 'ref', name, 'COMPUTE_REPORT.csv')):
            print(name, 'SCALE-Sim failed; skipped:', ref.stderr[-200:])
            continue
        ours = subprocess.run([a.metapipe, 'systolic', '-c', cfg_path, '-t', topo_path, '-i', kind, '-p',
                               os.path.join(base, 'ours')], capture_output=True, text=True)
        compared += 1
        if ours.returncode != 0:
            bad += 1
            print(name, 'metapipe failed:', ours.stdout[-300:], ours.stderr[-300:])
            continue
        for r in REPORTS:
            want = open(os.path.join(base, 'ref', name, r + '.csv')).read()
            got = open(os.path.join(base, 'ours', name, r + '.csv')).read()
            if want != got:
                bad += 1
                print(name, r, 'differs\n  SCALE-Sim:', want.splitlines()[1:], '\n  metapipe: ', got.splitlines()[1:])
                break
    print(f'seed {a.seed}: {compared} cases compared, {bad} differ')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
