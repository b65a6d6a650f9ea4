# Sourced by the device scripts (run from the repository's root): `conv ARGS...` runs llama.cpp's
# convert_hf_to_gguf.py from the tree extracted in $W/llama (the caller sets W and PYTHONPATH)
# through llama_converter.py, which tells it "qwen2" for a tokenizer hash it does not know.
conv() {
    python3 tests/reference/llama_converter.py "$W/llama" "$@"
}
