#!/usr/bin/env python3
"""The DeepSeek-V3 GGUF fixture: tests/fixtures/deepseek through llama.cpp's own converter
(`deepseek2`, with kv_b_proj split into `attn_k_b` / `attn_v_b`), and transformers' logits of the
checkpoint it holds.

usage: PYTHONPATH=LLAMA/gguf-py make_gguf_deepseek.py LLAMA OUT_DIR
  LLAMA  llama.cpp's tree (llama-cpp-python's sdist, vendor/llama.cpp), run with the oracle
         environment of make_fixtures.py (the converter imports torch)
Run from the repository root, after `pack_fixtures.py unpack` (and `pack` afterwards).
Writes OUT_DIR/deepseek-bf16.gguf, OUT_DIR/deepseek-q8_0.gguf (the tree keeps the Q8_0 one) and
OUT_DIR/reference.safetensors; given an older tree (llama-cpp-python 0.3.8's, whose converter
writes kv_b_proj whole as `attn_kv_b`), OUT_DIR/deepseek-legacy-q8_0.gguf and the same reference (`input_ids`: the fixture's prompt, `logits`: transformers, f32,
eager attention).

A GGUF cannot say YaRN's `mscale` apart from `mscale_all_dim`: llama.cpp writes only
`rope.scaling.yarn_log_multiplier` (0.1 x mscale_all_dim) and takes mscale equal to it (as the
released DeepSeek-V3 and Kimi-K2 configs have them, both 1). The fixture's checkpoint has
mscale 1 and mscale_all_dim 0.8 (so its own test moves both factors); this file is made from the
same weights with mscale 0.8, the configuration the GGUF states, and the oracle is transformers
on that configuration. The released configs' `scoring_func: sigmoid` is added too (transformers
does not write it back).

The fixture has no tokenizer: it gets one of exactly its 128 ids (the first 128 characters of the
byte-level alphabet, no merges, no special tokens), through the converter's generic byte-level
vocabulary step. The tensors and the model's metadata are the converter's own; it leaves the MTP
layer out (the checkpoint states one without its tensors).
"""
import json
import os
import shutil
import sys
import tempfile

from llama_converter import convert

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.environ.get("DEEPSEEK_FIXTURE", os.path.join(HERE, "..", "fixtures", "deepseek"))


def byte_tokenizer(out, n):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[:n]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(out, "tokenizer_config.json"), "w"))


def oracle(hf, out):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    ids = load_file(os.path.join(FIXTURE, "reference.safetensors"))["input_ids"]
    m = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager",
                                                          experts_implementation="eager").float().eval()
    with torch.no_grad():
        logits = m(input_ids=ids.unsqueeze(0), use_cache=False).logits[0].float().contiguous()
    save_file(dict(input_ids=ids, logits=logits), os.path.join(out, "reference.safetensors"))
    print("reference:", tuple(logits.shape), "std", float(logits.std()))


def main():
    llama, out = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as w:
        hf = os.path.join(w, "hf")
        shutil.copytree(FIXTURE, hf, ignore=shutil.ignore_patterns("reference.*", "*.xz"))
        cfg_path = os.path.join(hf, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["rope_scaling"]["mscale"] = cfg["rope_scaling"]["mscale_all_dim"]
        # the released configs' router keys (transformers writes neither; the converter states
        # the gating function from scoring_func, and llama.cpp takes a file without it for
        # DeepSeek-V2's softmax router)
        cfg.update(scoring_func="sigmoid", topk_method="noaux_tc")
        legacy = not os.path.isdir(os.path.join(llama, "conversion"))
        if legacy:
            # a converter of early 2025 (llama-cpp-python 0.3.8's tree) writes kv_b_proj whole
            # (`attn_kv_b`) and states the key length from `head_dim` as well as its own, which
            # its writer refuses as a duplicate: the released configs have no `head_dim`
            cfg.pop("head_dim", None)
        json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
        byte_tokenizer(hf, cfg["vocab_size"])
        os.makedirs(out, exist_ok=True)
        oracle(hf, out)
        for ty in ("q8_0",) if legacy else ("bf16", "q8_0"):
            name = f"deepseek-legacy-{ty}.gguf" if legacy else f"deepseek-{ty}.gguf"
            convert(llama, [hf, "--outtype", ty, "--outfile", os.path.join(out, name)])


if __name__ == "__main__":
    main()
