#!/usr/bin/env python3
"""Make the tiny hybrid checkpoints (Qwen3-Next, Qwen3.5-MoE: Gated DeltaNet + gated attention)
under tests/fixtures/ and what transformers computes on them. Run once, by hand, with the
oracle environment of make_fixtures.py (torch + transformers 5.24.0); the tests only read what
this writes.

usage: make_hybrid_fixtures.py OUT_DIR [NAME ...]   (default: next and qwen35)

Same files and reference.safetensors keys as make_fixtures.py (logits, hidden_states,
router_*, generated_ids / gen_logits / gen_margin with 24 decoded tokens, forced_*).

The two fixtures share nothing the released models happen to share, as the engine must not
assume it either:
  next    Qwen3NextForCausalLM, hub spelling (full_attention_interval 4, top-level rope_theta and
          partial_rotary_factor), per-expert tensors, untied, norm_topk_prob false, a dense
          layer through mlp_only_layers, dk 16 != dv 24, 2 key heads / 6 value heads (r = 3).
  qwen35  Qwen3_5MoeForConditionalGeneration with a tiny vision tower and dummy mtp.* tensors,
          transformers-5 spelling (text_config, rope_parameters with mrope_section), fused
          experts (gate_up_proj / down_proj), tied embeddings, hidden 96 (not a multiple of 64),
          non-periodic layer_types (linear, full, linear, linear), dk 24 != dv 16, 2 / 4 heads.
Both prompts are ~270 tokens: past transformers' 64-token delta-rule chunks and the engine's
256-token prefill chunk.

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import json
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import FORCED, PROMPT, QWEN3_FORCED, QWEN3_PROMPT, greedy_and_forced, fuse_experts, prefill_with_hidden, save_random  # noqa: E402

LONG = 13  # prompt repeats: ~270 tokens
GEN = 24

COMMON = dict(vocab_size=1024, num_hidden_layers=4, linear_conv_kernel_dim=4, max_position_embeddings=4096,
              rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, initializer_range=0.02)

FIXTURES = {
    "next": dict(arch="qwen3_next", seed=21, text=dict(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_key_head_dim=16, linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=6,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=48,
        intermediate_size=96, mlp_only_layers=[1], decoder_sparse_step=1, norm_topk_prob=False,
        tie_word_embeddings=False, layer_types=["linear_attention"] * 3 + ["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25})),
    # the shape of the qwen3next GGUF fixtures (tests/reference/gguf_next_device.sh): every layer
    # MoE and the top-k renormalised, as llama.cpp's qwen3next graph assumes (and Qwen3-Next-80B is)
    "next-moe": dict(arch="qwen3_next", seed=23, text=dict(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_key_head_dim=16, linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=6,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=48,
        intermediate_size=96, mlp_only_layers=[], decoder_sparse_step=1, norm_topk_prob=True,
        tie_word_embeddings=False, layer_types=["linear_attention"] * 3 + ["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25})),
    "qwen35": dict(arch="qwen3_5_moe", seed=22, fused=True, mtp=True, text=dict(
        hidden_size=96, num_attention_heads=3, num_key_value_heads=1, head_dim=32,
        linear_key_head_dim=24, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=10, num_experts_per_tok=3, moe_intermediate_size=48, shared_expert_intermediate_size=32,
        tie_word_embeddings=True,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        # 32 * 0.25 = 8 rotary dims = 4 frequencies = sum(mrope_section)
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True})),
}


def config(spec):
    text = dict(COMMON)
    text.update(spec["text"])
    if spec["arch"] == "qwen3_next":
        return transformers.Qwen3NextConfig(**text), transformers.Qwen3NextForCausalLM
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=text["hidden_size"],
                  num_position_embeddings=64)
    cfg = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=vision,
                                        tie_word_embeddings=text["tie_word_embeddings"])
    return cfg, transformers.Qwen3_5MoeForConditionalGeneration


@torch.no_grad()
def perturb(model):
    """Zero-centred (1 + w) norms get N(0, 0.1), plain ones 1 + N(0, 0.1), so a norm read with the
    wrong offset shows; routers x4 (wider top-k margins)."""
    g = torch.Generator().manual_seed(1234)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            noise = torch.randn(p.shape, generator=g) * 0.1
            if torch.all(p == 0):
                p.copy_(noise)
            elif torch.all(p == 1):
                p.copy_(1.0 + noise)
        elif name.endswith("mlp.gate.weight") and p.dim() == 2 and p.shape[0] > 1:
            p.mul_(4.0)


def hub_spelling_next(path):
    """config.json as public Qwen3-Next copies spell it: full_attention_interval instead of
    layer_types, top-level rope_theta / partial_rotary_factor, num_experts, torch_dtype."""
    c = json.load(open(path))
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp["rope_theta"]
    c["partial_rotary_factor"] = rp["partial_rotary_factor"]
    c["rope_scaling"] = None
    if "num_local_experts" in c:
        c["num_experts"] = c.pop("num_local_experts")
    c["torch_dtype"] = c.pop("dtype", "bfloat16")
    lt = c.pop("layer_types")
    interval = lt.index("full_attention") + 1
    assert lt == ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(len(lt))]
    c["full_attention_interval"] = interval
    json.dump(c, open(path, "w"), indent=2, sort_keys=True)


def add_mtp(out, h):
    """Dummy mtp.* tensors in a shard of their own, listed in an index, as released files carry."""
    extra = {"mtp.fc.weight": torch.randn(h, 2 * h) * 0.02, "mtp.norm.weight": torch.ones(h),
             "mtp.layers.0.input_layernorm.weight": torch.ones(h)}
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in extra.items()},
              os.path.join(out, "model-00002-of-00002.safetensors"))
    first = "model-00001-of-00002.safetensors"
    os.replace(os.path.join(out, "model.safetensors"), os.path.join(out, first))
    with safe_open(os.path.join(out, first), "pt") as f:
        idx = {"metadata": {}, "weight_map": {k: first for k in f.keys()}}
    for k in extra:
        idx["weight_map"][k] = "model-00002-of-00002.safetensors"
    json.dump(idx, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)


def text_model(m):
    inner = m.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def make(name, out_root):
    spec = FIXTURES[name]
    cfg, cls = config(spec)
    out = os.path.join(out_root, name)
    save_random(lambda: cls(cfg), perturb, spec["seed"], out)
    if spec["arch"] == "qwen3_next":
        hub_spelling_next(os.path.join(out, "config.json"))
    if spec.get("fused"):
        fuse_experts(out)
        with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
            keys = list(f.keys())
        assert any(k.endswith("experts.gate_up_proj") for k in keys), "not fused"
        assert any(k.startswith("model.visual.") for k in keys), "no vision tower"
    if spec.get("mtp"):
        add_mtp(out, spec["text"]["hidden_size"])

    V = COMMON["vocab_size"]
    ids = [i % V for i in QWEN3_PROMPT] * LONG
    forced = [i % V for i in QWEN3_FORCED]

    try:
        m = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                experts_implementation="eager").eval()
    except TypeError:  # transformers before experts_implementation: eager is all there is
        m = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    tc = m.config.get_text_config() if hasattr(m.config, "get_text_config") else m.config
    tm = text_model(m)
    L, E, K = tc.num_hidden_layers, tc.num_experts, tc.num_experts_per_tok
    x = torch.tensor([ids])
    o, hs, rl = prefill_with_hidden(m, tm, x, L, E)
    T = len(ids)
    mlp_only = getattr(tc, "mlp_only_layers", []) or []
    moe_layers = [i for i in range(L) if i not in mlp_only]
    assert rl.shape[0] == len(moe_layers), (rl.shape, moe_layers)
    probs = torch.softmax(rl, -1)
    top_v, top_i = torch.topk(probs, K, -1)
    margin = top_v[..., K - 1] - torch.topk(probs, K + 1, -1).values[..., K]
    renorm = getattr(tc, "norm_topk_prob", True)
    top_w = top_v / top_v.sum(-1, keepdim=True) if renorm else top_v
    logits = o.logits[0].float()
    ref = dict(input_ids=torch.tensor(ids), logits=logits.contiguous(),
               hidden_states=torch.stack([hs[i][0].float() for i in range(L + 2)]).contiguous(),
               router_logits=rl.contiguous(), router_topk_idx=top_i.contiguous(),
               router_topk_weight=top_w.contiguous(), router_margin=margin.contiguous())
    tail, gen, gl, _ = greedy_and_forced(m, ids, forced, GEN)
    ref.update(tail)
    with torch.no_grad():
        full = m(input_ids=torch.cat([x[0], gen[:-1]]).unsqueeze(0), use_cache=False).logits[0].float()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    info = dict(fixture=name, arch=spec["arch"], seed=spec["seed"], text_config=spec["text"], moe_layers=moe_layers,
                prompt=" ".join([PROMPT] * LONG) + " (Qwen3 ids mod vocab)", prompt_ids=ids, forced=FORCED,
                forced_ids=forced, generated_ids=gen.tolist(), gen_margin_min=float(ref["gen_margin"].min()),
                router_margin_min=float(margin.min()), router_margin_below_1em4=int((margin < 1e-4).sum()),
                cache_vs_onepass_max_abs=float((full[T - 1:] - gl).abs().max()),
                logits_abs_max=float(logits.abs().max()), logits_std=float(logits.std()),
                versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    json.dump(info, open(os.path.join(out, "reference.json"), "w"), indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: {size / 1e6:.2f} MB, T {T}, gen margin min {info['gen_margin_min']:.2e}, router margin min "
          f"{info['router_margin_min']:.2e} ({info['router_margin_below_1em4']} below 1e-4), cache vs one pass "
          f"{info['cache_vs_onepass_max_abs']:.1e}, files {sorted(os.listdir(out))}")


def main():
    out = sys.argv[1]
    torch.set_num_threads(2)
    # next-moe is made only for its GGUFs (gguf_next_device.sh), not kept as a checkpoint
    for n in sys.argv[2:] or [n for n in FIXTURES if n != "next-moe"]:
        make(n, out)


if __name__ == "__main__":
    main()
