#!/usr/bin/env python3
"""An agent's turns against an OpenAI-compatible server: two conversations, interleaved, each
turn resending its whole history (a HISTORY-token start plus every earlier turn's NEW tokens)
and NEW tokens of its own, as token ids (the same ids reach moescope and llama-server when both
run one model's tokenizer), streamed; prints each turn's time to first token and the prompt
tokens the server says it took from its cache.

    agent_turns.py URL [TURNS=10] [HISTORY=8000] [NEW=200] [VOCAB=100000]

Standard library only. Issue 46's agent scenario (README, "Serving several clients")."""
import http.client
import json
import random
import sys
import time
import urllib.parse


def turn(url, ids):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    body = {"prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read()[:300])
    ttft, cached = None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        ch = j.get("choices") or []
        if ttft is None and ch and ch[0].get("text"):
            ttft = time.perf_counter() - t0
        u = j.get("usage") or {}
        if "prompt_tokens_details" in u:
            cached = (u["prompt_tokens_details"] or {}).get("cached_tokens")
        if "timings" in j:
            cached = j["timings"].get("cache_n", cached)
    c.close()
    return ttft, cached


def main():
    url = sys.argv[1]
    turns, history, new, vocab = (int(a) for a in (sys.argv[2:6] + ["10", "8000", "200", "100000"][len(sys.argv) - 2:]))
    rng = random.Random(46)
    convs = {name: [rng.randrange(100, vocab) for _ in range(history)] for name in "AB"}
    rows = []
    for t in range(1, turns + 1):
        for name in "AB":
            convs[name] += [rng.randrange(100, vocab) for _ in range(new)]
            ttft, cached = turn(url, convs[name])
            rows.append({"turn": t, "conversation": name, "prompt": len(convs[name]), "cached": cached,
                         "ttft_ms": round(1000 * ttft, 1)})
            print(json.dumps(rows[-1]), flush=True)
    first = [r["ttft_ms"] for r in rows if r["turn"] == 1]
    later = sorted(r["ttft_ms"] for r in rows if r["turn"] > 1)
    print(json.dumps({"turn1_ttft_ms": first, "later_ttft_ms_median": later[len(later) // 2],
                      "later_ttft_ms_max": later[-1], "ratio_turn1_over_later_max": round(min(first) / later[-1], 2)}))


if __name__ == "__main__":
    main()
