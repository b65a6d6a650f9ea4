#!/usr/bin/env python3
"""tests/fixtures/family_chat_reference.json: transformers' renders of GLM-4.5/4.6's,
DeepSeek-V3.1's and Kimi-K2's chat templates (tests/fixtures/templates/, llama.cpp's copies),
for tests/family_chat.rs. Run once, by hand, with the oracle environment of make_fixtures.py;
the tests only read what this writes.

usage: make_family_chat_fixtures.py OUT.json

Each case: the template, the messages, the tools, the template's keyword arguments
(`enable_thinking`, `thinking`), add_generation_prompt, and transformers' render_jinja_template
text (what apply_chat_template calls), with `strftime_now` pinned as make_harmony_fixtures.py
pins it.
"""
import datetime as dt
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402
import transformers.utils.chat_template_utils as ctu  # noqa: E402

OUT = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "fixtures", "templates")
CLOCK = 1796428800  # 2026-12-05 00:00:00 UTC

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city, now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Name, e.g. Zürich"}},
                   "required": ["city"]}}}
CALL = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}

CHATS = [
    ("user", [{"role": "user", "content": "What is a trait?"}], None, {}, True),
    ("system-user", [{"role": "system", "content": "Answer in one line."},
                     {"role": "user", "content": "What is a trait?"}], None, {}, True),
    ("multi-turn-reasoning", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And 3+3?"}], None, {}, True),
    ("thinking-off", [{"role": "user", "content": "Hi"}], None, {"enable_thinking": False}, True),
    ("thinking-on", [{"role": "user", "content": "Hi"}], None, {"enable_thinking": True, "thinking": True}, True),
    ("tools-call-result", [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp_c\": 3}"}], [WEATHER], {}, True),
    ("no-generation-prompt", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
     None, {}, False),
]

# the templates and the cases each runs (DeepSeek-V3.1's and Kimi-K2's tool calls take the
# arguments as JSON text, as OpenAI's clients send them)
FILES = {"glm": "GLM-4.6.jinja", "deepseek": "deepseek-ai-DeepSeek-V3.1.jinja", "kimi": "moonshotai-Kimi-K2.jinja"}
# the special tokens apply_chat_template passes from each tokenizer_config.json
SPECIAL = {"glm": {}, "deepseek": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
           "kimi": {"bos_token": "[BOS]", "eos_token": "[EOS]"}}


class FixedClock(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime.fromtimestamp(CLOCK, dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = FixedClock


def with_text_arguments(msgs):
    out = json.loads(json.dumps(msgs))
    for m in out:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"], ensure_ascii=False)
    return out


renders = []
for fam, file in FILES.items():
    template = open(os.path.join(TEMPLATES, file)).read()
    for name, msgs, tools, kwargs, agp in CHATS:
        if fam != "glm":
            msgs = with_text_arguments(msgs)
        text = ctu.render_jinja_template(conversations=[msgs], tools=tools, chat_template=template,
                                         add_generation_prompt=agp, **kwargs, **SPECIAL[fam])[0][0]
        renders.append({"template": file, "name": name, "messages": msgs, "tools": tools, "kwargs": kwargs,
                        "special": SPECIAL[fam], "add_generation_prompt": agp, "text": text})

out = {"made_by": "tests/reference/make_family_chat_fixtures.py", "transformers": transformers.__version__,
       "clock": CLOCK, "renders": renders}
with open(OUT, "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
print(f"{len(renders)} renders -> {OUT}")
