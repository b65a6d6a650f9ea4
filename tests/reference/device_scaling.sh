#!/usr/bin/env bash
# moescope against llama.cpp at 1-16 threads, run on the lent device (issue 23), from the repo root.
#
# Carried in the ignored folder .dev/ (the tree plus these must stay under the device's 64 MiB):
#   .dev/moescope.xz       `cargo build --release --no-default-features`, stripped, `xz -6`
#                          (2.7 MB; it reads the tokenizers from ./assets)
#   .dev/llama-cpu.tar.xz  llama.cpp's sources without the GPU backends and the web UI (3.8 MB;
#                          from llama-cpp-python 0.3.36's vendor/llama.cpp, `tar -cJf` of
#                          CMakeLists.txt cmake ggml src include common tools vendor gguf-py
#                          licenses LICENSE app, excluding ggml/src/ggml-{cuda,vulkan,...} and tools/ui)
#   .dev/llama-bench-noamx.xz, .dev/llama-bench-amx.xz (optional) the two llama-bench binaries
#                          an earlier call built and returned: no build then (a call is 10 minutes)
# There: llama.cpp is built twice from those sources (statically linked), natively with AMX disabled (the
# comparison the issue's criteria name) and natively as is (AMX where the CPU has it); an
# N-layer package of the Qwen3-30B-A3B shape is synthesized, and its Q4_0 GGUF written from it
# (tests/reference/moe_to_gguf.py, with the tarball's gguf-py); then alternated rounds of
# `bench` / `llama-bench` (noamx) / `llama-bench` (amx) and two traces.
#
# Results in $OUT (at most 8 files come back): steps.log (lscpu, timings, every round's
# tables), results.tgz (every run's JSON, rewritten after each round so a killed run still
# returns what it finished), trace-t8.json.gz and trace-t16.json.gz, and the llama-bench
# binaries it built (llama-bench-{noamx,amx}.xz, to carry next time).
# Knobs: THREADS (1,2,4,8,16), ROUNDS (3), LAYERS (8), PROMPT (512), GEN (32), TRACES (1: the
# traces and the roofline after the rounds; 0: none).
set -uo pipefail
: "${OUT:?OUT must name the results folder}"
THREADS=${THREADS:-1,2,4,8,16}
ROUNDS=${ROUNDS:-3}
LAYERS=${LAYERS:-8}
PROMPT=${PROMPT:-512}
GEN=${GEN:-32}
TRACES=${TRACES:-1}
W=/tmp/scaling
RES=$W/res
mkdir -p "$W" "$RES"
LOG=$OUT/steps.log
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
save() { tar -czf "$OUT/results.tgz" -C "$W" res; }

{ lscpu; nproc; free -g; } >>"$LOG" 2>&1
log "start"
xz -dc .dev/moescope.xz >"$W/moescope" && chmod +x "$W/moescope" || { log "no .dev/moescope.xz"; exit 1; }
M=$W/moescope
export MOESCOPE_ASSETS=$PWD/assets

# llama.cpp, two builds side by side (8 jobs each), unless carried
# (with both binaries carried, the sources may stay behind: .dev/gguf-py.tar.xz, a tar of the
# sources' gguf-py alone, then gives the GGUF writer; the tree plus both tarballs and both
# binaries would pass 64 MiB)
mkdir -p "$W/llama"
if [[ -f .dev/llama-cpu.tar.xz ]]; then
    tar -xJf .dev/llama-cpu.tar.xz -C "$W/llama" || { log "bad .dev/llama-cpu.tar.xz"; exit 1; }
else
    tar -xJf .dev/gguf-py.tar.xz -C "$W/llama" || { log "no .dev/llama-cpu.tar.xz nor .dev/gguf-py.tar.xz"; exit 1; }
fi
build() { # build DIR EXTRA_FLAGS
    cmake -S "$W/llama" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DCMAKE_C_FLAGS="$2" -DCMAKE_CXX_FLAGS="$2" >"$1.log" 2>&1 &&
        ninja -C "$1" -j 8 llama-bench >>"$1.log" 2>&1 &&
        strip "$1/bin/llama-bench" && xz -3 -T2 -c "$1/bin/llama-bench" >"$OUT/llama-bench-$(basename "$1").xz"
}
pids=()
for v in noamx amx; do
    if [[ -f .dev/llama-bench-$v.xz ]]; then
        mkdir -p "$W/$v/bin" && xz -dc ".dev/llama-bench-$v.xz" >"$W/$v/bin/llama-bench" && chmod +x "$W/$v/bin/llama-bench"
        log "llama-bench ($v) carried"
    else
        flags=""
        [[ $v == noamx ]] && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        build "$W/$v" "$flags" &
        pids+=($!)
    fi
done
# meanwhile the package and its GGUF
"$M" synth --shape qwen3-30b-a3b --layers "$LAYERS" -o "$W/b.moe" >>"$LOG" 2>&1 || { log "synth failed"; exit 1; }
log "synth done"
PYTHONPATH=$W/llama/gguf-py python3 tests/reference/moe_to_gguf.py "$W/b.moe" "$W/b.gguf" >"$W/gguf.log" 2>&1 ||
    { tail -20 "$W/gguf.log" >>"$LOG"; log "gguf failed"; exit 1; }
log "gguf done"
for p in "${pids[@]}"; do
    wait "$p" || log "a llama.cpp build failed: $(tail -5 "$W"/*.log | tr '\n' ' ' | tail -c 600)"
done
log "llama.cpp ready; AMX in the native build's log: $(grep -c -i 'amx' "$W/amx.log" 2>/dev/null || echo carried)"

for r in $(seq 1 "$ROUNDS"); do
    "$M" bench -m "$W/b.moe" -p "$PROMPT" -n "$GEN" -r 3 -t "$THREADS" -o json >"$RES/r$r-ours.json" 2>"$RES/r$r-ours.err"
    log "round $r: moescope rc=$?"
    for v in noamx amx; do
        [[ -x $W/$v/bin/llama-bench ]] || continue
        "$W/$v/bin/llama-bench" -m "$W/b.gguf" -p "$PROMPT" -n "$GEN" -r 3 -t "$THREADS" -o json \
            >"$RES/r$r-$v.json" 2>"$RES/r$r-$v.err"
        log "round $r: llama.cpp $v rc=$?"
    done
    save
done

# where the time goes: traces at 8 and 16 threads, and decode against the read bandwidth
for t in $( ((TRACES)) && echo 8 16); do
    "$M" bench -m "$W/b.moe" -p "$PROMPT" -n "$GEN" -r 1 -t "$t" --trace "$OUT/trace-t$t.json.gz" \
        --trace-max-events 400000 >>"$LOG" 2>&1
    log "trace t$t rc=$?"
done
if ((TRACES)); then
    "$M" bench -m "$W/b.moe" -p 0 -n "$GEN" -r 3 -t 8,16 --roofline >"$RES/roofline.md" 2>&1
    log "roofline rc=$?"
fi
save
python3 - "$RES" >>"$LOG" 2>&1 <<'EOF'
import json, sys, glob, os, collections
res = sys.argv[1]
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(os.path.join(res, "r*-*.json"))):
    r, who = os.path.basename(f)[:-5].split("-", 1)
    try:
        data = json.load(open(f))
    except Exception as e:
        print(f, "unreadable:", e)
        continue
    for x in data:
        test = f"pp{x['n_prompt']}" if x.get("n_prompt") else f"tg{x['n_gen']}"
        rows[(test, x["n_threads"])].setdefault(who, []).append(round(x["avg_ts"], 1))
print("test threads | moescope | llama noamx | llama amx | ours/noamx medians")
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
for (test, t), d in sorted(rows.items()):
    o, n, a = d.get("ours", []), d.get("noamx", []), d.get("amx", [])
    print(test, t, "|", o, "|", n, "|", a, "|", round(med(o) / med(n), 2) if n else "-")
EOF
cat "$RES/roofline.md" >>"$LOG" 2>/dev/null
log "end"
