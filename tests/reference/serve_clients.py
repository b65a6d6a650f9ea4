#!/usr/bin/env python3
"""Concurrent streaming clients against an OpenAI-compatible server (moescope serve, llama-server):
N clients take REQUESTS requests of MAX_TOKENS tokens each from one queue, each a streamed
/v1/completions with its own prompt, greedy, end of sequence ignored. Prints one JSON line:
aggregate decode tok/s (completion tokens over the run's wall time), p50 / p99 time to first
token and time between tokens, and the tokens each request got.

    serve_clients.py URL CLIENTS [REQUESTS=16] [MAX_TOKENS=128] [PROMPT_WORDS=24]

Standard library only. Issue 46's measurement (README, "Serving several clients")."""
import http.client
import json
import sys
import threading
import time
import urllib.parse

WORDS = ("trait struct enum borrow lifetime crate module iterator closure vector slice string "
         "pattern match reference thread channel mutex future async await macro generic bound").split()


def prompt(i, n):
    # each request its own text: no two share a prefix beyond the first word
    return " ".join(WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(n))


def one(url, i, max_tokens, words, out):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"prompt": prompt(i, words), "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read()[:200])
    times, tokens = [], None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        j = json.loads(data)
        if j.get("usage"):
            tokens = j["usage"]["completion_tokens"]
        ch = j.get("choices") or []
        if ch and ch[0].get("text"):
            times.append(time.perf_counter())
    c.close()
    out.append({"ttft": times[0] - t0 if times else None, "gaps": [b - a for a, b in zip(times, times[1:])],
                "tokens": tokens if tokens is not None else len(times), "start": t0, "end": time.perf_counter()})


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def main():
    url, clients = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    words = int(sys.argv[5]) if len(sys.argv) > 5 else 24
    todo, lock, out = list(range(n)), threading.Lock(), []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            one(url, i, max_tokens, words, out)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    toks = sum(r["tokens"] for r in out)
    ttft = [r["ttft"] for r in out if r["ttft"] is not None]
    gaps = [g for r in out for g in r["gaps"]]
    print(json.dumps({"clients": clients, "requests": len(out), "tokens": toks, "wall_s": round(wall, 3),
                      "tok_s": round(toks / wall, 2),
                      "ttft_ms_p50": round(1000 * pct(ttft, 50), 1), "ttft_ms_p99": round(1000 * pct(ttft, 99), 1),
                      "tpot_ms_p50": round(1000 * pct(gaps, 50), 2), "tpot_ms_p99": round(1000 * pct(gaps, 99), 2),
                      "min_tokens": min(r["tokens"] for r in out)}))


if __name__ == "__main__":
    main()
