# Sourced by the device scripts: `conv ARGS...` runs llama.cpp's convert_hf_to_gguf.py from the
# tree extracted in $W/llama (the caller sets W and PYTHONPATH), told "qwen2" for a tokenizer
# hash it does not know (the tiny tokenizers are trained with Qwen2's split regex).
conv() {
    python3 - "$@" <<PYEOF
import sys, runpy
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
sys.path.insert(0, "$W/llama")
import conversion.base as b
orig = b.TextModel.get_vocab_base_pre
def pre(self, tok):
    try:
        return orig(self, tok)
    except NotImplementedError:
        return "qwen2"
b.TextModel.get_vocab_base_pre = pre
runpy.run_path("$W/llama/convert_hf_to_gguf.py", run_name="__main__")
PYEOF
}
