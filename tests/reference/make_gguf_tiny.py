#!/usr/bin/env python3
# usage: make_gguf_tiny.py OUT_DIR CORPUS.txt QWEN3_TOKENIZER_CONFIG.json
# A tiny random Qwen3-MoE checkpoint for the GGUF tests (issue 25), shaped so that every ggml
# type fits its rows (hidden, expert width and vocabulary multiples of 256, as K-quants need):
# vocab 512 (a byte-level BPE in Qwen's layout, trained by make_demo_tokenizer.py on CORPUS),
# hidden 256, 2 layers, 4 heads of 64 (2 KV heads), 4 experts of width 256, top-2, lm_head
# untied; norms and q/k norms drawn around 1 so that misplaced norm weights show.
# Writes OUT_DIR/hf (config.json, model.safetensors in f32, tokenizer files) and
# OUT_DIR/hf_logits.safetensors: `ids` (the prompt, 40 tokens) and `logits` [40, 512] from
# transformers in f32 with eager attention.
import os, subprocess, sys
import torch
import transformers
from safetensors.torch import save_file

out, corpus, qcfg = sys.argv[1], sys.argv[2], sys.argv[3]
hf = os.path.join(out, "hf")
here = os.path.dirname(os.path.abspath(__file__))
subprocess.run([sys.executable, os.path.join(here, "make_demo_tokenizer.py"), corpus, qcfg, hf, "512"], check=True)
tok = transformers.AutoTokenizer.from_pretrained(hf)
eos = tok.convert_tokens_to_ids("<|im_end|>")
cfg = transformers.Qwen3MoeConfig(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True,
    tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=2048,
    initializer_range=0.05, eos_token_id=eos, bos_token_id=None, decoder_sparse_step=1, mlp_only_layers=[],
)
cfg._attn_implementation = "eager"
torch.manual_seed(25)
model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(1 + 0.2 * torch.randn_like(p))
model.save_pretrained(hf, safe_serialization=True)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 512, (1, 40), generator=g)
with torch.no_grad():
    logits = model(input_ids=ids).logits[0].float()
save_file({"ids": ids[0].to(torch.int64).contiguous(), "logits": logits.contiguous()},
          os.path.join(out, "hf_logits.safetensors"))
print("tiny checkpoint:", hf, "logits std", logits.std().item())
