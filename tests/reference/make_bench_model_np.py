#!/usr/bin/env python3
# usage: make_bench_model_np.py OUT_DIR TOKENIZER_DIR [LAYERS]   (default 8 layers; 11.2 GB, ~2 min)
# The benchmark checkpoint (Qwen3-30B-A3B dimensions, N layers, random N(0, 0.02) weights rounded
# to bf16, the real checkpoint's key names and config) with numpy alone, for machines without
# torch: the same shapes as the project's torch script, written tensor by tensor into 2 GiB
# safetensors shards with an index. Then: moescope convert OUT_DIR -o bench8-q4.moe --quant q4
# make_bench_hybrid_np.py makes the Qwen3.5 sibling with the helpers below.
import os, sys, json, struct, shutil, time
import numpy as np

RNG = np.random.default_rng(0)


def bf16(shape, fill, chunk=1 << 26):
    """bf16 bytes of `shape`, a chunk at a time: N(0, 0.02) when `fill` is True, else every value
    `fill` (a float), or an f32 array to round (`fill` an ndarray)."""
    n = int(np.prod(shape))
    for at in range(0, n, chunk):
        m = min(chunk, n - at)
        if isinstance(fill, np.ndarray):
            x = fill.astype(np.float32).ravel()[at:at + m]
        elif fill is True:
            x = RNG.standard_normal(m, dtype=np.float32) * np.float32(0.02)
        else:
            x = np.full(m, fill, dtype=np.float32)
        b = x.view(np.uint32)
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        yield b.astype(np.uint16).tobytes()


def write_checkpoint(out, config, specs, tokdir, tok_files=("tokenizer.json", "tokenizer_config.json")):
    """config.json, then `specs` [(name, shape, fill)] into 2 GiB bf16 shards with an index."""
    os.makedirs(out, exist_ok=True)
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    shard_bytes = 2 * 1024**3
    shards, cur, cb = [], [], 0
    for s in specs:
        nb = 2 * int(np.prod(s[1]))
        if cur and cb + nb > shard_bytes:
            shards.append(cur); cur, cb = [], 0
        cur.append(s); cb += nb
    shards.append(cur)
    wm = {}; total = 0; t0 = time.time()
    for si, sh in enumerate(shards):
        fn = f"model-{si+1:05d}-of-{len(shards):05d}.safetensors"
        hdr = {"__metadata__": {"format": "pt"}}; off = 0
        for name, shape, _ in sh:
            nb = 2 * int(np.prod(shape))
            hdr[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}; off += nb
            wm[name] = fn
        hb = json.dumps(hdr).encode(); hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(os.path.join(out, fn), "wb") as f:
            f.write(struct.pack("<Q", len(hb))); f.write(hb)
            for name, shape, fill in sh:
                for part in bf16(shape, fill):
                    f.write(part)
        total += off
        print(f"wrote {fn} t={time.time()-t0:.0f}s", flush=True)
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(out, "model.safetensors.index.json"), "w"))
    for f in tok_files:
        if os.path.exists(os.path.join(tokdir, f)):
            shutil.copy(os.path.join(tokdir, f), out)
    print("done", total)


def main():
    out, tokdir = sys.argv[1], sys.argv[2]
    nl = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    cfgd = {
      "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
      "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
      "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
      "max_position_embeddings": 40960, "max_window_layers": nl, "mlp_only_layers": [], "model_type": "qwen3_moe",
      "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
      "num_experts_per_tok": 8, "num_hidden_layers": nl, "num_key_value_heads": 4, "output_router_logits": False,
      "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
      "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
      "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    }
    H, V, NH, NKV, HD, E, FF = 2048, 151936, 32, 4, 128, 128, 768

    def specs():
        yield "model.embed_tokens.weight", (V, H), True
        for i in range(nl):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (H,), 1.0
            yield p + "self_attn.q_proj.weight", (NH * HD, H), True
            yield p + "self_attn.k_proj.weight", (NKV * HD, H), True
            yield p + "self_attn.v_proj.weight", (NKV * HD, H), True
            yield p + "self_attn.o_proj.weight", (H, NH * HD), True
            yield p + "self_attn.q_norm.weight", (HD,), 1.0
            yield p + "self_attn.k_norm.weight", (HD,), 1.0
            yield p + "post_attention_layernorm.weight", (H,), 1.0
            yield p + "mlp.gate.weight", (E, H), True
            for e in range(E):
                yield p + f"mlp.experts.{e}.gate_proj.weight", (FF, H), True
                yield p + f"mlp.experts.{e}.up_proj.weight", (FF, H), True
                yield p + f"mlp.experts.{e}.down_proj.weight", (H, FF), True
        yield "model.norm.weight", (H,), 1.0
        yield "lm_head.weight", (V, H), True

    write_checkpoint(out, cfgd, list(specs()), tokdir)


if __name__ == "__main__":
    main()
