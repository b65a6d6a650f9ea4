//! ggml's codebook types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M as integer
//! codes with one scale per sub-block, for [`crate::ggml::low_bit_codes`].
//!
//! Each group of 8 (IQ3: 4) values is an entry of a fixed codebook (the type's "grid"), with a
//! sign per value (IQ2/IQ3) or a shift of +-1/8 per group (IQ1). A value is the sub-block scale
//! times the entry's value times the sign, as gguf-py 0.19 computes it: `(db * grid) * sign`,
//! one rounding, which is `db * code` with the signed entry as the code. IQ1's
//! `dl * (grid + delta)` with delta = +-1/8 is `(dl / 8) * (8 grid +- 1)`: the same exact
//! product (dl / 8 is exact), so the same rounding.
//!
//! | type    | values / bytes | layout                                                          |
//! |---------|----------------|-----------------------------------------------------------------|
//! | IQ2_XXS | 256 / 66       | f16 d; per 32 values a u32 of 4 grid indices, a u32 of 4 x 7-bit sign indices and a 4-bit scale (top) |
//! | IQ2_XS  | 256 / 74       | f16 d; 32 u16 (9-bit index, 7-bit sign index); 8 bytes of 4-bit scales per 16 values |
//! | IQ2_S   | 256 / 82       | f16 d; 32 index bytes, 32 sign bytes, 8 bytes of 2-bit index highs, 8 bytes of 4-bit scales per 16 |
//! | IQ3_XXS | 256 / 98       | f16 d; 64 index bytes (4 values each); per 32 values a u32 of 4 x 7-bit sign indices and a 4-bit scale |
//! | IQ3_S   | 256 / 110      | f16 d; 64 index bytes, 8 bytes of index 9th bits, 32 sign bytes, 4 bytes of 4-bit scales per 32 |
//! | IQ1_S   | 256 / 50       | f16 d; 32 index bytes; per 32 values a u16: 4 x 3-bit index highs, 3-bit scale, delta sign |
//! | IQ1_M   | 256 / 56       | 32 index bytes; 16 bytes of (3-bit index high, delta sign) nibbles; 4 u16 of 3-bit scales per 16, f16 d in their top nibbles |
//!
//! The grids are ggml's (`iq2xxs_grid` ...), kept in `iq_grids.bin` as gguf-py stores them:
//! indices into the type's few values, packed (`tests/reference/make_iq_grids.py` writes it from
//! gguf-py; the unit test checks every unpacked entry against the sums it prints).

use std::sync::OnceLock;

use crate::ggml::{BlockType, QK_K, f16_at};

/// The codebook types, in ggml's order of their grids here.
pub const TYPES: [BlockType; 7] = [
    BlockType::Iq2Xxs,
    BlockType::Iq2Xs,
    BlockType::Iq2S,
    BlockType::Iq3Xxs,
    BlockType::Iq3S,
    BlockType::Iq1S,
    BlockType::Iq1M,
];

/// The packed grids, one after another in [`GRIDS`]' order.
const PACKED: &[u8] = include_bytes!("iq_grids.bin");

/// One grid: its packed bytes, values per entry, indices per byte, and the values indexed.
struct GridSpec {
    bytes: usize,
    width: usize,
    per_byte: usize,
    values: &'static [i8],
}

/// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S (IQ1_M shares IQ1_S's).
const GRIDS: [GridSpec; 6] = [
    GridSpec { bytes: 512, width: 8, per_byte: 4, values: &[8, 25, 43] },
    GridSpec { bytes: 1024, width: 8, per_byte: 4, values: &[8, 25, 43] },
    GridSpec { bytes: 2048, width: 8, per_byte: 4, values: &[8, 25, 43] },
    GridSpec { bytes: 512, width: 4, per_byte: 2, values: &[4, 12, 20, 28, 36, 44, 52, 62] },
    GridSpec { bytes: 1024, width: 4, per_byte: 2, values: &[1, 3, 5, 7, 9, 11, 13, 15] },
    GridSpec { bytes: 4096, width: 8, per_byte: 4, values: &[-1, 0, 1] },
];

/// Grid `k` of [`GRIDS`], unpacked (entry `i` is `width` values from `i * width`).
fn grid(k: usize) -> &'static [i8] {
    static TABLES: [OnceLock<Vec<i8>>; 6] = [const { OnceLock::new() }; 6];
    TABLES[k].get_or_init(|| {
        let g = &GRIDS[k];
        let start: usize = GRIDS[..k].iter().map(|g| g.bytes).sum();
        // indices lowest bits first: 2-bit fields at 0, 2, 4, 6, or 3-bit ones at 0 and 4
        let (step, mask) = (8 / g.per_byte, if g.per_byte == 4 { 3 } else { 7 });
        PACKED[start..start + g.bytes]
            .iter()
            .flat_map(|&b| (0..g.per_byte).map(move |e| (b >> (e * step)) & mask))
            .map(|i| g.values[i as usize])
            .collect()
    })
}

/// ggml's `ksigns_iq2xs`: 7 sign bits and an eighth that makes their parity even.
fn ksigns(i: u32) -> u8 {
    let i = (i & 127) as u8;
    i | ((i.count_ones() as u8 & 1) << 7)
}

/// Entry `i` of grid `k` times the signs in `signs` (bit `j`: value `j` negative), into `out`.
fn signed_entry(k: usize, i: usize, signs: u8, out: &mut [i8]) {
    let w = GRIDS[k].width;
    for (j, (o, &g)) in out.iter_mut().zip(&grid(k)[i * w..(i + 1) * w]).enumerate() {
        *o = if (signs >> j) & 1 == 1 { -g } else { g };
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// IQ2's scale for a 4-bit `sc`: `d (0.5 + sc) 0.25`, in gguf-py's order.
fn iq2_scale(d: f32, sc: u32) -> f32 {
    d * (0.5 + sc as f32) * 0.25
}

/// Block `b` of codebook type `t` as codes (`codes[..256]`) and one scale per sub-block
/// (pushed to `scales`); returns the sub-block length.
///
/// # Panics
/// For a type without a codebook (a caller's bug), or `b` shorter than a block.
pub fn codes(t: BlockType, b: &[u8], codes: &mut [i8], scales: &mut Vec<f32>) -> usize {
    let codes = &mut codes[..QK_K];
    match t {
        BlockType::Iq2Xxs => {
            let d = f16_at(b, 0);
            for ib in 0..8 {
                let (idx, aux) = (&b[2 + 8 * ib..6 + 8 * ib], u32_at(b, 6 + 8 * ib));
                scales.push(iq2_scale(d, aux >> 28));
                for l in 0..4 {
                    let at = 32 * ib + 8 * l;
                    signed_entry(0, idx[l] as usize, ksigns(aux >> (7 * l)), &mut codes[at..at + 8]);
                }
            }
            32
        }
        BlockType::Iq2Xs => {
            let (d, sc) = (f16_at(b, 0), &b[66..74]);
            for s in 0..16 {
                scales.push(iq2_scale(d, ((sc[s / 2] >> (4 * (s % 2))) & 15) as u32));
            }
            for i in 0..32 {
                let q = u16_at(b, 2 + 2 * i) as u32;
                signed_entry(1, (q & 511) as usize, ksigns(q >> 9), &mut codes[8 * i..8 * i + 8]);
            }
            16
        }
        BlockType::Iq2S => {
            let (d, qs, signs, qh, sc) = (f16_at(b, 0), &b[2..34], &b[34..66], &b[66..74], &b[74..82]);
            for s in 0..16 {
                scales.push(iq2_scale(d, ((sc[s / 2] >> (4 * (s % 2))) & 15) as u32));
            }
            for i in 0..32 {
                let gi = qs[i] as usize | (((qh[i / 4] >> (2 * (i % 4))) & 3) as usize) << 8;
                signed_entry(2, gi, signs[i], &mut codes[8 * i..8 * i + 8]);
            }
            16
        }
        BlockType::Iq3Xxs => {
            let (d, qs) = (f16_at(b, 0), &b[2..66]);
            for ib in 0..8 {
                let aux = u32_at(b, 66 + 4 * ib);
                scales.push(d * (0.5 + (aux >> 28) as f32) * 0.5);
                for l in 0..4 {
                    let signs = ksigns(aux >> (7 * l));
                    let at = 32 * ib + 8 * l;
                    for h in 0..2 {
                        let gi = qs[8 * ib + 2 * l + h] as usize;
                        signed_entry(3, gi, signs >> (4 * h), &mut codes[at + 4 * h..at + 4 * h + 4]);
                    }
                }
            }
            32
        }
        BlockType::Iq3S => {
            let (d, qs, qh, signs, sc) = (f16_at(b, 0), &b[2..66], &b[66..74], &b[74..106], &b[106..110]);
            for s in 0..8 {
                scales.push(d * (1 + 2 * ((sc[s / 2] >> (4 * (s % 2))) & 15) as u32) as f32);
            }
            for i in 0..64 {
                let gi = qs[i] as usize | (((qh[i / 8] >> (i % 8)) & 1) as usize) << 8;
                signed_entry(4, gi, signs[i / 2] >> (4 * (i % 2)), &mut codes[4 * i..4 * i + 4]);
            }
            32
        }
        BlockType::Iq1S => {
            let (d, qs) = (f16_at(b, 0), &b[2..34]);
            for ib in 0..8 {
                let h = u16_at(b, 34 + 2 * ib) as u32;
                // dl / 8: the codes are in eighths
                scales.push(d * (2 * ((h >> 12) & 7) + 1) as f32 * 0.125);
                let delta = if h & 0x8000 == 0 { 1 } else { -1 };
                for l in 0..4 {
                    let gi = qs[4 * ib + l] as usize | (((h >> (3 * l)) & 7) as usize) << 8;
                    iq1_group(gi, delta, &mut codes[32 * ib + 8 * l..32 * ib + 8 * l + 8]);
                }
            }
            32
        }
        BlockType::Iq1M => {
            let (qs, qh) = (&b[0..32], &b[32..48]);
            let s: [u32; 4] = std::array::from_fn(|k| u16_at(b, 48 + 2 * k) as u32);
            let bits = (s[0] >> 12) | ((s[1] >> 8) & 0xF0) | ((s[2] >> 4) & 0xF00) | (s[3] & 0xF000);
            let d = half::f16::from_bits(bits as u16).to_f32();
            for k in 0..16 {
                scales.push(d * (2 * ((s[k / 4] >> (3 * (k % 4))) & 7) + 1) as f32 * 0.125);
            }
            for i in 0..32 {
                let e = (qh[i / 2] >> (4 * (i % 2))) & 15;
                let delta = if e & 8 == 0 { 1 } else { -1 };
                iq1_group(qs[i] as usize | ((e & 7) as usize) << 8, delta, &mut codes[8 * i..8 * i + 8]);
            }
            16
        }
        _ => panic!("{} has no codebook", t.name()),
    }
}

/// IQ1's entry `gi` shifted by `delta` eighths, in eighths: `8 g + delta`.
fn iq1_group(gi: usize, delta: i8, out: &mut [i8]) {
    for (o, &g) in out.iter_mut().zip(&grid(5)[gi * 8..gi * 8 + 8]) {
        *o = 8 * g + delta;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fnv1a64(v: impl IntoIterator<Item = u8>) -> u64 {
        v.into_iter().fold(0xcbf29ce484222325, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    }

    #[test]
    fn grids_and_signs_are_gguf_py_s() {
        // tests/reference/make_iq_grids.py's sums of gguf-py 0.19's unpacked grids (each value
        // a signed byte, entry after entry) and of IQ2_XXS.ksigns
        let want = [
            0xbb4ee025b5ac6e8e_u64,
            0xc9b1ee61e79909bd,
            0x123edd38a3b62b90,
            0xdfa5dc83d6a155d5,
            0xfa37020c25b44829,
            0x6703ed863501ae2e,
        ];
        for (k, w) in want.into_iter().enumerate() {
            let g = grid(k);
            assert_eq!(g.len(), GRIDS[k].bytes * GRIDS[k].per_byte, "grid {k}");
            assert_eq!(fnv1a64(g.iter().map(|&v| v as u8)), w, "grid {k}");
        }
        assert_eq!(PACKED.len(), GRIDS.iter().map(|g| g.bytes).sum::<usize>());
        assert_eq!(fnv1a64((0..128).map(ksigns)), 0xf19ba8f8c3292ba5);
    }
}
