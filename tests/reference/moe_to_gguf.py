#!/usr/bin/env python3
"""A llama.cpp GGUF holding the same weights as a synthetic Qwen3-MoE, gpt-oss, GLM-4.5 or DeepSeek-V3
package.

usage: moe_to_gguf.py PACKAGE.moe OUT.gguf

gpt-oss packages (`moescope synth --shape gpt-oss-20b|gpt-oss-120b`, MXFP4 experts): the experts
are ggml's MXFP4 blocks as they are (moescope keeps that layout), every q8 matrix (attention,
embeddings, output; synth draws f16-exact scales) becomes Q8_0 blocks with its scales
repeated, norms, biases, sinks and routers stay F32, and the tokenizer goes with llama.cpp's
`gpt-4o` pre-tokenizer: both engines hold the same weights, so the logits agree too.

GLM-4.5 packages (`moescope synth --shape glm-4.5|glm-4.5-air`, q4g32) go as the Qwen3-MoE ones
below, under llama.cpp's glm4moe names (q/k/v biases, router correction `exp_probs_b`, shared
experts `ffn_*_shexp`, the leading dense layers' `ffn_*`) and keys (sigmoid gating, groups,
scale, renormalisation, rotary dims); they carry no tokenizer, so the file gets a byte-level
vocabulary padded to the model's (llama.cpp needs one to load; benchmarks feed ids).
DeepSeek-V3 / Kimi-K2 packages (`moescope synth --shape deepseek-v3|kimi-k2`, q4g32) the same way
under llama.cpp's deepseek2 names, the latent attention's key and value halves as `attn_k_b` /
`attn_v_b` (the package keeps that split). Qwen3.5-MoE packages (`moescope synth --shape
qwen3.5-35b-a3b`, q4g32) under llama.cpp's qwen35moe names, the hybrid's tensors transformed as its
converter transforms a checkpoint's (`qwen35moe` below).

For packages `moescope synth --quant q4g32` writes (qwen3_moe architecture). Its int4 matrices
are llama.cpp's Q4_0 values exactly: codes in [-8, 7] biased by 8, value j of a group of 32 in the
low nibble of byte j and value j + 16 in the high one, one scale per 32 values, and synth draws
every scale as an exact f16. So attention and experts become Q4_0 blocks byte for byte (after
undoing moescope's 4-row interleave), the q8 embedding (group 128, f16-exact scales) becomes
Q8_0 blocks with each scale repeated over its four 32-blocks, and norms and routers stay F32:
both engines compute the same layers and route the same tokens the same way. The output layer
(moescope stores it as its own int6 layout) is written as random valid Q6_K blocks of the same
scale, as a Q4_0 file made by llama-quantize keeps it in Q6_K: the logits differ, routing
does not. Every converted tensor is checked (all scales exact in f16) before it is written.

Needs numpy and gguf (gguf-py), e.g. the oracle venv.
"""
import json
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HEADER = 4096


def read_package(path):
    with open(path, "rb") as f:
        head = f.read(HEADER)
    if head[:8] != b"MOESCOPE":
        sys.exit(f"{path}: not a moescope package")
    fields = struct.unpack_from("<8Q", head, 16)
    meta_off, meta_len = fields[1], fields[2]
    with open(path, "rb") as f:
        f.seek(meta_off)
        meta = json.loads(f.read(meta_len).decode().rstrip())
    return meta, np.memmap(path, dtype=np.uint8, mode="r")


def deinterleave(vals, rows, cols, layout):
    """Row-major bytes of a q4 [rows, cols] matrix (moescope interleaves rows in blocks of 4,
    128-value chunks of 64 bytes)."""
    rb = cols // 2
    if layout.endswith("_x4"):
        return vals.reshape(rows // 4, cols // 128, 4, 64).transpose(0, 2, 1, 3).reshape(rows, rb)
    return vals.reshape(rows, rb)


def f16_exact(scales, what):
    h = scales.astype(np.float16)
    if not np.array_equal(h.astype(np.float32), scales):
        sys.exit(f"{what}: scales are not exact f16 values (not a synth package?)")
    return h


def q4_0_blocks(mm, base, shape, scales_off, layout, group, what):
    rows, cols = shape
    if group != 32:
        sys.exit(f"{what}: q4 group {group}; Q4_0 needs 32 (synth --quant q4g32)")
    nb = cols // 32
    vals = np.asarray(mm[base:base + rows * cols // 2])
    vals = deinterleave(vals, rows, cols, layout)
    sc = np.frombuffer(mm[scales_off:scales_off + rows * nb * 4].tobytes(), dtype=np.float32).reshape(rows, nb)
    out = np.empty((rows, nb, 18), dtype=np.uint8)
    out[:, :, 0:2] = f16_exact(sc, what).view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = vals.reshape(rows, nb, 16)
    return out.reshape(rows, nb * 18)


def q8_0_blocks(mm, t):
    rows, cols = t["shape"]
    g = t["group"]
    if g % 32:
        sys.exit(f"{t['name']}: q8 group {g} is not a multiple of 32")
    q = np.asarray(mm[t["offset"]:t["offset"] + rows * cols]).reshape(rows, cols // 32, 32)
    so = t["scales_offset"]
    sc = np.frombuffer(mm[so:so + rows * (cols // g) * 4].tobytes(), dtype=np.float32).reshape(rows, cols // g)
    sc = np.repeat(f16_exact(sc, t["name"]), g // 32, axis=1)
    out = np.empty((rows, cols // 32, 34), dtype=np.uint8)
    out[:, :, 0:2] = sc.view(np.uint8).reshape(rows, cols // 32, 2)
    out[:, :, 2:] = q
    return out.reshape(rows, cols // 32 * 34)


def f32(mm, t):
    n = int(np.prod(t["shape"]))
    return np.frombuffer(mm[t["offset"]:t["offset"] + 4 * n].tobytes(), dtype=np.float32).reshape(t["shape"])


def f32_entry(mm, t):
    """A plan's entry (type, byte shape, how to make it) for the F32 tensor `t`."""
    return T.F32, tuple(t["shape"]), lambda: f32(mm, t)


def random_q6_k(rows, cols, std, seed):
    """Valid Q6_K blocks (ql[128], qh[64], int8 scales[16], f16 d) of weights ~ std."""
    rng = np.random.default_rng(seed)
    nb = cols // 256
    out = np.empty((rows, nb, 210), dtype=np.uint8)
    out[:, :, 0:192] = rng.integers(0, 256, size=(rows, nb, 192), dtype=np.uint8)
    # codes q - 32 uniform in [-32, 31] have std ~18.5; sub-block scales ~ 16
    out[:, :, 192:208] = rng.integers(12, 20, size=(rows, nb, 16), dtype=np.int8).view(np.uint8)
    d = np.full((rows, nb), std / (18.5 * 16), dtype=np.float16)
    out[:, :, 208:210] = d.view(np.uint8).reshape(rows, nb, 2)
    return out.reshape(rows, nb * 210)


def add_tokenizer(w, meta, n, pre, eos_default):
    tok = meta["tokenizer"]
    if not tok.get("tokenizer_json"):
        # a package cut below its tokenizer (`synth --vocab`) carries none: benchmarks feed ids
        return byte_vocab(w, n)
    tj = json.loads(tok["tokenizer_json"])
    vocab = dict(tj["model"]["vocab"])
    special = {}
    for a in tj.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        special[a["id"]] = a.get("special", False)
    tokens, types = [f"[PAD{i}]" for i in range(n)], [gguf.TokenType.UNUSED] * n
    for s, i in vocab.items():
        if i < n:
            tokens[i] = s
            types[i] = gguf.TokenType.NORMAL
    for i, sp in special.items():
        if i < n:
            types[i] = gguf.TokenType.CONTROL if sp else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = vocab.get(tok.get("eos_token") or eos_default)
    if eos is not None:
        w.add_eos_token_id(eos)
    pad = vocab.get(tok.get("pad_token") or "<|endoftext|>")
    if pad is not None:
        w.add_pad_token_id(pad)
        w.add_bos_token_id(pad)
    w.add_add_bos_token(False)
    if tok.get("chat_template"):
        w.add_chat_template(tok["chat_template"])


def write_plan(w, dst, plan):
    for name, qt, bs, _ in plan:
        f = qt == T.F32
        w.add_tensor_info(name, bs, np.dtype(np.float32 if f else np.uint8), int(np.prod(bs)) * (4 if f else 1),
                          raw_dtype=None if f else qt)
    w.write_header_to_file(dst)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, qt, bs, make in plan:
        arr = make()
        assert arr.shape == tuple(bs), (name, arr.shape, bs)
        w.write_tensor_data(np.ascontiguousarray(arr))
        if name.endswith("ffn_down_exps.weight"):
            print(f"\r{name}", end="", file=sys.stderr, flush=True)
    w.close()
    print(f"\nwrote {dst}", file=sys.stderr)


def common_keys(w, meta, c, ffn):
    """The keys both architectures write the same way (`ffn`: feed_forward_length)."""
    w.add_name(meta["name"] + " (synthetic)" if meta.get("synthetic") else meta["name"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(ffn)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])


def gpt_oss(src, dst, meta, mm):
    c = meta["model"]
    tensors = {t["name"]: t for t in meta["tensors"]}
    L, H, E, V = c["num_hidden_layers"], c["hidden_size"], c["num_experts"], c["vocab_size"]
    sliding = set(c["sliding"]["layers"])
    y = c["rope_yarn"]
    w = gguf.GGUFWriter(dst, "gpt-oss")
    common_keys(w, meta, c, c["moe_intermediate_size"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(y["factor"])
    w.add_rope_scaling_orig_ctx_len(y["original_max_position_embeddings"])
    w.add_float32("gpt-oss.rope.scaling.yarn_beta_fast", y["beta_fast"])
    w.add_float32("gpt-oss.rope.scaling.yarn_beta_slow", y["beta_slow"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_sliding_window(c["sliding"]["window"])
    w.add_array("gpt-oss.attention.sliding_window_pattern", [l in sliding for l in range(L)])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    add_tokenizer(w, meta, V, "gpt-4o", "<|return|>")

    def q8(name):
        t = tensors[name]
        r, cc = t["shape"]
        if t["dtype"] != "q8" or t["layout"] != "row_major":
            sys.exit(f"{name}: {t['dtype']} {t['layout']}; expected row-major q8")
        return T.Q8_0, (r, cc // 32 * 34), lambda: q8_0_blocks(mm, t)

    def f32_of(name):
        return f32_entry(mm, tensors[name])

    ex = meta["experts"]
    parts = {p["name"]: p for p in ex["parts"]}

    def experts(l, part):
        p = parts[part]
        if p["layout"] != "mxfp4_ggml":
            sys.exit(f"{part}: layout {p['layout']}; expected MXFP4 experts (synth's default for gpt-oss)")
        li = ex["layers"].index(l)
        r, cc = p["shape"]

        def make():
            out = []
            for e in range(E):
                off = ex["table"][li * E + e][0] + p["offset"]
                out.append(np.asarray(mm[off:off + p["length"]]).reshape(r, cc // 32 * 17))
            return np.stack(out)
        return T.MXFP4, (E, r, cc // 32 * 17), make

    plan = [("token_embd.weight", *q8("model.embed_tokens.weight"))]
    for l in range(L):
        P = f"model.layers.{l}."
        for name, made in [
            ("attn_norm.weight", f32_of(P + "input_layernorm.weight")),
            ("attn_q.weight", q8(P + "self_attn.q_proj.weight")),
            ("attn_q.bias", f32_of(P + "self_attn.q_proj.bias")),
            ("attn_k.weight", q8(P + "self_attn.k_proj.weight")),
            ("attn_k.bias", f32_of(P + "self_attn.k_proj.bias")),
            ("attn_v.weight", q8(P + "self_attn.v_proj.weight")),
            ("attn_v.bias", f32_of(P + "self_attn.v_proj.bias")),
            ("attn_output.weight", q8(P + "self_attn.o_proj.weight")),
            ("attn_output.bias", f32_of(P + "self_attn.o_proj.bias")),
            ("attn_sinks.weight", f32_of(P + "self_attn.sinks")),
            ("post_attention_norm.weight", f32_of(P + "post_attention_layernorm.weight")),
            ("ffn_gate_inp.weight", f32_of(P + "mlp.gate.weight")),
            ("ffn_gate_inp.bias", f32_of(P + "mlp.gate.bias")),
            ("ffn_gate_exps.weight", experts(l, "gate_proj")),
            ("ffn_gate_exps.bias", f32_of(P + "mlp.experts.gate_proj.bias")),
            ("ffn_up_exps.weight", experts(l, "up_proj")),
            ("ffn_up_exps.bias", f32_of(P + "mlp.experts.up_proj.bias")),
            ("ffn_down_exps.weight", experts(l, "down_proj")),
            ("ffn_down_exps.bias", f32_of(P + "mlp.experts.down_proj.bias")),
        ]:
            plan.append((f"blk.{l}.{name}", *made))
    plan.append(("output_norm.weight", *f32_of("model.norm.weight")))
    plan.append(("output.weight", *q8("lm_head.weight")))
    write_plan(w, dst, plan)


def byte_vocab(w, n):
    """A vocabulary for a package that carries none (GLM's synth shapes): the byte-level alphabet,
    one merge ("Ġ Ġ"), then fillers up to `n`; llama.cpp needs one to load, and benchmarks feed
    token ids."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    tokens = [chr(c) for c in cs] + ["ĠĠ"]
    tokens += [f"<filler{i}>" for i in range(len(tokens), n)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.USER_DEFINED] * (n - 257))
    w.add_token_merges(["Ġ Ġ"])
    w.add_eos_token_id(n - 1)
    w.add_add_bos_token(False)


def q4_helpers(mm, meta):
    """How q4g32 dense matrices, F32 vectors and experts of the package become GGUF tensors:
    (type, byte shape, maker) for write_plan."""
    tensors = {t["name"]: t for t in meta["tensors"]}
    E = meta["model"]["num_experts"]

    def dense_q4(name):
        t = tensors[name]
        r, cc = t["shape"]
        make = lambda: q4_0_blocks(mm, t["offset"], t["shape"], t["scales_offset"], t["layout"], t["group"], name)
        return T.Q4_0, (r, cc // 32 * 18), make

    def dense_f32(name):
        return f32_entry(mm, tensors[name])

    ex = meta.get("experts") or {"parts": [], "layers": []}
    parts = {p["name"]: p for p in ex["parts"]}

    def experts(l, part):
        p = parts[part]
        li = ex["layers"].index(l)
        r, cc = p["shape"]

        def make():
            blocks = []
            for e in range(E):
                off = ex["table"][li * E + e][0]
                blocks.append(q4_0_blocks(mm, off + p["offset"], p["shape"], off + p["scales_offset"], p["layout"],
                                          p["group"], f"layer {l} expert {e} {part}"))
            return np.stack(blocks)
        return T.Q4_0, (E, r, cc // 32 * 18), make

    return tensors, dense_q4, dense_f32, experts


def embedding_and_output(mm, c, tensors):
    """token_embd (Q8_0 from the q8 embedding) and the plan's tail: output_norm and a random
    Q6_K output layer of the same scale (see the module doc)."""
    V, H = c["vocab_size"], c["hidden_size"]
    emb = tensors["model.embed_tokens.weight"]
    head = [("token_embd.weight", T.Q8_0, (V, H // 32 * 34), lambda: q8_0_blocks(mm, emb))]
    tail = [("output_norm.weight", *f32_entry(mm, tensors["model.norm.weight"])),
            ("output.weight", T.Q6_K, (V, H // 256 * 210), lambda: random_q6_k(V, H, 0.02, 0))]
    return head, tail


def sigmoid_moe_keys(w, c):
    """The keys GLM-4.5's and DeepSeek-V3's files state alike: experts, the shared expert, the
    leading dense layers, the sigmoid router's scale, renormalisation and groups, the file type
    and a byte-level vocabulary (their synth shapes carry no tokenizer)."""
    sig = c["sigmoid_router"]
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_shared_count(c.get("shared_experts", 0) // c["moe_intermediate_size"])
    w.add_leading_dense_block_count(len(c["mlp_only_layers"]))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(sig["routed_scaling_factor"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_expert_group_count(sig["n_group"])
    w.add_expert_group_used_count(sig["topk_group"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    byte_vocab(w, c["vocab_size"])


def sigmoid_moe_ffn(l, dense, dense_q4, dense_f32, experts):
    """Layer l's feed-forward tensors under llama.cpp's names: a dense MLP, or the router with
    its correction bias, the routed experts and the shared expert."""
    P = f"model.layers.{l}."
    if dense:
        return [(f"ffn_{n}.weight", dense_q4(P + f"mlp.{n}_proj.weight")) for n in ("gate", "up", "down")]
    items = [("ffn_gate_inp.weight", dense_f32(P + "mlp.gate.weight")),
             ("exp_probs_b.bias", dense_f32(P + "mlp.gate.e_score_correction_bias"))]
    items += [(f"ffn_{n}_exps.weight", experts(l, f"{n}_proj")) for n in ("gate", "up", "down")]
    items += [(f"ffn_{n}_shexp.weight", dense_q4(P + f"mlp.shared_experts.{n}_proj.weight"))
              for n in ("gate", "up", "down")]
    return items


def glm4moe(src, dst, meta, mm):
    """GLM-4.5 (glm4_moe) packages, q4g32: llama.cpp's glm4moe names and keys."""
    c = meta["model"]
    L = c["num_hidden_layers"]
    dense = set(c["mlp_only_layers"])
    w = gguf.GGUFWriter(dst, "glm4moe")
    common_keys(w, meta, c, c["intermediate_size"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(c.get("rotary_dim") or c["head_dim"])
    sigmoid_moe_keys(w, c)
    tensors, dense_q4, dense_f32, experts = q4_helpers(mm, meta)
    head, tail = embedding_and_output(mm, c, tensors)
    plan = list(head)
    for l in range(L):
        P = f"model.layers.{l}."
        items = [("attn_norm.weight", dense_f32(P + "input_layernorm.weight"))]
        for n, hf in [("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj")]:
            items.append((f"{n}.weight", dense_q4(P + f"self_attn.{hf}.weight")))
            if c.get("qkv_bias"):
                items.append((f"{n}.bias", dense_f32(P + f"self_attn.{hf}.bias")))
        items.append(("attn_output.weight", dense_q4(P + "self_attn.o_proj.weight")))
        if c.get("qk_norm"):
            items += [("attn_q_norm.weight", dense_f32(P + "self_attn.q_norm.weight")),
                      ("attn_k_norm.weight", dense_f32(P + "self_attn.k_norm.weight"))]
        items.append(("post_attention_norm.weight", dense_f32(P + "post_attention_layernorm.weight")))
        items += sigmoid_moe_ffn(l, l in dense, dense_q4, dense_f32, experts)
        plan += [(f"blk.{l}.{name}", *made) for name, made in items]
    write_plan(w, dst, plan + tail)


def deepseek2(src, dst, meta, mm):
    """DeepSeek-V3 / Kimi-K2 (deepseek_v3) packages, q4g32: llama.cpp's deepseek2 names and keys,
    the latent attention split as its newer files hold it (attn_k_b [nh, kv_lora, nope] and
    attn_v_b [nh, v, kv_lora]: the package's k_b_proj / v_b_proj rows, reshaped), YaRN's
    yarn_log_multiplier 0.1 x mscale_all_dim (synth's shapes: 1, the softmax scale's mscale)."""
    c = meta["model"]
    L, nh = c["num_hidden_layers"], c["num_attention_heads"]
    m, y = c["mla"], c["rope_yarn"]
    dense = set(c["mlp_only_layers"])
    kvl, rope, nope, vd = m["kv_lora_rank"], m["qk_rope_head_dim"], m["qk_nope_head_dim"], m["v_head_dim"]
    ms = 0.1 * np.log(y["factor"]) + 1.0
    want = ms * ms / np.sqrt(nope + rope)
    if abs(m["softmax_scale"] / want - 1) > 1e-6 or y["attention_factor"] != 1.0:
        sys.exit(f"{src}: mscale and mscale_all_dim other than 1 are not written by this script")
    w = gguf.GGUFWriter(dst, "deepseek2")
    common_keys(w, meta, c, c["intermediate_size"])
    w.add_head_count_kv(1)
    w.add_key_length(kvl + rope)
    w.add_value_length(kvl)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vd)
    w.add_kv_lora_rank(kvl)
    if m.get("q_lora_rank"):
        w.add_q_lora_rank(m["q_lora_rank"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(rope)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(y["factor"])
    w.add_rope_scaling_orig_ctx_len(y["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1)
    w.add_vocab_size(c["vocab_size"])
    sigmoid_moe_keys(w, c)
    tensors, dense_q4, dense_f32, experts = q4_helpers(mm, meta)
    head, tail = embedding_and_output(mm, c, tensors)

    def per_head(name, rows):
        qt, (r, b), make = dense_q4(name)
        return qt, (nh, rows, b), lambda: make().reshape(nh, rows, b)

    plan = list(head)
    for l in range(L):
        P = f"model.layers.{l}."
        A = P + "self_attn."
        items = [("attn_norm.weight", dense_f32(P + "input_layernorm.weight"))]
        if m.get("q_lora_rank"):
            items += [("attn_q_a.weight", dense_q4(A + "q_a_proj.weight")),
                      ("attn_q_a_norm.weight", dense_f32(A + "q_a_layernorm.weight")),
                      ("attn_q_b.weight", dense_q4(A + "q_b_proj.weight"))]
        else:
            items.append(("attn_q.weight", dense_q4(A + "q_proj.weight")))
        items += [("attn_kv_a_mqa.weight", dense_q4(A + "kv_a_proj_with_mqa.weight")),
                  ("attn_kv_a_norm.weight", dense_f32(A + "kv_a_layernorm.weight")),
                  ("attn_k_b.weight", per_head(A + "k_b_proj.weight", kvl)),
                  ("attn_v_b.weight", per_head(A + "v_b_proj.weight", vd)),
                  ("attn_output.weight", dense_q4(A + "o_proj.weight")),
                  ("ffn_norm.weight", dense_f32(P + "post_attention_layernorm.weight"))]
        items += sigmoid_moe_ffn(l, l in dense, dense_q4, dense_f32, experts)
        plan += [(f"blk.{l}.{name}", *made) for name, made in items]
    write_plan(w, dst, plan + tail)


def tiled(n_k, per_k, size):
    """Row (or column) order of llama.cpp's qwen35moe value heads: the HF checkpoint groups a key
    head's `per_k` value heads together (value head h reads key head h / per_k), ggml's broadcast
    wants them tiled (position p reads key head p mod n_k), each head `size` rows long; entry p
    is the HF index written at position p."""
    return np.arange(n_k * per_k * size).reshape(n_k, per_k, size).transpose(1, 0, 2).reshape(-1)


def qwen35moe(src, dst, meta, mm):
    """Qwen3.5-MoE (qwen3_5_moe) packages, q4g32: llama.cpp's qwen35moe names and keys, as its
    converter writes a checkpoint: norms as the (1 + w) they multiply by (the package keeps them
    so), `ssm_a` = -exp(A_log), the value heads of every linear-attention tensor in the tiled
    order (`tiled`), `attn_q` per head [queries(hd) | output gates(hd)], `conv1d` [channels, K]."""
    c = meta["model"]
    hy = c["hybrid"]
    L, nh, hd = c["num_hidden_layers"], c["num_attention_heads"], c["head_dim"]
    nk, dk, nv, dv = hy["key_heads"], hy["key_head_dim"], hy["value_heads"], hy["value_head_dim"]
    if nv % nk or dv % 32:
        sys.exit(f"{src}: {nv} value heads of {dv} over {nk} key heads are not written by this script")
    kinds = hy["layer_types"]
    w = gguf.GGUFWriter(dst, "qwen35moe")
    common_keys(w, meta, c, c["intermediate_size"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    # the hybrid's keys by name: older gguf-py (ik_llama.cpp's) lacks some of their writer methods
    for key, v in [("expert_shared_feed_forward_length", hy["shared_expert_intermediate_size"]),
                   ("ssm.conv_kernel", hy["conv_kernel"]), ("ssm.state_size", dk), ("ssm.group_count", nk),
                   ("ssm.time_step_rank", nv), ("ssm.inner_size", nv * dv), ("full_attention_interval", 4),
                   ("rope.dimension_count", hy["rotary_dim"])]:
        w.add_uint32(f"qwen35moe.{key}", v)
    w.add_array("qwen35moe.attention.recurrent_layers", [k == "linear_attention" for k in kinds])
    # text positions are equal in all three sections: interleaved MRoPE is plain RoPE over
    # rotary_dim; llama.cpp requires the key (Qwen3.5's default sections)
    w.add_array("qwen35moe.rope.dimension_sections", [11, 11, 10, 0])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    add_tokenizer(w, meta, c["vocab_size"], "qwen35", "<|im_end|>")

    tensors, dense_q4, dense_f32, experts = q4_helpers(mm, meta)
    head, tail = embedding_and_output(mm, c, tensors)
    v_rows = tiled(nk, nv // nk, dv)
    v_heads = tiled(nk, nv // nk, 1)

    def rows(made, order):
        qt, bs, make = made
        return qt, bs, lambda: make()[order]

    def out_columns(made):
        """ssm_out: its columns (value channels) tiled, whole Q4_0 blocks moved."""
        qt, (r, b), make = made
        blocks = tiled(nk, nv // nk, dv // 32)
        return qt, (r, b), lambda: make().reshape(r, b // 18, 18)[:, blocks].reshape(r, b)

    def neg_exp(made):
        """-exp(A_log) rounded once from f64: numpy's f32 exp is off by an ulp at times, which the
        engine's own exp of the package's A_log is not"""
        qt, bs, make = made
        return qt, bs, lambda: (-np.exp(make().astype(np.float64))).astype(np.float32)[v_heads]

    def q_and_gate(P):
        (qt, (r, b), q), (_, _, g) = dense_q4(P + "q_proj.weight"), dense_q4(P + "o_gate_proj.weight")
        return qt, (2 * r, b), lambda: np.stack([q().reshape(nh, hd, b), g().reshape(nh, hd, b)], 1).reshape(2 * r, b)

    qk = 2 * nk * dk
    plan = list(head)
    for l in range(L):
        P = f"model.layers.{l}."
        items = [("attn_norm.weight", dense_f32(P + "input_layernorm.weight"))]
        if kinds[l] == "linear_attention":
            A = P + "linear_attn."
            items += [
                ("attn_qkv.weight", rows(dense_q4(A + "in_proj_qkv.weight"), np.r_[np.arange(qk), qk + v_rows])),
                ("attn_gate.weight", rows(dense_q4(A + "in_proj_z.weight"), v_rows)),
                ("ssm_beta.weight", rows(dense_q4(A + "in_proj_b.weight"), v_heads)),
                ("ssm_alpha.weight", rows(dense_q4(A + "in_proj_a.weight"), v_heads)),
                ("ssm_conv1d.weight", rows(dense_f32(A + "conv1d.weight"), np.r_[np.arange(qk), qk + v_rows])),
                ("ssm_a", neg_exp(dense_f32(A + "A_log"))),
                ("ssm_dt.bias", rows(dense_f32(A + "dt_bias"), v_heads)),
                ("ssm_norm.weight", dense_f32(A + "norm.weight")),
                ("ssm_out.weight", out_columns(dense_q4(A + "out_proj.weight"))),
            ]
        else:
            A = P + "self_attn."
            items += [("attn_q.weight", q_and_gate(A)),
                      ("attn_k.weight", dense_q4(A + "k_proj.weight")),
                      ("attn_v.weight", dense_q4(A + "v_proj.weight")),
                      ("attn_output.weight", dense_q4(A + "o_proj.weight")),
                      ("attn_q_norm.weight", dense_f32(A + "q_norm.weight")),
                      ("attn_k_norm.weight", dense_f32(A + "k_norm.weight"))]
        items += [("post_attention_norm.weight", dense_f32(P + "post_attention_layernorm.weight")),
                  ("ffn_gate_inp.weight", dense_f32(P + "mlp.gate.weight"))]
        items += [(f"ffn_{n}_exps.weight", experts(l, f"{n}_proj")) for n in ("gate", "up", "down")]
        items += [(f"ffn_{n}_shexp.weight", dense_q4(P + f"mlp.shared_expert.{n}_proj.weight"))
                  for n in ("gate", "up", "down")]
        items.append(("ffn_gate_inp_shexp.weight", dense_f32(P + "mlp.shared_expert_gate.weight")))
        plan += [(f"blk.{l}.{name}", *made) for name, made in items]
    write_plan(w, dst, plan + tail)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    meta, mm = read_package(src)
    c = meta["model"]
    if c["arch"] == "gpt_oss":
        return gpt_oss(src, dst, meta, mm)
    if c["arch"] == "glm4_moe":
        return glm4moe(src, dst, meta, mm)
    if c["arch"] == "deepseek_v3":
        return deepseek2(src, dst, meta, mm)
    if c["arch"] == "qwen3_5_moe":
        return qwen35moe(src, dst, meta, mm)
    if c["arch"] != "qwen3_moe":
        sys.exit(f"{src}: architecture {c['arch']}; this script writes qwen3moe, qwen35moe, gpt-oss, glm4moe and "
                 "deepseek2 GGUFs")
    if c["tie_word_embeddings"]:
        sys.exit(f"{src}: tied embeddings are not handled")
    L, E = c["num_hidden_layers"], c["num_experts"]

    w = gguf.GGUFWriter(dst, "qwen3moe")
    common_keys(w, meta, c, c["intermediate_size"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)

    add_tokenizer(w, meta, c["vocab_size"], "qwen2", "<|im_end|>")

    tensors, dense_q4, dense_f32, experts = q4_helpers(mm, meta)
    head, tail = embedding_and_output(mm, c, tensors)
    # (gguf name, type, byte shape, how to make it), in data-section order
    plan = list(head)
    for l in range(L):
        P = f"model.layers.{l}."
        for name, made in [
            ("attn_norm", dense_f32(P + "input_layernorm.weight")),
            ("attn_q", dense_q4(P + "self_attn.q_proj.weight")),
            ("attn_k", dense_q4(P + "self_attn.k_proj.weight")),
            ("attn_v", dense_q4(P + "self_attn.v_proj.weight")),
            ("attn_output", dense_q4(P + "self_attn.o_proj.weight")),
            ("attn_q_norm", dense_f32(P + "self_attn.q_norm.weight")),
            ("attn_k_norm", dense_f32(P + "self_attn.k_norm.weight")),
            ("ffn_norm", dense_f32(P + "post_attention_layernorm.weight")),
            ("ffn_gate_inp", dense_f32(P + "mlp.gate.weight")),
            ("ffn_gate_exps", experts(l, "gate_proj")),
            ("ffn_up_exps", experts(l, "up_proj")),
            ("ffn_down_exps", experts(l, "down_proj")),
        ]:
            plan.append((f"blk.{l}.{name}.weight", *made))
    plan += tail

    write_plan(w, dst, plan)


if __name__ == "__main__":
    main()
