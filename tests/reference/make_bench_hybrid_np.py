#!/usr/bin/env python3
# usage: make_bench_hybrid_np.py OUT_DIR QWEN35_TOKENIZER_DIR [LAYERS]   (default 8: ~15 GB, ~4 min)
# A Qwen3.5-35B-A3B-shaped benchmark checkpoint with numpy alone: hidden 2048; layers in the
# released pattern (three Gated DeltaNet layers, then one full-attention layer: L L L F ...);
# linear attention 16 key / 32 value heads x 128, conv kernel 4; gated full attention 16 / 2
# heads x 256, a quarter of it rotary; 256 experts, top-8, expert width 512, stored fused as the
# official bf16 files store them (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]);
# a shared expert of width 512; vocab 248320; untied output layer. The config is the composite
# Qwen3_5MoeForConditionalGeneration one (text_config), without the vision tower. Weights
# N(0, 0.02) in bf16; (1 + w) norms zero, the gated norm one, A_log = log U(1, 16) and
# dt_bias one as transformers initialises them. QWEN35_TOKENIZER_DIR needs a plain
# tokenizer.json and chat_template.jinja (gunzip shared/assets' copy).
import os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_bench_model_np import RNG, write_checkpoint  # noqa: E402

out, tokdir = sys.argv[1], sys.argv[2]
nl = int(sys.argv[3]) if len(sys.argv) > 3 else 8
H, V, E, I, IS = 2048, 248320, 256, 512, 512
NH, NKV, HD = 16, 2, 256
NK, DK, NV, DV, K = 16, 128, 32, 128, 4
CONV = 2 * NK * DK + NV * DV
kinds = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(nl)]
text = {
    "model_type": "qwen3_5_moe_text", "hidden_size": H, "num_hidden_layers": nl, "vocab_size": V,
    "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "hidden_act": "silu",
    "linear_conv_kernel_dim": K, "linear_key_head_dim": DK, "linear_value_head_dim": DV,
    "linear_num_key_heads": NK, "linear_num_value_heads": NV, "layer_types": kinds,
    "full_attention_interval": 4, "num_experts": E, "num_experts_per_tok": 8, "moe_intermediate_size": I,
    "shared_expert_intermediate_size": IS, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "attention_bias": False, "attn_output_gate": True, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    "eos_token_id": 248046, "dtype": "bfloat16", "mtp_num_hidden_layers": 0,
}
config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
          "text_config": text, "tie_word_embeddings": False, "image_token_id": 248056, "video_token_id": 248057,
          "vision_start_token_id": 248053, "vision_end_token_id": 248054, "transformers_version": "5.24.0"}


def specs():
    P = "model.language_model."
    yield P + "embed_tokens.weight", (V, H), True
    for i in range(nl):
        p = f"{P}layers.{i}."
        yield p + "input_layernorm.weight", (H,), 0.0
        if kinds[i] == "full_attention":
            yield p + "self_attn.q_proj.weight", (2 * NH * HD, H), True
            yield p + "self_attn.k_proj.weight", (NKV * HD, H), True
            yield p + "self_attn.v_proj.weight", (NKV * HD, H), True
            yield p + "self_attn.o_proj.weight", (H, NH * HD), True
            yield p + "self_attn.q_norm.weight", (HD,), 0.0
            yield p + "self_attn.k_norm.weight", (HD,), 0.0
        else:
            a = p + "linear_attn."
            yield a + "in_proj_qkv.weight", (CONV, H), True
            yield a + "in_proj_z.weight", (NV * DV, H), True
            yield a + "in_proj_b.weight", (NV, H), True
            yield a + "in_proj_a.weight", (NV, H), True
            yield a + "conv1d.weight", (CONV, 1, K), True
            yield a + "A_log", (NV,), np.log(RNG.uniform(1, 16, NV))
            yield a + "dt_bias", (NV,), 1.0
            yield a + "norm.weight", (DV,), 1.0
            yield a + "out_proj.weight", (H, NV * DV), True
        yield p + "post_attention_layernorm.weight", (H,), 0.0
        yield p + "mlp.gate.weight", (E, H), True
        yield p + "mlp.experts.gate_up_proj", (E, 2 * I, H), True
        yield p + "mlp.experts.down_proj", (E, H, I), True
        yield p + "mlp.shared_expert.gate_proj.weight", (IS, H), True
        yield p + "mlp.shared_expert.up_proj.weight", (IS, H), True
        yield p + "mlp.shared_expert.down_proj.weight", (H, IS), True
        yield p + "mlp.shared_expert_gate.weight", (1, H), True
    yield P + "norm.weight", (H,), 0.0
    yield "lm_head.weight", (V, H), True


write_checkpoint(out, config, list(specs()), tokdir, ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))
