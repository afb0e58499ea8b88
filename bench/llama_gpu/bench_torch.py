#!/usr/bin/env python3
"""The PyTorch reference for bench/llama_gpu: the same Llama architecture (RMSNorm, grouped-query
attention with RoPE on adjacent pairs, SwiGLU MLP, greedy argmax) with random bf16 weights of a preset's
shapes, batch 1, a static bf16 KV cache of the benchmark's context, one decode step timed in two ways:
eager (one kernel per PyTorch op) and the same step captured once in a CUDA graph and replayed. The cache
holds `--fill` positions of random keys and values, so attention reads what it would after a prompt.

Only the benchmark's device run uses this file; torch is never a dependency of metapipe.
Prints one JSON line per mode: {"impl": "torch-eager" | "torch-cuda-graph", "ms_per_token": ...}.
"""
import argparse
import json
import math
import time

import torch

PRESETS = {  # the shapes of models/llama.cpp's presets
    "smollm2-135m": dict(layers=30, d=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152,
                         theta=100000.0, tied=True),
    "llama3.1-8b": dict(layers=32, d=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
                        theta=500000.0, tied=False),
    "toy": dict(layers=2, d=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=96, theta=10000.0,
                tied=True),  # a check of the script (runs with --device cpu)
}


class Llama:
    def __init__(self, s, ctx, dev):
        self.s, self.ctx = s, ctx
        g = torch.Generator(device=dev).manual_seed(1)

        def w(rows, cols):
            a = math.sqrt(3.0 / cols)
            return ((torch.rand(rows, cols, device=dev, generator=g) * 2 - 1) * a).to(torch.bfloat16)

        d, qw, kvw = s["d"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
        self.emb = w(s["vocab"], d)
        self.out = self.emb if s["tied"] else w(s["vocab"], d)
        self.norm = torch.ones(d, device=dev, dtype=torch.bfloat16)
        self.layers = []
        for _ in range(s["layers"]):
            self.layers.append(dict(
                n1=torch.ones(d, device=dev, dtype=torch.bfloat16), wqkv=w(qw + 2 * kvw, d), wo=w(d, qw),
                n2=torch.ones(d, device=dev, dtype=torch.bfloat16), wgu=w(2 * s["ffn"], d), wd=w(d, s["ffn"]),
                k=torch.randn(1, s["kv_heads"], ctx, s["head_dim"], device=dev, dtype=torch.bfloat16),
                v=torch.randn(1, s["kv_heads"], ctx, s["head_dim"], device=dev, dtype=torch.bfloat16)))
        half = s["head_dim"] // 2
        self.freq = s["theta"] ** (-torch.arange(half, device=dev, dtype=torch.float32) * 2 / s["head_dim"])
        self.positions = torch.arange(ctx, device=dev)
        # Grouped-query attention natively where this torch's SDPA has it (2.5+), else K/V repeated per group.
        try:
            q = torch.zeros(1, 4, 1, 8, device=dev, dtype=torch.bfloat16)
            kv = torch.zeros(1, 2, 4, 8, device=dev, dtype=torch.bfloat16)
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            self.native_gqa = True
        except TypeError:
            self.native_gqa = False

    def rope(self, x, pos):  # x [heads, head_dim]; adjacent pairs (2i, 2i+1)
        ang = pos.float() * self.freq
        c, s_ = torch.cos(ang), torch.sin(ang)
        a, b = x[..., 0::2].float(), x[..., 1::2].float()
        return torch.stack((a * c - b * s_, b * c + a * s_), dim=-1).flatten(-2).to(x.dtype)

    def rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def step(self, token, pos):
        """token, pos: 0-d int64 device tensors (static: a captured graph replays on the same memory).
        Returns the greedy next token as a 0-d int64 device tensor. Nothing here reads a value back to the
        host, so the step can be captured in a CUDA graph."""
        s = self.s
        H, HKV, Dh = s["heads"], s["kv_heads"], s["head_dim"]
        qw, kvw = H * Dh, HKV * Dh
        # index_select on a 1-element device tensor: indexing with a 0-d tensor (self.emb[token]) turns it
        # into a Python int, a host sync that CUDA-graph capture rejects.
        x = torch.index_select(self.emb, 0, token.view(1)).view(s["d"])
        mask = (self.positions <= pos).view(1, 1, 1, -1)
        for L in self.layers:
            h = self.rms(x, L["n1"])
            qkv = L["wqkv"] @ h
            q = self.rope(qkv[:qw].view(H, Dh), pos)
            k = self.rope(qkv[qw:qw + kvw].view(HKV, Dh), pos)
            v = qkv[qw + kvw:].view(HKV, Dh)
            L["k"].index_copy_(2, pos.view(1), k.view(1, HKV, 1, Dh))
            L["v"].index_copy_(2, pos.view(1), v.view(1, HKV, 1, Dh))
            if self.native_gqa:
                a = torch.nn.functional.scaled_dot_product_attention(
                    q.view(1, H, 1, Dh), L["k"], L["v"], attn_mask=mask, enable_gqa=True)
            else:
                # Each kv head repeated for its group by expand + reshape (no output size to compute on the
                # host, unlike some versions of repeat_interleave).
                def rep(t):
                    return t[:, :, None].expand(1, HKV, H // HKV, self.ctx, Dh).reshape(1, H, self.ctx, Dh)
                a = torch.nn.functional.scaled_dot_product_attention(
                    q.view(1, H, 1, Dh), rep(L["k"]), rep(L["v"]), attn_mask=mask)
            x = x + L["wo"] @ a.view(qw)
            h = self.rms(x, L["n2"])
            gu = L["wgu"] @ h
            g, u = gu[:s["ffn"]], gu[s["ffn"]:]
            x = x + L["wd"] @ (torch.nn.functional.silu(g) * u)
        logits = self.out @ self.rms(x, self.norm)
        return torch.argmax(logits)


def time_steps(fn, n, cuda):
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m", choices=sorted(PRESETS))
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--fill", type=int, default=0, help="cache positions before the timed steps (default ctx - 64)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: eager only, to check the script where no GPU is present")
    a = ap.parse_args()
    dev = a.device
    cuda = dev == "cuda"
    m = Llama(PRESETS[a.shapes], a.ctx, dev)
    fill = a.fill or max(0, a.ctx - 64)
    # Static inputs of the step: the graph captures their addresses; the step writes the next token into
    # `token` on the device. `pos` stays at `fill`: every timed step attends over the same cache length.
    token = torch.ones((), dtype=torch.int64, device=dev)
    pos = torch.full((), fill, dtype=torch.int64, device=dev)

    def eager():
        token.copy_(m.step(token, pos))

    with torch.no_grad():
        for _ in range(3):
            eager()
        ms_eager = time_steps(eager, a.steps, cuda)
        # Kernels per step, from the profiler (what slide 56 counts).
        kernels = None
        if cuda:
            try:
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    eager()
                    torch.cuda.synchronize()
                kernels = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
            except Exception:  # the profiler is optional
                pass
        print(json.dumps({"impl": "torch-eager", "shapes": a.shapes, "ctx": a.ctx, "ms_per_token": ms_eager,
                          "kernels_per_token": kernels, "token": int(token)}), flush=True)
        if not cuda:
            return

        # Warm-up on a side stream (lazy initialization of cuBLAS handles and workspaces happens outside
        # the capture), then capture one step and replay it.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                eager()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            eager()
        graph.replay()
        torch.cuda.synchronize()
        ms_graph = time_steps(graph.replay, a.steps, cuda)
        print(json.dumps({"impl": "torch-cuda-graph", "shapes": a.shapes, "ctx": a.ctx, "ms_per_token": ms_graph,
                          "kernels_per_token": kernels, "token": int(token)}), flush=True)


if __name__ == "__main__":
    main()
