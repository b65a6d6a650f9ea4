#!/usr/bin/env python3
"""Train the demo model's tokenizer: a byte-level BPE in the Qwen2/Qwen3 layout (NFC normalizer,
Qwen's split regex, ByteLevel without its own regex, ByteLevel decoder), vocabulary 4096, with
Qwen-style special tokens and the Qwen3 chat template, trained on the Rust toolchain docs.

usage: make_demo_tokenizer.py CORPUS.txt QWEN3_TOKENIZER_CONFIG.json OUT_DIR [VOCAB]

Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json (the chat template is taken
verbatim from the Qwen3 tokenizer_config.json given, so `--chat` renders exactly like Qwen3).
Needs only the `tokenizers` wheel.
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# added but not "special" in Qwen3 (they are decoded and shown): thinking and tool markers
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def main():
    corpus, qwen_cfg, out = sys.argv[1], sys.argv[2], sys.argv[3]
    vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    n_added = len(SPECIAL) + len(ADDED)
    trainer = trainers.BpeTrainer(vocab_size=vocab - n_added, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train([corpus], trainer)
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(ADDED)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    qc = json.load(open(qwen_cfg))
    cfg = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "errors": "replace", "model_max_length": 4096, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": qc["chat_template"],
    }
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)
    ids = {t: tok.token_to_id(t) for t in SPECIAL + ADDED}
    print(f"vocab {tok.get_vocab_size()}; specials {ids}")
    print(tok.encode("fn main() { println!(\"Hello, world!\"); }").tokens)


if __name__ == "__main__":
    main()
