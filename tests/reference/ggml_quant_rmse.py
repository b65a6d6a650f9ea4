#!/usr/bin/env python3
"""ggml's own reference quantizers (`quantize_row_{q4_K,q2_K,iq4_xs}_ref` through the type
traits' `from_float_ref`, dequantized by `to_float`) on the values of kernels/tests/ggml_quant.rs:
the root mean square error each gives, which that test holds moescope's quantizers to.

usage: ggml_quant_rmse.py LIBGGML_BASE   (libggml-base.so of llama-cpp-python 0.3.36's tree)
"""
import ctypes
import math
import sys

import numpy as np


class Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


F = ctypes.POINTER(ctypes.c_float)
TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, F, ctypes.c_int64)
FROM_FLOAT = ctypes.CFUNCTYPE(None, F, ctypes.c_void_p, ctypes.c_int64)
TYPES = {"Q4_K": 12, "Q2_K": 10, "IQ4_XS": 23}


def values():
    out = np.empty(64 * 1024, dtype=np.float32)
    for i in range(out.size):
        v = math.sin(0.37 * i) * (1.0 + 0.5 * math.cos(0.011 * i)) + 0.3 * math.sin(1.7 * i) ** 3
        if i % 97 == 0:
            v *= 4.0
        out[i] = 0.02 * v
    return out


def main(lib_path):
    lib = ctypes.CDLL(lib_path)
    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    x = values()
    for name, ty in TYPES.items():
        tr = lib.ggml_get_type_traits(ty).contents
        blocks = np.zeros(x.size // tr.blck_size * tr.type_size, dtype=np.uint8)
        back = np.zeros_like(x)
        for r in range(64):
            row = np.ascontiguousarray(x[1024 * r:1024 * (r + 1)])
            o = 1024 // tr.blck_size * tr.type_size * r
            FROM_FLOAT(tr.from_float_ref)(row.ctypes.data_as(F), blocks[o:].ctypes.data, 1024)
        TO_FLOAT(tr.to_float)(blocks.ctypes.data, back.ctypes.data_as(F), x.size)
        print(f"{name}: rmse {math.sqrt(float(np.mean((x.astype(np.float64) - back) ** 2))):.3e}")


if __name__ == "__main__":
    main(sys.argv[1])
