#!/usr/bin/env python3
"""llama.cpp's own convert_hf_to_gguf.py, run from its tree, told "qwen2" for a pre-tokenizer
hash it does not know (the tiny tokenizers are trained with Qwen2's split regex).

usage: PYTHONPATH=LLAMA/gguf-py llama_converter.py LLAMA ARGS...
  LLAMA  llama.cpp's tree (llama-cpp-python's sdist, vendor/llama.cpp); ARGS the converter's
Used by llama_convert.sh (the device scripts) and make_gguf_gpt_oss.py.
"""
import os
import runpy
import sys


def convert(llama, args):
    sys.argv = ["convert_hf_to_gguf.py"] + list(args)
    sys.path.insert(0, llama)
    try:
        import conversion.base as b
        cls, run = b.TextModel, lambda: runpy.run_path(os.path.join(llama, "convert_hf_to_gguf.py"), run_name="__main__")
    except ModuleNotFoundError:
        # a tree from before the converter became a package (llama-cpp-python 0.3.8's, early
        # 2025): its classes live in the script itself, so it runs as the module it is patched in
        import convert_hf_to_gguf as b
        cls, run = b.Model, b.main
    orig = cls.get_vocab_base_pre

    def pre(self, tok):
        try:
            return orig(self, tok)
        except NotImplementedError:
            return "qwen2"

    cls.get_vocab_base_pre = pre
    try:
        run()
    except SystemExit as e:
        if e.code:
            raise


if __name__ == "__main__":
    convert(sys.argv[1], sys.argv[2:])
