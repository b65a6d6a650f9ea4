#!/usr/bin/env python3
"""A vocabulary-only GGUF without its token strings and merges, which the tokenizer.json it was
converted from holds again (tests/gguf_vocab.rs puts them back and checks the file's CRC-32):
tests/fixtures/gguf/qwen35-vocab.gguf (16 MB, 2.9 MB packed) kept as 1 MB.

    strip_vocab_gguf.py IN.gguf TOKENIZER.json OUT.gguf

The two arrays keep their type and count; only their elements go. Refuses a file whose arrays
the tokenizer.json does not give back byte for byte (tokens by id, holes as [PAD{id}], merges
as "a b")."""
import json
import struct
import sys

FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRIPPED = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def strings(items):
    return b"".join(struct.pack("<Q", len(e)) + e for e in (s.encode("utf-8") for s in items))


def main(src, tok, out):
    b = open(src, "rb").read()
    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    assert b[:4] == b"GGUF" and n_tensors == 0, "a vocabulary-only GGUF"
    t = json.load(open(tok, encoding="utf-8"))
    by_id = {v: k for k, v in t["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in t["added_tokens"]})
    o, keep = 24, bytearray(b[:24])

    def string(o):
        n = struct.unpack_from("<Q", b, o)[0]
        return b[o + 8 : o + 8 + n].decode("utf-8"), o + 8 + n

    for _ in range(n_kv):
        key, o = string(o)
        kind, head = struct.unpack_from("<I", b, o)[0], o
        o += 4
        if kind == 8:
            _, o = string(o)
        elif kind == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            body = o
            if et == 8:
                for _ in range(n):
                    _, o = string(o)
            else:
                o += FIXED[et] * n
            if key in STRIPPED:
                want = (
                    [by_id.get(i, f"[PAD{i}]") for i in range(n)]
                    if key.endswith("tokens")
                    else [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"][:n]]
                )
                assert strings(want) == b[body:o], f"{key}: the tokenizer.json does not give it back"
                keep += struct.pack("<Q", len(key.encode())) + key.encode() + b[head:body]
                continue
        else:
            o += FIXED[kind]
        keep += struct.pack("<Q", len(key.encode())) + key.encode() + b[head:o]
    keep += b[o:]
    open(out, "wb").write(keep)
    print(f"{out}: {len(b)} -> {len(keep)} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:4])
