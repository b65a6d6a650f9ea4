#!/usr/bin/env bash
# moescope against llama.cpp (and ik_llama.cpp, when a build of it is carried) at 1-16 threads,
# run on the lent device (issues 23, 45), from the repo root.
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
#   .dev/gguf-py.tar.xz    (optional) a tar of gguf-py alone: the GGUF writer when the llama.cpp
#                          sources stay behind; GGUF_PY may name another gguf-py folder instead
#   IK_BENCH=path          (optional) an ik_llama.cpp llama-bench built outside the project (this
#                          script builds no fetched repository): run with -rtr 1 beside the others;
#                          IK_WAIT=seconds waits that long for it to appear (a build still running);
#                          a path ending in .xz (a stripped static build an earlier call returned,
#                          carried in .dev/) is unpacked first
# With neither the llama.cpp sources nor its binaries carried, llama.cpp is left out.
# There: llama.cpp is built twice from those sources (statically linked), natively with AMX disabled (the
# comparison the issue's criteria name) and natively as is (AMX where the CPU has it); an
# N-layer package of the Qwen3-30B-A3B shape is synthesized (QUANT: q4, or q4g32 for GGUF Q4_0's
# groups), and its Q4_0 GGUF written from it (tests/reference/moe_to_gguf.py: the same weights
# when QUANT is q4g32); then alternated rounds of `bench` (once per tier of ISAS, e.g. "amx avx512")
# / `llama-bench` (noamx) / `llama-bench` (amx) / ik_llama.cpp's, and two traces.
#
# Results in $OUT (at most 8 files come back): steps.log (lscpu, timings, every round's
# tables), results.tgz (every run's JSON, rewritten after each round so a killed run still
# returns what it finished), trace-t8.json.gz and trace-t16.json.gz, and the llama-bench
# binaries it built (llama-bench-{noamx,amx}.xz, to carry next time).
# Knobs: THREADS (1,2,4,8,16), ROUNDS (3), LAYERS (8), PROMPT (512), GEN (32), TRACES (1: the
# traces and the roofline after the rounds; 0: none), QUANT (q4), ISAS (the best tier only),
# SHAPE (qwen3-30b-a3b; any synth shape moe_to_gguf.py writes, e.g. qwen3.5-35b-a3b), TAG (a
# suffix of the work folder and of steps.log / results.tgz: two shapes in one call),
# IK_FLAGS (-rtr 1: ik_llama.cpp's flags besides the shared ones).
set -uo pipefail
: "${OUT:?OUT must name the results folder}"
THREADS=${THREADS:-1,2,4,8,16}
ROUNDS=${ROUNDS:-3}
LAYERS=${LAYERS:-8}
PROMPT=${PROMPT:-512}
GEN=${GEN:-32}
TRACES=${TRACES:-1}
QUANT=${QUANT:-q4}
ISAS=${ISAS:-best}
SHAPE=${SHAPE:-qwen3-30b-a3b}
TAG=${TAG:-}
IK_BENCH=${IK_BENCH:-}
IK_FLAGS=${IK_FLAGS:--rtr 1}
W=/tmp/scaling$TAG
RES=$W/res
mkdir -p "$W" "$RES"
LOG=$OUT/steps$TAG.log
log() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
save() { tar -czf "$OUT/results$TAG.tgz" -C "$W" res; }

{ lscpu; nproc; free -g; } >>"$LOG" 2>&1
log "start"
xz -dc .dev/moescope.xz >"$W/moescope" && chmod +x "$W/moescope" || { log "no .dev/moescope.xz"; exit 1; }
M=$W/moescope
export MOESCOPE_ASSETS=$PWD/assets
# the tiers' compute peak at each thread count (are the vCPUs cores or hyperthreads?)
"$M" compute-peak -t "$THREADS" >>"$LOG" 2>&1

# llama.cpp, two builds side by side (8 jobs each), unless carried
# (with both binaries carried, the sources may stay behind: .dev/gguf-py.tar.xz, a tar of the
# sources' gguf-py alone, then gives the GGUF writer; the tree plus both tarballs and both
# binaries would pass 64 MiB)
mkdir -p "$W/llama"
if [[ -f .dev/llama-cpu.tar.xz ]]; then
    tar -xJf .dev/llama-cpu.tar.xz -C "$W/llama" || { log "bad .dev/llama-cpu.tar.xz"; exit 1; }
elif [[ -f .dev/gguf-py.tar.xz ]]; then
    tar -xJf .dev/gguf-py.tar.xz -C "$W/llama" || { log "bad .dev/gguf-py.tar.xz"; exit 1; }
elif [[ -z ${GGUF_PY:-} ]]; then
    log "no .dev/llama-cpu.tar.xz, .dev/gguf-py.tar.xz nor GGUF_PY: no GGUF writer"
    exit 1
fi
GGUF_PY=${GGUF_PY:-$W/llama/gguf-py}
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
    elif [[ -f $W/llama/CMakeLists.txt ]]; then
        flags=""
        [[ $v == noamx ]] && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        build "$W/$v" "$flags" &
        pids+=($!)
    fi
done
# meanwhile the package and its GGUF
"$M" synth --shape "$SHAPE" --layers "$LAYERS" --quant "$QUANT" -o "$W/b.moe" >>"$LOG" 2>&1 || { log "synth failed"; exit 1; }
log "synth done"
PYTHONPATH=$GGUF_PY python3 tests/reference/moe_to_gguf.py "$W/b.moe" "$W/b.gguf" >"$W/gguf.log" 2>&1 ||
    { tail -20 "$W/gguf.log" >>"$LOG"; log "gguf failed"; exit 1; }
log "gguf done"
for p in "${pids[@]}"; do
    wait "$p" || log "a llama.cpp build failed: $(tail -5 "$W"/*.log | tr '\n' ' ' | tail -c 600)"
done
log "llama.cpp ready; AMX in the native build's log: $(grep -c -i 'amx' "$W/amx.log" 2>/dev/null || echo carried)"

# an ik_llama.cpp build may still be finishing beside this script: wait for it (IK_WAIT seconds)
# a carried build (xz, as an earlier call returned it) unpacked next to the others
if [[ $IK_BENCH == *.xz ]]; then
    xz -dc "$IK_BENCH" >"$W/ik-llama-bench" && chmod +x "$W/ik-llama-bench" && IK_BENCH=$W/ik-llama-bench
fi
if [[ -n $IK_BENCH ]]; then
    for _ in $(seq 1 "${IK_WAIT:-0}"); do [[ -x $IK_BENCH ]] && break; sleep 1; done
    [[ -x $IK_BENCH ]] && log "ik_llama.cpp: $IK_BENCH" || { log "IK_BENCH=$IK_BENCH is not an executable"; IK_BENCH=""; }
fi
for r in $(seq 1 "$ROUNDS"); do
    for isa in $ISAS; do
        # "best": the tier the CPU gives (no cap); else MOESCOPE_ISA=tier
        env $([[ $isa != best ]] && echo "MOESCOPE_ISA=$isa") "$M" bench -m "$W/b.moe" -p "$PROMPT" -n "$GEN" -r 3 \
            -t "$THREADS" -o json >"$RES/r$r-ours_$isa.json" 2>"$RES/r$r-ours_$isa.err"
        log "round $r: moescope ($isa) rc=$?"
    done
    for v in noamx amx; do
        [[ -x $W/$v/bin/llama-bench ]] || continue
        "$W/$v/bin/llama-bench" -m "$W/b.gguf" -p "$PROMPT" -n "$GEN" -r 3 -t "$THREADS" -o json \
            >"$RES/r$r-$v.json" 2>"$RES/r$r-$v.err"
        log "round $r: llama.cpp $v rc=$?"
    done
    if [[ -n $IK_BENCH ]]; then
        # -rtr 1: ik_llama.cpp repacks the weights at load into its row-interleaved layouts
        # shellcheck disable=SC2086 # IK_FLAGS: several flags
        "$IK_BENCH" -m "$W/b.gguf" -p "$PROMPT" -n "$GEN" -r 3 -t "$THREADS" $IK_FLAGS -o json \
            >"$RES/r$r-ik.json" 2>"$RES/r$r-ik.err"
        log "round $r: ik_llama.cpp rc=$?"
    fi
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
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
whos = sorted({w for d in rows.values() for w in d if w.startswith("ours")})
others = [w for w in ("noamx", "amx", "ik") if any(w in d for d in rows.values())]
print("test threads |", " | ".join(whos + others), "| medians: each moescope tier / each other")
for (test, t), d in sorted(rows.items()):
    cells = [str(d.get(w, [])) for w in whos + others]
    ratios = [f"{o}/{w}={med(d[o]) / med(d[w]):.2f}" for o in whos for w in others if d.get(o) and d.get(w)]
    print(test, t, "|", " | ".join(cells), "|", " ".join(ratios))
EOF
cat "$RES/roofline.md" >>"$LOG" 2>/dev/null
log "end"
