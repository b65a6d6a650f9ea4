#!/usr/bin/env python3
"""llama.cpp's logits on the tiny Qwen3-MoE re-typed to each single quant type (the files
`moescope-replay --write-typed-ggufs DIR` writes, as tests/gguf_llama_logits.rs derives them), for
tests/fixtures/gguf/tiny/llama-logits.safetensors.

usage: PYTHONPATH=LLAMA_CPP_PYTHON LLAMA_CPP_LIB_PATH=LIBDIR llama_logits.py REFERENCE DIR OUT
  LLAMA_CPP_PYTHON  llama-cpp-python's source tree (its ctypes bindings; nothing built there)
  LIBDIR            the folder of a libllama.so built from the same version's vendor/llama.cpp
  REFERENCE         tests/fixtures/gguf/tiny/reference.safetensors unpacked (its `ids`)
  DIR               the typed files (tiny-TYPE.gguf), and tiny-yarn.gguf (the q4_0 file with
                    YaRN's rope.scaling keys: factor 4 over 16 original positions, so the
                    40-token prompt runs past them; its logits are `llama_yarn`)

The whole 40-token prompt is one batch of one sequence, KV cache in f32 (so the cache's f16
rounding is not among the differences), 2 threads; each file's logits at the rows of ROWS kept as
f16 (`llama_<type>`: [len(ROWS), vocab]) with `rows` (I64) beside them, to keep the fixture small.
"""
import glob
import json
import os
import struct
import sys

import numpy as np
import llama_cpp

ROWS = [0, 20, 39]
GGML_TYPE_F32 = 0


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        dt = {"I64": np.int64, "F32": np.float32}[v["dtype"]]
        a, z = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + a:8 + n + z], dtype=dt).reshape(v["shape"])
    return out


def write_safetensors(path, tensors):
    head, blobs, at = {}, [], 0
    for k, a in tensors.items():
        raw = a.tobytes()
        head[k] = {"dtype": {np.dtype(np.int64): "I64", np.dtype(np.float16): "F16"}[a.dtype],
                   "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main(reference, folder, out):
    ids = [int(x) for x in read_safetensors(reference)["ids"]]
    res = {"rows": np.array(ROWS, dtype=np.int64)}
    for path in sorted(glob.glob(os.path.join(folder, "tiny-*.gguf"))):
        ty = os.path.basename(path)[len("tiny-"):-len(".gguf")]
        m = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
                            type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, flash_attn=False, verbose=False)
        m.eval(ids)
        logits = np.array(m.scores[:len(ids)], dtype=np.float32)
        assert np.isfinite(logits).all(), ty
        res["llama_" + ty] = logits[ROWS].astype(np.float16)
        print(ty, "logits std", float(logits.std()), "rows", logits[ROWS].argmax(axis=1).tolist())
        del m
    write_safetensors(out, res)


if __name__ == "__main__":
    main(*sys.argv[1:4])
