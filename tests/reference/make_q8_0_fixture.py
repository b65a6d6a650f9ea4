#!/usr/bin/env python3
# usage: make_q8_0_fixture.py OUT.bin     (gguf-py 0.19 on the path; writes kernels/tests/fixtures/q8_0_blocks.bin)
# Values and what gguf-py's reference Q8_0 quantizer (`gguf.quants.quantize`, ggml's
# `quantize_row_q8_0_ref` in numpy) makes of them: the oracle of the q8_0 KV cache's blocks.
# Groups of 32: normal values at scales from 1e-6 to 1e4, a group of zeros, groups whose
# x / d lands exactly halfway between codes (d = 1 and d = 0.5: halves go away from zero),
# one with a lone outlier, f16-subnormal scales, and one group of all-equal negatives.
#
# File (LE): u32 n_values, n_values f32, then n_values / 32 blocks of 34 bytes (f16 d, 32 i8).
import struct, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

rng = np.random.default_rng(47)
groups = []
for s in [1e-6, 1e-3, 0.05, 1.0, 3.0, 100.0, 1e4]:
    for _ in range(4):
        groups.append(rng.standard_normal(32) * s)
groups.append(np.zeros(32))
# amax 127 -> d = 1, id = 1: k + 0.5 is a tie
groups.append(np.array([127.0] + [k + 0.5 for k in range(-15, 16)]))
# amax 63.5 -> d = 0.5, id = 2: (k + 0.5) / 2 is a tie
groups.append(np.array([-63.5] + [(k + 0.5) / 2 for k in range(-15, 16)]))
g = rng.standard_normal(32) * 0.01
g[7] = 50.0
groups.append(g)
groups.append(rng.standard_normal(32) * 1e-9)
groups.append(np.full(32, -0.3))
x = np.concatenate(groups).astype(np.float32)
blocks = gguf.quants.quantize(x.reshape(1, -1), T.Q8_0).tobytes()
assert len(blocks) == len(x) // 32 * 34
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<I", len(x)))
    f.write(x.astype("<f4").tobytes())
    f.write(blocks)
