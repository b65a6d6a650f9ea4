#!/usr/bin/env python3
"""tests/fixtures/gguf/harmony-vocab.gguf and harmony-vocab.json: a vocabulary-only gpt-oss GGUF
with llama.cpp's `gpt-4o` pre-tokenizer, and tiktoken's ids for texts, for tests/gguf_vocab.rs.
Run once, by hand, with the oracle environment (tiktoken 0.14, transformers 5.24, gguf-py from
llama-cpp-python 0.3.36's tree on PYTHONPATH).

usage: make_harmony_vocab_gguf.py O200K_BASE.tiktoken OUT_DIR

The vocabulary is o200k_harmony cut to 1,024 ids (tests/harmony_chat.rs's model uses the same
cut): o200k_base's first 1,015 ranks, then the nine named harmony tokens. tiktoken, on those
ranks with that pattern, is the oracle; the GGUF holds what llama.cpp's converter writes for a
BPE vocabulary (tokens by id as transformers' TikTokenConverter spells them, NORMAL or CONTROL,
its merges).
"""
import json
import os
import sys

import gguf
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import o200k_base  # noqa: F401  (the pattern below is its)
from transformers.convert_slow_tokenizer import TikTokenConverter, bytes_to_unicode

RANKS, OUT = sys.argv[1], sys.argv[2]
NAMED = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
         "<|end|>", "<|message|>", "<|call|>"]
N = 1024 - len(NAMED)
all_ranks = load_tiktoken_bpe(RANKS)
ranks = {t: r for t, r in all_ranks.items() if r < N}
import tiktoken_ext.openai_public as op  # noqa: E402
op.load_tiktoken_bpe = lambda *a, **k: all_ranks
pat = op.o200k_base()["pat_str"]
specials = {s: N + i for i, s in enumerate(NAMED)}
enc = tiktoken.Encoding("o200k_harmony_1024", pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)

conv = TikTokenConverter(vocab_file=RANKS, pattern=pat)
conv.load_tiktoken_bpe = lambda _: ranks
vocab, merges = conv.extract_vocab_merges_from_model(RANKS)
tokens = [None] * 1024
for t, i in vocab.items():
    tokens[i] = t
for s, i in specials.items():
    tokens[i] = s
types = [gguf.TokenType.NORMAL] * N + [gguf.TokenType.CONTROL] * len(NAMED)

TEXTS = [
    "Hello, world! The quick brown fox's 12345 jumps.",
    "  spaces\n\n\ttabs and CAPS I'M here; naïve café 日本 🦀",
    "<|start|>user<|message|>2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
    "fn main() { println!(\"{}\", 3.14159); }\r\n",
]
os.makedirs(OUT, exist_ok=True)
w = gguf.GGUFWriter(os.path.join(OUT, "harmony-vocab.gguf"), "gpt-oss")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("gpt-4o")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges([f"{a} {b}" for a, b in merges])
w.add_eos_token_id(specials["<|return|>"])
w.add_pad_token_id(specials["<|endoftext|>"])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
w.close()
rows = [{"text": t, "ids": enc.encode(t, allowed_special="all")} for t in TEXTS]
with open(os.path.join(OUT, "harmony-vocab.json"), "w") as f:
    json.dump({"made_by": "tests/reference/make_harmony_vocab_gguf.py", "rows": rows}, f, ensure_ascii=False, indent=1)
print(f"{len(merges)} merges, {len(rows)} texts -> {OUT}")
