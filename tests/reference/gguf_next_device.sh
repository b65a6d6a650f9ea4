#!/usr/bin/env bash
# The qwen3next GGUF fixtures of issue 25, made on the lent device (llama.cpp's converter imports
# torch), from the repo root. Carried: .dev/llama-src.tar.xz and .dev/gguf-0.19.0-py3-none-any.whl
# (see make_gguf_fixtures.sh).
#   - a tiny Qwen3-Next checkpoint, every layer MoE with the top-k renormalised (llama.cpp's
#     qwen3next graph has no dense layer and always renormalises), and transformers' logits on it
#     (make_hybrid_fixtures.py next-moe)
#   - with the tiny tokenizer of make_demo_tokenizer.py (512 tokens; the vocabulary is 1024: padded),
#     BF16 and Q8_0 qwen3next GGUFs by convert_hf_to_gguf.py (--no-mtp: the checkpoint has none)
#   - transformers loading each GGUF, where it can
# Results in $OUT: steps.log, next-gguf.tgz (next-moe-{bf16,q8_0}.gguf, config.json,
# reference.safetensors with input_ids and the checkpoint's logits, reference.json).
set -uo pipefail
: "${OUT:?OUT must name the results folder}"
# the fixtures, the demo's weights and the tokenizers are packed in the tree: as files here
python3 tests/reference/pack_fixtures.py unpack
W=/tmp/gn
mkdir -p "$W/llama" "$W/site" "$W/g" "$W/ck"
LOG=$OUT/steps.log
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
python3 -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)' >>"$LOG" 2>&1
tar -xJf .dev/llama-src.tar.xz -C "$W/llama" || { log "no .dev/llama-src.tar.xz"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" .dev/gguf-0.19.0-py3-none-any.whl >>"$LOG" 2>&1
log "start"
python3 tests/reference/make_hybrid_fixtures.py "$W/ck" next-moe >>"$LOG" 2>&1 || { log "checkpoint failed"; exit 1; }
Q=$W/ck/next-moe
python3 tests/reference/make_demo_tokenizer.py tests/fixtures/demo/heldout.txt assets/tokenizers/qwen3/tokenizer_config.json "$Q" 512 >>"$LOG" 2>&1
log "checkpoint: $(ls "$Q" | tr '\n' ' ')"
export PYTHONPATH=$W/llama/gguf-py:$W/llama:$W/site PYTHONUNBUFFERED=1
. tests/reference/llama_convert.sh
for t in bf16 q8_0; do
    conv "$Q" --no-mtp --outtype $t --outfile "$W/g/next-moe-$t.gguf" >"$W/conv-$t.log" 2>&1 || { tail -15 "$W/conv-$t.log" >>"$LOG"; log "$t failed"; }
done
grep -h "WARNING\|pre-tokenizer" "$W"/conv-*.log | sort | uniq -c | head >>"$LOG"
log "converted: $(ls -la "$W/g" | tr '\n' ' ')"
python3 - "$Q" "$W/g" >>"$LOG" 2>&1 <<'EOF'
import os, sys, torch, transformers
from safetensors.torch import load_file, save_file
q, g = sys.argv[1], sys.argv[2]
ref = load_file(os.path.join(q, "reference.safetensors"))
ids = ref["input_ids"].unsqueeze(0)
kw = dict(dtype=torch.float32, attn_implementation="eager")
out = {"input_ids": ref["input_ids"].contiguous(), "logits": ref["logits"].contiguous()}
for t in ["bf16", "q8_0"]:
    p = os.path.join(g, f"next-moe-{t}.gguf")
    if not os.path.exists(p):
        continue
    try:
        m = transformers.AutoModelForCausalLM.from_pretrained(q, gguf_file=p, **kw).eval()
        with torch.no_grad():
            lg = m(input_ids=ids).logits[0].float()
        out[f"logits_{t}"] = lg.contiguous()
        print(f"next-moe {t}: max |dlogit| vs checkpoint {(lg - ref['logits']).abs().max().item():.3g}")
    except Exception as e:
        print(f"next-moe {t}: transformers {transformers.__version__} cannot load it: {type(e).__name__}: {e}"[:400])
save_file(out, os.path.join(g, "reference.safetensors"))
EOF
cp "$Q/config.json" "$Q/reference.json" "$W/g/"
tar -czf "$OUT/next-gguf.tgz" -C "$W/g" $(cd "$W/g" && ls)
ls -la "$OUT" >>"$LOG"
log "end"
