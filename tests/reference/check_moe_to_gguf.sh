#!/usr/bin/env bash
# usage: check_moe_to_gguf.sh MOESCOPE SHAPE [GGUF_PY]   e.g. target/release/moescope qwen3.5-35b-a3b
# Checks that moe_to_gguf.py writes the package's model: a 4-layer, 64-expert synth package of
# SHAPE goes to GGUF and back through moescope's own GGUF reader (which tests/gguf_hybrid.rs and
# tests/gguf.rs hold to llama.cpp's converter), and both packages route the same 40 prompt tokens.
# Plain shapes: every layer's experts and weights equal, bit for bit. qwen35moe: the tiled value
# heads sum ssm_out's groups in another order, so layer 0's weights agree to ~1e-6 and the int8
# activations of later layers turn that into rounding flips (a wrong permutation: no token agrees).
set -euo pipefail
M=$1 SHAPE=$2
export PYTHONPATH=${3:-${PYTHONPATH:-}}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$M" synth --shape "$SHAPE" --layers 4 --experts 64 --vocab 4096 --quant q4g32 -o "$W/a.moe" 2>/dev/null
python3 "$(dirname "$0")/moe_to_gguf.py" "$W/a.moe" "$W/a.gguf" 2>/dev/null
"$M" convert "$W/a.gguf" -o "$W/b.moe" >/dev/null 2>&1
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(4096)) for _ in range(40)))")
for p in a b; do
    "$M" run -m "$W/$p.moe" --prompt-ids "$ids" -n 1 --temperature 0 --routing-out "$W/$p.jsonl" --json >/dev/null 2>&1
done
python3 - "$W/a.jsonl" "$W/b.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)][1:] for f in sys.argv[1:])
first = 0.0
for l in sorted({x["l"] for x in a}):
    xs = [(x, y) for x, y in zip(a, b) if x["l"] == l and x["p"] == 0]
    same = sum(x["e"] == y["e"] for x, y in xs)
    d = max(abs(p - q) for x, y in xs for p, q in zip(x["w"], y["w"]))
    first = d if l == 0 else first
    print(f"layer {l}: {same}/{len(xs)} prompt tokens route alike, max |dweight| {d:.2e}")
sys.exit(0 if first < 1e-5 else 1)
PY
