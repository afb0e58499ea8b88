#!/usr/bin/env python3
"""Checks reference_llama.py: on a small random Llama written here, its KV-cached forward pass equals a
second, naive one (no cache, position by position, RoPE as complex rotations) at every position; with the
installed SmolLM2, greedy decoding of a chat prompt answers the question. Exit 77 = skipped."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_llama  # noqa: E402


def write_tiny(path, rng, tied):
    d, n_head, n_kv, ffn, vocab, layers = 32, 4, 2, 48, 40, 2
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500.0)
    w.add_context_length(64)
    t = {}

    def add(name, *shape, scale=0.3):
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        t[name] = a
        w.add_tensor(name, a)

    add("token_embd.weight", vocab, d, scale=1.0)
    for l in range(layers):
        p = "blk.%d." % l
        t[p + "attn_norm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w.add_tensor(p + "attn_norm.weight", t[p + "attn_norm.weight"])
        add(p + "attn_q.weight", d, d)
        add(p + "attn_k.weight", d // n_head * n_kv, d)
        add(p + "attn_v.weight", d // n_head * n_kv, d)
        add(p + "attn_output.weight", d, d)
        t[p + "ffn_norm.weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w.add_tensor(p + "ffn_norm.weight", t[p + "ffn_norm.weight"])
        add(p + "ffn_gate.weight", ffn, d)
        add(p + "ffn_up.weight", ffn, d)
        add(p + "ffn_down.weight", d, ffn)
    t["output_norm.weight"] = np.ones(d, dtype=np.float32)
    w.add_tensor("output_norm.weight", t["output_norm.weight"])
    if not tied:
        add("output.weight", vocab, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t, dict(d=d, n_head=n_head, n_kv=n_kv, layers=layers, theta=500.0, eps=1e-5)


def naive_logits(t, c, ids):
    """Full recomputation for each position: the last position's logits after ids[:i+1], for every i."""
    d, H, KV = c["d"], c["n_head"], c["n_kv"]
    hd = d // H
    out = []

    def rms(x, g):
        return x / np.sqrt((x * x).mean() + c["eps"]) * g

    def rot(v, pos):
        z = v[0::2] + 1j * v[1::2]
        z = z * np.exp(1j * pos * c["theta"] ** (-np.arange(hd // 2) * 2.0 / hd))
        r = np.empty(hd)
        r[0::2], r[1::2] = z.real, z.imag
        return r

    for n in range(1, len(ids) + 1):
        xs = [t["token_embd.weight"][i].astype(np.float64) for i in ids[:n]]
        for l in range(c["layers"]):
            p = "blk.%d." % l
            ks, vs, qs = [], [], []
            for pos, x in enumerate(xs):
                h = rms(x, t[p + "attn_norm.weight"])
                q = t[p + "attn_q.weight"] @ h
                k = t[p + "attn_k.weight"] @ h
                v = t[p + "attn_v.weight"] @ h
                qs.append([rot(q[j * hd:(j + 1) * hd], pos) for j in range(H)])
                ks.append([rot(k[j * hd:(j + 1) * hd], pos) for j in range(KV)])
                vs.append([v[j * hd:(j + 1) * hd] for j in range(KV)])
            new = []
            for pos, x in enumerate(xs):
                o = []
                for j in range(H):
                    kv = j * KV // H
                    s = np.array([qs[pos][j] @ ks[u][kv] for u in range(pos + 1)]) / np.sqrt(hd)
                    a = np.exp(s - s.max())
                    a /= a.sum()
                    o.append(sum(a[u] * vs[u][kv] for u in range(pos + 1)))
                x = x + t[p + "attn_output.weight"] @ np.concatenate(o)
                h = rms(x, t[p + "ffn_norm.weight"])
                g = t[p + "ffn_gate.weight"] @ h
                x = x + t[p + "ffn_down.weight"] @ (g / (1 + np.exp(-g)) * (t[p + "ffn_up.weight"] @ h))
                new.append(x)
            xs = new
        head = t.get("output.weight", t["token_embd.weight"])
        out.append(head @ rms(xs[-1], t["output_norm.weight"]))
    return np.stack(out)


def check_tiny(tmp):
    rng = np.random.default_rng(27)
    for tied in (True, False):
        path = os.path.join(tmp, "tiny_%d.gguf" % tied)
        t, c = write_tiny(path, rng, tied)
        ids = [int(x) for x in rng.integers(0, 40, size=7)]
        want = naive_logits(t, c, ids)
        m = reference_llama.Model(path, np.float64)
        got_prefill = m.forward(ids[:4], 0)  # four at once, then one by one through the cache
        got = [got_prefill[i] for i in range(4)] + [m.forward([ids[i]], i)[-1] for i in range(4, 7)]
        err = np.abs(np.stack(got) - want).max() / np.abs(want).max()
        if not err < 1e-5:  # the reference returns float32 logits
            sys.exit("FAIL: reference_llama differs from the naive forward (tied=%s): rel err %g" % (tied, err))
        print("tiny llama (tied=%s): max relative difference %.2e" % (tied, err))
    # Bad input is a clear message, not a traceback.
    r = subprocess.run([sys.executable, os.path.join(HERE, "reference_llama.py"), "--model", path, "--tokens", "1,x"],
                       capture_output=True, text=True)
    if r.returncode == 0 or "comma-separated integers" not in r.stderr:
        sys.exit("FAIL: bad --tokens gave rc %d: %s" % (r.returncode, r.stderr))
    r = subprocess.run([sys.executable, os.path.join(HERE, "reference_llama.py"), "--model", path, "--tokens", "1,99"],
                       capture_output=True, text=True)
    if r.returncode == 0 or "outside the vocabulary of 40" not in r.stderr:
        sys.exit("FAIL: out-of-range token gave rc %d: %s" % (r.returncode, r.stderr))


def default_model():
    d = os.environ.get("METAPIPE_MODEL_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "metapipe", "models")
    p = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.isfile(p) else None


def check_smollm2():
    path = default_model()
    if path is None:
        print("SKIP: the default model is not installed (run scripts/install-deps)")
        return False
    import tokenizer_reference

    r = subprocess.run([sys.executable, os.path.join(HERE, "reference_llama.py"), "--model", path, "--chat",
                        "What is the capital of France?", "-n", "8"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("FAIL: reference_llama.py failed: " + r.stderr)
    ids = [int(x) for x in r.stdout.strip().split(",")]
    text = tokenizer_reference.build(path).decode(ids, skip_special_tokens=False)
    print("SmolLM2 answers: %r" % text)
    if "Paris" not in text:
        sys.exit("FAIL: the greedy answer to the capital of France does not name Paris: %r" % text)
    return True


def main():
    with tempfile.TemporaryDirectory() as tmp:
        check_tiny(tmp)
    check_smollm2()
    print("PASS")


if __name__ == "__main__":
    main()
