#!/usr/bin/env python3
"""The GLM-4.5 GGUF fixtures: tests/fixtures/glm through llama.cpp's own converter, in bf16 (the
checkpoint's values; norms, router and biases f32) and q8_0.

usage: PYTHONPATH=LLAMA/gguf-py:LLAMA make_gguf_glm.py LLAMA OUT_DIR
  LLAMA  llama.cpp's tree (llama-cpp-python's sdist, vendor/llama.cpp), run with the oracle
         environment of make_fixtures.py (the converter imports torch)
Run from the repository root, after `pack_fixtures.py unpack` (and `pack` afterwards).
Writes OUT_DIR/glm-bf16.gguf and OUT_DIR/glm-q8_0.gguf (the tree keeps the Q8_0 one).

The fixture has no tokenizer: it gets one of exactly its 256 ids (the byte-level alphabet, no
merges, no special tokens), and the converter's GLM vocabulary step, which looks up GLM's own
special tokens ([gMASK], <|user|>, ...), is replaced by its generic byte-level one. The
tensors and the model's metadata are the converter's own. The checkpoint states one MTP layer
without its tensors (transformers makes none): the file's block_count counts it, as the
released files' do.

The committed glm-q8_0.gguf was made from the fixture with that MTP layer added
(moescope::derived_fixture::with_mtp_layer; tests/mtp.rs writes it as target/tmp/glm-mtp-PID):
GLM_FIXTURE=target/tmp/glm-mtp-PID. Its main weights are the fixture's, so transformers'
references of tests/fixtures/glm are its own, and its blk.3.* / nextn.* tensors are what
tests/mtp.rs checks the GGUF path's MTP section against.
"""
import json
import os
import shutil
import sys
import tempfile

from llama_converter import convert

HERE = os.path.dirname(os.path.abspath(__file__))
# GLM_FIXTURE: a fixture folder elsewhere (one make_sigmoid_moe_fixtures.py just wrote)
FIXTURE = os.environ.get("GLM_FIXTURE", os.path.join(HERE, "..", "fixtures", "glm"))


def byte_tokenizer(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(out, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(out, "tokenizer_config.json"), "w"))


def main():
    llama, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, llama)
    import conversion.base as b
    b.TextModel._set_vocab_glm = b.TextModel._set_vocab_gpt2
    with tempfile.TemporaryDirectory() as w:
        hf = os.path.join(w, "hf")
        shutil.copytree(FIXTURE, hf, ignore=shutil.ignore_patterns("reference.*", "*.xz"))
        byte_tokenizer(hf)
        os.makedirs(out, exist_ok=True)
        for ty in ("bf16", "q8_0"):
            convert(llama, [hf, "--outtype", ty, "--outfile", os.path.join(out, f"glm-{ty}.gguf")])


if __name__ == "__main__":
    main()
