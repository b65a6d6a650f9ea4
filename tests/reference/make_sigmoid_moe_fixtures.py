#!/usr/bin/env python3
"""Make the tiny checkpoints of the sigmoid-routed families (GLM-4.5's `glm4_moe`, DeepSeek-V3's
`deepseek_v3`) under
tests/fixtures/ and what transformers computes on them. Run once, by hand, with the oracle
environment of make_fixtures.py (torch + transformers); the tests only read what this writes.

usage: make_sigmoid_moe_fixtures.py OUT_DIR [NAME ...]   (default: every fixture below)

Same reference.safetensors keys as make_fixtures.py (logits, generated_ids / gen_logits /
gen_margin with 24 decoded tokens, forced_*), plus
    router_topk_idx  i64 [Lm, T, k]   each MoE layer's choice (Lm: the MoE layers)
    router_margin    f32 [Lm, T]      c_k - c_{k+1} of the choice scores (sigmoid + correction,
                                      experts outside the kept groups at -inf): below ~1e-4 the
                                      set may flip legitimately
    router_topk_weight f32 [Lm, T, k] the weights transformers used

The shapes share nothing the released models happen to share:
  glm     Glm4MoeForCausalLM, hub spelling (top-level rope_theta and partial_rotary_factor,
          n_routed_experts, num_nextn_predict_layers), 4 query heads of 32 over 2 KV heads
          (q_dim 128 != hidden 64), rotary on a quarter of each head, q/k norms, q/k/v biases
          non-zero, the first layer dense, 8 experts top-3 with a non-zero correction bias,
          no renormalisation, routed scaling 2.5, one shared expert, a ~270-token prompt.
  deepseek          DeepseekV3ForCausalLM: multi-head latent attention with q_lora (48) and
                    kv_lora (32), qk_nope 16 + qk_rope 8 against v 24, rope interleaved, YaRN x4
                    over 128 positions with mscale 1 and mscale_all_dim 0.8 (so both the cos/sin
                    factor and the softmax scale move), 8 experts in 4 groups keeping 2, top-3,
                    correction bias, renormalised, routed scaling 2.5, a shared expert, the
                    first layer dense.
  deepseek-noqlora  a plain q_proj (q_lora_rank null), rope not interleaved, no YaRN, two
                    shared experts, no renormalisation, vocabulary 128.
Vocabulary 256 or less: the logits are most of a fixture's bytes.

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import FORCED, PROMPT, QWEN3_FORCED, QWEN3_PROMPT, greedy_and_forced, save_random  # noqa: E402

LONG = 13  # prompt repeats: ~270 tokens, past the engine's 256-token chunk
GEN = 24

FIXTURES = {
    "glm": dict(
        cls="Glm4MoeForCausalLM", cfg="Glm4MoeConfig", seed=43,
        config=dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                    num_experts_per_tok=3, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
                    norm_topk_prob=False, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
                    rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                    initializer_range=0.02, pad_token_id=None, eos_token_id=None, bos_token_id=None),
    ),
    "deepseek": dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", seed=47,
        config=dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                    q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                    intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
                    n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1, norm_topk_prob=True,
                    routed_scaling_factor=2.5, rope_interleave=True, attention_bias=False, rms_norm_eps=1e-6,
                    max_position_embeddings=512, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "mscale": 1.0, "mscale_all_dim": 0.8},
                    initializer_range=0.02, pad_token_id=None, eos_token_id=None, bos_token_id=None),
    ),
    "deepseek-noqlora": dict(
        cls="DeepseekV3ForCausalLM", cfg="DeepseekV3Config", seed=53,
        config=dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                    q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                    intermediate_size=64, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                    n_shared_experts=2, n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=False,
                    routed_scaling_factor=1.0, rope_interleave=False, attention_bias=False, rms_norm_eps=1e-6,
                    max_position_embeddings=512, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    initializer_range=0.02, pad_token_id=None, eos_token_id=None, bos_token_id=None),
    ),
}


@torch.no_grad()
def perturb(model):
    g = torch.Generator().manual_seed(4321)
    rnd = lambda shape, std, mean=0.0: torch.randn(shape, generator=g) * std + mean  # noqa: E731
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.copy_(1.0 + rnd(p.shape, 0.1))
        elif name.endswith("_proj.bias"):
            p.copy_(rnd(p.shape, 0.05))
        elif name.endswith("mlp.gate.weight"):
            p.mul_(4.0)
        elif name in ("lm_head.weight", "model.embed_tokens.weight"):
            p.mul_(4.0)  # livelier logits: the greedy tokens vary
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(rnd(b.shape, 0.05))


def hub_spelling(path, mtp_layers=1):
    """config.json as the released checkpoints spell it: top-level rope_theta (and
    partial_rotary_factor), n_routed_experts, num_nextn_predict_layers, torch_dtype."""
    c = json.load(open(path))
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    if "partial_rotary_factor" in rp:
        c["partial_rotary_factor"] = rp.pop("partial_rotary_factor")
    ty = rp.pop("rope_type", "default")
    c["rope_scaling"] = dict(rp, type=ty) if ty != "default" else None  # DeepSeek-V3's spelling
    if "num_local_experts" in c:
        c["n_routed_experts"] = c.pop("num_local_experts")
    c.pop("num_mtp_layers", None)
    c["num_nextn_predict_layers"] = mtp_layers
    c["torch_dtype"] = c.pop("dtype", "bfloat16")
    json.dump(c, open(path, "w"), indent=2, sort_keys=True)


def make(name, out_root):
    spec = FIXTURES[name]
    out = os.path.join(out_root, name)
    cls = getattr(transformers, spec["cls"])
    cfg = getattr(transformers, spec["cfg"])(**spec["config"])
    save_random(lambda: cls(cfg), perturb, spec["seed"], out)
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        print(name, "saved:", {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if ".layers.1." in k})
    hub_spelling(os.path.join(out, "config.json"))

    V = cfg.vocab_size
    ids = [i % V for i in QWEN3_PROMPT] * LONG
    forced = [i % V for i in QWEN3_FORCED]
    m = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    m = m.float().eval()
    rope = m.model.rotary_emb.rope_type
    assert rope == spec["config"]["rope_parameters"]["rope_type"], f"reloaded with {rope} RoPE"
    K = cfg.num_experts_per_tok
    x = torch.tensor([ids])
    # every MoE layer's choice scores and choice, from its router's own forward
    caught = []

    def router_hook(mod, i, o):
        h = i[0].view(-1, mod.hidden_dim).float()
        s = torch.sigmoid(h @ mod.weight.float().T)
        c = s + mod.e_score_correction_bias
        ng = mod.num_group
        gs = c.view(-1, ng, mod.num_experts // ng).topk(2, -1)[0].sum(-1)
        keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, mod.topk_group, -1)[1], 1)
        mask = keep.unsqueeze(-1).expand(-1, ng, mod.num_experts // ng).reshape(-1, mod.num_experts)
        c = c.masked_fill(~mask.bool(), float("-inf"))
        caught.append((c, o[2], o[1]))

    hooks = [lay.mlp.gate.register_forward_hook(router_hook) for lay in m.model.layers if hasattr(lay.mlp, "gate")]
    with torch.no_grad():
        o = m(input_ids=x, use_cache=False)
    for h in hooks:
        h.remove()
    choice = torch.stack([c for c, _, _ in caught])  # [Lm, T, E]
    top_v, top_i = torch.topk(choice, K + 1, -1)
    idx = torch.stack([i for _, i, _ in caught])  # [Lm, T, k] transformers' own (unsorted)
    assert torch.equal(idx.sort(-1).values, top_i[..., :K].sort(-1).values), "the hook's choice is not the router's"
    margin = (top_v[..., K - 1] - top_v[..., K]).nan_to_num(posinf=1e9)
    ref = dict(input_ids=torch.tensor(ids), logits=o.logits[0].float().contiguous(),
               router_topk_idx=top_i[..., :K].contiguous(), router_margin=margin.contiguous(),
               router_topk_weight=torch.stack([w for _, _, w in caught]).float().contiguous())
    tail, gen, gl, _ = greedy_and_forced(m, ids, forced, GEN)
    ref.update(tail)
    T = len(ids)
    with torch.no_grad():
        full = m(input_ids=torch.cat([x[0], gen[:-1]]).unsqueeze(0), use_cache=False).logits[0].float()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    info = dict(fixture=name, seed=spec["seed"], config=spec["config"],
                prompt=" ".join([PROMPT] * LONG) + " (Qwen3 ids mod vocab)", prompt_ids=ids, forced=FORCED,
                forced_ids=forced, generated_ids=gen.tolist(), gen_margin_min=float(ref["gen_margin"].min()),
                router_margin_min=float(margin.min()), router_margin_below_1em4=int((margin < 1e-4).sum()),
                cache_vs_onepass_max_abs=float((full[T - 1:] - gl).abs().max()),
                logits_abs_max=float(ref["logits"].abs().max()), logits_std=float(ref["logits"].std()),
                versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    json.dump(info, open(os.path.join(out, "reference.json"), "w"), indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: {size / 1e6:.2f} MB, T {T}, gen margin min {info['gen_margin_min']:.2e}, router margin min "
          f"{info['router_margin_min']:.2e} ({info['router_margin_below_1em4']} below 1e-4), cache vs one pass "
          f"{info['cache_vs_onepass_max_abs']:.1e}, logits |max| {info['logits_abs_max']:.2f} std "
          f"{info['logits_std']:.3f}, generated {gen.tolist()}, files {sorted(os.listdir(out))}")


def main():
    out = sys.argv[1]
    torch.set_num_threads(2)
    for n in sys.argv[2:] or list(FIXTURES):
        make(n, out)


if __name__ == "__main__":
    main()
