#!/usr/bin/env python3
"""Train a Qwen3-MoE with the expert layout of Qwen3-30B-A3B (128 experts per layer, top-8,
normalised weights) for its routing, then record that routing as moescope traces. Runs once, on
a GPU machine with torch + transformers, inside one 10-minute command; moescope only reads the
traces it writes.

usage: train_routing.py CORPUS_DIR OUT_DIR [--minutes 5.5] [--tokens 5000]

CORPUS_DIR holds train.txt and heldout.txt (routing_corpus.py: Rust books, Rust std API pages,
Python docs). The tokenizer is the demo model's (src/demo). Training follows train_demo.py
(documents plus chat samples, AdamW, cosine, bf16 autocast, the load-balancing loss at the
coefficient Qwen3-30B-A3B was trained with, 0.001; the checkpoint kept is the best on held-out
text) with transformers' grouped_mm experts.

Recording: chat prompts (questions about Rust and Python) and continuation prompts (held-out
passages) get sampled replies (temperature 0.7, top-p 0.95, top-k 20, as Qwen recommends);
then each whole sequence runs once more through the fp32 model with a hook on every MoE block
that takes its input x (the post-attention-normed hidden state, [T, H]):
  route      softmax(W_l x) top-8, renormalised (what the block computes)
  candidates softmax(W_{l+1} x) top-16 with scores: moescope's predictor (the next MoE
             layer's router on this layer's MoE input; the last layer's record predicts the
             next token's layer 0 with W_0)
Traces (moescope routing JSON lines, gzip): a prompt is one pass (prefill), each reply token a
pass of its own (decode); records carry `ph` ("prefill" / "decode"), `c` and `cs`. The prompts
alternate between two files: routing-tune (for tuning) and routing-heldout (for judging), each
with at least --tokens / 2 tokens. OUT_DIR also gets routing_log.json: training curve,
perplexity, per-layer routing statistics (entropy, shares, how many experts consecutive tokens
share) and the predictor's recall measured on the traces.
"""
import argparse
import gzip
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
from train_demo import DEMO_TOK, blocks_of, chat_samples, is_prose, window_nll  # noqa: E402

E, K, CAND = 128, 8, 16
CONFIG = dict(vocab_size=4096, hidden_size=512, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
              head_dim=64, intermediate_size=1024, moe_intermediate_size=192, num_experts=E, num_experts_per_tok=K,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
              max_position_embeddings=4096, hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, use_sliding_window=False,
              sliding_window=None, router_aux_loss_coef=0.001, initializer_range=0.02, attention_dropout=0.0)

QUESTIONS = [
    "What is ownership in Rust?", "How do I read a file line by line in Python?",
    "Explain lifetimes in Rust.", "What does a list comprehension do?",
    "How do traits differ from interfaces?", "How do I start a thread in Python?",
    "What is the difference between Vec and a slice?", "Explain decorators in Python.",
    "How does error handling with Result work?", "What is a generator in Python?",
    "Tell me about iterators in Rust.", "How do I parse command-line arguments in Python?",
    "What are closures in Rust?", "Explain the with statement.",
    "How does pattern matching work in Rust?", "What is asyncio?",
    "What is unsafe Rust for?", "How do dictionaries work in Python?",
    "Tell me about Cargo workspaces.", "What is the GIL?",
]


def set_experts(model, impl):
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_experts_implementation"):
            c._experts_implementation = impl


def train(args, tok, dev, rng):
    eot = tok.token_to_id("<|endoftext|>")
    train_blocks = blocks_of(os.path.join(args.corpus, "train.txt"))
    held_text = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    docs = ["\n\n".join(train_blocks[i:i + 24]) for i in range(0, len(train_blocks), 24)]
    chats = chat_samples(train_blocks, rng)
    enc = lambda xs: [e.ids for e in tok.encode_batch(xs)]  # noqa: E731
    doc_ids, chat_ids = enc(docs), enc(chats)
    n_doc, n_chat = sum(map(len, doc_ids)), sum(map(len, chat_ids))
    print(f"train: {len(docs)} documents, {n_doc} tokens; {len(chats)} chat samples, {n_chat} tokens", flush=True)
    sel_ids = tok.encode(held_text[:400000]).ids[:32768]

    cfg = transformers.Qwen3MoeConfig(**CONFIG)
    model = transformers.Qwen3MoeForCausalLM(cfg).to(dev)
    if dev == "cuda":
        # grouped_mm: one kernel per projection for all experts (the eager loop over 128
        # experts would take most of the time budget); eager where this transformers lacks it
        set_experts(model, "grouped_mm")
        try:
            with torch.autocast(dev, dtype=torch.bfloat16):
                model(input_ids=torch.zeros(2, 16, dtype=torch.long, device=dev)).logits.sum().backward()
            model.zero_grad(set_to_none=True)
        except Exception as e:  # noqa: BLE001
            print(f"grouped_mm experts failed ({e}); eager experts", flush=True)
            set_experts(model, "eager")
    nparams = sum(p.numel() for p in model.parameters())
    print(f"params {nparams / 1e6:.1f} M, experts {model.config._experts_implementation}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=dev == "cuda")
    warm, total = 100, args.max_steps

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        p = min(1.0, (s - warm) / max(1, total - warm))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def epoch_stream():
        items = doc_ids + chat_ids
        order = list(range(len(items)))
        rng.shuffle(order)
        flat = []
        for i in order:
            flat.extend(items[i])
            flat.append(eot)
        return torch.tensor(flat, dtype=torch.long)

    L = args.seq + 1
    stream, pos, epoch = epoch_stream(), 0, 0
    log = dict(curve=[], evals=[], train_tokens=dict(documents=n_doc, chat=n_chat), params=nparams)
    best, step = (float("inf"), None, -1), 0
    t0 = time.time()
    deadline = t0 + args.minutes * 60
    while step < total and time.time() < deadline:
        if pos + args.batch * L > len(stream):
            stream, pos, epoch = epoch_stream(), 0, epoch + 1
        xb = stream[pos:pos + args.batch * L].view(args.batch, L).to(dev, non_blocking=True)
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
        if step == 30:
            per = (time.time() - t0) / 30
            total = min(args.max_steps, int((deadline - t0) / per * 0.9))
            print(f"{per * 1e3:.0f} ms/step -> {total} steps in the budget", flush=True)
        if step % 100 == 0 or step == total:
            aux = float(out.aux_loss.detach()) if getattr(out, "aux_loss", None) is not None else float("nan")
            model.eval()
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                s, n = window_nll(model, sel_ids, dev)
            ev = s / n
            log["curve"].append(dict(step=step, loss=float(out.loss), aux=aux, epoch=epoch, heldout_nll=ev))
            print(f"step {step} epoch {epoch} loss {float(out.loss):.4f} aux {aux:.4f} held-out ppl "
                  f"{math.exp(ev):.2f} t={time.time() - t0:.0f}s", flush=True)
            if ev < best[0]:
                best = (ev, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    log.update(steps=step, train_seconds=time.time() - t0, best_step=best[2], best_heldout_ppl=math.exp(best[0]),
               tokens_per_step=args.batch * args.seq)
    print(f"trained {step} steps in {time.time() - t0:.0f} s; best step {best[2]} ppl {math.exp(best[0]):.2f}",
          flush=True)
    model.load_state_dict(best[1])
    # recording runs in fp32, where grouped_mm (bf16 only) does not apply
    set_experts(model, "eager")
    return model.float().eval(), held_text, log


def prompts(tok, held_text, rng):
    """Chat questions and held-out continuations, interleaved; rendered as the Qwen3 template
    renders one user turn with thinking off for a third of them."""
    paras = [b for b in held_text.split("\n\n") if is_prose(b) and 300 < len(b) < 1500]
    rng.shuffle(paras)
    out = []
    for i, q in enumerate(QUESTIONS):
        think = "<think>\n\n</think>\n\n" if i % 3 == 2 else ""
        out.append(("chat", f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{think}"))
        if i % 2 == 1 and paras:
            out.append(("continue", paras.pop()))
    return out


class Capture:
    """Forward pre-hooks on every MoE block: the block's input x ([T, H]) per layer."""

    def __init__(self, model):
        self.xs = {}
        self.hooks = [layer.mlp.register_forward_pre_hook(self.hook(li)) for li, layer in enumerate(model.model.layers)]

    def hook(self, li):
        def f(_mod, args):
            self.xs[li] = args[0].reshape(-1, args[0].shape[-1]).float()
        return f


def record(model, tok, held_text, args, rng, dev):
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    layers = model.model.layers
    W = [layer.mlp.gate.weight.float() for layer in layers]
    nl = len(layers)
    cap = Capture(model)
    files = {name: [] for name in ("tune", "heldout")}
    tokens = {name: 0 for name in files}
    seqs = []
    plist = prompts(tok, held_text, rng)
    i = 0
    while min(tokens.values()) < args.tokens // 2 and i < 4 * len(plist):
        kind, text = plist[i % len(plist)]
        name = "tune" if i % 2 == 0 else "heldout"
        i += 1
        x = torch.tensor([tok.encode(text).ids], device=dev)
        with torch.no_grad():
            g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=args.reply,
                               min_new_tokens=min(48, args.reply), do_sample=True, temperature=0.7, top_k=20, top_p=0.95,
                               eos_token_id=im_end if kind == "chat" else eot, pad_token_id=eot)
        ids = g[0].tolist()
        n_prompt = x.shape[1]
        cap.xs.clear()
        with torch.no_grad():
            model(input_ids=g, use_cache=False)
        recs = []
        for li in range(nl):
            xl = cap.xs[li]
            probs = torch.softmax(xl @ W[li].T, dim=-1)
            top = torch.topk(probs, K, dim=-1)
            w = top.values / top.values.sum(-1, keepdim=True)
            nxt = torch.softmax(xl @ W[(li + 1) % nl].T, dim=-1)
            cand = torch.topk(nxt, CAND, dim=-1)
            recs.append((top.indices.cpu().tolist(), w.cpu().tolist(), cand.indices.cpu().tolist(),
                         cand.values.cpu().tolist()))
        seqs.append(dict(file=name, kind=kind, prompt_tokens=n_prompt, reply_tokens=len(ids) - n_prompt,
                         reply=tok.decode(ids[n_prompt:])[:600], recs=recs))
        tokens[name] += len(ids)
        print(f"[{name}] {kind}: {n_prompt} + {len(ids) - n_prompt} tokens: "
              f"{tok.decode(ids[n_prompt:])[:160]!r}", flush=True)
    return seqs, tokens


def write_traces(seqs, out, bytes_per_expert):
    nl = len(seqs[0]["recs"])
    head = dict(moescope_routing=1, model="routing model: Qwen3-MoE 12 x 128 experts top-8 trained on Rust and "
                "Python docs (tests/reference/train_routing.py)", moe_layers=list(range(nl)), num_experts=E,
                top_k=K, bytes_per_expert=bytes_per_expert, candidates=CAND)
    for name in ("tune", "heldout"):
        path = os.path.join(out, f"routing-{name}.jsonl.gz")
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
            f.write(json.dumps(head) + "\n")
            p = 0
            for s in (s for s in seqs if s["file"] == name):
                n = len(s["recs"][0][0])
                passes = [(0, s["prompt_tokens"], "prefill")] + [(t, t + 1, "decode")
                                                                for t in range(s["prompt_tokens"], n)]
                for a, b, ph in passes:
                    for t in range(a, b):
                        for li in range(nl):
                            e, w, c, cs = (r[t] for r in s["recs"][li])
                            f.write(json.dumps(dict(p=p, t=t, l=li, e=e, w=[round(v, 5) for v in w], ph=ph, c=c,
                                                    cs=[round(v, 5) for v in cs]), separators=(",", ":")) + "\n")
                    p += 1
        print(f"wrote {path} ({os.path.getsize(path)} bytes)", flush=True)


def routing_stats(seqs):
    """Per layer: entropy and shares of expert use, experts shared by consecutive decode tokens;
    the predictor's recall (of the next layer's top-8 by its top-8 and top-16 candidates)."""
    nl = len(seqs[0]["recs"])
    counts = torch.zeros(nl, E)
    overlap, n_ov = [0.0] * nl, [0] * nl
    rec8, rec16, mass8, n_pred = 0.0, 0.0, 0.0, 0
    for s in seqs:
        n = len(s["recs"][0][0])
        for li in range(nl):
            es, ws, cs, _ = s["recs"][li]
            for t in range(n):
                counts[li, es[t]] += 1
                if t > s["prompt_tokens"]:
                    overlap[li] += len(set(es[t]) & set(es[t - 1])) / K
                    n_ov[li] += 1
                # the candidates of (t, li) predict (t, li + 1), or (t + 1, 0) after the last layer
                nli, nt = (li + 1, t) if li + 1 < nl else (0, t + 1)
                if nt < n:
                    true_e, true_w = s["recs"][nli][0][nt], s["recs"][nli][1][nt]
                    c = cs[t]
                    rec8 += len(set(c[:K]) & set(true_e)) / K
                    rec16 += len(set(c) & set(true_e)) / K
                    mass8 += sum(w for e, w in zip(true_e, true_w) if e in set(c[:K]))
                    n_pred += 1
    layers = []
    for li in range(nl):
        p = counts[li] / counts[li].sum()
        ent = float(-(p[p > 0] * p[p > 0].log()).sum())
        layers.append(dict(layer=li, entropy=ent, uniform=math.log(E), max_share=float(p.max()),
                           unused=int((counts[li] == 0).sum()), consecutive_overlap=overlap[li] / max(1, n_ov[li])))
        print(f"layer {li}: entropy {ent:.3f} / {math.log(E):.3f}, max share {float(p.max()):.3f}, unused "
              f"{int((counts[li] == 0).sum())}, consecutive decode tokens share {overlap[li] / max(1, n_ov[li]):.2f}",
              flush=True)
    pred = dict(recall_top8=rec8 / n_pred, recall_top16=rec16 / n_pred, gate_mass_top8=mass8 / n_pred)
    print(f"predictor: recall {pred['recall_top8']:.3f} (top-8 candidates), {pred['recall_top16']:.3f} (top-16); "
          f"gate mass covered by top-8 {pred['gate_mass_top8']:.3f}", flush=True)
    return layers, pred


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.5)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--tokens", type=int, default=5000)
    ap.add_argument("--reply", type=int, default=320)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, for trying the script on a CPU")
    args = ap.parse_args()
    if args.tiny:
        global E
        CONFIG.update(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, moe_intermediate_size=16, num_experts=32)
        E = 32
    t_start = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    print(f"device {gpu}, torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    tok = Tokenizer.from_file(os.path.join(DEMO_TOK, "tokenizer.json"))
    rng = random.Random(0)
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    model, held_text, log = train(args, tok, dev, rng)
    seqs, tokens = record(model, tok, held_text, args, rng, dev)
    # an expert of the model itself in bf16 (gate, up, down): what its own package would read
    h, i = CONFIG["hidden_size"], CONFIG["moe_intermediate_size"]
    write_traces(seqs, args.out, 3 * h * i * 2)
    layers, pred = routing_stats(seqs)
    log.update(gpu=gpu, torch=torch.__version__, transformers=transformers.__version__, config=CONFIG,
               trace_tokens=tokens, routing=layers, predictor=pred, seconds=time.time() - t_start,
               samples=[{k: s[k] for k in ("file", "kind", "prompt_tokens", "reply_tokens", "reply")} for s in seqs])
    json.dump(log, open(os.path.join(args.out, "routing_log.json"), "w"), indent=1, ensure_ascii=False)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
