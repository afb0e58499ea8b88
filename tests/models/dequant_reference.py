#!/usr/bin/env python3
"""Rows of a GGUF file's tensors dequantized by the PyPI `gguf` package, for checking where the C++ reader
says a tensor's data is. Prints one JSON list of float lists, one per NAME:ROW argument.

    dequant_reference.py --model FILE.gguf blk.0.attn_q.weight:5 token_embd.weight:1000
"""
import argparse
import json

import gguf
import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("rows", nargs="+", help="TENSOR:ROW")
    args = ap.parse_args()
    r = gguf.GGUFReader(args.model)
    by_name = {t.name: t for t in r.tensors}
    out = []
    for spec in args.rows:
        name, row = spec.rsplit(":", 1)
        t = by_name[name]
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, int(t.shape[0]))
        out.append([float(x) for x in a[int(row)].astype(np.float64)])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
