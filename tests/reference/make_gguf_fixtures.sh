#!/usr/bin/env bash
# The GGUF fixtures of issue 25, made on the lent device (it has torch and transformers; llama.cpp's
# converter imports torch), from the repo root. Carried in the ignored folder .dev/:
#   .dev/llama-src.tar.xz   llama.cpp from llama-cpp-python 0.3.36's vendor/llama.cpp (CPU backend
#                           only): CMakeLists.txt cmake ggml src include common tools vendor gguf-py
#                           licenses LICENSE app conversion convert_hf_to_gguf.py
#   .dev/gguf-0.19.0-py3-none-any.whl   for transformers' GGUF loader (it checks the installed
#                           package's version; the converter imports the tree's own gguf-py first)
# Made there, all by llama.cpp's tools, gguf-py and transformers, none by moescope:
#   - a tiny random Qwen3-MoE checkpoint (make_gguf_tiny.py) and its GGUFs: convert_hf_to_gguf.py
#     --outtype f32, bf16, f16, q8_0, a bf16 split in parts (--split-max-tensors), a q8_0 with fused
#     gate_up experts; llama-quantize Q4_0, Q4_1, Q5_0, Q4_K_M, Q5_K_M, Q6_K from the f32 file
#   - the oracle: transformers loading each GGUF, logits on the checkpoint's prompt (gguf_oracle.py)
#   - vocabulary-only GGUFs of the real Qwen3 and Qwen3.5 tokenizers (assets/tokenizers)
#   - the demo model (src/demo) as BF16, Q8_0 and Q4_K_M GGUFs, for the perplexity comparison
#   - llama-quantize, llama-perplexity, llama-tokenize, llama-gguf-split built for x86-64-v3 (AVX2),
#     statically, to run on the development machine
# The tiny tokenizer is trained with Qwen2's split regex, so its pre-tokenizer is "qwen2"; the
# converter does not know its hash and is told so (the real vocabularies are recognised as they are).
# Results in $OUT: steps.log, tiny-a.tgz, tiny-b.tgz, demo.tgz, qwen3-vocab.gguf.gz,
# qwen35-vocab.gguf.gz, llama-tools.tar.xz.
set -uo pipefail
: "${OUT:?OUT must name the results folder}"
# the fixtures, the demo's weights and the tokenizers are packed in the tree: as files here
python3 tests/reference/pack_fixtures.py unpack
W=/tmp/gg
mkdir -p "$W/llama" "$W/site" "$W/t" "$W/g"
LOG=$OUT/steps.log
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
{ lscpu | head -20; nproc; python3 -c 'import transformers, torch; print("transformers", transformers.__version__, "torch", torch.__version__)'; } >>"$LOG" 2>&1
tar -xJf .dev/llama-src.tar.xz -C "$W/llama" || { log "no .dev/llama-src.tar.xz"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" .dev/gguf-0.19.0-py3-none-any.whl >>"$LOG" 2>&1 || { log "gguf wheel"; exit 1; }
export PYTHONPATH=$W/llama/gguf-py:$W/llama:$W/site PYTHONUNBUFFERED=1
log "start"

(
    cmake -S "$W/llama" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
        -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DCMAKE_EXE_LINKER_FLAGS=-static >"$W/build.log" 2>&1 &&
        ninja -C "$W/b" -j 12 llama-quantize llama-perplexity llama-tokenize llama-gguf-split >>"$W/build.log" 2>&1
) &
BUILD=$!

. tests/reference/llama_convert.sh

python3 tests/reference/make_gguf_tiny.py "$W/t" tests/fixtures/demo/heldout.txt assets/tokenizers/qwen3/tokenizer_config.json >>"$LOG" 2>&1 || { log "tiny checkpoint failed"; exit 1; }
log "tiny checkpoint"
for t in f32 bf16 f16 q8_0; do
    conv "$W/t/hf" --outtype $t --outfile "$W/g/tiny-$t.gguf" >"$W/conv-$t.log" 2>&1 || { tail -20 "$W/conv-$t.log" >>"$LOG"; log "convert $t failed"; }
done
mkdir -p "$W/g/split"
conv "$W/t/hf" --outtype bf16 --split-max-tensors 12 --outfile "$W/g/split/tiny-bf16.gguf" >"$W/conv-split.log" 2>&1 || { tail -20 "$W/conv-split.log" >>"$LOG"; log "split failed"; }
conv "$W/t/hf" --outtype q8_0 --fuse-gate-up-exps --outfile "$W/g/tiny-q8_0-fused.gguf" >"$W/conv-fused.log" 2>&1 || { tail -20 "$W/conv-fused.log" >>"$LOG"; log "fused failed"; }
grep -h "pre-tokenizer\|chkhsh\|WARNING" "$W"/conv-*.log | sort | uniq -c | head -20 >>"$LOG"
log "converted: $(ls "$W/g" "$W/g/split" | tr '\n' ' ')"

# vocabulary-only GGUFs of the real tokenizers
mkq() { # DIR VOCAB_SIZE
    mkdir -p "$1"
    python3 - "$1" "$2" <<'EOF'
import json, sys
d, v = sys.argv[1], int(sys.argv[2])
c = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": v, "hidden_size": 2048,
     "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
     "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
     "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960, "tie_word_embeddings": False,
     "bos_token_id": 151643, "eos_token_id": 151645}
json.dump(c, open(f"{d}/config.json", "w"))
EOF
}
mkq "$W/v3" 151936
cp assets/tokenizers/qwen3/tokenizer.json "$W/v3/tokenizer.json"
cp assets/tokenizers/qwen3/tokenizer_config.json "$W/v3/"
conv "$W/v3" --vocab-only --outfile "$W/qwen3-vocab.gguf" >"$W/conv-v3.log" 2>&1 || { tail -20 "$W/conv-v3.log" >>"$LOG"; log "qwen3 vocab failed"; }
mkq "$W/v35" 248320
cp assets/tokenizers/qwen3.5/tokenizer.json "$W/v35/tokenizer.json"
cp assets/tokenizers/qwen3.5/chat_template.jinja "$W/v35/"
conv "$W/v35" --vocab-only --outfile "$W/qwen35-vocab.gguf" >"$W/conv-v35.log" 2>&1 || { tail -20 "$W/conv-v35.log" >>"$LOG"; log "qwen35 vocab failed"; }
# kept without what its tokenizer.json gives back
python3 tests/reference/strip_vocab_gguf.py "$W/qwen35-vocab.gguf" "$W/v35/tokenizer.json" "$W/qwen35-vocab-stripped.gguf" >>"$LOG" 2>&1
grep -h "tokenizer.ggml.pre\|pre-tokenizer" "$W"/conv-v3*.log | head >>"$LOG"
for v in qwen3 qwen35; do [[ -f $W/$v-vocab.gguf ]] && gzip -9 -c "$W/$v-vocab.gguf" >"$OUT/$v-vocab.gguf.gz"; done
log "vocab done"

# the demo model
mkdir -p "$W/demo"
cp src/demo/model/config.json src/demo/model/model-0000*.safetensors src/demo/model/model.safetensors.index.json src/demo/tokenizer.json src/demo/tokenizer_config.json "$W/demo/"
conv "$W/demo" --outtype bf16 --outfile "$W/g/demo-bf16.gguf" >"$W/conv-demo.log" 2>&1 || { tail -20 "$W/conv-demo.log" >>"$LOG"; log "demo failed"; }
conv "$W/demo" --outtype q8_0 --outfile "$W/g/demo-q8_0.gguf" >>"$W/conv-demo.log" 2>&1
log "demo converted"

wait $BUILD || { tail -30 "$W/build.log" >>"$LOG"; log "build failed"; }
Q=$W/b/bin/llama-quantize
for t in Q4_0 Q4_1 Q5_0 Q4_K_M Q5_K_M Q6_K; do
    l=$(echo $t | tr A-Z a-z)
    "$Q" "$W/g/tiny-f32.gguf" "$W/g/tiny-$l.gguf" $t >"$W/q-$l.log" 2>&1 || { tail -5 "$W/q-$l.log" >>"$LOG"; log "quantize $t failed"; }
    grep -h "converting to\|type " "$W/q-$l.log" | awk '{print $NF}' | sort | uniq -c | tr '\n' ' ' >>"$LOG"; echo " <- $t" >>"$LOG"
done
"$Q" "$W/g/demo-bf16.gguf" "$W/g/demo-q4_k_m.gguf" Q4_K_M >"$W/q-demo.log" 2>&1 || log "demo Q4_K_M failed"
grep -E "^llama_model_quantize_impl|type|size" "$W/q-demo.log" | tail -6 >>"$LOG"
log "quantized"

args=()
for f in f32 bf16 f16 q8_0 q8_0-fused q4_0 q4_1 q5_0 q4_k_m q5_k_m q6_k; do
    [[ -f $W/g/tiny-$f.gguf ]] && args+=("${f//-/_}=$W/g/tiny-$f.gguf")
done
python3 tests/reference/gguf_oracle.py "$W/t/hf" "$W/t/hf_logits.safetensors" "$W/t/oracle.safetensors" "${args[@]}" >>"$LOG" 2>&1 || log "oracle failed"
log "oracle done"

cp "$W/t/hf_logits.safetensors" "$W/t/oracle.safetensors" "$W/g/" 2>/dev/null
mkdir -p "$W/g/hf" && cp "$W/t/hf/"*.json "$W/g/hf/"
tar -czf "$OUT/tiny-a.tgz" -C "$W/g" hf hf_logits.safetensors oracle.safetensors tiny-bf16.gguf tiny-f16.gguf tiny-q8_0.gguf tiny-q8_0-fused.gguf split
tar -czf "$OUT/tiny-b.tgz" -C "$W/g" $(cd "$W/g" && ls tiny-q[456]*.gguf)
tar -czf "$OUT/demo.tgz" -C "$W/g" demo-q4_k_m.gguf demo-q8_0.gguf
for b in llama-quantize llama-perplexity llama-tokenize llama-gguf-split; do strip "$W/b/bin/$b" 2>/dev/null; done
tar -cJf "$OUT/llama-tools.tar.xz" -C "$W/b/bin" llama-quantize llama-perplexity llama-tokenize llama-gguf-split 2>>"$LOG"
ls -la "$OUT" "$W/g" >>"$LOG"
log "end"
