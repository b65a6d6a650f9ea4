#!/usr/bin/env python3
"""Make the tiny Qwen3-MoE checkpoints under tests/fixtures/ and what transformers computes on
them (the oracle of the engine tests). Run once, by hand, with torch + transformers
(see ../../README.md, "Fixtures"); the tests only read what this writes.

usage: make_fixtures.py OUT_DIR [NAME ...]      (default: every fixture)
       make_fixtures.py OUT_DIR --custom NAME '{"config": {...}, "seed": 11, "shard": "1MB", "fused": false}'
                                                 (a checkpoint of any other shape, to check the
                                                 engine beyond the committed fixtures; see
                                                 MOESCOPE_EXTRA_FIXTURES in tests/reference_logits.rs)

Each fixture is a directory holding a HuggingFace checkpoint (config.json, bf16 safetensors,
maybe an index and a tokenizer) plus:
  reference.safetensors
    input_ids          i64 [T]          the prompt
    logits             f32 [T, V]       one pass over the prompt, every position
    hidden_states      f32 [L+2, T, H]  embeddings, output of each layer, after final norm
    router_logits      f32 [Lm, T, E]   per MoE layer (Lm = number of MoE layers)
    router_topk_idx    i64 [Lm, T, k]   descending probability
    router_topk_weight f32 [Lm, T, k]   weights used (renormalised iff norm_topk_prob)
    router_margin      f32 [Lm, T]      p_k - p_{k+1}: below ~1e-4 the set may flip legitimately
    generated_ids      i64 [G]          greedy continuation through HF's KV cache
    gen_logits         f32 [G, V]       logits that chose each generated id
    gen_margin         f32 [G]          top1 - top2 of those logits
    forced_ids         i64 [F]          a fixed continuation, for teacher-forced decode tests
    forced_logits      f32 [F, V]       forced_logits[i] = logits after prompt + forced[:i] (one pass)
  reference.json       the same facts in words, versions, and the generated ids

How: the model is built in fp32 with a fixed seed, its norm weights perturbed (1 + N(0, 0.1), so
an ignored norm weight shows) and its router scaled by 4 (wider top-k margins), saved in bf16;
then the *saved files* are loaded back in fp32 with eager attention and eager experts, so every
reference is exact fp32 math on the bf16-rounded weights.

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import json
import os
import re
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO_TOK = os.path.join(HERE, "..", "..", "src", "demo")
PROMPT = "The quick brown fox jumps over the lazy dog. Hello, 世界! 1+1=2"
FORCED = " Rust is a systems programming language; 混合专家 models route each token to a few experts."
# ids of PROMPT / FORCED in the real Qwen3 tokenizer (checked in make_tokenizer_fixtures.py);
# fixtures without a tokenizer use them modulo their vocabulary
QWEN3_PROMPT = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 21927, 11, 220, 99489, 0, 220,
                16, 10, 16, 28, 17]
QWEN3_FORCED = [33789, 374, 264, 5942, 15473, 4128, 26, 6567, 115, 115, 39762, 101057, 4119, 6021, 1817,
                3950, 311, 264, 2421, 11647, 13]

BASE = dict(vocab_size=1024, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, intermediate_size=192, moe_intermediate_size=64,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], tie_word_embeddings=False, max_position_embeddings=2048)

# name -> (config overrides, options). Together they cover: single file; sharded with an index;
# a dense layer through mlp_only_layers with norm_topk_prob false; tied embeddings; fused experts;
# the transformers-5 config spelling; odd sizes with multi-head attention (no grouping), more
# experts, another top-k, decoder_sparse_step 2; and a real (trained) tokenizer.
FIXTURES = {
    "single": ({}, dict(seed=0)),
    # not committed: the tests split "single" into shards instead (src/derived_fixture.rs)
    "sharded": ({}, dict(seed=1, shard="700KB")),
    "dense-layer": (dict(mlp_only_layers=[1], norm_topk_prob=False, intermediate_size=160), dict(seed=2)),
    "tied-demo-tok": (dict(tie_word_embeddings=True, vocab_size=4096, num_hidden_layers=2),
                      dict(seed=3, tokenizer=DEMO_TOK)),
    "fused": ({}, dict(seed=4, fused=True)),
    # seed 0, single's: the tree keeps only this fixture's config.json, the rest are symlinks to
    # single's files (the tree's size budget); its weights were seed 5's until session 27
    "t5-config": ({}, dict(seed=0, t5_config=True)),
    "odd": (dict(vocab_size=999, hidden_size=80, num_attention_heads=5, num_key_value_heads=5, head_dim=16,
                 intermediate_size=112, moe_intermediate_size=48, num_experts=24, num_experts_per_tok=6,
                 decoder_sparse_step=2, num_hidden_layers=4, tie_word_embeddings=True),
            dict(seed=6, shard="600KB")),
    "wide": (dict(vocab_size=512, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  moe_intermediate_size=32, num_experts=64, num_experts_per_tok=8, num_hidden_layers=2),
             dict(seed=7, fused=True)),
    # YaRN as Qwen3's model card adds it (rope_scaling type yarn, factor 4), shrunk: 64 original
    # positions x 4; the prompt (5 x 21 tokens) and its continuation run past the original 64
    "yarn": (dict(num_hidden_layers=2, max_position_embeddings=256),
             dict(seed=8, repeat=5, rope=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                             original_max_position_embeddings=64))),
}


def perturb(model):
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
            elif name.endswith("mlp.gate.weight"):
                p.mul_(4.0)


def hub_spelling(path):
    """config.json as the official Qwen3-MoE hub checkpoints spell it (transformers-4 keys)."""
    c = json.load(open(path))
    rp = c.pop("rope_parameters", None) or {}
    c["rope_theta"] = rp.pop("rope_theta", 1000000.0)
    c["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    if "num_local_experts" in c:
        c["num_experts"] = c.pop("num_local_experts")
    c["torch_dtype"] = c.pop("dtype", "bfloat16")
    c["use_sliding_window"] = False
    c["max_window_layers"] = c["num_hidden_layers"]
    json.dump(c, open(path, "w"), indent=2, sort_keys=True)


def fuse_experts(d):
    """Rewrite per-expert tensors into the fused layout of the official Qwen3.5 checkpoints:
    experts.gate_up_proj [E, 2I, H] (gate rows then up rows) and experts.down_proj [E, H, I]."""
    files = [f for f in os.listdir(d) if f.endswith(".safetensors") and f.startswith("model")]
    assert files == ["model.safetensors"], "fuse only single-file fixtures"
    path = os.path.join(d, "model.safetensors")
    with safe_open(path, "pt") as fh:
        meta = fh.metadata()
        T = {k: fh.get_tensor(k) for k in fh.keys()}
    pat = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    groups = {}
    for k in list(T):
        m = pat.match(k)
        if m:
            groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = T.pop(k)
    for pre, ex in groups.items():
        E = len(ex)
        T[pre + ".gate_up_proj"] = torch.stack([torch.cat([ex[e]["gate"], ex[e]["up"]]) for e in range(E)]).contiguous()
        T[pre + ".down_proj"] = torch.stack([ex[e]["down"] for e in range(E)]).contiguous()
    save_file(T, path, metadata=meta)


def make(name, out_root):
    over, opt = FIXTURES[name]
    kw = dict(BASE)
    kw.update(over)
    rope = opt.get("rope", {"rope_type": "default", "rope_theta": 1000000.0})
    cfg = transformers.Qwen3MoeConfig(hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False,
                                      rope_parameters=rope,
                                      use_sliding_window=False, sliding_window=None, router_aux_loss_coef=0.001,
                                      initializer_range=0.02, **kw)
    out = os.path.join(out_root, name)
    save_random(lambda: transformers.Qwen3MoeForCausalLM(cfg), perturb, opt["seed"], out,
                max_shard_size=opt.get("shard", "50GB"))
    if not opt.get("t5_config"):
        hub_spelling(os.path.join(out, "config.json"))
    if opt.get("fused"):
        fuse_experts(out)

    V = kw["vocab_size"]
    if opt.get("tokenizer"):
        from tokenizers import Tokenizer
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(opt["tokenizer"], f), out)
        tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        ids, forced = tok.encode(PROMPT).ids, tok.encode(FORCED).ids
        assert max(ids + forced) < V
    else:
        ids, forced = [i % V for i in QWEN3_PROMPT] * opt.get("repeat", 1), [i % V for i in QWEN3_FORCED]

    oracle(out, ids, forced, dict(fixture=name, seed=opt["seed"], config_overrides=over,
                                  fused=bool(opt.get("fused")), transformers5_config=bool(opt.get("t5_config")),
                                  tokenizer=os.path.basename(os.path.normpath(opt["tokenizer"])) if opt.get("tokenizer") else None))


def prefill_with_hidden(m, tm, x, L, E):
    """One pass of `m` over `x` ([1, T]) with the hidden states of its text model `tm` caught on
    the way (embeddings, each layer's output, after the final norm) and the router logits of the
    MoE layers, in layer order ([Lm, T, E])."""
    hs = {}
    hooks = [tm.embed_tokens.register_forward_hook(lambda mod, i, o: hs.__setitem__(0, o.detach().clone()))]
    for li, layer in enumerate(tm.layers):
        hooks.append(layer.register_forward_hook(
            lambda mod, i, o, li=li: hs.__setitem__(li + 1, (o[0] if isinstance(o, tuple) else o).detach().clone())))
    hooks.append(tm.norm.register_forward_hook(lambda mod, i, o: hs.__setitem__(L + 1, o.detach().clone())))
    with torch.no_grad():
        o = m(input_ids=x, output_router_logits=True, use_cache=False)
    for h in hooks:
        h.remove()
    T = x.shape[1]
    rl = torch.stack([r.reshape(T, E).float() for r in o.router_logits])
    return o, hs, rl


def save_random(make_model, perturb, seed, out, **save):
    """The model `make_model()` builds under `seed`, `perturb`ed, saved in bf16 into a fresh
    folder `out` (save_pretrained's generation_config.json dropped: the references pass their
    own generation settings)."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    torch.manual_seed(seed)
    model = make_model()
    perturb(model)
    model.to(torch.bfloat16).eval().save_pretrained(out, **save)
    gc = os.path.join(out, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def greedy_and_forced(m, ids, forced, n):
    """The tail every fixture's reference shares: `n` greedy tokens after `ids` with each step's
    logits and top-2 margin, and one pass over `ids + forced` whose logits at the forced
    positions are `forced_logits`. Returns those tensors (reference.safetensors keys), the
    generated ids, the steps' logits and the forced pass's logits."""
    x, T, V = torch.tensor([ids]), len(ids), m.config.vocab_size
    with torch.no_grad():
        g = m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                       pad_token_id=V - 1)
    gen = g.sequences[0, T:]
    gl = torch.stack([s[0].float() for s in g.logits])
    t2 = torch.topk(gl, 2, -1).values
    with torch.no_grad():
        fo = m(input_ids=torch.tensor([ids + forced]), use_cache=False).logits[0].float()
    tail = dict(generated_ids=gen.contiguous(), gen_logits=gl.contiguous(), gen_margin=(t2[:, 0] - t2[:, 1]).contiguous(),
                forced_ids=torch.tensor(forced), forced_logits=fo[T - 1:T + len(forced) - 1].contiguous())
    return tail, gen, gl, fo


def oracle(out, ids, forced, info_extra, prompt=PROMPT):
    """What transformers computes on the checkpoint saved in `out` (reloaded in fp32, eager
    attention and experts): reference.safetensors and reference.json, as the module doc says."""
    name = info_extra.get("fixture", os.path.basename(out))
    # ---- the oracle: reload the saved files in fp32 --------------------------------------
    m = transformers.Qwen3MoeForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                         experts_implementation="eager").eval()
    c = m.config
    V = c.vocab_size
    L, E, K = c.num_hidden_layers, c.num_local_experts, c.num_experts_per_tok
    x = torch.tensor([ids])
    o, hs, rl = prefill_with_hidden(m, m.model, x, L, E)
    probs = torch.softmax(rl, -1)
    top_v, top_i = torch.topk(probs, K, -1)
    margin = top_v[..., K - 1] - torch.topk(probs, K + 1, -1).values[..., K]
    top_w = top_v / top_v.sum(-1, keepdim=True) if c.norm_topk_prob else top_v
    moe_layers = [i for i in range(L) if i not in c.mlp_only_layers and (i + 1) % c.decoder_sparse_step == 0]
    assert len(moe_layers) == rl.shape[0]
    T = len(ids)
    ref = dict(input_ids=torch.tensor(ids), logits=o.logits[0].float().contiguous(),
               hidden_states=torch.stack([hs[i][0] for i in range(L + 2)]).contiguous(),
               router_logits=rl.contiguous(), router_topk_idx=top_i.contiguous(),
               router_topk_weight=top_w.contiguous(), router_margin=margin.contiguous())
    tail, gen, gl, fo = greedy_and_forced(m, ids, forced, 16)
    ref.update(tail)
    save_file(ref, os.path.join(out, "reference.safetensors"))
    info = dict(info_extra)
    info.update(moe_layers=moe_layers, prompt=prompt, prompt_ids=ids, forced_ids=forced, generated_ids=gen.tolist(),
                gen_margin_min=float(ref["gen_margin"].min()), router_margin_min=float(margin.min()),
                router_margin_below_1em4=int((margin < 1e-4).sum()),
                cache_vs_onepass_max_abs=float((fo[T - 1:T - 1 + 1] - gl[:1]).abs().max()),
                versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    json.dump(info, open(os.path.join(out, "reference.json"), "w"), indent=1, ensure_ascii=False)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: {size / 1e6:.2f} MB, gen margin min {info['gen_margin_min']:.2e}, "
          f"router margin min {info['router_margin_min']:.2e}, files {sorted(os.listdir(out))}")
    return m


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or list(FIXTURES)
    if names[0] == "--custom":
        spec = json.loads(names[2])
        FIXTURES[names[1]] = (spec.get("config", {}), dict(seed=spec.get("seed", 100), shard=spec.get("shard", "50GB"),
                                                             fused=spec.get("fused", False),
                                                             t5_config=spec.get("t5_config", False)))
        names = [names[1]]
    torch.set_num_threads(2)
    for n in names:
        make(n, out)


if __name__ == "__main__":
    main()
