#!/usr/bin/env bash
# llama-perplexity on GGUFs of the trained demo model, and a tiny qwen35moe GGUF for the hybrid
# GGUF work (issue 25), on the lent device, from the repo root. Carried: .dev/llama-src.tar.xz
# and .dev/gguf-0.19.0-py3-none-any.whl (see make_gguf_fixtures.sh).
#   - llama.cpp built statically for x86-64-v3 (llama-perplexity, llama-quantize, llama-tokenize,
#     llama-gguf-split), returned in llama-tools-static.tar.xz to run on the development machine
#   - the demo (src/demo) as BF16 and Q8_0 GGUFs (convert_hf_to_gguf.py), Q4_0 and Q4_K_M
#     (llama-quantize); `llama-perplexity -c 512 -b 512` on tests/fixtures/demo/heldout.txt for
#     each (compare with `moescope perplexity -m FILE.gguf --window 512 --second-half`)
#   - tests/fixtures/qwen35 (a tiny Qwen3.5-MoE) with the tiny tokenizer of make_gguf_tiny.py as
#     BF16 and Q8_0 qwen35moe GGUFs, and transformers' logits on each where it loads them
# Results in $OUT: steps.log, llama-tools-static.tar.xz, demo-gguf.tgz, qwen35-gguf.tgz.
set -uo pipefail
: "${OUT:?OUT must name the results folder}"
# the fixtures, the demo's weights and the tokenizers are packed in the tree: as files here
python3 tests/reference/pack_fixtures.py unpack
W=/tmp/gp
mkdir -p "$W/llama" "$W/site" "$W/g"
LOG=$OUT/steps.log
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
tar -xJf .dev/llama-src.tar.xz -C "$W/llama" || { log "no .dev/llama-src.tar.xz"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" .dev/gguf-0.19.0-py3-none-any.whl >>"$LOG" 2>&1
export PYTHONPATH=$W/llama/gguf-py:$W/llama:$W/site PYTHONUNBUFFERED=1
log "start"
(
    cmake -S "$W/llama" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DCMAKE_EXE_LINKER_FLAGS=-static >"$W/build.log" 2>&1 &&
        ninja -C "$W/b" -j 14 llama-quantize llama-perplexity llama-tokenize llama-gguf-split >>"$W/build.log" 2>&1
) &
BUILD=$!
. tests/reference/llama_convert.sh
mkdir -p "$W/demo"
cp src/demo/model/config.json src/demo/model/model-0000*.safetensors src/demo/model/model.safetensors.index.json src/demo/tokenizer.json src/demo/tokenizer_config.json "$W/demo/"
for t in bf16 q8_0; do
    conv "$W/demo" --outtype $t --outfile "$W/g/demo-$t.gguf" >"$W/conv-demo-$t.log" 2>&1 || { tail -5 "$W/conv-demo-$t.log" >>"$LOG"; log "demo $t failed"; }
done
log "demo converted"

# the held-out text, packed in the repository
H=$W/heldout.txt
xz -dc tests/fixtures/demo/heldout.txt.xz >"$H"

# the tiny Qwen3.5-MoE with a tokenizer of 512 tokens (its vocabulary is 1024: padded)
Q=$W/q35
mkdir -p "$Q"
cp tests/fixtures/qwen35/config.json tests/fixtures/qwen35/*.safetensors tests/fixtures/qwen35/model.safetensors.index.json "$Q/"
python3 tests/reference/make_demo_tokenizer.py "$H" assets/tokenizers/qwen3/tokenizer_config.json "$Q" 512 >>"$LOG" 2>&1
cp assets/tokenizers/qwen3.5/chat_template.jinja "$Q/"
for t in bf16 q8_0; do
    conv "$Q" --outtype $t --outfile "$W/g/qwen35-$t.gguf" >"$W/conv-q35-$t.log" 2>&1 || { tail -12 "$W/conv-q35-$t.log" >>"$LOG"; log "qwen35 $t failed"; }
done
python3 - "$Q" "$W/g" >>"$LOG" 2>&1 <<'EOF'
import os, sys, torch, transformers
from safetensors.torch import save_file
q, g = sys.argv[1], sys.argv[2]
ids = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(1))
res = {"ids": ids[0].contiguous()}
kw = dict(dtype=torch.float32, attn_implementation="eager")
ref = transformers.AutoModelForCausalLM.from_pretrained(q, **kw).eval()
with torch.no_grad():
    res["logits"] = ref(input_ids=ids).logits[0].float().contiguous()
print("qwen35 checkpoint logits std", res["logits"].std().item())
for t in ["bf16", "q8_0"]:
    p = os.path.join(g, f"qwen35-{t}.gguf")
    if not os.path.exists(p):
        continue
    try:
        m = transformers.AutoModelForCausalLM.from_pretrained(q, gguf_file=p, **kw).eval()
        with torch.no_grad():
            lg = m(input_ids=ids).logits[0].float()
        res[f"logits_{t}"] = lg.contiguous()
        print(f"qwen35 {t}: max |dlogit| vs checkpoint {(lg - res['logits']).abs().max().item():.3g}")
    except Exception as e:
        print(f"qwen35 {t}: transformers {transformers.__version__} cannot load it: {type(e).__name__}: {e}"[:400])
save_file(res, os.path.join(g, "qwen35-reference.safetensors"))
EOF
log "qwen35 done"

wait $BUILD || { tail -30 "$W/build.log" >>"$LOG"; log "build failed"; }
B=$W/b/bin
for t in Q4_0 Q4_K_M; do
    l=$(echo $t | tr A-Z a-z)
    "$B/llama-quantize" "$W/g/demo-bf16.gguf" "$W/g/demo-$l.gguf" $t >"$W/q-$l.log" 2>&1 || log "quantize $t failed"
    grep -c "converting to\|type" "$W/q-$l.log" >/dev/null
done
log "quantized"
for f in bf16 q8_0 q4_0 q4_k_m; do
    "$B/llama-perplexity" -m "$W/g/demo-$f.gguf" -f "$H" -c 512 -b 512 -t 14 >"$W/ppl-$f.log" 2>&1
    log "llama-perplexity demo-$f: $(grep -E 'Final estimate' "$W/ppl-$f.log") $(grep -E 'tokenizing the input|tokens' "$W/ppl-$f.log" | head -2 | tr '\n' ' ')"
done
for b in llama-quantize llama-perplexity llama-tokenize llama-gguf-split; do strip "$B/$b"; done
tar -cJf "$OUT/llama-tools-static.tar.xz" -C "$B" llama-quantize llama-perplexity llama-tokenize llama-gguf-split
tar -czf "$OUT/demo-gguf.tgz" -C "$W/g" demo-q8_0.gguf demo-q4_0.gguf demo-q4_k_m.gguf
tar -czf "$OUT/qwen35-gguf.tgz" -C "$W/g" $(cd "$W/g" && ls qwen35-*)
cp "$W"/ppl-*.log "$OUT/" 2>/dev/null
ls -la "$OUT" >>"$LOG"
log "end"
