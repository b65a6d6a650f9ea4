//! ggml's block formats (llama.cpp's GGUF tensor types) and their scalar dequantizers.
//!
//! Each function turns whole blocks into f32 values with the same f32 operations, in the same
//! order, as gguf-py 0.19's `gguf.quants.dequantize` (which ggml's `dequantize_row_*` agree
//! with), so the values equal the file's bit for bit: f16 scales widen exactly, a K-quant
//! sub-block's scale is `d * sc` rounded to f32 once, and a value is `scale * q` (minus
//! `dmin * m` for the asymmetric types), never a fused multiply-add.
//!
//! | type   | values / bytes | layout                                                     |
//! |--------|----------------|------------------------------------------------------------|
//! | Q4_0   | 32 / 18        | f16 d, 16 bytes: value j low nibble, j + 16 high; d (q - 8) |
//! | Q4_1   | 32 / 20        | f16 d, f16 m, nibbles as Q4_0; d q + m                     |
//! | Q5_0   | 32 / 22        | f16 d, u32 qh (bit j: value j's 5th bit), nibbles; d (q - 16) |
//! | Q8_0   | 32 / 34        | f16 d, 32 x i8; d q                                        |
//! | Q4_K   | 256 / 144      | f16 d, f16 dmin, 12 bytes of 6-bit (sc, m) x 8, 128 bytes  |
//! | Q5_K   | 256 / 176      | as Q4_K, then 32 bytes qh (bit j of byte l: sub-block j) before the nibbles |
//! | Q6_K   | 256 / 210      | 128 bytes low nibbles, 64 bytes 2-bit highs, 16 x i8 scales, f16 d |
//! | Q2_K   | 256 / 84       | 16 bytes (scale lo nibble, min hi nibble) per 16 values, 64 bytes of 2-bit codes, f16 d, f16 dmin |
//! | Q3_K   | 256 / 110      | 32 bytes high-bit mask, 64 bytes 2-bit codes, 12 bytes of 6-bit scales x 16, f16 d |
//! | IQ4_NL | 32 / 18        | f16 d, 16 bytes of nibbles indexing a fixed 16-value table (`IQ4_VALUES`) |
//! | IQ4_XS | 256 / 136      | f16 d, 2 + 4 bytes of 6-bit scales x 8, 128 bytes of nibbles as IQ4_NL's |
//! | IQ1_S ... IQ3_S | 256 / 50-110 | codebook entries with signs or shifts: see [`crate::ggml_iq`] |
//!
//! The low-bit types are read through [`low_bit_codes`]: a block's integer codes with one scale (and,
//! Q2_K, one min) per sub-block, so a dequantized value is `scale * code` (`- min`), and a
//! relayout into a moescope format copies the same numbers.

use half::f16;

/// A block format moescope reads from GGUF files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// ggml's `block_mxfp4`: moescope's own MXFP4 layout (`crate::mxfp4`), byte for byte.
    Mxfp4,
    Q2K,
    Q3K,
    Iq4Nl,
    Iq4Xs,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq3S,
    Iq2S,
    Iq1M,
}

/// Values per K-quant super-block.
pub const QK_K: usize = 256;

impl BlockType {
    /// Every supported type, in ggml id order.
    pub const ALL: [BlockType; 22] = [
        BlockType::F32,
        BlockType::F16,
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q8_0,
        BlockType::Q2K,
        BlockType::Q3K,
        BlockType::Q4K,
        BlockType::Q5K,
        BlockType::Q6K,
        BlockType::Iq2Xxs,
        BlockType::Iq2Xs,
        BlockType::Iq3Xxs,
        BlockType::Iq1S,
        BlockType::Iq4Nl,
        BlockType::Iq3S,
        BlockType::Iq2S,
        BlockType::Iq4Xs,
        BlockType::Iq1M,
        BlockType::Bf16,
        BlockType::Mxfp4,
    ];

    /// The type with ggml id `id` (`GGMLQuantizationType`), if moescope reads it.
    pub fn from_ggml_id(id: u32) -> Option<BlockType> {
        BlockType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    pub fn ggml_id(self) -> u32 {
        match self {
            BlockType::F32 => 0,
            BlockType::F16 => 1,
            BlockType::Q4_0 => 2,
            BlockType::Q4_1 => 3,
            BlockType::Q5_0 => 6,
            BlockType::Q8_0 => 8,
            BlockType::Q2K => 10,
            BlockType::Q3K => 11,
            BlockType::Q4K => 12,
            BlockType::Q5K => 13,
            BlockType::Q6K => 14,
            BlockType::Iq4Nl => 20,
            BlockType::Iq4Xs => 23,
            BlockType::Iq2Xxs => 16,
            BlockType::Iq2Xs => 17,
            BlockType::Iq3Xxs => 18,
            BlockType::Iq1S => 19,
            BlockType::Iq3S => 21,
            BlockType::Iq2S => 22,
            BlockType::Iq1M => 29,
            BlockType::Bf16 => 30,
            BlockType::Mxfp4 => 39,
        }
    }

    /// ggml's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            BlockType::F32 => "F32",
            BlockType::F16 => "F16",
            BlockType::Bf16 => "BF16",
            BlockType::Q4_0 => "Q4_0",
            BlockType::Q4_1 => "Q4_1",
            BlockType::Q5_0 => "Q5_0",
            BlockType::Q8_0 => "Q8_0",
            BlockType::Q4K => "Q4_K",
            BlockType::Q5K => "Q5_K",
            BlockType::Q6K => "Q6_K",
            BlockType::Mxfp4 => "MXFP4",
            BlockType::Q2K => "Q2_K",
            BlockType::Q3K => "Q3_K",
            BlockType::Iq4Nl => "IQ4_NL",
            BlockType::Iq4Xs => "IQ4_XS",
            BlockType::Iq2Xxs => "IQ2_XXS",
            BlockType::Iq2Xs => "IQ2_XS",
            BlockType::Iq3Xxs => "IQ3_XXS",
            BlockType::Iq1S => "IQ1_S",
            BlockType::Iq3S => "IQ3_S",
            BlockType::Iq2S => "IQ2_S",
            BlockType::Iq1M => "IQ1_M",
        }
    }

    /// Values per block.
    pub fn block(self) -> usize {
        match self {
            BlockType::F32 | BlockType::F16 | BlockType::Bf16 => 1,
            BlockType::Q4_0
            | BlockType::Q4_1
            | BlockType::Q5_0
            | BlockType::Q8_0
            | BlockType::Mxfp4
            | BlockType::Iq4Nl => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockType::F32 => 4,
            BlockType::F16 | BlockType::Bf16 => 2,
            BlockType::Q4_0 => 18,
            BlockType::Q4_1 => 20,
            BlockType::Q5_0 => 22,
            BlockType::Q8_0 => 34,
            BlockType::Q4K => 144,
            BlockType::Q5K => 176,
            BlockType::Q6K => 210,
            BlockType::Mxfp4 => crate::mxfp4::BLOCK_BYTES,
            BlockType::Q2K => 84,
            BlockType::Q3K => 110,
            BlockType::Iq4Nl => 18,
            BlockType::Iq4Xs => 136,
            BlockType::Iq2Xxs => 66,
            BlockType::Iq2Xs => 74,
            BlockType::Iq3Xxs => 98,
            BlockType::Iq1S => 50,
            BlockType::Iq3S => 110,
            BlockType::Iq2S => 82,
            BlockType::Iq1M => 56,
        }
    }

    /// Bytes of `n` values (`n` a whole number of blocks).
    pub fn bytes_of(self, n: usize) -> usize {
        n / self.block() * self.block_bytes()
    }
}

#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantize `out.len()` values (whole blocks) from `bytes` (exactly their blocks).
///
/// # Panics
/// When `out.len()` is not a whole number of blocks or `bytes` is not their size: callers
/// check shapes against the file first.
pub fn dequantize(t: BlockType, bytes: &[u8], out: &mut [f32]) {
    let (qk, bb) = (t.block(), t.block_bytes());
    assert!(out.len().is_multiple_of(qk) && bytes.len() == out.len() / qk * bb, "{}: bad block span", t.name());
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(qk));
    match t {
        BlockType::F32 => blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        BlockType::F16 => blocks.for_each(|(b, o)| o[0] = f16_at(b, 0)),
        BlockType::Bf16 => {
            blocks.for_each(|(b, o)| o[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
        }
        BlockType::Q4_0 => blocks.for_each(|(b, o)| q4_0(b, o)),
        BlockType::Q4_1 => blocks.for_each(|(b, o)| q4_1(b, o)),
        BlockType::Q5_0 => blocks.for_each(|(b, o)| q5_0(b, o)),
        BlockType::Q8_0 => blocks.for_each(|(b, o)| q8_0(b, o)),
        BlockType::Q4K => blocks.for_each(|(b, o)| q4_k(b, o)),
        BlockType::Q5K => blocks.for_each(|(b, o)| q5_k(b, o)),
        BlockType::Q6K => blocks.for_each(|(b, o)| q6_k(b, o)),
        BlockType::Mxfp4 => crate::mxfp4::dequantize_row(bytes, out),
        _ => {
            let (mut codes, mut scales, mut mins) = ([0i8; QK_K], Vec::with_capacity(16), Vec::with_capacity(16));
            for (b, o) in blocks {
                scales.clear();
                mins.clear();
                let sub = low_bit_codes(t, b, &mut codes, &mut scales, &mut mins);
                for (j, o) in o.iter_mut().enumerate() {
                    // gguf-py's two operations, never fused: scale * code, then (Q2_K) - min
                    let v = scales[j / sub] * codes[j] as f32;
                    *o = if t == BlockType::Q2K { v - mins[j / sub] } else { v };
                }
            }
        }
    }
}

/// IQ4_NL's and IQ4_XS's 16 values, which a nibble indexes (ggml's `kvalues_iq4nl`): the
/// format's codebook, not a tuning.
pub const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// Sub-block `j`'s 6-bit scale (0-63, stored biased by 32) of a Q3_K block's 12 scale bytes:
/// the low four bits are the low (`j < 8`) or high nibble of byte `j % 8`, the high two bits
/// field `j / 4` of byte `8 + j % 4`.
pub fn q3_k_scale(s: &[u8], j: usize) -> u8 {
    let lo = if j < 8 { s[j] & 15 } else { s[j - 8] >> 4 };
    lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4
}

/// All 16 of a Q3_K block's 6-bit scales ([`q3_k_scale`], stored biased by 32) as 16 bytes in
/// two u64, little-endian, from its 12 scale bytes `s`: low four bits from the nibbles of bytes
/// 0..8, high two from field j / 4 of byte 8 + j % 4, by whole-word masks and shifts.
pub(crate) fn q3_k_scale_bytes(s: &[u8]) -> [u64; 2] {
    let x = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    let y = u32::from_le_bytes([s[8], s[9], s[10], s[11]]) as u64;
    let (m4, m2) = (0x0F0F_0F0F_0F0F_0F0Fu64, 0x0303_0303u64);
    let high = |r: u64| (y >> (2 * r)) & m2;
    [(x & m4) | (high(0) | high(1) << 32) << 4, ((x >> 4) & m4) | (high(2) | high(3) << 32) << 4]
}

/// Value `i`'s 2-bit field of a Q2_K / Q3_K block's 64 code bytes: two halves of 128 values,
/// each four runs of 32 taking bits `2s..2s + 1` (run `s`) of bytes `32h .. 32h + 32`.
fn two_bits(qs: &[u8], i: usize) -> u8 {
    let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
    (qs[32 * h + l] >> (2 * s)) & 3
}

/// A Q2_K, Q3_K, IQ4_NL, IQ4_XS or codebook-type (IQ1_S ... IQ3_S, [`crate::ggml_iq`]) block `b` as integer codes (`codes[..t.block()]`) with one
/// scale per sub-block pushed to `scales` (and, Q2_K, one min to `mins`, the value being
/// `scale * code - min`); returns the sub-block length. Each scale is rounded to f32 once, as
/// gguf-py computes it (`d * sc`).
///
/// # Panics
/// For any other type (a caller's bug), or `b` shorter than a block.
pub fn low_bit_codes(t: BlockType, b: &[u8], codes: &mut [i8], scales: &mut Vec<f32>, mins: &mut Vec<f32>) -> usize {
    match t {
        BlockType::Q2K => {
            let (sc, qs, d, dmin) = (&b[0..16], &b[16..80], f16_at(b, 80), f16_at(b, 82));
            for &s in sc {
                scales.push(d * (s & 15) as f32);
                mins.push(dmin * (s >> 4) as f32);
            }
            for (i, c) in codes[..QK_K].iter_mut().enumerate() {
                *c = two_bits(qs, i) as i8;
            }
            16
        }
        BlockType::Q3K => {
            let (hmask, qs, sc, d) = (&b[0..32], &b[32..96], &b[96..108], f16_at(b, 108));
            for j in 0..16 {
                scales.push(d * (q3_k_scale(sc, j) as i32 - 32) as f32);
            }
            for (i, c) in codes[..QK_K].iter_mut().enumerate() {
                // the high bit is a mask: set means no offset, clear means -4
                let high = (hmask[i % 32] >> (i / 32)) & 1;
                *c = two_bits(qs, i) as i8 - if high == 1 { 0 } else { 4 };
            }
            16
        }
        BlockType::Iq4Nl => {
            scales.push(f16_at(b, 0));
            nibble_values(&b[2..18], &mut codes[..32]);
            32
        }
        BlockType::Iq4Xs => {
            let (d, high, low) = (f16_at(b, 0), u16::from_le_bytes([b[2], b[3]]), &b[4..8]);
            for j in 0..8 {
                let ls = (low[j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4;
                scales.push(d * (ls as i32 - 32) as f32);
                nibble_values(&b[8 + 16 * j..24 + 16 * j], &mut codes[32 * j..32 * j + 32]);
            }
            32
        }
        _ if crate::ggml_iq::TYPES.contains(&t) => crate::ggml_iq::codes(t, b, codes, scales),
        _ => panic!("{} has no low-bit codes", t.name()),
    }
}

/// 16 bytes of nibbles as 32 values of [`IQ4_VALUES`]: low nibbles first, then high ones.
fn nibble_values(q: &[u8], out: &mut [i8]) {
    for (l, &byte) in q.iter().enumerate() {
        out[l] = IQ4_VALUES[(byte & 15) as usize];
        out[l + 16] = IQ4_VALUES[(byte >> 4) as usize];
    }
}

fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        o[j] = d * ((b[2 + j] & 15) as i32 - 8) as f32;
        o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
    }
}

fn q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        o[j] = d * (b[4 + j] & 15) as f32 + m;
        o[j + 16] = d * (b[4 + j] >> 4) as f32 + m;
    }
}

fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let lo = (b[6 + j] & 15) as u32 | ((qh >> j) & 1) << 4;
        let hi = (b[6 + j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        o[j] = d * (lo as i32 - 16) as f32;
        o[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        o[j] = b[2 + j] as i8 as f32 * d;
    }
}

/// Sub-block `j`'s 6-bit scale and min of a Q4_K / Q5_K block's 12 scale bytes.
pub fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

fn q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for j in 0..8 {
        let (sc, m) = k_scale_min(scales, j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        // sub-blocks 2g and 2g + 1 share the 32 bytes of group g: low and high nibbles
        let (g, shift) = (j / 2, 4 * (j % 2));
        for l in 0..32 {
            let q = (qs[32 * g + l] >> shift) & 15;
            o[32 * j + l] = dl * q as f32 - ml;
        }
    }
}

fn q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for j in 0..8 {
        let (sc, m) = k_scale_min(scales, j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        let (g, shift) = (j / 2, 4 * (j % 2));
        for l in 0..32 {
            let q = ((qs[32 * g + l] >> shift) & 15) | ((qh[l] >> j) & 1) << 4;
            o[32 * j + l] = dl * q as f32 - ml;
        }
    }
}

fn q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    // two halves of 128 values; in each, four runs of 32 (t = 0..3) take the low nibbles of
    // ql[l] / ql[l + 32] (t = 0, 1) or their high nibbles (t = 2, 3) and bits 2t..2t+1 of qh[l]
    for h in 0..2 {
        for t in 0..4 {
            for l in 0..32 {
                let lo = (ql[64 * h + 32 * (t % 2) + l] >> (4 * (t / 2))) & 15;
                let hi = (qh[32 * h + l] >> (2 * t)) & 3;
                let i = 128 * h + 32 * t + l;
                let dl = d * scales[i / 16] as i8 as f32;
                o[i] = dl * ((lo | hi << 4) as i32 - 32) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3_k_scale_bytes_are_the_scales_one_by_one() {
        let mut x = 7u64;
        for _ in 0..200 {
            let s: Vec<u8> = (0..12)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 40) as u8
                })
                .collect();
            let [a, b] = q3_k_scale_bytes(&s);
            let bytes: Vec<u8> = a.to_le_bytes().into_iter().chain(b.to_le_bytes()).collect();
            let one_by_one: Vec<u8> = (0..16).map(|j| q3_k_scale(&s, j)).collect();
            assert_eq!(bytes, one_by_one, "{s:?}");
        }
    }

    #[test]
    fn ids_sizes_and_names_agree_with_ggml() {
        for t in BlockType::ALL {
            assert_eq!(BlockType::from_ggml_id(t.ggml_id()), Some(t));
        }
        assert_eq!(BlockType::from_ggml_id(34), None, "TQ1_0 is not read");
        assert_eq!(BlockType::Q6K.bytes_of(512), 420);
        // ggml's type_traits: (id, values, bytes) of the codebook types
        for (id, qk, bytes) in
            [(16, 256, 66), (17, 256, 74), (18, 256, 98), (19, 256, 50), (21, 256, 110), (22, 256, 82), (29, 256, 56)]
        {
            let t = BlockType::from_ggml_id(id).expect("read");
            assert_eq!((t.block(), t.block_bytes()), (qk, bytes), "{}", t.name());
        }
    }

    #[test]
    fn q4_0_nibble_order() {
        // d = 1.0 (f16 0x3C00); byte j = (hi << 4) | lo with lo = j, hi = 15 - j
        let mut b = vec![0x00, 0x3C];
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let mut o = [0f32; 32];
        dequantize(BlockType::Q4_0, &b, &mut o);
        for j in 0..16 {
            assert_eq!(o[j], j as f32 - 8.0);
            assert_eq!(o[j + 16], (15 - j) as f32 - 8.0);
        }
    }
}
