#!/usr/bin/env bash
# usage: gguf_bench_vs_llama.sh FILE.gguf [ROUNDS] [THREADS]   (default 4 rounds, 2 threads)
# The GGUF speed comparison of README ("GGUF files"): `moescope bench -m FILE.gguf` (converted
# once into the cache directory, the file's own types) beside `llama-bench` on the same file,
# -p 128 -n 32 -r 3, the order flipped every round so that a drift of the host's speed does not
# favour one side; then each round's ratios and their median.
# Environment: MOESCOPE (binary), LLAMA_BENCH (llama-bench), OUT_DIR (default .).
set -u
f=$1; rounds=${2:-4}; t=${3:-2}
M=${MOESCOPE:-moescope}; LB=${LLAMA_BENCH:-llama-bench}; D=${OUT_DIR:-.}
mkdir -p "$D"
"$M" bench -m "$f" -p 1 -n 1 -r 1 -t "$t" > /dev/null || exit 1 # converts once, outside the rounds
ours() { "$M" bench -m "$f" -p 128 -n 32 -r 3 -t "$t" -o json > "$D/r$1-ours.json"; }
llama() { "$LB" -m "$f" -p 128 -n 32 -r 3 -t "$t" -o json > "$D/r$1-llama.json" 2> "$D/r$1-llama.err"; }
for r in $(seq 1 "$rounds"); do
    if (( r % 2 )); then ours "$r"; llama "$r"; else llama "$r"; ours "$r"; fi
    echo "round $r done $(date +%T)" >&2
done
python3 - "$D" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def speeds(path):
    out = {}
    for row in json.load(open(path)):
        test = "pp%d" % row["n_prompt"] if row["n_prompt"] else "tg%d" % row["n_gen"]
        out[f"{test} t{row['n_threads']}"] = row["avg_ts"]
    return out
ratios = {}
for r in range(1, rounds + 1):
    o, l = speeds(f"{d}/r{r}-ours.json"), speeds(f"{d}/r{r}-llama.json")
    for k in o:
        ratios.setdefault(k, []).append((o[k], l[k], o[k] / l[k]))
        print(f"round {r} {k}: moescope {o[k]:.2f} t/s, llama.cpp {l[k]:.2f} t/s, {o[k] / l[k]:.2f}x")
for k, v in ratios.items():
    rs = [x[2] for x in v]
    print(f"{k}: median {statistics.median(rs):.2f}x (range {min(rs):.2f}-{max(rs):.2f})")
PY
