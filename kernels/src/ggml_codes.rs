//! ggml's quantized blocks as integer codes with a scale (and min) per sub-block: what a
//! lossless relayout into a moescope format copies, and what a matrix kept as the file's
//! blocks (`MatData::Blocks`) is decoded into before its products, so that `scale * code -
//! min` gives every value gguf-py's dequantizer gives, bit for bit.

use crate::ggml::BlockType;
use crate::isa::Isa;

/// Codes of a block of `t` with the scale and min of each run of `sub` codes (value =
/// `scale * code - min`; the symmetric types' mins are 0 and their codes signed, the
/// asymmetric types' codes unsigned); `None` for the float types.
pub fn block_codes(
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
                let (s, m) = crate::ggml::k_scale_min(sc, j);
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
            crate::ggml::dequantize(BlockType::Q6K, &unit, &mut v);
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
            let sub = crate::ggml::low_bit_codes(t, b, codes, scales, mins);
            // the symmetric types' mins are 0, one per scale as every type's
            mins.resize(scales.len(), 0.0);
            Some(sub)
        }
        BlockType::F32 | BlockType::F16 | BlockType::Bf16 => None,
    }
}

/// The q8 matrix a block type is computed as where a package keeps its blocks as they are
/// ([`crate::mat::MatData::Blocks`]): one scale per sub-block of `group` codes, and whether
/// value = `scale * code - min` (`true`) or `scale * code`. `None` for the types moescope keeps
/// in a format of its own (the float types, Q4_0, Q4_1, Q8_0, Q6_K, MXFP4).
pub fn blocks_run_as(t: BlockType) -> Option<(usize, bool)> {
    match t {
        BlockType::Q4K | BlockType::Q5K => Some((32, true)),
        BlockType::Q2K => Some((16, true)),
        BlockType::Q5_0 | BlockType::Iq4Nl | BlockType::Iq4Xs => Some((32, false)),
        BlockType::Iq2Xxs | BlockType::Iq3Xxs | BlockType::Iq3S | BlockType::Iq1S => Some((32, false)),
        BlockType::Q3K | BlockType::Iq2Xs | BlockType::Iq2S | BlockType::Iq1M => Some((16, false)),
        BlockType::F32
        | BlockType::F16
        | BlockType::Bf16
        | BlockType::Q4_0
        | BlockType::Q4_1
        | BlockType::Q8_0
        | BlockType::Q6K
        | BlockType::Mxfp4 => None,
    }
}

/// Whole rows of blocks of `t` (`raw`: `codes.len() / t.block()` blocks) as the q8 matrix
/// [`blocks_run_as`] names: codes, a scale per group and, where it has them, a min per group
/// (`mins` is left alone otherwise). The tier only picks how: every tier gives the same numbers.
///
/// # Panics
/// For a type [`blocks_run_as`] does not name, or spans that disagree (callers' bugs).
pub fn decode_blocks(t: BlockType, raw: &[u8], codes: &mut [i8], scales: &mut [f32], mins: &mut [f32], isa: Isa) {
    let Some((group, with_mins)) = blocks_run_as(t) else { panic!("{} is not kept as blocks", t.name()) };
    let (qk, per) = (t.block(), t.block() / group);
    assert!(raw.len() == t.bytes_of(codes.len()) && scales.len() * group == codes.len(), "{}: bad span", t.name());
    if matches!(t, BlockType::Q5_0 | BlockType::Iq4Nl) {
        return decode_32s(t, raw, codes, scales);
    }
    let (mut sc, mut mn) = (Vec::with_capacity(per), Vec::with_capacity(per));
    let mut unused = [0f32; 16];
    for (i, (b, c)) in raw.chunks_exact(t.block_bytes()).zip(codes.chunks_exact_mut(qk)).enumerate() {
        let s = &mut scales[i * per..(i + 1) * per];
        let m = if with_mins { &mut mins[i * per..(i + 1) * per] } else { &mut unused[..per] };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the Avx512 tier (F, BW, VL among its features) was detected on this CPU; a
        // whole block, its 256 codes and its sub-blocks' scales and mins
        if isa >= Isa::Avx512 && unsafe { crate::ggml_codes_avx512::decode_block(t, b, c, s, m) } {
            continue;
        }
        if decode_fast(t, b, c, s, m) {
            continue;
        }
        sc.clear();
        mn.clear();
        let sub = block_codes(t, b, c, &mut sc, &mut mn);
        debug_assert_eq!(sub, Some(group));
        s.copy_from_slice(&sc);
        m.copy_from_slice(&mn[..per]);
    }
}

/// Q5_0 and IQ4_NL blocks (32 values and one f16 `d` each) into codes and scales, the numbers
/// [`block_codes`] gives: the codes in loops over whole blocks, the scales widened 64 at a time
/// (`half`'s slice conversion takes F16C where the CPU has it). A call per block cost as much as
/// the q8 product the decoded rows then serve.
fn decode_32s(t: BlockType, raw: &[u8], codes: &mut [i8], scales: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let bb = t.block_bytes();
    let mut h = [half::f16::ZERO; 64];
    for ((bs, cs), ss) in raw.chunks(64 * bb).zip(codes.chunks_mut(64 * 32)).zip(scales.chunks_mut(64)) {
        for (j, (b, c)) in bs.chunks_exact(bb).zip(cs.chunks_exact_mut(32)).enumerate() {
            h[j] = half::f16::from_le_bytes([b[0], b[1]]);
            if t == BlockType::Iq4Nl {
                for l in 0..16 {
                    c[l] = crate::ggml::IQ4_VALUES[(b[2 + l] & 15) as usize];
                    c[l + 16] = crate::ggml::IQ4_VALUES[(b[2 + l] >> 4) as usize];
                }
            } else {
                // Q5_0: 32 high bits, then the low nibbles; codes q - 16
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for l in 0..16 {
                    let lo = (b[6 + l] & 15) as u32 | ((qh >> l) & 1) << 4;
                    let hi = (b[6 + l] >> 4) as u32 | ((qh >> (l + 16)) & 1) << 4;
                    c[l] = lo as i8 - 16;
                    c[l + 16] = hi as i8 - 16;
                }
            }
        }
        h[..ss.len()].convert_to_f32_slice(ss);
    }
}

/// One block of Q2_K, Q3_K, Q5_K or IQ4_XS decoded straight into its slices (`c`: the block's
/// codes, `sc` and `mn` a scale and min per sub-block): the numbers [`block_codes`] gives, in
/// loops over whole runs of 32 that the compiler vectorizes (a product decodes every block it
/// reads). False for the types it leaves to [`block_codes`].
fn decode_fast(t: BlockType, b: &[u8], c: &mut [i8], sc: &mut [f32], mn: &mut [f32]) -> bool {
    use crate::ggml::{IQ4_VALUES, f16_at, k_scale_min, q3_k_scale};
    match t {
        BlockType::Q2K => {
            let (s, qs, d, dmin) = (&b[0..16], &b[16..80], f16_at(b, 80), f16_at(b, 82));
            for j in 0..16 {
                sc[j] = d * (s[j] & 15) as f32;
                mn[j] = dmin * (s[j] >> 4) as f32;
            }
            // run j = 4h + k of 32 codes: bits 2k..2k+1 of bytes 32h..32h + 32
            for (j, run) in c.chunks_exact_mut(32).enumerate() {
                let (q, k) = (&qs[32 * (j / 4)..32 * (j / 4) + 32], 2 * (j % 4));
                for l in 0..32 {
                    run[l] = ((q[l] >> k) & 3) as i8;
                }
            }
        }
        BlockType::Q3K => {
            let (hmask, qs, s, d) = (&b[0..32], &b[32..96], &b[96..108], f16_at(b, 108));
            for j in 0..16 {
                sc[j] = d * (q3_k_scale(s, j) as i32 - 32) as f32;
            }
            // as Q2_K's runs, less 4 where run j's bit of the high mask is clear
            for (j, run) in c.chunks_exact_mut(32).enumerate() {
                let (q, k) = (&qs[32 * (j / 4)..32 * (j / 4) + 32], 2 * (j % 4));
                for l in 0..32 {
                    let low = ((hmask[l] >> j) & 1) ^ 1;
                    run[l] = ((q[l] >> k) & 3) as i8 - 4 * low as i8;
                }
            }
        }
        BlockType::Q5K => {
            let (d, dmin, s, qh, qs) = (f16_at(b, 0), f16_at(b, 2), &b[4..16], &b[16..48], &b[48..176]);
            for (j, run) in c.chunks_exact_mut(32).enumerate() {
                let (scale, min) = k_scale_min(s, j);
                sc[j] = d * scale as f32;
                mn[j] = dmin * min as f32;
                let (q, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
                for l in 0..32 {
                    run[l] = (((q[l] >> shift) & 15) | ((qh[l] >> j) & 1) << 4) as i8;
                }
            }
        }
        BlockType::Iq4Xs => {
            let (d, high, low) = (f16_at(b, 0), u16::from_le_bytes([b[2], b[3]]), &b[4..8]);
            for (j, run) in c.chunks_exact_mut(32).enumerate() {
                let ls = (low[j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4;
                sc[j] = d * (ls as i32 - 32) as f32;
                let q = &b[8 + 16 * j..24 + 16 * j];
                for l in 0..16 {
                    run[l] = IQ4_VALUES[(q[l] & 15) as usize];
                    run[l + 16] = IQ4_VALUES[(q[l] >> 4) as usize];
                }
            }
        }
        _ => return false,
    }
    true
}

/// The bits of a block's f16 scales (`d`, and `dmin` where the type has one; the second is the
/// first where it has not) for a type [`blocks_run_as`] names: a block's values are finite
/// exactly when these are (IQ1_M's `d` is the top nibbles of its four u16 scales).
pub fn block_halves(t: BlockType, b: &[u8]) -> [u16; 2] {
    let h = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    match t {
        BlockType::Q5K => [h(0), h(2)],
        BlockType::Q2K => [h(80), h(82)],
        BlockType::Q3K => [h(108); 2],
        BlockType::Iq1M => {
            let d = (0..4).fold(0u16, |d, k| d | (h(48 + 2 * k) >> 12) << (4 * k));
            [d; 2]
        }
        _ => [h(0); 2],
    }
}
