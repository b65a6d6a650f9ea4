#!/usr/bin/env python3
# usage: make_gguf_np.py CHECKPOINT_DIR OUT.gguf
# Writes a BF16 GGUF of a Qwen3-MoE safetensors checkpoint (the benchmark checkpoint of
# make_bench_model_np.py) with numpy and the `gguf` package alone, for llama.cpp side-by-side
# runs on machines without torch (llama.cpp's own converter imports torch). Then:
#   llama-quantize OUT.gguf OUT-q4_0.gguf Q4_0
# Tensors stream one at a time (the experts of one projection of one layer are stacked into
# llama.cpp's [n_expert, rows, cols] tensor, ~400 MB at the 30B-A3B shape), so memory stays small.
import json, os, struct, sys
import numpy as np
import gguf

src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
tok = json.load(open(os.path.join(src, "tokenizer.json")))

# safetensors: name -> (file, dtype, shape, begin, end)
index = {}
for f in sorted(os.listdir(src)):
    if not f.endswith(".safetensors"):
        continue
    path = os.path.join(src, f)
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
    for k, v in hdr.items():
        if k != "__metadata__":
            index[k] = (path, v["dtype"], v["shape"], 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
maps = {}


def raw(name):
    """The tensor's bytes as uint16 (bf16) or float32, numpy shape as in the checkpoint."""
    path, dt, shape, b, e = index[name]
    if path not in maps:
        maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
    buf = maps[path][b:e]
    if dt == "BF16":
        return buf.view(np.uint16).reshape(shape)
    if dt == "F32":
        return buf.view(np.float32).reshape(shape)
    raise SystemExit(f"{path}: tensor {name} has dtype {dt}; only BF16 and F32 are handled")


def as_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a


nl, ne = cfg["num_hidden_layers"], cfg["num_experts"]
plan = [("token_embd.weight", "model.embed_tokens.weight", None)]
for i in range(nl):
    p, q = f"model.layers.{i}.", f"blk.{i}."
    plan += [
        (q + "attn_norm.weight", p + "input_layernorm.weight", None),
        (q + "attn_q.weight", p + "self_attn.q_proj.weight", None),
        (q + "attn_k.weight", p + "self_attn.k_proj.weight", None),
        (q + "attn_v.weight", p + "self_attn.v_proj.weight", None),
        (q + "attn_output.weight", p + "self_attn.o_proj.weight", None),
        (q + "attn_q_norm.weight", p + "self_attn.q_norm.weight", None),
        (q + "attn_k_norm.weight", p + "self_attn.k_norm.weight", None),
        (q + "ffn_norm.weight", p + "post_attention_layernorm.weight", None),
        (q + "ffn_gate_inp.weight", p + "mlp.gate.weight", None),
    ]
    for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
        plan.append((f"{q}{g}.weight", [f"{p}mlp.experts.{e}.{h}.weight" for e in range(ne)], "stack"))
plan += [("output_norm.weight", "model.norm.weight", None)]
# a tied checkpoint (the demo) has no lm_head: llama.cpp then uses token_embd as the output
if "lm_head.weight" in index:
    plan.append(("output.weight", "lm_head.weight", None))

w = gguf.GGUFWriter(out, "qwen3moe")
w.add_block_count(nl)
w.add_context_length(cfg["max_position_embeddings"])
w.add_embedding_length(cfg["hidden_size"])
w.add_feed_forward_length(cfg["intermediate_size"])
w.add_head_count(cfg["num_attention_heads"])
w.add_head_count_kv(cfg["num_key_value_heads"])
w.add_key_length(cfg["head_dim"])
w.add_value_length(cfg["head_dim"])
w.add_rope_freq_base(cfg["rope_theta"])
w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
w.add_expert_count(ne)
w.add_expert_used_count(cfg["num_experts_per_tok"])
w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

# the byte-level BPE vocabulary, padded to the model's vocab size as llama.cpp's converter does
vocab = dict(tok["model"]["vocab"])
added = {t["content"]: t for t in tok.get("added_tokens", [])}
for c, t in added.items():
    vocab[c] = t["id"]
size = cfg["vocab_size"]
tokens, types = [f"[PAD{i}]" for i in range(size)], [gguf.TokenType.UNUSED] * size
for s, i in vocab.items():
    if i < size:
        tokens[i] = s
        t = added.get(s)
        types[i] = gguf.TokenType.NORMAL if t is None else (gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED)
merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
# ids from the config, else (the demo's config has none) the tokenizer_config's tokens
tcp = os.path.join(src, "tokenizer_config.json")
tc = json.load(open(tcp)) if os.path.exists(tcp) else {}


def special(key):
    if cfg.get(f"{key}_token_id") is not None:
        return cfg[f"{key}_token_id"]
    t = tc.get(f"{key}_token")
    t = t.get("content") if isinstance(t, dict) else t
    return vocab.get(t) if t is not None else None


for key, add in (("eos", w.add_eos_token_id), ("bos", w.add_bos_token_id), ("pad", w.add_pad_token_id)):
    if special(key) is not None:
        add(special(key))
w.add_add_bos_token(False)

for name, key, how in plan:
    if how == "stack":
        _, dt, shape, _, _ = index[key[0]]
        shape = [len(key)] + shape
    else:
        _, dt, shape, _, _ = index[key]
    one_d = len(shape) == 1 or name.endswith("ffn_gate_inp.weight")
    # norms and the router stay f32 (as llama.cpp's converter keeps them); everything else bf16
    if one_d:
        w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    else:
        nbytes = 2 * int(np.prod(shape))
        w.add_tensor_info(name, shape[:-1] + [shape[-1] * 2], np.dtype(np.uint8), nbytes, raw_dtype=gguf.GGMLQuantizationType.BF16)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
for name, key, how in plan:
    if how == "stack":
        a = np.stack([raw(k) for k in key])
    else:
        a = raw(key)
    if a.ndim == 1 or name.endswith("ffn_gate_inp.weight"):
        a = np.ascontiguousarray(as_f32(a))
    else:
        a = np.ascontiguousarray(a).view(np.uint8)
    w.write_tensor_data(a)
w.close()
print(f"wrote {out} ({os.path.getsize(out)} bytes, {len(plan)} tensors)")
