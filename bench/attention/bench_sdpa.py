#!/usr/bin/env python3
"""The references of the attention benchmark: PyTorch SDPA's cuDNN and flash (FlashAttention-2) backends,
timed on the shapes of bench_attention's CSV with the same method (one batch of about --batch-ms of
launches to settle the clock, then --samples timed batches; CUDA events; the median per launch), and one
table with ours beside them and the ratios (> 1: ours is faster).

Runs only where PyTorch and a GPU are (the device machine; device-attention.sh calls it). A backend that
rejects a shape (GQA, head dim) is shown as n/a with its reason in the notes below the table.

usage: bench_sdpa.py OURS.csv [--samples N] [--batch-ms T]
"""
import argparse
import csv
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def flops(row):
    f = 4.0 * row["batch"] * row["heads"] * row["seq_q"] * row["seq_kv"] * row["dim"]
    if row["causal"]:
        f /= 2
    if row["pass"].startswith("bwd"):
        f *= 2.5
    return f


def time_fn(fn, samples, batch_ms):
    """Median ms per call: 3 warm-up calls, a call count per batch from their time, a settling batch,
    then `samples` timed batches."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def batch(n):
        e0.record()
        for _ in range(n):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1)

    one = max(1e-3, batch(3) / 3)
    n = int(min(20000, max(1, batch_ms / one)))
    batch(n)
    return statistics.median(batch(n) / n for _ in range(samples))


def make_fn(row, backend):
    b, h, hkv, nq, nkv, d = (row[k] for k in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "dim"))
    dev, dt = "cuda", torch.bfloat16
    train = row["pass"].startswith("bwd")
    q = torch.randn(b, h, nq, d, device=dev, dtype=dt, requires_grad=train)
    k = torch.randn(b, hkv, nkv, d, device=dev, dtype=dt, requires_grad=train)
    v = torch.randn(b, hkv, nkv, d, device=dev, dtype=dt, requires_grad=train)
    causal = bool(row["causal"])
    extra = {"enable_gqa": True} if hkv != h else {}  # (torch >= 2.5; MHA shapes do without it)

    def fwd():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **extra)

    if not train:
        fwd()  # raises where the backend rejects the shape
        return fwd
    out = fwd()
    grad = torch.randn_like(out)

    def bwd():  # the backward alone, on a graph recorded once
        torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    bwd()
    return bwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ours")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--batch-ms", type=float, default=100.0)
    a = ap.parse_args()
    rows = []
    with open(a.ours) as f:
        for r in csv.DictReader(f):
            for k in ("dim", "causal", "batch", "heads", "kv_heads", "seq_q", "seq_kv"):
                r[k] = int(r[k])
            r["ms"] = float(r["ms"])
            rows.append(r)
    notes = []
    # A shape listed once per decode config (bench_attention --decode-config) gets its references timed once.
    ref_ms = {}
    backends = [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}")
    head = f"{'pass':6} {'d':>3} {'mask':6} {'B':>3} {'H':>6} {'N':>11} {'ours ms':>9} {'TFLOP/s':>8}"
    for name, _ in backends:
        head += f" {name + ' ms':>9} {'x ' + name:>8}"
    print(head)
    for r in rows:
        line = (f"{r['pass']:6} {r['dim']:>3} {'causal' if r['causal'] else 'full':6} {r['batch']:>3} "
                f"{str(r['heads']) + ':' + str(r['kv_heads']):>6} {str(r['seq_q']) + ':' + str(r['seq_kv']):>11} ")
        ours = r["ms"] if r["status"] == "ok" and r["ms"] > 0 else math.nan
        tf = flops(r) / (ours * 1e-3) / 1e12 if ours == ours else math.nan
        line += f"{ours:>9.3f} {tf:>8.1f}" if ours == ours else f"{r['status']:>9} {'':>8}"
        for name, backend in backends:
            key = (name, r["pass"], r["dim"], r["causal"], r["batch"], r["heads"], r["kv_heads"], r["seq_q"],
                   r["seq_kv"])
            if key not in ref_ms:
                try:
                    ref_ms[key] = time_fn(make_fn(r, backend), a.samples, a.batch_ms)
                except Exception as e:  # the backend does not take this shape
                    notes.append(f"{name} on {r['pass']} d{r['dim']} H {r['heads']}:{r['kv_heads']} N {r['seq_q']}: "
                                 f"{str(e).splitlines()[0][:160]}")
                    ref_ms[key] = None
                torch.cuda.empty_cache()
            ms = ref_ms[key]
            if ms is None:
                line += f" {'n/a':>9} {'':>8}"
            else:
                line += f" {ms:>9.3f} {ms / ours if ours == ours else math.nan:>7.3f}x"
        if r.get("decode_config"):
            line += f"  {r['decode_config']}"
        print(line, flush=True)
    # Decode is memory-bound: its K and V bytes per time against a device-to-device copy's bandwidth
    # (read + write of 2 GiB, the same method).
    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_fn(lambda: dst.copy_(src), a.samples, a.batch_ms)
    copy_gbps = 2 * src.numel() * 2 / (copy_ms * 1e-3) / 1e9
    print(f"HBM copy bandwidth (2 GiB read + write): {copy_gbps:.0f} GB/s")
    for r in rows:
        if r["pass"] == "decode" and r["status"] == "ok" and r["ms"] > 0:
            gbps = 2 * 2 * r["batch"] * r["kv_heads"] * r["seq_kv"] * r["dim"] / (r["ms"] * 1e-3) / 1e9
            config = f" [{r['decode_config']}]" if r.get("decode_config") else ""
            print(f"decode B={r['batch']} kv={r['seq_kv']}: {gbps:.0f} GB/s of K and V, "
                  f"{100 * gbps / copy_gbps:.0f} % of the copy bandwidth{config}")
    for n in notes:
        print("note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
