//! The codes, scales and mins of ggml's quantized blocks: what a lossless relayout into a
//! moescope format (`source::exact_format`) copies, so that `scale * code - min` gives
//! every value gguf-py's dequantizer gives, bit for bit.

use moescope_kernels::ggml::{BlockType, dequantize};

/// Codes of a block of `t` with the scale and min of each run of `sub` codes (value =
/// `scale * code - min`; the symmetric types' mins are 0 and their codes signed, the
/// asymmetric types' codes unsigned); `None` for the float types.
pub(super) fn block_codes(
    t: BlockType,
    b: &[u8],
    codes: &mut [i8],
    scales: &mut Vec<f32>,
    mins: &mut Vec<f32>,
) -> Option<usize> {
    let f16 = |at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    match t {
        // copied whole (`Format::Mxfp4` is ggml's block), never through codes
        BlockType::Mxfp4 => None,
        BlockType::Q8_0 => {
            scales.push(f16(0));
            mins.push(0.0);
            codes.iter_mut().zip(&b[2..34]).for_each(|(c, &q)| *c = q as i8);
            Some(32)
        }
        BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Q4_1 => {
            // Q4_1: d, m, then nibbles as Q4_0's; Q5_0: d, 32 high bits, nibbles
            let (qs, qh, bias) = match t {
                BlockType::Q4_0 => (&b[2..18], 0u32, 8),
                BlockType::Q5_0 => (&b[6..22], u32::from_le_bytes([b[2], b[3], b[4], b[5]]), 16),
                _ => (&b[4..20], 0u32, 0),
            };
            scales.push(f16(0));
            mins.push(if t == BlockType::Q4_1 { -f16(2) } else { 0.0 });
            for j in 0..16 {
                let lo = (qs[j] & 15) as u32 | ((qh >> j) & 1) << 4;
                let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                codes[j] = (lo as i32 - bias) as i8;
                codes[j + 16] = (hi as i32 - bias) as i8;
            }
            Some(32)
        }
        BlockType::Q4K | BlockType::Q5K => {
            let (d, dmin) = (f16(0), f16(2));
            let (sc, qh, qs) = if t == BlockType::Q4K {
                (&b[4..16], &b[0..0], &b[16..144])
            } else {
                (&b[4..16], &b[16..48], &b[48..176])
            };
            for j in 0..8 {
                let (s, m) = moescope_kernels::ggml::k_scale_min(sc, j);
                scales.push(d * s as f32);
                mins.push(dmin * m as f32);
                let (g, shift) = (j / 2, 4 * (j % 2));
                for l in 0..32 {
                    let hi = if qh.is_empty() { 0 } else { ((qh[l] >> j) & 1) << 4 };
                    codes[32 * j + l] = (((qs[32 * g + l] >> shift) & 15) | hi) as i8;
                }
            }
            Some(32)
        }
        BlockType::Q6K => {
            let d = f16(208);
            for s in 0..16 {
                scales.push(d * b[192 + s] as i8 as f32);
                mins.push(0.0);
            }
            // the codes are the dequantized values over their sub-block scale
            let mut v = [0f32; 256];
            let mut unit = b.to_vec();
            unit[192..208].iter_mut().for_each(|s| *s = 1);
            unit[208..210].copy_from_slice(&half::f16::ONE.to_le_bytes());
            dequantize(BlockType::Q6K, &unit, &mut v);
            codes.iter_mut().zip(&v).for_each(|(c, &x)| *c = x as i8);
            Some(16)
        }
        BlockType::Q2K
        | BlockType::Q3K
        | BlockType::Iq4Nl
        | BlockType::Iq4Xs
        | BlockType::Iq2Xxs
        | BlockType::Iq2Xs
        | BlockType::Iq2S
        | BlockType::Iq3Xxs
        | BlockType::Iq3S
        | BlockType::Iq1S
        | BlockType::Iq1M => {
            let sub = moescope_kernels::ggml::low_bit_codes(t, b, codes, scales, mins);
            // the symmetric types' mins are 0, one per scale as every type's
            mins.resize(scales.len(), 0.0);
            Some(sub)
        }
        BlockType::F32 | BlockType::F16 | BlockType::Bf16 => None,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::gguf::source::exact_format;

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
