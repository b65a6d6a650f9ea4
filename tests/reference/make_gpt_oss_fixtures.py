#!/usr/bin/env python3
"""Make the tiny gpt-oss checkpoints under tests/fixtures/ and what transformers computes on
them. Run once, by hand, with the oracle environment of make_fixtures.py (torch +
transformers); the tests only read what this writes.

usage: make_gpt_oss_fixtures.py OUT_DIR [NAME ...]   (default: gpt-oss-mxfp4, the one committed)

Same reference.safetensors keys as make_fixtures.py (logits, generated_ids / gen_logits /
gen_margin with 24 decoded tokens, forced_*), plus
    router_topk_idx  i64 [L, T, k]   each layer's choice (top-k of the router's logits)
    router_margin    f32 [L, T]      logit_k - logit_{k+1}
    dequant_gate_up  f32 [E, H, 2I]  layer 0's experts as transformers holds them after loading
    dequant_down     f32 [E, I, H]   (for the MXFP4 checkpoint: its dequantization, the oracle)

The shapes share nothing the released models happen to share:
  gpt-oss        GptOssForCausalLM in bf16, hub spelling (rope_scaling yarn with truncate
                 false), layer kinds not alternating (full, sliding, sliding, full), a window of
                 20 under a ~270-token prompt, 4 query heads of 32 over 2 KV heads (q_dim 128 !=
                 hidden 96), 8 experts top-3; every bias non-zero, sinks of about e^1 to e^4
                 (a real share of each softmax), gate/up weights large enough that the clamp at
                 7 bites (the share clamped is in reference.json).
  gpt-oss-mxfp4  the same weights with the experts in the hub's MXFP4 (`*_blocks`, `*_scales`,
                 quantization_config mxfp4), quantized here to the nearest e2m1 value under a
                 power-of-two scale per 32; transformers dequantizes them on load
                 (Mxfp4Config(dequantize=True)), which is the oracle.
Only gpt-oss-mxfp4 is committed (the tree's size budget): the tests derive the bf16 release
layout from it (src/derived_fixture.rs), and its MXFP4 values are exact in bf16, so its
references serve both.

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import FORCED, PROMPT, QWEN3_FORCED, QWEN3_PROMPT, greedy_and_forced, save_random  # noqa: E402

LONG = 13  # prompt repeats: ~270 tokens, past the window and the engine's 256-token chunk
GEN = 24
SEED = 31

CONFIG = dict(vocab_size=1024, hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, intermediate_size=64, num_local_experts=8, num_experts_per_tok=3, sliding_window=20,
              layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
              rms_norm_eps=1e-5, max_position_embeddings=512, attention_bias=True, tie_word_embeddings=False,
              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
              initializer_range=0.02, pad_token_id=None, eos_token_id=None, bos_token_id=None)

FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


@torch.no_grad()
def perturb(model):
    g = torch.Generator().manual_seed(4321)
    rnd = lambda shape, std, mean=0.0: torch.randn(shape, generator=g) * std + mean  # noqa: E731
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.copy_(1.0 + rnd(p.shape, 0.1))
        elif name.endswith("self_attn.sinks"):
            p.copy_(rnd(p.shape, 1.0, 2.5))
        elif name.endswith("_proj.bias") and ".self_attn." in name:
            p.copy_(rnd(p.shape, 0.05))
        elif name.endswith("mlp.router.weight"):
            p.mul_(4.0)
        elif name.endswith("mlp.router.bias"):
            p.copy_(rnd(p.shape, 0.2))
        elif name.endswith("experts.gate_up_proj"):
            p.mul_(20.0)
        elif name.endswith("experts.gate_up_proj_bias"):
            p.copy_(rnd(p.shape, 0.5))
        elif name.endswith("experts.down_proj_bias"):
            p.copy_(rnd(p.shape, 0.05))


def hub_spelling(path):
    """config.json as the released gpt-oss spells it: rope_scaling (yarn) and a top-level
    rope_theta instead of rope_parameters, torch_dtype."""
    c = json.load(open(path))
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    c["torch_dtype"] = c.pop("dtype", "bfloat16")
    c["swiglu_limit"] = 7.0
    json.dump(c, open(path, "w"), indent=2, sort_keys=True)


def mxfp4(w):
    """w [..., n] (n a multiple of 32) -> (blocks u8 [..., n/32, 16], scales u8 [..., n/32]): a
    power-of-two scale per 32 (the largest magnitude lands in [4, 8), clamped at 6) and each
    value the nearest e2m1 code, low nibble first."""
    w = w.astype(np.float32)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(g).max(-1)
    e = np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-30))) - 2, 0).astype(np.int32)
    e = np.clip(e, -127, 127)
    x = g / np.exp2(e)[..., None]
    codes = np.abs(x[..., None] - FP4[None, :]).argmin(-1).astype(np.uint8)  # nearest (first on ties)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), (e + 127).astype(np.uint8)


def to_mxfp4(out):
    """Rewrite the experts of the checkpoint in `out` into the hub's MXFP4 tensors."""
    path = os.path.join(out, "model.safetensors")
    with safe_open(path, "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    for k in list(t):
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            w = t.pop(k).float().numpy()  # [E, in, out]: rows of the stored matrix are its outputs
            blocks, scales = mxfp4(np.ascontiguousarray(np.swapaxes(w, 1, 2)))
            t[k + "_blocks"] = torch.from_numpy(blocks)
            t[k + "_scales"] = torch.from_numpy(scales)
    save_file({k: v.contiguous() for k, v in t.items()}, path, metadata={"format": "pt"})
    c = json.load(open(os.path.join(out, "config.json")))
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2, sort_keys=True)


def make(name, out_root):
    out = os.path.join(out_root, name)
    cfg = transformers.GptOssConfig(**CONFIG)
    save_random(lambda: transformers.GptOssForCausalLM(cfg), perturb, SEED, out)
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        print(name, "saved:", {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if ".layers.0." in k})
    hub_spelling(os.path.join(out, "config.json"))
    kw = {}
    if name.endswith("mxfp4"):
        to_mxfp4(out)
        kw["quantization_config"] = transformers.Mxfp4Config(dequantize=True)

    V = CONFIG["vocab_size"]
    ids = [i % V for i in QWEN3_PROMPT] * LONG
    forced = [i % V for i in QWEN3_FORCED]
    try:
        m = transformers.GptOssForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                           experts_implementation="eager", **kw)
    except TypeError:  # transformers before experts_implementation: eager is all there is
        m = transformers.GptOssForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager", **kw)
    m = m.float().eval()
    experts0 = m.model.layers[0].mlp.experts
    L, K = cfg.num_hidden_layers, cfg.num_experts_per_tok
    x = torch.tensor([ids])
    # every layer's router logits, and how often the clamp bites
    caught, clamped = [], [0, 0]

    def router_hook(mod, i, o):
        caught.append(o[0].detach().float())

    def experts_hook(mod, i, o):
        hs, idx = i[0], i[1]
        for e in idx.unique().tolist():
            tok = (idx == e).any(-1)
            gu = hs[tok] @ mod.gate_up_proj[e] + mod.gate_up_proj_bias[e]
            clamped[0] += int((gu[..., ::2] > 7).sum() + (gu[..., 1::2].abs() > 7).sum())
            clamped[1] += gu.numel()

    hooks = [lay.mlp.router.register_forward_hook(router_hook) for lay in m.model.layers]
    hooks += [lay.mlp.experts.register_forward_hook(experts_hook) for lay in m.model.layers]
    with torch.no_grad():
        o = m(input_ids=x, use_cache=False)
    for h in hooks:
        h.remove()
    rl = torch.stack(caught[:L])  # [L, T, E]
    top_v, top_i = torch.topk(rl, K + 1, -1)
    T = len(ids)
    ref = dict(input_ids=torch.tensor(ids), logits=o.logits[0].float().contiguous(),
               router_topk_idx=top_i[..., :K].contiguous(), router_margin=(top_v[..., K - 1] - top_v[..., K]).contiguous(),
               dequant_gate_up=experts0.gate_up_proj.detach().float().contiguous(),
               dequant_down=experts0.down_proj.detach().float().contiguous())
    tail, gen, gl, _ = greedy_and_forced(m, ids, forced, GEN)
    ref.update(tail)
    with torch.no_grad():
        full = m(input_ids=torch.cat([x[0], gen[:-1]]).unsqueeze(0), use_cache=False).logits[0].float()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    info = dict(fixture=name, seed=SEED, config=CONFIG, prompt=" ".join([PROMPT] * LONG) + " (Qwen3 ids mod vocab)",
                prompt_ids=ids, forced=FORCED, forced_ids=forced, generated_ids=gen.tolist(),
                gen_margin_min=float(ref["gen_margin"].min()), router_margin_min=float(ref["router_margin"].min()),
                router_margin_below_1em4=int((ref["router_margin"] < 1e-4).sum()),
                clamped_share=clamped[0] / max(clamped[1], 1),
                cache_vs_onepass_max_abs=float((full[T - 1:] - gl).abs().max()),
                logits_abs_max=float(ref["logits"].abs().max()), logits_std=float(ref["logits"].std()),
                versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    json.dump(info, open(os.path.join(out, "reference.json"), "w"), indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: {size / 1e6:.2f} MB, T {T}, gen margin min {info['gen_margin_min']:.2e}, router margin min "
          f"{info['router_margin_min']:.2e} ({info['router_margin_below_1em4']} below 1e-4), clamped "
          f"{info['clamped_share']:.3f}, cache vs one pass {info['cache_vs_onepass_max_abs']:.1e}, "
          f"logits |max| {info['logits_abs_max']:.2f} std {info['logits_std']:.3f}, files {sorted(os.listdir(out))}")


def main():
    out = sys.argv[1]
    torch.set_num_threads(4)
    for n in sys.argv[2:] or ["gpt-oss-mxfp4"]:
        make(n, out)


if __name__ == "__main__":
    main()
