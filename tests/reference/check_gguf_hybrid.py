#!/usr/bin/env python3
# usage: check_gguf_hybrid.py CHECKPOINT_DIR MODEL.gguf [N_TOKENS]   (default 48)
# Checks that a qwen35moe GGUF made from a Qwen3.5-MoE safetensors checkpoint (llama.cpp's
# convert_hf_to_gguf.py, as the hybrid benchmark uses) holds the same model: transformers runs
# the checkpoint, then loads the GGUF (its integrations/gguf undoes the converter's transforms:
# norms stored as 1 + w, ssm_a = -exp(A_log), value heads tiled) and runs it on the same ids;
# the two runs' logits are compared. Both run in bf16 one after the other, so a 4-layer
# benchmark checkpoint (8.8 GB) fits in 24 GB. Prints max |dlogit|, the logits' std and how many
# positions agree on the argmax; exits 1 when the GGUF's model differs by more than bf16 noise.
import sys
import torch
import transformers

ck, gg = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 48
torch.manual_seed(0)
ids = torch.randint(0, 200000, (1, n))


def run(model):
    with torch.no_grad():
        out = model(input_ids=ids).logits[0].float()
    del model
    return out


kw = dict(dtype=torch.bfloat16, attn_implementation="eager")
a = run(transformers.AutoModelForCausalLM.from_pretrained(ck, **kw))
b = run(transformers.AutoModelForCausalLM.from_pretrained(ck, gguf_file=gg, **kw))
d = (a - b).abs().max().item()
sd = a.std().item()
agree = (a.argmax(-1) == b.argmax(-1)).sum().item()
print(f"{n} tokens: max |dlogit| {d:.3e} ({d / sd:.3f} sd of {sd:.3e}); argmax agrees at {agree}/{n}")
# bf16 runs differ only by rounding order (A_log comes back through log(-(-exp)) in f32)
sys.exit(0 if d / sd < 0.05 and agree >= n - 1 else 1)
