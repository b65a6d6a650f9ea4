//! MXFP4 (OCP Microscaling, FP4 elements): blocks of 32 values, each an e2m1 float (1 sign, 2
//! exponent and 1 mantissa bits: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) times one shared power of two
//! stored as an e8m0 byte (`2^(e - 127)`). 4.25 bits a weight: gpt-oss's released experts.
//!
//! Stored as ggml's `block_mxfp4` (layout name `mxfp4_ggml`), rows one after another: a block
//! is 17 bytes, the exponent byte then 16 bytes of codes; code byte `j` holds value `j` in its
//! low nibble and value `j + 16` in its high nibble (the order of q4's blocks). A GGUF file's
//! MXFP4 tensor is these bytes exactly; the hub's safetensors keep the exponents apart and
//! put value `2j` in the low nibble and `2j + 1` in the high one ([`from_hub`] reorders them).
//!
//! The kernels use the codes doubled, as integers (`E2M1_X2`, -12..12), and half the scale,
//! `2^(e - 128)` ([`half_scale`]): the product of a block with int8 activations is then an exact
//! integer sum times one float.

/// Bytes of one block of 32 values.
pub const BLOCK_BYTES: usize = 17;
/// Values per block.
pub const BLOCK: usize = 32;

/// Each 4-bit code's value times two.
pub const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: an e8m0 scale halved, as the doubled codes need it (exact, subnormal below
/// e = 2, as ggml computes it).
#[inline]
pub fn half_scale(e: u8) -> f32 {
    if e < 2 { f32::from_bits(0x0020_0000 << e) } else { f32::from_bits(((e as u32) - 1) << 23) }
}

/// One row (`BLOCK_BYTES` per 32 values) as f32.
pub fn dequantize_row(q: &[u8], out: &mut [f32]) {
    for (b, o) in q.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK)) {
        let d = half_scale(b[0]);
        for (j, &byte) in b[1..].iter().enumerate() {
            o[j] = E2M1_X2[(byte & 0x0F) as usize] as f32 * d;
            o[j + 16] = E2M1_X2[(byte >> 4) as usize] as f32 * d;
        }
    }
}

/// The code of the e2m1 value nearest `x` (a value already divided by its block's scale),
/// saturating at ±6, ties to the even code (OCP's round-to-nearest-even).
fn code(x: f32) -> u8 {
    let a = x.abs();
    let m = match a {
        _ if a <= 0.25 => 0,
        _ if a < 0.75 => 1,
        _ if a <= 1.25 => 2,
        _ if a < 1.75 => 3,
        _ if a <= 2.5 => 4,
        _ if a < 3.5 => 5,
        _ if a <= 5.0 => 6,
        _ => 7,
    };
    if x.is_sign_negative() && m != 0 { m | 8 } else { m }
}

/// Quantize one row (a multiple of 32 values) into `out` (`BLOCK_BYTES` per block): each
/// block's scale the power of two that puts its largest magnitude in [4, 8) (ggml's choice;
/// values past 6 saturate), each value its nearest code.
pub fn quantize_row(x: &[f32], out: &mut [u8]) {
    for (xs, b) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 { (amax.log2().floor() as i32 - 2 + 127).clamp(1, 254) } else { 0 };
        b[0] = e as u8;
        // the block's scale 2^(e - 127), and its inverse (exact: both powers of two)
        let inv = 1.0 / (2.0 * half_scale(e as u8));
        for j in 0..16 {
            b[1 + j] = code(xs[j] * inv) | (code(xs[j + 16] * inv) << 4);
        }
    }
}

/// A row of the hub's MXFP4 (`blocks`: 16 bytes per 32 values, value `2j` in byte `j`'s low
/// nibble and `2j + 1` in its high one; `scales`: one e8m0 byte per block) in this layout.
pub fn from_hub(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    for ((src, &e), b) in blocks.chunks_exact(16).zip(scales).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        b[0] = e;
        let nib = |v: usize| (src[v / 2] >> (4 * (v % 2))) & 0x0F;
        for j in 0..16 {
            b[1 + j] = nib(j) | (nib(j + 16) << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The e2m1 values as the OCP spec and transformers' `FP4_VALUES` list them.
    const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

    #[test]
    fn half_scales_are_powers_of_two_down_to_the_subnormals() {
        for e in 0..=255u8 {
            assert_eq!(half_scale(e) as f64, 2f64.powi(e as i32 - 128), "e {e}");
        }
    }

    #[test]
    fn a_hub_block_reads_as_transformers_dequantizes_it() {
        // transformers: lut[blocks & 0xF] at even positions, lut[blocks >> 4] at odd ones,
        // times ldexp(1, e - 127)
        let blocks: Vec<u8> = (0..32u32).map(|i| (i * 37 + 11) as u8).collect();
        let scales = [120u8, 131];
        let mut ours = vec![0u8; 2 * BLOCK_BYTES];
        from_hub(&blocks, &scales, &mut ours);
        let mut got = vec![0f32; 64];
        dequantize_row(&ours, &mut got);
        for b in 0..2 {
            for j in 0..16 {
                let byte = blocks[b * 16 + j];
                let s = 2f32.powi(scales[b] as i32 - 127);
                assert_eq!(got[b * 32 + 2 * j], E2M1[(byte & 0xF) as usize] * s, "block {b} value {}", 2 * j);
                assert_eq!(got[b * 32 + 2 * j + 1], E2M1[(byte >> 4) as usize] * s, "block {b} value {}", 2 * j + 1);
            }
        }
    }

    #[test]
    fn quantizing_picks_the_nearest_value_under_the_block_scale() {
        let mut s = 7u64;
        let mut r = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let x: Vec<f32> = (0..256).map(|i| r() * if i < 32 { 1e-3 } else { 3.0 }).collect();
        let mut q = vec![0u8; 8 * BLOCK_BYTES];
        quantize_row(&x, &mut q);
        let mut back = vec![0f32; 256];
        dequantize_row(&q, &mut back);
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let scale = 2f32.powi(q[b * BLOCK_BYTES] as i32 - 127);
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((4.0..8.0).contains(&(amax / scale)), "block {b}: amax {amax} scale {scale}");
            for (j, &v) in xs.iter().enumerate() {
                // brute force: no e2m1 value under this scale is nearer (6 caps the largest)
                let best = E2M1.iter().map(|&c| (c * scale - v).abs()).fold(f32::INFINITY, f32::min);
                let got = back[b * 32 + j];
                assert!((got - v).abs() <= best + 1e-7 * scale, "block {b} value {j}: {v} -> {got}, best error {best}");
            }
        }
    }
}
