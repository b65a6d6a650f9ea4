#!/usr/bin/env python3
# usage: make_gguf_reader_fixture.py OUT_DIR
# A small GGUF written by gguf-py's GGUFWriter (not by moescope), with metadata of every value
# type and tensors of several types and shapes (a 3-D expert slab among them), and what gguf-py's
# own GGUFReader reads back from it, as JSON: the oracle of tests/gguf_reader.rs.
import json, os, sys
import numpy as np
import gguf

out = sys.argv[1]
path = os.path.join(out, "tiny.gguf")
rng = np.random.default_rng(7)
w = gguf.GGUFWriter(path, "qwen3moe")
w.add_uint8("test.u8", 200)
w.add_int8("test.i8", -100)
w.add_uint16("test.u16", 60000)
w.add_int16("test.i16", -30000)
w.add_uint32("test.u32", 4000000000)
w.add_int32("test.i32", -2000000000)
w.add_float32("test.f32", 0.1)
w.add_bool("test.bool", True)
w.add_string("test.string", "héllo <|im_end|>")
w.add_uint64("test.u64", 2**63 + 5)
w.add_int64("test.i64", -(2**62))
w.add_float64("test.f64", 1e-300)
w.add_array("test.ints", [1, -2, 3])
w.add_array("test.strings", ["a", "", "ü b"])
w.add_block_count(2)
w.add_expert_count(3)


def q(a, t):
    return gguf.quants.quantize(a, t), t


tensors = {
    "token_embd.weight": (rng.standard_normal((8, 64)).astype(np.float32), gguf.GGMLQuantizationType.F32),
    "blk.0.attn_q.weight": (rng.standard_normal((4, 64)).astype(np.float16), gguf.GGMLQuantizationType.F16),
    "blk.0.attn_k.weight": q(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
    "blk.0.attn_v.weight": q(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_0),
    "blk.0.ffn_gate_exps.weight": q(rng.standard_normal((3, 2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
    "blk.0.attn_norm.weight": (rng.standard_normal(64).astype(np.float32), gguf.GGMLQuantizationType.F32),
}
for name, (data, t) in tensors.items():
    if t in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_dtype=t)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

r = gguf.GGUFReader(path)


def value(f):
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]].tolist()[0]


doc = {
    "metadata": [
        {"key": k, "type": f.types[0].name.lower(), "value": value(f)}
        for k, f in r.fields.items()
        if not k.startswith("GGUF.")
    ],
    "tensors": [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "ne": [int(x) for x in t.shape],
            "offset": int(t.data_offset),
            "bytes": int(t.n_bytes),
        }
        for t in r.tensors
    ],
}
json.dump(doc, open(os.path.join(out, "tiny.json"), "w"), indent=1, ensure_ascii=False)
print(path, os.path.getsize(path), "bytes")
