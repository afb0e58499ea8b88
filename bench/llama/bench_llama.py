#!/usr/bin/env python3
"""The measuring half of bench_llama.sh (run with the benchmark venv's python): metapipe generate and
llama.cpp on the same GGUF, prompt and thread count, alternating, each configuration `--repeat` times;
prints the best and median of each with the ratio."""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import llama_cpp

PROMPT_TOKENS = 256
NEW_TOKENS = 128
SEED_TEXT = ("The history of computing is a story of machines that learned to count, then to calculate, then to "
             "follow programs written by people who imagined what they might do. ")


def make_prompt(llm):
    """A text whose tokenization is exactly PROMPT_TOKENS tokens (BOS included) for this model."""
    text = SEED_TEXT * 40
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:PROMPT_TOKENS]
    body = llm.detokenize(ids[1:] if ids and ids[0] == llm.token_bos() else ids).decode("utf-8", "ignore")
    return body


def last_logits(llm):
    """The logits of the last evaluated token, straight from the llama.cpp context."""
    ctx = llm._ctx.ctx if hasattr(llm, "_ctx") else llm.ctx
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(llm.n_vocab(),))


def run_llama_cpp(llm, ids):
    """Prefill and greedy decode from the same prompt ids metapipe's tokenizer produced, so both models
    start from one token sequence and their greedy continuations can be compared."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    out = []
    nxt = int(np.argmax(last_logits(llm)))
    out.append(nxt)
    t_dec = 0.0
    for _ in range(NEW_TOKENS - 1):
        t = time.perf_counter()
        llm.eval([nxt])
        t_dec += time.perf_counter() - t
        nxt = int(np.argmax(last_logits(llm)))
        out.append(nxt)
    return {"prompt_tokens": len(ids), "prefill": len(ids) / (t1 - t0), "decode": (NEW_TOKENS - 1) / t_dec,
            "tokens": out}


def run_metapipe(exe, model, prompt, threads):
    cmd = [exe, "generate", "--model", model, "--prompt", prompt, "-n", str(NEW_TOKENS), "--threads",
           str(threads), "--json", "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("bench_llama: metapipe generate failed: " + p.stderr.strip())
    j = json.loads(p.stdout.strip().splitlines()[-1])
    return {"prompt_tokens": len(j["prompt_tokens"]), "ids": j["prompt_tokens"], "prefill": j["prompt_tokens_per_s"],
            "decode": j["decode_tokens_per_s"], "tokens": j["tokens"], "rss_kib": j["max_rss_kib"],
            "weights": j["weight_bytes"], "kv": j["kv_cache_bytes"], "isa": j["isa"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--metapipe", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import os
    llm = llama_cpp.Llama(model_path=a.model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=512,
                          n_batch=512, verbose=False)
    prompt = make_prompt(llm)
    ours, theirs = [], []
    for i in range(a.repeat):
        ours.append(run_metapipe(a.metapipe, a.model, prompt, a.threads))
        theirs.append(run_llama_cpp(llm, ours[-1]["ids"]))
        print("round %d: metapipe decode %.1f prefill %.1f | llama.cpp decode %.1f prefill %.1f tokens/s" %
              (i + 1, ours[-1]["decode"], ours[-1]["prefill"], theirs[-1]["decode"], theirs[-1]["prefill"]),
              flush=True)
    llama_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gguf_mib = os.path.getsize(a.model) / 2**20
    o, t = ours[-1], theirs[-1]
    same = sum(1 for x, y in zip(o["tokens"], t["tokens"]) if x == y)
    first_diff = next((k for k, (x, y) in enumerate(zip(o["tokens"], t["tokens"])) if x != y), None)
    print()
    print("model %s (%.1f MiB), %d threads, prompt %d tokens (llama.cpp %d), %d new tokens, greedy; "
          "metapipe kernels %s" % (os.path.basename(a.model), gguf_mib, a.threads, o["prompt_tokens"],
                                   t["prompt_tokens"], NEW_TOKENS, o["isa"]))
    print("%-28s %12s %12s %8s" % ("tokens/s (median of %d)" % a.repeat, "metapipe", "llama.cpp", "ratio"))
    for key, name in (("decode", "decode (batch 1)"), ("prefill", "prefill (256-token prompt)")):
        m = statistics.median(r[key] for r in ours)
        l = statistics.median(r[key] for r in theirs)
        print("%-28s %12.1f %12.1f %8.2f" % (name, m, l, m / l))
    for key, name in (("decode", "decode, best"), ("prefill", "prefill, best")):
        m = max(r[key] for r in ours)
        l = max(r[key] for r in theirs)
        print("%-28s %12.1f %12.1f %8.2f" % (name, m, l, m / l))
    kv_mib = o["kv"] / 2**20
    print("max RSS: metapipe %.1f MiB (limit 1.3 x GGUF + KV cache = %.1f MiB; KV cache %.1f MiB f32), "
          "llama.cpp process %.1f MiB (includes Python)" % (o["rss_kib"] / 1024, 1.3 * gguf_mib + kv_mib, kv_mib,
                                                           llama_rss / 1024))
    print("greedy tokens: %d of %d the same%s" % (same, NEW_TOKENS,
                                                  "" if first_diff is None else ", first difference at %d" % first_diff))


if __name__ == "__main__":
    main()
