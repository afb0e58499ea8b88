#!/usr/bin/env python3
"""An independent NumPy reference of a Llama GGUF model, for tests: weights dequantized with the PyPI `gguf`
package, the forward pass written out here (RMSNorm, RoPE, grouped-query attention, SwiGLU), greedy decoding.
It shares no code with metapipe.

    reference_llama.py --model FILE.gguf --tokens 1,2,3 [-n 32] [--logits-out FILE.npy] [--json]
    reference_llama.py --model FILE.gguf --chat "What is the capital of France?"   (tokens from tokenizer_reference.py)

Prints the greedy continuation ids (comma-separated, or one JSON object with --json). --logits-out writes the
logits at the last prompt position (the ones that choose the first new token) as a float32 .npy vector;
--all-logits-out writes one row per generated token (row 0 = last prompt position).
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


class Model:
    def __init__(self, path, dtype):
        r = gguf.GGUFReader(path)
        arch = field(r, "general.architecture")
        if arch != "llama":
            sys.exit("reference_llama: %s: architecture %r, expected llama" % (path, arch))
        self.n_layer = int(field(r, "llama.block_count"))
        self.d = int(field(r, "llama.embedding_length"))
        self.n_head = int(field(r, "llama.attention.head_count"))
        self.n_kv = int(field(r, "llama.attention.head_count_kv", self.n_head))
        self.eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(field(r, "llama.rope.freq_base", 10000.0))
        self.hd = self.d // self.n_head
        self.rope_dim = int(field(r, "llama.rope.dimension_count", self.hd))
        self.dtype = dtype
        self.w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            # numpy shape is the GGUF dims reversed: (rows, row length) for a matrix.
            self.w[t.name] = np.ascontiguousarray(a.reshape([int(x) for x in reversed(t.shape)]), dtype=dtype)
        self.head = self.w.get("output.weight", self.w["token_embd.weight"])  # tied embeddings
        # RoPE on adjacent pairs (2i, 2i+1): the GGUF converter permutes Q/K rows so that llama's "normal"
        # rotation applies to the stored weights.
        half = self.rope_dim // 2
        self.inv_freq = self.theta ** (-np.arange(half, dtype=np.float64) * 2.0 / self.rope_dim)
        self.cache_k = [[] for _ in range(self.n_layer)]
        self.cache_v = [[] for _ in range(self.n_layer)]

    def rms(self, x, w):
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + self.eps)
        return (y * w).astype(self.dtype)

    def rope(self, x, pos):
        # x: (T, heads, hd); pos: (T,)
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # (T, half)
        c = np.cos(ang)[:, None, :]
        s = np.sin(ang)[:, None, :]
        out = x.astype(np.float64).copy()
        a = out[..., 0 : self.rope_dim : 2].copy()
        b = out[..., 1 : self.rope_dim : 2].copy()
        out[..., 0 : self.rope_dim : 2] = a * c - b * s
        out[..., 1 : self.rope_dim : 2] = a * s + b * c
        return out.astype(self.dtype)

    def forward(self, ids, start):
        """Runs tokens `ids` at positions start.. with the KV cache; returns logits of every position."""
        T = len(ids)
        pos = np.arange(start, start + T)
        x = self.w["token_embd.weight"][np.asarray(ids)]
        group = self.n_head // self.n_kv
        for l in range(self.n_layer):
            p = "blk.%d." % l
            h = self.rms(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.n_head, self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.hd)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            self.cache_k[l].append(k)
            self.cache_v[l].append(v)
            K = np.concatenate(self.cache_k[l], axis=0)  # (S, n_kv, hd)
            V = np.concatenate(self.cache_v[l], axis=0)
            S = K.shape[0]
            Kh = np.repeat(K, group, axis=1).transpose(1, 0, 2).astype(np.float64)  # (heads, S, hd)
            Vh = np.repeat(V, group, axis=1).transpose(1, 0, 2).astype(np.float64)
            qh = q.transpose(1, 0, 2).astype(np.float64)  # (heads, T, hd)
            att = qh @ Kh.transpose(0, 2, 1) / np.sqrt(self.hd)  # (heads, T, S)
            mask = (np.arange(S)[None, :] > pos[:, None])  # key position after the query's: hidden
            att = np.where(mask[None], -np.inf, att)
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            o = (att @ Vh).transpose(1, 0, 2).reshape(T, self.d).astype(self.dtype)
            x = x + o @ self.w[p + "attn_output.weight"].T
            h = self.rms(x, self.w[p + "ffn_norm.weight"])
            g = (h @ self.w[p + "ffn_gate.weight"].T).astype(np.float64)
            u = (h @ self.w[p + "ffn_up.weight"].T).astype(np.float64)
            a = (g / (1.0 + np.exp(-g)) * u).astype(self.dtype)
            x = x + a @ self.w[p + "ffn_down.weight"].T
        x = self.rms(x, self.w["output_norm.weight"])
        return (x @ self.head.T).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="prompt token ids, comma-separated")
    src.add_argument("--chat", help="a user message, wrapped in the chat format and tokenized by tokenizer_reference.py")
    ap.add_argument("-n", type=int, default=32, help="tokens to generate greedily (default 32)")
    ap.add_argument("--logits-out", help="write the last prompt position's logits here (.npy)")
    ap.add_argument("--all-logits-out", help="write the logits of every decoding step here (.npy, n x vocab)")
    ap.add_argument("--float64", action="store_true", help="weights and activations in float64 (default float32)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop after the end-of-generation token")
    args = ap.parse_args()
    if args.n < 0:
        sys.exit("reference_llama: -n must be >= 0")

    if args.tokens is not None:
        try:
            prompt = [int(t) for t in args.tokens.split(",") if t.strip() != ""]
        except ValueError:
            sys.exit("reference_llama: --tokens wants comma-separated integers, got %r" % args.tokens)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import tokenizer_reference

        # SmolLM2's template adds this system message before a first user message; other <|im_start|>
        # templates get none.
        system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        template = field(gguf.GGUFReader(args.model), "tokenizer.chat_template", "")
        if "<|im_start|>" not in template:
            sys.exit("reference_llama: %s: --chat needs an <|im_start|> chat template" % args.model)
        if system.split("\n", 1)[1].split("<|im_end|>")[0] not in template:
            system = ""
        text = system + "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % args.chat
        prompt = tokenizer_reference.build(args.model).encode(text, add_special_tokens=False).ids
    if not prompt:
        sys.exit("reference_llama: the prompt has no tokens")

    m = Model(args.model, np.float64 if args.float64 else np.float32)
    vocab = m.head.shape[0]
    bad = [t for t in prompt if t < 0 or t >= vocab]
    if bad:
        sys.exit("reference_llama: token ids %s are outside the vocabulary of %d" % (bad[:5], vocab))
    eos = int(field(gguf.GGUFReader(args.model), "tokenizer.ggml.eos_token_id", -1))

    logits = m.forward(prompt, 0)[-1]
    first = logits.copy()
    steps = [logits]
    out = []
    pos = len(prompt)
    for i in range(args.n):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if args.stop_at_eos and nxt == eos:
            break
        if i + 1 == args.n:
            break
        logits = m.forward([nxt], pos)[-1]
        steps.append(logits)
        pos += 1
    if args.logits_out:
        np.save(args.logits_out, first.astype(np.float32))
    if args.all_logits_out:
        np.save(args.all_logits_out, np.stack(steps).astype(np.float32))
    if args.json:
        top = np.argsort(-first)[:5]
        print(json.dumps({"prompt_tokens": prompt, "tokens": out,
                          "top5_first": [[int(t), float(first[t])] for t in top]}))
    else:
        print(",".join(str(t) for t in out))


if __name__ == "__main__":
    main()
