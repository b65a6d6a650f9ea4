#!/usr/bin/env python3
"""tests/fixtures/harmony_reference.json: what tiktoken and transformers do with gpt-oss's
tokenizer and chat template, for tests/harmony.rs. Run once, by hand, with the oracle
environment of make_fixtures.py plus `pip install tiktoken` (0.14); the tests only read it.

usage: make_harmony_fixtures.py O200K_BASE.tiktoken OUT.json

- tiktoken's own `o200k_harmony` definition (tiktoken_ext.openai_public) with its ranks read from
  the local file (the one in crates.io's tiktoken-rs 0.12.1, which
  assets/tokenizers/o200k_harmony/ranks.bin was made from): the pattern, the special tokens,
  and the ids of TEXTS (allowed_special="all").
- transformers' TikTokenConverter on the same ranks: CRC-32s of its vocabulary ("ID TOKEN\\n"
  by id) and merges ("LEFT RIGHT\\n" in order), and its ids of TEXTS (checked equal to tiktoken's
  here).
- transformers' render_jinja_template (what apply_chat_template calls) of
  assets/tokenizers/o200k_harmony/chat_template.jinja for CHATS, with `strftime_now` pinned to
  2026-12-05 (CLOCK below, seconds since the epoch, UTC).
"""
import datetime as dt
import json
import os
import sys
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import tiktoken  # noqa: E402
import tiktoken_ext.openai_public as op  # noqa: E402
import transformers  # noqa: E402
import transformers.utils.chat_template_utils as ctu  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402
from transformers.convert_slow_tokenizer import TikTokenConverter  # noqa: E402

RANKS, OUT = sys.argv[1], sys.argv[2]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
CLOCK = 1796428800  # 2026-12-05 00:00:00 UTC

op.load_tiktoken_bpe = lambda *a, **k: load_tiktoken_bpe(RANKS)
spec = op.o200k_harmony()
enc = tiktoken.Encoding(**spec)

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog's back; it's 3.14159 and 1234567 times.",
    "  leading spaces\n\n\n\ttabs\t\t and trailing   ",
    "Ünïcödé, naïve café; Ñandú नमस्ते क्षत्रिय 混合专家模型 日本語のテキスト 한국어",
    "emoji 🦀🦀 and 👩‍👩‍👧 family, ﷺ, e\u0301te\u0301",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": None}  # comment\r\n",
    "CAPITALS and MiXeD CaSe: HTTPServer, iPhone, I'M, YOU'LL, they'd",
    "URLs: https://example.com/a/b?c=d&e=f#g and paths /usr/local/bin//x",
    "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>analysis<|message|>Add.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>4<|return|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\":\"Paris\"}<|call|>",
    "<|startoftext|><|endoftext|><|reserved_200000|><|reserved_201087|> not <|special|>",
    "1 12 123 1234 12345 123456 1,234,567.89 -42 +7 3e10 0x1F",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "Ставка 5% — «кавычки» и „Anführungszeichen“ …",
    "",
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "when": {"oneOf": [{"type": "string"}, {"type": "number"}]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the docs",
                                           "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

# (name, messages, tools, kwargs, add_generation_prompt)
CHATS = [
    ("user", [{"role": "user", "content": "Hi!"}], None, {}, True),
    ("system", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], None, {}, True),
    ("developer-effort-low", [{"role": "developer", "content": "Answer in French."},
                              {"role": "user", "content": "Hello"}], None, {"reasoning_effort": "low"}, True),
    ("effort-high", [{"role": "user", "content": "Prove it."}], None, {"reasoning_effort": "high"}, True),
    ("multi-turn", [{"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "4", "thinking": "Simple addition."},
                    {"role": "user", "content": "And 3+3?"}], None, {}, True),
    ("tools", [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}],
     [WEATHER, SEARCH], {}, True),
    ("tool-turns", [{"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}],
     [WEATHER], {}, True),
    ("tool-turns-answered", [{"role": "user", "content": "Weather in Paris?"},
                             {"role": "assistant", "content": "", "thinking": "Call it.", "tool_calls": [CALL]},
                             {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                             {"role": "assistant", "content": "Sunny, 21 C."},
                             {"role": "user", "content": "Thanks"}],
     [WEATHER], {"reasoning_effort": "medium"}, True),
    ("training-last-assistant", [{"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello!", "thinking": "Greet back."}],
     None, {}, False),
    ("identity-builtin", [{"role": "user", "content": "Search"}], None,
     {"model_identity": "You are a test model.", "builtin_tools": ["browser", "python"]}, True),
]


class FixedClock(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime.fromtimestamp(CLOCK, dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = FixedClock
ctu._cached_compile_jinja_template.cache_clear() if hasattr(ctu._cached_compile_jinja_template, "cache_clear") else None
template = open(os.path.join(ROOT, "assets/tokenizers/o200k_harmony/chat_template.jinja")).read()

# one name per id, in id order: tokenizers numbers added tokens as it adds them, so tiktoken's
# second name of 200018 (o200k_base's <|endofprompt|>) would shift every later id
specials = {k: v for k, v in sorted(spec["special_tokens"].items(), key=lambda kv: kv[1]) if k != "<|endofprompt|>"}
assert list(specials.values()) == list(range(199998, 201088))
conv = TikTokenConverter(vocab_file=RANKS, pattern=spec["pat_str"], extra_special_tokens=specials)
hf = conv.converted()
vocab, merges = conv.extract_vocab_merges_from_model(RANKS)
vocab_text = "".join(f"{i} {t}\n" for t, i in sorted(vocab.items(), key=lambda kv: kv[1]))
merges_text = "".join(f"{a} {b}\n" for a, b in merges)

encoded = []
for t in TEXTS:
    ids = enc.encode(t, allowed_special="all")
    assert hf.encode(t).ids == ids, f"transformers' conversion disagrees with tiktoken on {t!r}"
    assert enc.decode(ids) == t
    encoded.append({"text": t, "ids": ids})

renders = []
for name, msgs, tools, kwargs, agp in CHATS:
    text = ctu.render_jinja_template(conversations=[msgs], tools=tools, chat_template=template,
                                     add_generation_prompt=agp, **kwargs)[0][0]
    renders.append({"name": name, "messages": msgs, "tools": tools, "kwargs": kwargs,
                    "add_generation_prompt": agp, "text": text,
                    "ids": enc.encode(text, allowed_special="all")})

out = {
    "made_by": "tests/reference/make_harmony_fixtures.py",
    "tiktoken": tiktoken.__version__,
    "transformers": transformers.__version__,
    "clock": CLOCK,
    "pattern": spec["pat_str"],
    "special_tokens": [[k, v] for k, v in specials.items()],
    "vocab_len": len(vocab), "vocab_crc32": zlib.crc32(vocab_text.encode()),
    "merges_len": len(merges), "merges_crc32": zlib.crc32(merges_text.encode()),
    "first_merges": merges[:5],
    "encode": encoded,
    "renders": renders,
}
with open(OUT, "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
print(f"{len(encoded)} texts, {len(renders)} renders, {len(merges)} merges -> {OUT}")
