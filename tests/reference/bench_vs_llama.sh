#!/usr/bin/env bash
# usage: bench_vs_llama.sh ROUND [THREADS]   (default 1,2)
# One round of the side-by-side benchmark against llama.cpp on the 4- and 8-layer packages of
# one shape: `moescope bench` on DIR/b{4,8}-q4.moe and `llama-bench` on DIR/b{4,8}-q4_0.gguf,
# -p 512 -n 32 -r 3, the order flipped every round (ours first on odd rounds) so that a drift of
# the host's speed does not favour one side. Writes rROUND-{ours,llama}-{4,8}.json in the current
# folder; bench_vs_llama_table.py turns the rounds into ratios (whole tokens and layers alone).
# Environment: MOESCOPE (binary), LLAMA_BENCH (llama-bench), PKG_DIR (the four files).
# Each file is read into the page cache just before its run: where a package and its GGUF
# together exceed RAM, each run would otherwise fault in from disk what the other evicted
# (measured on DeepSeek-V3's 5-layer pair, 33 GB on a 24 GiB machine: README).
set -u
r=$1; t=${2:-1,2}
M=${MOESCOPE:-moescope}; LB=${LLAMA_BENCH:-llama-bench}; D=${PKG_DIR:-.}
ours() { cat "$D/b$1-q4.moe" > /dev/null; "$M" bench -m "$D/b$1-q4.moe" -p 512 -n 32 -r 3 -t "$t" --roofline -o json > "r$r-ours-$1.json" 2> "r$r-ours-$1.err"; }
llama() { cat "$D/b$1-q4_0.gguf" > /dev/null; "$LB" -m "$D/b$1-q4_0.gguf" -p 512 -n 32 -r 3 -t "$t" -o json > "r$r-llama-$1.json" 2> "r$r-llama-$1.err"; }
if (( r % 2 )); then ours 4; llama 4; llama 8; ours 8; else llama 4; ours 4; ours 8; llama 8; fi
echo "round $r done $(date +%T)"
