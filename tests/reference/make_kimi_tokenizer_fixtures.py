#!/usr/bin/env python3
"""tests/fixtures/kimi/tokenizer_config.json and tests/fixtures/kimi_reference.json: what
tiktoken does with a Kimi-K2-style tokenizer, for tests/kimi_tokenizer.rs. Run once, by hand,
with the oracle environment of make_fixtures.py plus `pip install tiktoken` (0.14); the tests
only read the results.

usage: make_kimi_tokenizer_fixtures.py O200K_BASE.tiktoken

Kimi-K2's own tiktoken.model cannot be had on this machine, so the ranks are the first 163,584
of o200k_base (the file in crates.io's tiktoken-rs 0.12.1, which
assets/tokenizers/o200k_harmony/ranks.bin was made from): Kimi-K2's count, so its special
tokens take their ids. The test writes that tiktoken.model itself from ranks.bin. What is
Kimi's here is the rest of its tokenization_kimi.py: the split pattern (PAT below), special
tokens from tokenizer_config.json's added_tokens_decoder for ids 163584..163839 with
`<|reserved_token_ID|>` for the others, encoding with allowed_special="all". The config written
has the shape of Kimi-K2-Instruct's (auto_map, named special ids, [BOS]/[EOS]) and the chat
template llama.cpp keeps for Kimi-K2 (tests/fixtures/templates/moonshotai-Kimi-K2.jinja).
"""
import json
import os
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe

RANKS = sys.argv[1]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
N = 163584

PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NAMED = {
    163584: "[BOS]", 163585: "[EOS]", 163586: "<|im_end|>", 163587: "<|im_user|>",
    163588: "<|im_assistant|>", 163590: "<|start_header_id|>", 163591: "<|end_header_id|>",
    163593: "[EOT]", 163594: "<|im_system|>", 163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>", 163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>", 163599: "<|tool_call_end|>", 163601: "<|im_middle|>",
    163838: "[UNK]", 163839: "[PAD]",
}
TEXTS = [
    "Hello, world!",
    "你好，世界！这是一个测试。",
    "中文English混合Text和数字12345678",
    "DeepSeek与Kimi的MoE模型",
    "I'm sure they'll say it's DONE, won't they? WE'RE HERE'S",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 텍스트 and Ελληνικά κείμενο, русский Текст",
    "  leading spaces\n\n\ttabs\r\n  trailing   ",
    "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    "naïve café Ünïcödé e\u0301 combining\u0308 marks",
    "emoji 🤖🚀 and symbols ©®™ ½ ∑∫√",
    "path/to/file.txt and https://example.com/a?b=c",
    "1234567890 3.14159 1,000,000",
    "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
    "<|im_user|>user<|im_middle|>你好，Kimi！What's 2+2?<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "[BOS]<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": \"北京\"}<|tool_call_end|><|tool_calls_section_end|>[EOS]",
    "<|reserved_token_163600|> and <|reserved_token_163700|>",
    "混合Han汉字inWordsЖ字",
    "我们 的 中国 人民 共和国 世界 大学",
    "请问 Kimi 是 什么？ 答案 是 模型",
    "Ä中 ö文 ".join(["x"] * 3),
    "北京 上海 深圳 广州 东京 中文 测试 文本 今天 天气 很 好",
]

ranks = load_tiktoken_bpe(RANKS)
ranks = {t: r for t, r in ranks.items() if r < N}
assert len(ranks) == N
specials = {NAMED.get(i, f"<|reserved_token_{i}|>"): i for i in range(N, N + 256)}
enc = tiktoken.Encoding(name="kimi-k2-o200k", pat_str=PAT, mergeable_ranks=ranks, special_tokens=specials)
o200k = tiktoken.Encoding(name="o200k-cut", pat_str=r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
                          mergeable_ranks=ranks, special_tokens=specials)
rows, differ = [], 0
for t in TEXTS:
    ids = enc.encode(t, allowed_special="all")
    assert enc.decode(ids) == t
    differ += ids != o200k.encode(t, allowed_special="all")
    rows.append({"text": t, "ids": ids})
# the split pattern must matter: o200k's pattern on the same ranks gives other ids for some
assert differ >= 3, differ

template = open(os.path.join(ROOT, "tests/fixtures/templates/moonshotai-Kimi-K2.jinja")).read()
config = {
    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    "tokenizer_class": "TikTokenTokenizer",
    "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
    "model_max_length": 131072,
    "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for i, c in NAMED.items()},
    "chat_template": template,
}
os.makedirs(os.path.join(ROOT, "tests/fixtures/kimi"), exist_ok=True)
json.dump(config, open(os.path.join(ROOT, "tests/fixtures/kimi/tokenizer_config.json"), "w"), indent=1, ensure_ascii=False)
json.dump({"n_ranks": N, "texts_differing_under_o200k": differ, "encode": rows},
          open(os.path.join(ROOT, "tests/fixtures/kimi_reference.json"), "w"), ensure_ascii=False, indent=0)
print(f"{len(rows)} texts, {differ} differ under o200k's pattern")
