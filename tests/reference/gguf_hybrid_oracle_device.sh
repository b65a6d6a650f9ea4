#!/usr/bin/env bash
# The oracle of issue 25 for the hybrid GGUFs: transformers 5.24 (the first with a qwen35moe GGUF
# loader; the device has 5.17) loading tests/fixtures/gguf/qwen35/*.gguf, dequantized to f32, on
# the checkpoint reference's prompt; and trying the qwen3next files (tests/fixtures/gguf/next).
# On the lent device, from the repo root. Carried in .dev/tfw/: the wheels of transformers 5.24.0
# and of what it needs newer than the device's (huggingface-hub 1.31, tokenizers 0.23,
# safetensors 0.8, regex), installed --no-deps ahead of the device's own; .dev/gguf-0.19.0 wheel.
# Results in $OUT: steps.log, qwen35-oracle.safetensors (input_ids, logits_bf16, logits_q8_0).
set -uo pipefail
: "${OUT:?OUT must name the results folder}"
# the fixtures, the demo's weights and the tokenizers are packed in the tree: as files here
python3 tests/reference/pack_fixtures.py unpack
W=/tmp/go
mkdir -p "$W/site"
LOG=$OUT/steps.log
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
python3 -c 'import sys, transformers, torch, tokenizers, safetensors, huggingface_hub as h; print(sys.version, "transformers", transformers.__version__, "torch", torch.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__, "hub", h.__version__)' >>"$LOG" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$W/site" --find-links .dev/tfw \
    transformers==5.24.0 huggingface-hub==1.31.0 tokenizers safetensors regex .dev/gguf-0.19.0-py3-none-any.whl >>"$LOG" 2>&1 || { log "install failed"; exit 1; }
export PYTHONPATH=$W/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 - "$OUT" >>"$LOG" 2>&1 <<'EOF'
import os, sys, traceback, torch, transformers
from safetensors.torch import load_file, save_file
print("transformers", transformers.__version__, transformers.__file__)
out = sys.argv[1]
res = {}
for name, ref_dir, files in [("qwen35", "tests/fixtures/qwen35", ["qwen35-bf16.gguf", "qwen35-q8_0.gguf"]),
                             ("next", "tests/fixtures/gguf/next", ["next-moe-bf16.gguf", "next-moe-q8_0.gguf"])]:
    ref = load_file(os.path.join(ref_dir, "reference.safetensors"))
    ids = ref["input_ids"].unsqueeze(0)
    if name == "qwen35":
        res["input_ids"] = ref["input_ids"].contiguous()
    # the checkpoint's own config (its text part) passed with config=: transformers 5.24 builds a
    # qwen35moe GGUF's layer kinds from full_attention_interval and ignores recurrent_layers, so
    # the fixture's non-periodic layers (linear, full, linear, linear) load into the wrong modules
    cfg = transformers.AutoConfig.from_pretrained(ref_dir)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for f in files:
        d = os.path.join("tests/fixtures/gguf", name)
        try:
            m = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, config=cfg, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
            with torch.no_grad():
                lg = m(input_ids=ids).logits[0].float()
            print(f"{f}: {type(m).__name__}, max |dlogit| vs the checkpoint {(lg - ref['logits']).abs().max().item():.3g}, "
                  f"top-1 agreement {(lg.argmax(-1) == ref['logits'].argmax(-1)).float().mean().item():.3f}")
            if name == "qwen35":
                res["logits_" + f.split("-")[1].removesuffix(".gguf")] = lg.contiguous()
        except Exception as e:
            print(f"{f}: transformers {transformers.__version__} cannot load it: {type(e).__name__}: {e}"[:600])
            traceback.print_exc(limit=3)
save_file(res, os.path.join(out, "qwen35-oracle.safetensors"))
print("saved", sorted(res))
EOF
log "end"
