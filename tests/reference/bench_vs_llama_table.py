#!/usr/bin/env python3
# usage: bench_vs_llama_table.py  (in the folder of bench_vs_llama.sh's rounds)
# Per round and thread count: t/s of both sides at 4 and 8 layers, ours / llama.cpp, and the
# ratio for the layers alone (the 4 extra layers' time: 8-layer minus 4-layer seconds per
# token or per prompt, llama.cpp's over ours); then the median of each ratio over the rounds.
import json, glob, statistics as st, sys, re
def load(f):
    try: return json.load(open(f))
    except Exception: return []
rows = {}
for f in sorted(glob.glob("r*-*-*.json")):
    m = re.match(r"r(\d+)-(ours|llama)-(\d)\.json", f); r, who, L = int(m[1]), m[2], int(m[3])
    for o in load(f):
        kind = "pp" if o["n_prompt"] else "tg"
        rows[(r, who, L, kind, o["n_threads"])] = o["avg_ts"]
rounds = sorted({k[0] for k in rows})
print("round kind thr | 4L ours llama ratio | 8L ours llama ratio | layers ratio")
agg = {}
for r in rounds:
    for kind, n in (("tg", 32), ("pp", 512)):
        for t in (1, 2):
            try:
                o4, l4, o8, l8 = (rows[(r, w, L, kind, t)] for w, L in (("ours",4),("llama",4),("ours",8),("llama",8)))
            except KeyError: continue
            # per-token (tg) or per-prompt (pp) seconds; the 4 extra layers' time = 8L - 4L
            lo = n / o8 - n / o4; ll = n / l8 - n / l4
            lr = ll / lo if lo > 0 else float("nan")
            print(f"{r} {kind} {t} | {o4:.2f} {l4:.2f} {o4/l4:.3f} | {o8:.2f} {l8:.2f} {o8/l8:.3f} | {lr:.3f}")
            for key, v in (("4L", o4/l4), ("8L", o8/l8), ("layers", lr)):
                agg.setdefault((kind, t, key), []).append(v)
print("medians:")
for (kind, t, key), v in sorted(agg.items()):
    print(kind, t, key, f"{st.median(v):.3f}", " ".join(f"{x:.2f}" for x in v))
