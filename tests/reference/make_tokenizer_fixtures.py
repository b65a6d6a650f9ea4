#!/usr/bin/env python3
"""Reference token ids and rendered chat templates, made by the Python `tokenizers` library and
by transformers' `apply_chat_template`, for the real Qwen3 tokenizer and the demo tokenizer.

usage: make_tokenizer_fixtures.py QWEN3_TOKENIZER_DIR OUT_DIR
       make_tokenizer_fixtures.py --qwen35 QWEN35_TOKENIZER_DIR OUT_DIR
         (QWEN35_TOKENIZER_DIR: a plain tokenizer.json and chat_template.jinja, e.g. shared/assets'
          qwen3.5-tokenizer gunzipped; replaces the "qwen3.5" rows of chat_reference.json and
          copies the template to assets/tokenizers/qwen3.5/chat_template.jinja)

Writes into the repository's assets/tokenizers/qwen3/ (which `moescope synth` embeds):
  tokenizer.json.gz, tokenizer_config.json   (the real files; pack_fixtures.py pack then keeps
                                             tokenizer.json as .xz)
and into OUT_DIR:
  tokenizer_reference.json   {tokenizer: [{text, ids, decoded}]} for "qwen3" and "demo"
  chat_reference.json        [{tokenizer, messages, add_generation_prompt, enable_thinking?, text}]

The tree keeps large fixtures packed (tests/reference/pack_fixtures.py): `unpack` before
this, `pack` after.
"""
import gzip
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ASSETS = os.path.join(HERE, "..", "..", "assets", "tokenizers")
DEMO_DIR = os.path.join(HERE, "..", "..", "src", "demo")

TEXTS = [
    "The quick brown fox jumps over the lazy dog. Hello, 世界! 1+1=2",
    " Rust is a systems programming language; 混合专家 models route each token to a few experts.",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "def f(x):\n\treturn x**2  # tabs\tand  double  spaces\n\n\n",
    "They're here, we've gone, I'm done, you'll see, he'd know, IT'S LOUD, 'quoted'.",
    "日本語のテキストと한국어 텍스트, 中文标点：“引号”、《书名》。",
    "Emoji: 🦀🚀👩‍👩‍👧‍👦 🇫🇷 ❤️‍🔥 and skin tones 👍🏽",
    "Arabic مرحبا بالعالم and Hebrew שלום עולם, Devanagari नमस्ते, Thai สวัสดีครับ",
    "Combining: e\u0301 vs \u00e9, A\u030a vs \u00c5, ﬁ ligature, Ⅻ roman, ＦＵＬＬ width",
    "Numbers 1234567890 3.14159 -0.5e-10 0xDEADBEEF 1_000_000 ²³",
    "   leading spaces and trailing   \n\r\n\r\nwindows newlines\r\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>",
    "<|endoftext|> in the middle <|endoftext|><|endoftext|>",
    "URL https://example.com/a?b=c&d=e#frag and email a.b@c.d, path C:\\Users\\x\\file.txt",
    "Mixed\u00a0non-breaking\u2009thin\u200bzero-width\ufeffBOM\u2028sep",
    "",
    " ",
    "\n",
    "a" * 300,
    "SELECT * FROM t WHERE x > 3 AND y <= 'abc' ORDER BY z DESC; -- comment",
    "Ünïcödé ÀÉÎÕÜ ßẞ ǅ ﬀ Ωμέγα Привет мир",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is Rust?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me about MoE models."}],
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nIt is 4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Explain\nmulti-line\n  input"},
     {"role": "assistant", "content": "<think>\nthinking...\n</think>\n\nSure."}],
    [{"role": "user", "content": "Emoji 🦀 and 世界 and \"quotes\" and {braces}"}],
]


def main():
    qdir, out = sys.argv[1], sys.argv[2]
    qout = os.path.join(ASSETS, "qwen3")
    os.makedirs(qout, exist_ok=True)
    with open(os.path.join(qdir, "tokenizer.json"), "rb") as f, \
            open(os.path.join(qout, "tokenizer.json.gz"), "wb") as g:
        g.write(gzip.compress(f.read(), compresslevel=9, mtime=0))
    shutil.copy(os.path.join(qdir, "tokenizer_config.json"), qout)

    toks = {"qwen3": qdir, "demo": DEMO_DIR}
    ref = {}
    for name, d in toks.items():
        tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        rows = []
        for t in TEXTS:
            ids = tk.encode(t, add_special_tokens=True).ids
            rows.append(dict(text=t, ids=ids, decoded=tk.decode(ids, skip_special_tokens=False)))
        ref[name] = rows
    json.dump(ref, open(os.path.join(out, "tokenizer_reference.json"), "w"), ensure_ascii=False, indent=0)

    chats = []
    for name, d in toks.items():
        at = transformers.AutoTokenizer.from_pretrained(d)
        for msgs in CONVERSATIONS:
            for agp in (True, False):
                for think in (None, True, False):
                    kw = {} if think is None else {"enable_thinking": think}
                    text = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, **kw)
                    row = dict(tokenizer=name, messages=msgs, add_generation_prompt=agp, text=text)
                    if think is not None:
                        row["enable_thinking"] = think
                    chats.append(row)
    json.dump(chats, open(os.path.join(out, "chat_reference.json"), "w"), ensure_ascii=False, indent=0)
    print(f"{sum(len(r) for r in ref.values())} tokenizer rows, {len(chats)} chat renders; "
          f"transformers {transformers.__version__}")


def qwen35(tdir, out):
    """The Qwen3.5 chat template on the same conversations, thinking on, off and unset."""
    tout = os.path.join(ASSETS, "qwen3.5")
    os.makedirs(tout, exist_ok=True)
    shutil.copy(os.path.join(tdir, "chat_template.jinja"), tout)
    at = transformers.AutoTokenizer.from_pretrained(tdir)
    path = os.path.join(out, "chat_reference.json")
    chats = [r for r in json.load(open(path)) if r["tokenizer"] != "qwen3.5"]
    n = 0
    for msgs in CONVERSATIONS:
        for agp in (True, False):
            for think in (None, True, False):
                kw = {} if think is None else {"enable_thinking": think}
                text = at.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, **kw)
                row = dict(tokenizer="qwen3.5", messages=msgs, add_generation_prompt=agp, text=text)
                if think is not None:
                    row["enable_thinking"] = think
                chats.append(row)
                n += 1
    json.dump(chats, open(path, "w"), ensure_ascii=False, indent=0)
    print(f"{n} qwen3.5 chat renders; transformers {transformers.__version__}")


if __name__ == "__main__":
    if sys.argv[1] == "--qwen35":
        qwen35(sys.argv[2], sys.argv[3])
    else:
        main()
