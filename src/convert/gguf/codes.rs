//! Each block of a raw span as codes, scales and mins (`moescope_kernels::ggml_codes`): what a
//! relayout into a moescope format (`exact::exact_format`) copies.

use moescope_kernels::ggml::BlockType;
use moescope_kernels::ggml_codes::block_codes;

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
