#!/usr/bin/env python3
# usage: make_iq_grids.py OUT.bin OUT_SUMS.txt
# The codebooks ("grids") of ggml's IQ1/IQ2/IQ3 types, as gguf-py 0.19 holds them
# (`gguf.quants.IQ2_XXS.grid_hex`, ...: ggml's iq2xxs_grid etc. with each entry's bytes packed
# as indices into the type's `grid_map`), written for moescope's kernels crate
# (kernels/src/iq_grids.bin, read by ggml_iq.rs):
#   per type, in the order below: the hex decoded to bytes, nothing else (lowest bits first,
#   each byte holds four 2-bit indices for the 3-value maps, or, for IQ3's 8 values, two 3-bit
#   indices at bits 0 and 4, as gguf-py's init_grid unpacks them).
# And, to check the unpacking: per type a line "NAME fnv1a64-hex" of the unpacked grid
# (gguf-py's `cls.grid` after `init_grid()`, each value as a signed byte, row by row).
import sys
import numpy as np
import gguf.quants as q

TYPES = [q.IQ2_XXS, q.IQ2_XS, q.IQ2_S, q.IQ3_XXS, q.IQ3_S, q.IQ1_S]


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


out = open(sys.argv[1], "wb")
sums = open(sys.argv[2], "w")
for cls in TYPES:
    hexes = np.frombuffer(cls.grid_hex, dtype=np.uint8).reshape(-1, 2)
    packed = bytes(int(chr(a) + chr(b), 16) for a, b in hexes)
    out.write(packed)
    cls.init_grid()
    vals = cls.grid.reshape(-1).astype(np.int8).tobytes()
    sums.write(f"{cls.__name__} {len(packed)} {fnv1a64(vals):016x}\n")
out.close()
sums.close()
