#!/usr/bin/env python3
"""assets/tokenizers/o200k_harmony/ranks.bin: the o200k_base BPE ranks gpt-oss's tokenizer
(o200k_harmony) is built on, in a compact form moescope turns into a tokenizer.json
(src/convert/tiktoken.rs). Run once, by hand; then tests/reference/pack_fixtures.py pack.

usage: make_harmony_tokenizer.py O200K_BASE.tiktoken

The rank file ships in crates.io's tiktoken-rs 0.12.1 (`assets/o200k_base.tiktoken`, MIT; the
file is OpenAI's, from tiktoken, MIT). Each line is `BASE64 RANK`, ranks 0..199997 in order.
ranks.bin: per rank, in order, one byte of length (tokens are 1..128 bytes) and the bytes.
"""
import base64
import hashlib
import os
import sys

src = sys.argv[1]
raw = open(src, "rb").read()
toks = []
for i, line in enumerate(raw.decode().splitlines()):
    b64, rank = line.split()
    assert int(rank) == i, f"rank {rank} at line {i}"
    t = base64.b64decode(b64)
    assert 1 <= len(t) <= 255
    toks.append(t)
out = os.path.join(os.path.dirname(__file__), "../../assets/tokenizers/o200k_harmony/ranks.bin")
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "wb") as f:
    for t in toks:
        f.write(bytes([len(t)]) + t)
print(f"{len(toks)} ranks from {src} (sha256 {hashlib.sha256(raw).hexdigest()}) -> {out}")
