#!/usr/bin/env python3
# usage: make_ggml_blocks_fixture.py OUT.bin   (then `xz -9e OUT.bin`: the test reads ggml_blocks.bin.xz)
# Random blocks of every ggml type moescope reads, and what gguf-py 0.19's reference
# dequantizer (`gguf.quants.dequantize`) makes of them: the oracle of kernels' ggml tests.
# Block bytes are random; the f16 scales (d, dmin, m) are overwritten with random finite f16
# values (normal, subnormal, zero and negative among them), so every bit pattern of the quants
# and the 6-bit K-quant scales occurs. F16/BF16 values are random finite bit patterns.
#
# File: repeated records of u32 ggml_type, u32 n_values, the blocks' bytes, n_values f32 (LE).
import struct, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

rng = np.random.default_rng(25)


def finite_f16(n):
    """n random finite f16 bit patterns, with a few zeros, subnormals and negatives forced."""
    v = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    v = np.where((v & 0x7C00) == 0x7C00, v & 0x83FF, v)  # inf/nan -> subnormal of same sign
    v[:4] = [0x0000, 0x8000, 0x0001, 0x83FF][: min(4, n)]
    return v


def blocks(t, n_blocks):
    size, bb = gguf.GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, (n_blocks, bb), dtype=np.uint8)
    f16_at = {
        T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q8_0: [0],
        T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
        T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ4_NL: [0], T.IQ4_XS: [0],
        T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
    }.get(t, [])
    for at in f16_at:
        b[:, at:at + 2] = finite_f16(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if t == T.IQ1_M:
        # d's 16 bits are the top nibbles of the four u16 scales at 48..56, low nibble first
        d = finite_f16(n_blocks)
        sc = b[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):
            sc[:, k] |= ((d >> np.uint16(4 * k)) & np.uint16(15)) << np.uint16(12)
        b[:, 48:56] = sc.view(np.uint8)
    if t == T.F16:
        b = finite_f16(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if t == T.BF16:
        v = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint16)
        v = np.where((v & 0x7F80) == 0x7F80, v & 0x807F, v)  # no inf/nan
        b = v.view(np.uint8).reshape(n_blocks, 2)
    if t == T.F32:
        b = rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    return b, size


out = open(sys.argv[1], "wb")
for t, n_blocks in [(T.F32, 64), (T.F16, 256), (T.BF16, 256), (T.Q4_0, 48), (T.Q4_1, 48),
                    (T.Q5_0, 48), (T.Q8_0, 48), (T.Q4_K, 12), (T.Q5_K, 12), (T.Q6_K, 12), (T.MXFP4, 48),
                    # the low-bit types, appended so the records above keep their bytes
                    (T.Q2_K, 6), (T.Q3_K, 6), (T.IQ4_NL, 24), (T.IQ4_XS, 6),
                    # the codebook types, appended likewise (their grids are checked entry by
                    # entry elsewhere: make_iq_grids.py)
                    (T.IQ2_XXS, 4), (T.IQ2_XS, 4), (T.IQ2_S, 4), (T.IQ3_XXS, 4), (T.IQ3_S, 4),
                    (T.IQ1_S, 4), (T.IQ1_M, 4)]:
    b, size = blocks(t, n_blocks)
    vals = gguf.quants.dequantize(b.reshape(-1), t).astype(np.float32).reshape(-1)
    assert vals.size == n_blocks * size and np.isfinite(vals).all()
    out.write(struct.pack("<II", int(t), vals.size))
    out.write(b.tobytes())
    out.write(vals.astype("<f4").tobytes())
out.close()
