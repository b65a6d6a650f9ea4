#!/usr/bin/env python3
# usage: gguf_oracle.py HF_DIR HF_LOGITS.safetensors OUT.safetensors NAME=FILE.gguf ...
# The oracle of the GGUF tests: transformers loads each GGUF (dequantized to f32 by gguf-py,
# with the checkpoint's config passed in, since transformers reads qwen3moe GGUFs' expert width
# as 768 whatever `expert_feed_forward_length` says) and runs the prompt of HF_LOGITS; OUT
# holds `ids` and `logits_NAME` [tokens, vocab] for each. Prints each GGUF's distance from the
# checkpoint's own logits (a sanity check of the file, not of moescope).
import sys
import torch
import transformers
from safetensors.torch import load_file, save_file

hf, ref, out = sys.argv[1], sys.argv[2], sys.argv[3]
r = load_file(ref)
ids = r["ids"].unsqueeze(0)
cfg = transformers.AutoConfig.from_pretrained(hf)
cfg._attn_implementation = "eager"
res = {"ids": r["ids"]}
for arg in sys.argv[4:]:
    name, path = arg.split("=", 1)
    m = transformers.AutoModelForCausalLM.from_pretrained(hf, gguf_file=path, config=cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        lg = m(input_ids=ids).logits[0].float()
    res[f"logits_{name}"] = lg.contiguous()
    d = (lg - r["logits"]).abs().max().item()
    agree = (lg.argmax(-1) == r["logits"].argmax(-1)).float().mean().item()
    print(f"{name}: max |dlogit| vs checkpoint {d:.3g}, logits std {lg.std().item():.3g}, argmax agree {agree:.3f}")
    del m
save_file(res, out)
