#!/usr/bin/env python3
"""An independent tokenizer for tests: the GGUF file's vocabulary and merges loaded into the PyPI
`tokenizers` library's byte-level BPE, with the pre-tokenizer the file names. Reads a JSON list of strings
on stdin and prints a JSON list of token-id lists (no BOS added; special tokens in the text match whole).

    tokenizer_reference.py --model FILE.gguf < strings.json
"""
import argparse
import json
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def build(path):
    r = gguf.GGUFReader(path)
    if field(r, "tokenizer.ggml.model") != "gpt2":
        sys.exit("tokenizer_reference: %s: only gpt2 byte-level BPE files are handled" % path)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = field(r, "tokenizer.ggml.pre", "default")
    if pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        tk.pre_tokenizer = byte_level
    else:
        sys.exit("tokenizer_reference: %s: pre-tokenizer %r is not handled" % (path, pre))
    tk.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
    tk.add_special_tokens(specials)
    return tk


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    tk = build(args.model)
    texts = json.load(sys.stdin)
    print(json.dumps([tk.encode(t, add_special_tokens=False).ids for t in texts]))


if __name__ == "__main__":
    main()
