"""`moescope serve` through the official `openai` Python package (pinned in requirements.txt).

Run: python3 tests/python/test_openai.py target/release/moescope [GPT_OSS.moe]
(.ci/run makes a venv, installs requirements.txt and runs this; a missing package fails.)

It starts the server on the built-in demo model at a free port on 127.0.0.1, runs each check,
prints one line per check and exits non-zero at the first failure. Given a gpt-oss package (.ci/run
makes one with `moescope synth --shape gpt-oss-20b --layers 1 --experts 4`: random weights, the
real o200k_harmony tokenizer and template), it then checks the harmony format's split through the
same client: reasoning_content, content and a harmony tool call, streamed and not.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import openai
from openai import OpenAI

KEY = "test-key"


def start(binary, cache, model=None):
    env = dict(os.environ, MOESCOPE_CACHE_DIR=cache)
    p = subprocess.Popen(
        [binary, "serve", "--port", "0", "-t", "2", "--api-key", KEY] + (["-m", model] if model else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    line = p.stdout.readline().strip()
    if not line.startswith("listening on "):
        p.kill()
        sys.exit(f"no 'listening on' line from the server: {line!r}")
    return p, line.split(" ")[-1]


def chat(client, text, **kw):
    return client.chat.completions.create(model="demo", messages=[{"role": "user", "content": text}], **kw)


def streamed(client, text, **kw):
    """The content of a streamed chat, its last chunk and every chunk."""
    chunks = list(chat(client, text, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return content, chunks


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "parameters": {"type": "object", "properties": {"hour": {"type": "integer"}, "label": {"type": "string"}}},
    },
}
XML_CALL = "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n7\n</parameter>\n<parameter=label>\nwake up\nnow\n</parameter>\n</function>\n</tool_call>"


def checks(client, base):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert len(ids) == 1 and ids[0], ids
    yield f"models.list: {ids}"

    r = chat(client, "What is a trait?", max_tokens=20, seed=3)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content, r
    assert r.usage.completion_tokens <= 20 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    yield f"chat: {r.choices[0].message.content[:40]!r}, finish {r.choices[0].finish_reason}"

    text, chunks = streamed(client, "What is a trait?", max_tokens=20, seed=3, stream_options={"include_usage": True})
    assert text == r.choices[0].message.content, (text, r.choices[0].message.content)
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == r.usage.completion_tokens, last
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
    yield f"stream with include_usage: {len(chunks)} chunks, usage {last.usage.completion_tokens} tokens"

    a = chat(client, "Tell me about ownership.", max_tokens=24, seed=11, temperature=1.0)
    b = chat(client, "Tell me about ownership.", max_tokens=24, seed=11, temperature=1.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    yield "seed: same seed, same text"

    base_text = chat(client, "What is a borrow?", max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    t = base_text.choices[0].message.content
    words = t.split()
    stop = words[min(3, len(words) - 1)]
    s = chat(client, "What is a borrow?", max_tokens=30, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert s.choices[0].message.content == t[: t.find(stop)], (s.choices[0].message.content, t, stop)
    assert s.choices[0].finish_reason == "stop"
    st, _ = streamed(client, "What is a borrow?", max_tokens=30, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert st == t[: t.find(stop)], (st, t, stop)
    yield f"stop {stop!r}: cut before it, streamed or not"

    lp = chat(client, "What is a crate?", max_tokens=8, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = lp.choices[0].logprobs.content
    assert len(content) == 8, content
    for tok in content:
        tops = [x.logprob for x in tok.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tok.logprob <= 0.0, tok
    yield f"logprobs: 8 tokens, first {content[0].token!r} {content[0].logprob:.3f}"

    # tools: rendered through the template (the prompt lists them) ...
    req = urllib.request.Request(
        base + "/apply-template",
        data=json.dumps({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    prompt = json.loads(urllib.request.urlopen(req).read())["prompt"]
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt, prompt
    # ... and a <tool_call> block in the assistant's turn comes back as tool_calls. The demo
    # model never learnt to call tools, so the turn starts with the call (an assistant prefill)
    # and the model writes on from there.
    msgs = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": CALL}]
    tc = client.chat.completions.create(model="demo", messages=msgs, tools=[WEATHER], max_tokens=4)
    calls = tc.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", tc
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls[0].function.arguments
    assert tc.choices[0].finish_reason in ("tool_calls", "length"), tc.choices[0].finish_reason
    chunks = list(client.chat.completions.create(model="demo", messages=msgs, tools=[WEATHER], max_tokens=4, stream=True))
    deltas = [tcd for c in chunks if c.choices for tcd in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather" and json.loads(deltas[0].function.arguments) == {"city": "Paris"}
    yield f"tools: tool_calls {calls[0].function.name}({calls[0].function.arguments}), streamed too"

    # Qwen3.5's and Qwen3-Coder's XML function calls, each value typed by the tool's schema
    msgs = [{"role": "user", "content": "Wake me at 7."}, {"role": "assistant", "content": XML_CALL}]
    want = {"hour": 7, "label": "wake up\nnow"}
    tc = client.chat.completions.create(model="demo", messages=msgs, tools=[ALARM], max_tokens=4)
    calls = tc.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "set_alarm", tc
    assert json.loads(calls[0].function.arguments) == want, calls[0].function.arguments
    assert "<function=" not in (tc.choices[0].message.content or ""), tc.choices[0].message.content
    chunks = list(client.chat.completions.create(model="demo", messages=msgs, tools=[ALARM], max_tokens=4, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "set_alarm" and json.loads(deltas[0].function.arguments) == want, deltas
    assert not any("<function=" in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    yield f"XML tools: tool_calls {calls[0].function.name}({calls[0].function.arguments}), streamed too"

    c = client.completions.create(model="demo", prompt="A trait is", max_tokens=12, seed=5)
    assert c.object == "text_completion" and c.choices[0].text, c
    cs = list(client.completions.create(model="demo", prompt="A trait is", max_tokens=12, seed=5, stream=True))
    assert "".join(x.choices[0].text for x in cs if x.choices) == c.choices[0].text
    yield f"completions.create: {c.choices[0].text!r}, streamed the same"

    try:
        chat(client, "hi", n=2)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    try:
        OpenAI(base_url=base + "/v1", api_key="wrong").models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    yield "errors: n=2 -> BadRequestError, wrong key -> AuthenticationError"


# o200k_harmony's markup tokens: kept out of what the random model writes, so the channel the
# prefill opens is the one it writes in
HARMONY_MARKUP = {str(i): -100 for i in (199998, 199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012)}


def harmony_checks(client, base):
    req = urllib.request.Request(
        base + "/apply-template",
        data=json.dumps({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low"}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    prompt = json.loads(urllib.request.urlopen(req).read())["prompt"]
    assert prompt.startswith("<|start|>system<|message|>") and "\nReasoning: low\n" in prompt, prompt
    yield "harmony: the prompt is gpt-oss's template, reasoning_effort low"

    def ask(prefill, stream=False, **kw):
        msgs = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": prefill}]
        return client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, stream=stream,
                                              logit_bias=HARMONY_MARKUP, **kw)

    r = ask("<|channel|>analysis<|message|>")
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content")
    assert reasoning and not m.content and "<|" not in reasoning, m
    chunks = list(ask("<|channel|>analysis<|message|>", stream=True))
    streamed_r = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices)
    assert streamed_r == reasoning, (streamed_r, reasoning)
    yield f"harmony: analysis -> reasoning_content {reasoning!r}, streamed the same"

    final = "<|channel|>analysis<|message|>Add.<|end|><|start|>assistant<|channel|>final<|message|>"
    r = ask(final)
    m = r.choices[0].message
    assert m.content and not (m.model_extra or {}).get("reasoning_content"), m
    chunks = list(ask(final, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == m.content
    yield f"harmony: final -> content {m.content!r}, streamed the same"

    call = ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city": "Paris"}<|call|>')
    msgs = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": call}]
    tc = client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], max_tokens=2, temperature=0)
    calls = tc.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", tc
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls[0].function.arguments
    chunks = list(client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER], max_tokens=2,
                                                 temperature=0, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather" and json.loads(deltas[0].function.arguments) == {"city": "Paris"}
    yield f"harmony: to=functions.get_weather -> tool_calls {calls[0].function.arguments}, streamed too"


def run(binary, model, checks_of):
    with tempfile.TemporaryDirectory() as cache:
        p, addr = start(binary, cache, model)
        try:
            base = f"http://{addr}"
            client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
            # wait until the model is loaded
            import time

            for _ in range(600):
                try:
                    urllib.request.urlopen(base + "/health")
                    break
                except Exception:
                    time.sleep(0.1)
            n = 0
            for line in checks_of(client, base):
                n += 1
                print(f"ok {n} {line}", flush=True)
            return n
        finally:
            p.kill()
            p.wait()


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/moescope"
    n = run(binary, None, checks)
    if len(sys.argv) > 2:
        n += run(binary, sys.argv[2], harmony_checks)
    print(f"openai {openai.__version__}: {n} checks passed")


if __name__ == "__main__":
    main()
