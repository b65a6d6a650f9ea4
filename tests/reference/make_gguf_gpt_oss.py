#!/usr/bin/env python3
"""The gpt-oss GGUF fixture: tests/fixtures/gpt-oss-mxfp4 (the hub's MXFP4 layout) through
llama.cpp's own converter, its MXFP4 experts kept as they are and the rest in f32.

usage: PYTHONPATH=LLAMA/gguf-py:LLAMA make_gguf_gpt_oss.py LLAMA OUT.gguf
  LLAMA  llama.cpp's tree (llama-cpp-python's sdist, vendor/llama.cpp: convert_hf_to_gguf.py,
         conversion/, gguf-py/), run with the oracle environment of make_fixtures.py (the
         converter imports torch)
Run from the repository root, after `pack_fixtures.py unpack` (and `pack` afterwards).

The checkpoint gets the tiny byte-level tokenizer of make_demo_tokenizer.py (512 tokens, the
vocabulary padded to 1024 by the converter), the converter is told the pre-tokenizer ("qwen2":
it does not know the tiny one's hash), and the file gets `gpt-oss.attention.sliding_window_pattern`
(llama.cpp's per-layer booleans, which it reads) for the fixture's layers F S S F, since the
converter writes no layer kinds (llama.cpp assumes every other layer slides).

Checked here, before anything is written: gguf-py's dequantizer gives, for every expert matrix
of every layer, exactly the values transformers holds after loading the checkpoint (for layer 0,
the `dequant_*` tensors of the fixture's reference.safetensors; for all, the fixture's blocks
dequantized as transformers' integrations/mxfp4.py does).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from llama_converter import convert

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "gpt-oss-mxfp4")
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def with_layer_kinds(src, dst, kinds):
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    reader = gguf.GGUFReader(src, "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    key = f"{arch}.attention.sliding_window_pattern"
    meta = {key: MetadataDetails(gguf.GGUFValueType.ARRAY, kinds, sub_type=gguf.GGUFValueType.BOOL)}
    copy_with_new_metadata(reader, writer, meta, [])


def hub_dequant(blocks, scales):
    """transformers' integrations/mxfp4.py: low nibble at even positions, high at odd, times
    ldexp(1, e - 127); rows are the stored blocks' rows."""
    lo, hi = FP4[blocks & 0x0F], FP4[blocks >> 4]
    v = np.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    v = v * np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], -1).astype(np.float32)


def check(path):
    import gguf
    from gguf.quants import dequantize
    from safetensors import safe_open

    def load(name, want):
        with safe_open(os.path.join(FIXTURE, name), "np") as f:
            return {k: f.get_tensor(k) for k in f.keys() if want(k)}

    w = load("model.safetensors", lambda k: k.endswith("_blocks") or k.endswith("_scales"))
    ref = load("reference.safetensors", lambda k: k.startswith("dequant_"))
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    n = 0
    for l in range(json.load(open(os.path.join(FIXTURE, "config.json")))["num_hidden_layers"]):
        p = f"model.layers.{l}.mlp.experts."
        gu = hub_dequant(w[p + "gate_up_proj_blocks"], w[p + "gate_up_proj_scales"])  # [E, 2I, H]
        down = hub_dequant(w[p + "down_proj_blocks"], w[p + "down_proj_scales"])  # [E, H, I]
        if l == 0:
            assert np.array_equal(gu.transpose(0, 2, 1), ref["dequant_gate_up"]), "hub dequantizer vs transformers"
            assert np.array_equal(down.transpose(0, 2, 1), ref["dequant_down"]), "hub dequantizer vs transformers"
        for name, want in [("gate", gu[:, 0::2]), ("up", gu[:, 1::2]), ("down", down)]:
            x = t[f"blk.{l}.ffn_{name}_exps.weight"]
            assert x.tensor_type == gguf.GGMLQuantizationType.MXFP4, (x.name, x.tensor_type)
            got = dequantize(x.data, x.tensor_type).reshape(want.shape)
            assert np.array_equal(got, want), f"{x.name}: gguf-py's values differ from transformers'"
            n += 1
    print(f"{path}: {n} MXFP4 expert tensors equal transformers' values under gguf-py's dequantizer")


def main():
    llama, out = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as w:
        hf = os.path.join(w, "hf")
        shutil.copytree(FIXTURE, hf, ignore=shutil.ignore_patterns("reference.*", "*.xz"))
        subprocess.run([sys.executable, os.path.join(HERE, "make_demo_tokenizer.py"),
                        os.path.join(HERE, "..", "fixtures", "demo", "heldout.txt"),
                        os.path.join(HERE, "..", "..", "assets", "tokenizers", "qwen3", "tokenizer_config.json"),
                        hf, "512"], check=True)
        plain = os.path.join(w, "plain.gguf")
        convert(llama, [hf, "--outtype", "f32", "--outfile", plain])
        kinds = [k == "sliding_attention" for k in json.load(open(os.path.join(hf, "config.json")))["layer_types"]]
        with_layer_kinds(plain, out, kinds)
    check(out)


if __name__ == "__main__":
    main()
