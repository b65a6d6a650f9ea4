//! AVX-512 (BW) decoding of Q5_K blocks into codes, scales and mins: the numbers
//! `ggml_codes::block_codes` gives (each scale `d * sc` rounded once, as there), a whole block's
//! codes in a few shifts and masks of 64 bytes, so a product of a Q5_K matrix kept as blocks
//! spends little beside the q8 kernel it runs. (Q2_K, Q3_K and IQ4_XS are never decoded for
//! products: their integer block sums read the blocks, `mat/k23.rs`.)

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::ggml::{BlockType, f16_at, k_scale_min};

/// Block `b` of `t` decoded into `c` (256 codes), `sc` and `mn` (a scale and min per
/// sub-block; `mn` untouched for symmetric types); false for a type it does not decode.
///
/// # Safety
/// The CPU must have AVX-512F and BW; `b` is a whole block, `c` 256 codes, `sc` and `mn` room
/// for the type's sub-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn decode_block(t: BlockType, b: &[u8], c: &mut [i8], sc: &mut [f32], mn: &mut [f32]) -> bool {
    debug_assert!(b.len() >= t.block_bytes() && c.len() >= 256);
    let (bp, cp) = (b.as_ptr(), c.as_mut_ptr());
    // SAFETY (all blocks below): loads within the block's bytes, stores within the 256 codes and
    // the sub-blocks' scales and mins, as the caller promises
    unsafe {
        match t {
            BlockType::Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..8 {
                    let (s, m) = k_scale_min(&b[4..16], j);
                    sc[j] = d * s as f32;
                    mn[j] = dmin * m as f32;
                }
                let (nib, one) = (_mm512_set1_epi8(15), _mm512_set1_epi8(1));
                let qh = _mm256_loadu_si256(bp.add(16) as *const __m256i);
                for half in 0..2 {
                    // bytes of groups 2 half (runs 4 half, + 1) and 2 half + 1 (runs + 2, + 3); their
                    // high bits: bits 4 half, + 1 of qh, and + 2, + 3
                    let q = _mm512_loadu_si512(bp.add(48 + 64 * half) as *const _);
                    let sh = |n: i32| _mm256_srl_epi16(qh, _mm_cvtsi32_si128(n));
                    let h =
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(sh(4 * half as i32)), sh(4 * half as i32 + 2));
                    let hi_bit = |h: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(h, one));
                    let lo = _mm512_or_si512(_mm512_and_si512(q, nib), hi_bit(h));
                    let hi = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib),
                        hi_bit(_mm512_srli_epi16::<1>(h)),
                    );
                    let run = |j: usize| cp.add(32 * (4 * half + j)) as *mut __m256i;
                    _mm256_storeu_si256(run(0), _mm512_castsi512_si256(lo));
                    _mm256_storeu_si256(run(2), _mm512_extracti64x4_epi64::<1>(lo));
                    _mm256_storeu_si256(run(1), _mm512_castsi512_si256(hi));
                    _mm256_storeu_si256(run(3), _mm512_extracti64x4_epi64::<1>(hi));
                }
            }
            _ => return false,
        }
    }
    true
}
