#!/usr/bin/env python3
"""Train the demo model embedded in moescope: a small HuggingFace Qwen3MoeForCausalLM on the
Rust documentation, with the demo tokenizer (src/demo/tokenizer.json). Run once, on a GPU
machine, with torch + transformers; moescope only reads what this writes.

usage: train_demo.py CORPUS_DIR OUT_DIR [--minutes 7] [--max-steps 750]

CORPUS_DIR holds train.txt and heldout.txt from rust_docs_corpus.py (every 20th block held
out). OUT_DIR gets:
  demo/            the checkpoint (config.json, bf16 model-*.safetensors and their index) and
                   what transformers computes on it (reference.safetensors / reference.json,
                   as make_fixtures.py writes them) on a held-out prompt
  heldout_excerpt.txt   the first ~24k characters of heldout.txt (whole blocks): the text the
                   engine's perplexity test reads
  train_log.json   loss curve, held-out perplexity, routing statistics, time, GPU

Training data: the corpus as plain text (chunks of 24 blocks, each a document), plus chat
samples rendered the way the Qwen3 chat template renders one turn: each section heading of
the corpus, asked about in one of a few phrasings, answered by the paragraphs that follow it
(with the empty think block of `enable_thinking=false` in a third of them), so the workbench's
chat gets replies in the corpus's prose. Documents are shuffled each epoch, joined by
<|endoftext|> and cut into windows. The loss is the LM loss plus transformers' load-balancing
auxiliary loss (router_aux_loss_coef), so all experts are used while they specialise. The
checkpoint kept is the one with the lowest held-out loss.

Perplexity protocol (the engine's `moescope perplexity` follows it): the text is tokenized
whole, cut into consecutive windows of 512 tokens (the last one shorter), each evaluated from an
empty context; every token but a window's first is predicted; ppl = exp(mean NLL).
"""
import argparse
import json
import math
import os
import random
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures  # noqa: E402

DEMO_TOK = os.path.join(HERE, "..", "..", "src", "demo")
PPL_WINDOW = 512
EXCERPT_CHARS = 24000

CONFIG = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
              head_dim=64, intermediate_size=512, moe_intermediate_size=64, num_experts=16, num_experts_per_tok=4,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True,
              max_position_embeddings=4096, hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, use_sliding_window=False,
              sliding_window=None, router_aux_loss_coef=0.01, initializer_range=0.02, attention_dropout=0.0)

QUESTIONS = ["{h}", "Tell me about {h}.", "What is {h}?", "Explain {h}.", "Can you explain {l}?",
             "How does {l} work in Rust?", "I have a question about {l}."]


def blocks_of(path):
    return [b for b in open(path, encoding="utf-8").read().split("\n\n") if b.strip()]


def is_heading(b):
    return len(b) < 70 and "\n" not in b and not b.rstrip().endswith((".", ":", ";", ",", "{", "}", ")")) \
        and b[:1].isupper() and len(b.split()) <= 8


def is_prose(b):
    return len(b) > 60 and not b.startswith((" ", "$", "fn ", "let ", "use ", "#", "//", "[")) and \
        b.count(";") < 3 and b.rstrip().endswith((".", ":", "!", "?"))


def chat_samples(blocks, rng):
    out = []
    for i, b in enumerate(blocks[:-1]):
        if not is_heading(b):
            continue
        ans = []
        for nb in blocks[i + 1:i + 4]:
            if is_heading(nb) or (ans and not is_prose(nb)):
                break
            ans.append(nb)
            if sum(map(len, ans)) > 700:
                break
        if not ans or not is_prose(ans[0]):
            continue
        h = b.strip()
        q = rng.choice(QUESTIONS).format(h=h, l=h[0].lower() + h[1:] if not h[:2].isupper() else h)
        think = "<think>\n\n</think>\n\n" if rng.random() < 1 / 3 else ""
        out.append(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{think}" + "\n\n".join(ans) + "<|im_end|>\n")
    return out


def window_nll(model, ids, dev):
    """Sum of NLL and count over consecutive windows (the perplexity protocol)."""
    tot, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, PPL_WINDOW):
            w = ids[s:s + PPL_WINDOW]
            if len(w) < 2:
                break
            x = torch.tensor([w], device=dev)
            logits = model(input_ids=x, use_cache=False).logits[0].float()
            tot += F.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
            n += len(w) - 1
    return tot, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--max-steps", type=int, default=750)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    t_start = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    print(f"device {gpu}, torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    tok = Tokenizer.from_file(os.path.join(DEMO_TOK, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    rng = random.Random(0)
    torch.manual_seed(0)

    train_blocks = blocks_of(os.path.join(args.corpus, "train.txt"))
    held_text = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    docs = ["\n\n".join(train_blocks[i:i + 24]) for i in range(0, len(train_blocks), 24)]
    # twice, in other phrasings: the chat format is what the workbench asks in
    chats = chat_samples(train_blocks, rng) + chat_samples(train_blocks, rng)
    enc = lambda xs: [e.ids for e in tok.encode_batch(xs)]  # noqa: E731
    doc_ids, chat_ids = enc(docs), enc(chats)
    n_doc, n_chat = sum(map(len, doc_ids)), sum(map(len, chat_ids))
    print(f"train: {len(docs)} documents, {n_doc} tokens; {len(chats)} chat samples, {n_chat} tokens", flush=True)
    print("chat sample:", repr(chats[len(chats) // 2][:400]), flush=True)
    held_ids = tok.encode(held_text).ids
    # the held-out windows used for model selection: the first 64k tokens
    sel_ids = held_ids[:65536]

    cfg = transformers.Qwen3MoeConfig(**CONFIG)
    model = transformers.Qwen3MoeForCausalLM(cfg).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"params {nparams} ({nparams / 1e6:.2f} M)", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=dev == "cuda")
    warm = 200
    # cosine over the steps expected in the time budget (re-estimated after the first 50 steps)
    total = args.max_steps

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
    log = dict(curve=[], evals=[])
    best = (float("inf"), None, -1)
    step = 0
    t_train = time.time()
    deadline = t_train + args.minutes * 60
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
        # labels: transformers shifts them itself (logits[t] predicts labels[t + 1])
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 50:
            per = (time.time() - t_train) / 50
            total = min(args.max_steps, int((deadline - t_train) / per * 0.93))
            print(f"{per * 1e3:.0f} ms/step -> {total} steps in the budget", flush=True)
        if step % 50 == 0:
            aux = float(out.aux_loss.detach()) if getattr(out, "aux_loss", None) is not None else float("nan")
            log["curve"].append(dict(step=step, loss=float(loss), aux=aux, lr=lr_at(step), epoch=epoch))
            print(f"step {step} epoch {epoch} loss {float(loss):.4f} aux {aux:.4f} lr {lr_at(step):.2e} "
                  f"t={time.time() - t_start:.0f}s", flush=True)
        if step % 50 == 0 or step == total:
            model.eval()
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                s, n = window_nll(model, sel_ids, dev)
            ev = s / n
            log["evals"].append(dict(step=step, heldout_nll=ev, heldout_ppl=math.exp(ev)))
            print(f"  eval step {step}: held-out nll {ev:.4f} ppl {math.exp(ev):.2f}", flush=True)
            if ev < best[0]:
                best = (ev, {k: v.detach().clone() for k, v in model.state_dict().items()}, step)
    train_s = time.time() - t_train
    print(f"trained {step} steps in {train_s:.0f} s; best held-out step {best[2]} nll {best[0]:.4f}", flush=True)
    model.load_state_dict(best[1])

    # ---- save in bf16, then the oracle on the saved files --------------------------------
    out = os.path.join(args.out, "demo")
    os.makedirs(out, exist_ok=True)
    # shards of at most 8 MB: no tracked file of the repository passes 8 MB (the committed
    # checkpoint is this one's tensors in two shards, cut in the file's order)
    model.to("cpu").to(torch.bfloat16).save_pretrained(out, max_shard_size="8MB")
    gc = os.path.join(out, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    make_fixtures.hub_spelling(os.path.join(out, "config.json"))
    # (the tokenizer files are src/demo's: copy them beside the checkpoint to convert it)
    # excerpt: whole held-out blocks up to EXCERPT_CHARS
    ex, n = [], 0
    for b in held_text.split("\n\n"):
        if n + len(b) > EXCERPT_CHARS:
            break
        ex.append(b)
        n += len(b) + 2
    excerpt = "\n\n".join(ex) + "\n"
    open(os.path.join(args.out, "heldout_excerpt.txt"), "w", encoding="utf-8").write(excerpt)
    # the oracle's prompt: a held-out paragraph (prose), then its continuation, forced
    para = next(b for b in held_text.split("\n\n") if is_prose(b) and len(b) > 300)
    pids = tok.encode(para).ids
    ids, forced = pids[:48], pids[48:80]
    m = make_fixtures.oracle(out, ids, forced, dict(fixture="demo", trained=True), prompt=tok.decode(ids))
    m = m.to(dev)
    # perplexity of the saved (bf16-rounded) weights in fp32, on the excerpt and all held-out
    ppl = {}
    for name, text in (("excerpt", excerpt), ("heldout", held_text)):
        s, n = window_nll(m, tok.encode(text).ids, dev)
        ppl[name] = dict(tokens=n, nll=s / n, ppl=math.exp(s / n))
        print(f"fp32 perplexity ({name}, {n} predicted tokens): {math.exp(s / n):.3f}", flush=True)
    # routing statistics on the held-out text: per layer, how often each expert is picked
    E, K = cfg.num_experts, cfg.num_experts_per_tok
    counts = torch.zeros(cfg.num_hidden_layers, E)
    with torch.no_grad():
        for s in range(0, min(len(held_ids), 32768), PPL_WINDOW):
            x = torch.tensor([held_ids[s:s + PPL_WINDOW]], device=dev)
            o = m(input_ids=x, output_router_logits=True, use_cache=False)
            for li, r in enumerate(o.router_logits):
                top = torch.topk(r.float(), K, -1).indices.reshape(-1).cpu()
                counts[li] += torch.bincount(top, minlength=E).float()
    routing = []
    for li in range(cfg.num_hidden_layers):
        p = counts[li] / counts[li].sum()
        ent = float(-(p[p > 0] * p[p > 0].log()).sum())
        routing.append(dict(layer=li, entropy=ent, uniform=math.log(E), max_share=float(p.max()),
                            min_share=float(p.min()), shares=[round(float(v), 4) for v in p]))
        print(f"layer {li}: entropy {ent:.3f} (uniform {math.log(E):.3f}), share max {float(p.max()):.3f} "
              f"min {float(p.min()):.4f}", flush=True)
    # a few replies, greedy and sampled, through the chat format
    samples = []
    for q in ("What is ownership in Rust?", "How do I read a file?", "Tell me about traits."):
        prompt = f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        x = torch.tensor([tok.encode(prompt).ids], device=dev)
        for sample in (False, True):
            with torch.no_grad():
                g = m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=120, do_sample=sample,
                               temperature=0.7, top_k=20, top_p=0.95, eos_token_id=tok.token_to_id("<|im_end|>"),
                               pad_token_id=eot)
            text = tok.decode(g[0, x.shape[1]:].tolist())
            samples.append(dict(prompt=q, sampled=sample, reply=text))
            print(f"--- {q} ({'sampled' if sample else 'greedy'}):\n{text}\n", flush=True)
    log.update(gpu=gpu, torch=torch.__version__, transformers=transformers.__version__, params=nparams,
               config=CONFIG, steps=step, train_seconds=train_s, tokens_per_step=args.batch * args.seq,
               best_step=best[2], best_heldout_nll_bf16_autocast=best[0], perplexity_fp32=ppl, routing=routing,
               samples=samples, train_tokens=dict(documents=n_doc, chat=n_chat), seconds=time.time() - t_start)
    json.dump(log, open(os.path.join(args.out, "train_log.json"), "w"), indent=1, ensure_ascii=False)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
