//! Each block of a raw span as codes, scales and mins (`moescope_kernels::ggml_codes`), and
//! rows of blocks relaid into a moescope format (`exact::exact_format`): codes into q4 / q6 / q8
//! rows with f32 scales (and mins), or the K-quants' k4 / k6 records. The blocks are a GGUF
//! file's (`source.rs`) or ones quantized at conversion (`requant_blocks.rs`).

use moescope_kernels::Format;
use moescope_kernels::ggml::BlockType;
use moescope_kernels::ggml_codes::block_codes;
use moescope_kernels::kscales::K4_RECORD;
use moescope_kernels::quant::{interleave_rows, put_q6};

use super::exact::exact_format;
use crate::package::layout::ScaleForm;

/// `f(codes, scales, mins, sub)` for each block of `raw` (whole blocks of type `t`, see
/// [`block_codes`]); false, having stopped, if `t` has no codes.
pub(super) fn each_block(t: BlockType, raw: &[u8], mut f: impl FnMut(&[i8], &[f32], &[f32], usize)) -> bool {
    let (mut codes, mut sc, mut mn) = (vec![0i8; t.block()], Vec::new(), Vec::new());
    for b in raw.chunks_exact(t.block_bytes()) {
        sc.clear();
        mn.clear();
        let Some(sub) = block_codes(t, b, &mut codes, &mut sc, &mut mn) else { return false };
        f(&codes, &sc, &mn, sub);
    }
    true
}

/// Whether rows of blocks of `t` are exactly rows in format `f` (with mins where `mins`): bf16
/// of BF16, MXFP4 of MXFP4, q4 group 32 of codes that fit 4 bits, q6 group 16 of Q6_K, q8 of a
/// group dividing the type's sub-block.
pub fn encodes_as(t: BlockType, f: Format, mins: bool) -> bool {
    let (exact, form) = exact_format(t);
    let asym_ok = mins || !form.asymmetric();
    match f {
        Format::Bf16 => t == BlockType::Bf16 && !mins,
        Format::Mxfp4 => t == BlockType::Mxfp4 && !mins,
        Format::Q4 { group: 32 } => exact == f && asym_ok,
        Format::Q6 { group: 16 } => t == BlockType::Q6K && !mins,
        Format::Q8 { group } => t.block() > 1 && exact.group().is_some_and(|g| g % group == 0) && asym_ok,
        _ => false,
    }
}

/// Rows of blocks `raw` (rows of `cols` values of type `t`) as format `f`'s values (in the
/// stored row order), f32 scales and mins: bit for bit the blocks' values. The caller checked
/// [`encodes_as`]; false where a block has no codes.
pub fn encode_blocks(
    t: BlockType,
    raw: &[u8],
    f: Format,
    cols: usize,
    vals: &mut Vec<u8>,
    scales: &mut Vec<f32>,
    mut mins: Option<&mut Vec<f32>>,
) -> bool {
    vals.clear();
    scales.clear();
    if let Some(m) = mins.as_deref_mut() {
        m.clear();
    }
    let asym = exact_format(t).1.asymmetric();
    let whole = match f {
        // moescope's bf16 and MXFP4 rows are the file's
        Format::Bf16 | Format::Mxfp4 => {
            vals.extend_from_slice(raw);
            true
        }
        // codes in [-8, 7] (Q4_0) or [0, 15] with mins (Q4_K, Q4_1; Q4_0 with mins 8 d)
        Format::Q4 { .. } => {
            // the stored nibble: the unsigned code, or the signed one + 8
            let bias = if asym { 0 } else { 8 };
            each_block(t, raw, |codes, sc, mn, sub| {
                debug_assert_eq!(sub, 32);
                for (g, run) in codes.chunks_exact(32).enumerate() {
                    let nib = |i: usize| (run[i] as i32 + bias) as u8;
                    vals.extend((0..16).map(|i| nib(i) | nib(i + 16) << 4));
                    scales.push(sc[g]);
                    if let Some(m) = mins.as_deref_mut() {
                        m.push(if asym { mn[g] } else { 8.0 * sc[g] });
                    }
                }
            })
        }
        // Q6_K's codes (q - 32 stored as q) into q6 rows, a row's chunks after the last's
        Format::Q6 { .. } => {
            vals.resize(f.data_bytes(raw.len() / t.block_bytes() * t.block() / cols.max(1), cols), 0);
            let mut at = 0;
            each_block(t, raw, |codes, sc, _, _| {
                for &c in codes {
                    put_q6(vals, at, (c as i32 + 32) as u8);
                    at += 1;
                }
                scales.extend_from_slice(sc);
            })
        }
        Format::Q8 { group } => each_block(t, raw, |codes, sc, mn, sub| {
            vals.extend(codes.iter().map(|&c| c as u8));
            for (x, y) in sc.iter().zip(mn) {
                scales.extend(std::iter::repeat_n(*x, sub / group));
                if let Some(m) = mins.as_deref_mut() {
                    m.extend(std::iter::repeat_n(*y, sub / group));
                }
            }
        }),
        Format::F32 => false,
    };
    let rows = raw.len() / t.block_bytes() * t.block() / cols.max(1);
    if whole && f.interleaves(rows, cols) {
        let (rb, cb) = (f.data_bytes(1, cols), f.chunk_bytes().unwrap_or(cols));
        let mut x4 = vec![0u8; vals.len()];
        interleave_rows(vals, rb, cb, &mut x4);
        *vals = x4;
    }
    whole
}

/// The k4 or k6 records of blocks `raw` (rows of `cols` values) of Q4_K or Q6_K, the f16 scales
/// of Q8_0 or Q4_0, or Q4_1's f16 scales and mins, each row's scales then its mins (`-m`, the
/// sign bit flipped: exact), into `out`: what [`ScaleForm::K4`], `K6`, `F16` and `F16Mins` keep.
pub fn records_of(t: BlockType, raw: &[u8], cols: usize, out: &mut Vec<u8>) {
    out.clear();
    let form = exact_format(t).1;
    if form == ScaleForm::F16Mins {
        // Q4_1: d, m, then the nibbles
        for row in raw.chunks_exact(t.bytes_of(cols)) {
            out.extend(row.chunks_exact(t.block_bytes()).flat_map(|b| [b[0], b[1]]));
            out.extend(row.chunks_exact(t.block_bytes()).flat_map(|b| [b[2], b[3] ^ 0x80]));
        }
        return;
    }
    for b in raw.chunks_exact(t.block_bytes()) {
        match form {
            // Q6_K: d (its last 2 bytes), then its 16 scales
            ScaleForm::K6 => {
                out.extend_from_slice(&b[208..210]);
                out.extend_from_slice(&b[192..208]);
            }
            // Q8_0, Q4_0: d, the block's first 2 bytes
            ScaleForm::F16 => out.extend_from_slice(&b[..2]),
            // Q4_K: its first 16 bytes, d, dmin and the packed scales and mins
            _ => out.extend_from_slice(&b[..K4_RECORD]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::gguf::exact::exact_format;
    use moescope_kernels::ggml::dequantize;

    /// A block of `t` with random bytes and f16 scales in [1/1024, 1024).
    fn random_block(t: BlockType, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut b: Vec<u8> = (0..t.block_bytes()).map(|_| next() as u8).collect();
        let at = match t {
            BlockType::Q6K => 208,
            BlockType::Q2K => 80,
            BlockType::Q3K => 108,
            _ => 0,
        };
        let d = half::f16::from_f32((next() % 20) as f32 / 10.0 - 1.0).to_f32().exp2()
            * if next() % 2 == 0 { 1.0 } else { -1.0 };
        b[at..at + 2].copy_from_slice(&half::f16::from_f32(d * 0.01).to_le_bytes());
        b
    }

    #[test]
    fn codes_scales_and_mins_give_the_dequantized_values() {
        for t in [
            BlockType::Q8_0,
            BlockType::Q4_0,
            BlockType::Q5_0,
            BlockType::Q6K,
            BlockType::Q4_1,
            BlockType::Q4K,
            BlockType::Q5K,
            BlockType::Q2K,
            BlockType::Q3K,
            BlockType::Iq4Nl,
            BlockType::Iq4Xs,
        ]
        .into_iter()
        .chain(moescope_kernels::ggml_iq::TYPES)
        {
            for seed in 0..50 {
                let mut b = random_block(t, seed);
                if matches!(t, BlockType::Q4K | BlockType::Q5K) {
                    b[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes()); // dmin
                }
                if t == BlockType::Q4_1 {
                    b[2..4].copy_from_slice(&half::f16::from_f32(-0.07).to_le_bytes()); // m
                }
                let mut want = vec![0f32; t.block()];
                dequantize(t, &b, &mut want);
                let (mut codes, mut scales, mut mins) = (vec![0i8; t.block()], vec![], vec![]);
                let sub = block_codes(t, &b, &mut codes, &mut scales, &mut mins).expect("quantized");
                let (f, form) = exact_format(t);
                let asym = form.asymmetric();
                assert_eq!(f.group(), Some(sub), "{}", t.name());
                for (j, w) in want.iter().enumerate() {
                    // ggml's two operations: scale * code, then - min (symmetric types: min 0)
                    let got = if asym {
                        scales[j / sub] * codes[j] as f32 - mins[j / sub]
                    } else {
                        scales[j / sub] * codes[j] as f32
                    };
                    assert_eq!(got.to_bits(), w.to_bits(), "{} seed {seed} value {j}: {got} != {w}", t.name());
                    if !asym {
                        assert_eq!(mins[j / sub], 0.0);
                    }
                }
            }
        }
        let mut c = vec![0i8; 256];
        for t in [BlockType::F16, BlockType::Bf16, BlockType::F32, BlockType::Mxfp4] {
            assert_eq!(
                block_codes(t, &vec![0; t.block_bytes()], &mut c, &mut vec![], &mut vec![]),
                None,
                "{}",
                t.name()
            );
        }
    }
}
