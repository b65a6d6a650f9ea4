#!/usr/bin/env python3
"""How much the hybrid lookahead helps the predictor on a trained model: train a Qwen3.5-MoE text
model (linear-attention and full-attention layers 3:1, 128 experts top-8 and a shared expert per
layer) on the routing corpus for a few minutes on a GPU, then on held-out text compare, for
every MoE layer l, the next layer's router (and the one after it) applied to
  hn   the MoE block's normed input (what moescope handed the predictor before), and
  la   post_attention_layernorm_l(residual + sigmoid(gate . hn) * shared_expert(hn)) (what it
       hands it now: the residual with the shared expert added, as the next layer will see it)
against the routes those layers take: recall in all, per routed slot and by gate weight.

usage: hybrid_lookahead_recall.py CORPUS_DIR OUT_JSON [--minutes 4.5] [--tiny]

CORPUS_DIR: routing_corpus.py's output (train.txt, heldout.txt). Training follows
train_routing.py (documents plus chat samples, AdamW, cosine, bf16 autocast, load-balancing
loss 0.001, best checkpoint on held-out text); the tokenizer is the demo model's.
"""
import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_demo import DEMO_TOK, blocks_of, chat_samples, window_nll  # noqa: E402
from train_routing import set_experts  # noqa: E402

E, K = 128, 8
CONFIG = dict(vocab_size=4096, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
              head_dim=64, moe_intermediate_size=192, shared_expert_intermediate_size=384, num_experts=E,
              num_experts_per_tok=K, linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
              linear_num_key_heads=4, linear_num_value_heads=8,
              layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
              max_position_embeddings=4096, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
              attention_bias=False, initializer_range=0.02, router_aux_loss_coef=0.001,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [3, 3, 2], "mrope_interleaved": True})


def train(args, tok, dev, rng):
    eot = tok.token_to_id("<|endoftext|>")
    blocks = blocks_of(os.path.join(args.corpus, "train.txt"))
    held = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    docs = ["\n\n".join(blocks[i:i + 24]) for i in range(0, len(blocks), 24)]
    items = [e.ids for e in tok.encode_batch(docs + chat_samples(blocks, rng))]
    sel = tok.encode(held[:400000]).ids[:16384]
    model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**CONFIG)).to(dev)
    if dev == "cuda":
        set_experts(model, "grouped_mm")
        try:
            with torch.autocast(dev, dtype=torch.bfloat16):
                model(input_ids=torch.zeros(2, 16, dtype=torch.long, device=dev)).logits.sum().backward()
            model.zero_grad(set_to_none=True)
        except Exception as e:  # noqa: BLE001
            print(f"grouped_mm experts failed ({e}); eager experts", flush=True)
            set_experts(model, "eager")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    t0 = time.time()
    deadline, total, warm = t0 + args.minutes * 60, 100000, 50

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        p = min(1.0, (s - warm) / max(1, total - warm))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def stream():
        order = list(range(len(items)))
        rng.shuffle(order)
        flat = []
        for i in order:
            flat.extend(items[i])
            flat.append(eot)
        return torch.tensor(flat, dtype=torch.long)

    L = args.seq + 1
    data, pos, step, curve = stream(), 0, 0, []
    best = (float("inf"), None, -1)
    while step < total and time.time() < deadline:
        if pos + args.batch * L > len(data):
            data, pos = stream(), 0
        xb = data[pos:pos + args.batch * L].view(args.batch, L).to(dev)
        pos += args.batch * L
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        model.train()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = model(input_ids=xb[:, :-1], labels=xb[:, :-1].clone(), output_router_logits=True, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 20:
            per = (time.time() - t0) / 20
            total = int((deadline - t0) / per * 0.9)
            print(f"{per * 1e3:.0f} ms/step -> {total} steps", flush=True)
        if step % 100 == 0 or step == total:
            model.eval()
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                s, n = window_nll(model, sel, dev)
            curve.append(dict(step=step, loss=float(out.loss), heldout_ppl=math.exp(s / n)))
            print(curve[-1], f"t={time.time() - t0:.0f}s", flush=True)
            if s / n < best[0]:
                best = (s / n, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    if best[1] is not None:
        model.load_state_dict(best[1])
    set_experts(model, "eager")
    return model.float().eval(), held, dict(curve=curve, steps=step, best_step=best[2],
                                            best_heldout_ppl=math.exp(best[0]) if best[1] is not None else None)


def capture(model, ids, dev):
    """Per layer: hn and la ([T, H]) for one sequence."""
    got = {}
    hooks = []
    for li, layer in enumerate(model.model.layers):
        def pre(_mod, args, li=li, layer=layer):
            resid = args[0].reshape(-1, args[0].shape[-1]).float()
            norm = layer.post_attention_layernorm
            # the norm's own forward, past this hook
            hn = norm.__class__.forward(norm, resid)
            mlp = layer.mlp
            shared = torch.sigmoid(mlp.shared_expert_gate(hn)) * mlp.shared_expert(hn)
            got[li] = (hn, norm.__class__.forward(norm, resid + shared))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(pre))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids], device=dev), use_cache=False)
    for h in hooks:
        h.remove()
    return got


def new_recall():
    return dict(slot_routed=[0] * K, slot_predicted=[0] * K, gate_mass=0.0, gate_mass_predicted=0.0, routed=0,
                routed_predicted=0)


def score(r, guess, route, w):
    """guess, route: [T, K] expert ids (route by gate weight, largest first); w: [T, K]."""
    hit = (route[:, :, None] == guess[:, None, :]).any(-1)
    for j in range(K):
        r["slot_routed"][j] += int(hit.shape[0])
        r["slot_predicted"][j] += int(hit[:, j].sum())
    r["gate_mass"] += float(w.sum())
    r["gate_mass_predicted"] += float((w * hit).sum())
    r["routed"] += int(hit.numel())
    r["routed_predicted"] += int(hit.sum())


def summary(r):
    return dict(recall=r["routed_predicted"] / max(1, r["routed"]),
                gate_mass_recall=r["gate_mass_predicted"] / max(1e-9, r["gate_mass"]),
                slot_recall=[p / max(1, n) for p, n in zip(r["slot_predicted"], r["slot_routed"])], **r)


def measure(model, tok, held, dev, n_seq=8, seq=512):
    ids = tok.encode(held[400000:]).ids
    gates = [layer.mlp.gate.weight.detach().float() for layer in model.model.layers]
    n_layers = len(gates)
    res = {f"{a}_{x}": new_recall() for a in ("one", "two") for x in ("hn", "la")}
    for s in range(n_seq):
        chunk = ids[s * seq:(s + 1) * seq]
        if len(chunk) < seq:
            break
        got = capture(model, chunk, dev)
        routes = []
        for li in range(n_layers):
            p = torch.softmax(got[li][0] @ gates[li].T, dim=-1)
            v, i = torch.topk(p, K)
            routes.append((i, v / v.sum(-1, keepdim=True)))
        for li in range(n_layers):
            for ahead, name in ((1, "one"), (2, "two")):
                tl = li + ahead
                if tl >= n_layers:
                    continue  # within a token only: the layer after the last is the next token's
                for xi, x in ((0, "hn"), (1, "la")):
                    guess = torch.topk(got[li][xi] @ gates[tl].T, K).indices
                    score(res[f"{name}_{x}"], guess.cpu(), routes[tl][0].cpu(), routes[tl][1].cpu())
    return {k: summary(v) for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=4.5)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, for trying the script on a CPU")
    args = ap.parse_args()
    global E, K
    if args.tiny:
        CONFIG.update(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=32,
                      linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                      linear_num_value_heads=2, layer_types=CONFIG["layer_types"][:4])
        E = 32
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.time()
    tok = Tokenizer.from_file(os.path.join(DEMO_TOK, "tokenizer.json"))
    rng = random.Random(0)
    torch.manual_seed(0)
    model, held, log = train(args, tok, dev, rng)
    res = measure(model, tok, held, dev, n_seq=2 if args.tiny else 8, seq=128 if args.tiny else 512)
    for k, v in res.items():
        print(k, f"recall {v['recall']:.3f} gate mass {v['gate_mass_recall']:.3f}", flush=True)
    log.update(results=res, config=CONFIG, seconds=time.time() - t0,
               gpu=torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
               versions=dict(torch=torch.__version__, transformers=transformers.__version__))
    json.dump(log, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
