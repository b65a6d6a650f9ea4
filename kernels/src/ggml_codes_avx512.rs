//! AVX-512 (BW) decoding of Q2_K, Q3_K, Q5_K and IQ4_XS blocks into codes, scales and mins:
//! the numbers `ggml_codes::block_codes` gives (each scale `d * sc` rounded once, as there), a
//! whole block's codes in a few shifts, masks and shuffles of 64 bytes, so a product of a matrix
//! kept as blocks spends little beside the q8 kernel it runs.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::ggml::{BlockType, IQ4_VALUES, f16_at, k_scale_min, q3_k_scale_bytes};

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
            BlockType::Q2K => {
                // 16 bytes: scale in the low nibble, min in the high one
                let s = _mm512_cvtepu8_epi32(_mm_loadu_si128(bp as *const __m128i));
                let low = _mm512_cvtepi32_ps(_mm512_and_si512(s, _mm512_set1_epi32(15)));
                let high = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(s));
                _mm512_storeu_ps(sc.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(f16_at(b, 80)), low));
                _mm512_storeu_ps(mn.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(f16_at(b, 82)), high));
                two_bit_runs(_mm512_loadu_si512(bp.add(16) as *const _), None, cp);
            }
            BlockType::Q3K => {
                // the 16 six-bit scales a lane each
                let [first, second] = q3_k_scale_bytes(&b[96..108]);
                let s = _mm512_cvtepu8_epi32(_mm_set_epi64x(second as i64, first as i64));
                let s = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_set1_epi32(32)));
                _mm512_storeu_ps(sc.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(f16_at(b, 108)), s));
                // run j's high bit is bit j of its byte of the mask: bytes 0..32 for runs 0..3,
                // the same bytes shifted by 4 for runs 4..7
                let hm = _mm256_loadu_si256(bp as *const __m256i);
                let hm = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hm), _mm256_srli_epi16::<4>(hm));
                two_bit_runs(_mm512_loadu_si512(bp.add(32) as *const _), Some(hm), cp);
            }
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
            BlockType::Iq4Xs => {
                let (d, high) = (f16_at(b, 0), u16::from_le_bytes([b[2], b[3]]));
                for j in 0..8 {
                    let ls = (b[4 + j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4;
                    sc[j] = d * (ls as i32 - 32) as f32;
                }
                let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i));
                let nib = _mm512_set1_epi8(15);
                for half in 0..2 {
                    // four sub-blocks of 16 bytes, one per 128-bit lane: run i is lane i's low
                    // nibbles' values, then its high nibbles'
                    let q = _mm512_loadu_si512(bp.add(8 + 64 * half) as *const _);
                    let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(q, nib));
                    let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib));
                    let first = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi);
                    let second = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi);
                    _mm512_storeu_si512(cp.add(128 * half) as *mut _, first);
                    _mm512_storeu_si512(cp.add(128 * half + 64) as *mut _, second);
                }
            }
            _ => return false,
        }
    }
    true
}

/// The 256 two-bit codes of Q2_K / Q3_K (`qs`: the 64 code bytes; run `4h + k` of 32 is bits
/// `2k..2k+1` of bytes `32h..32h + 32`) into `c`, less 4 where `high` (Q3_K's mask, arranged
/// as run `k`'s bit `k` in bytes 0..32 and run `4 + k`'s in bytes 32..64) has the run's bit clear.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn two_bit_runs(qs: __m512i, high: Option<__m512i>, c: *mut i8) {
    let (three, four) = (_mm512_set1_epi8(3), _mm512_set1_epi8(4));
    for k in 0..4 {
        let mut v = _mm512_and_si512(_mm512_srl_epi16(qs, _mm_cvtsi32_si128(2 * k)), three);
        if let Some(h) = high {
            let set = _mm512_test_epi8_mask(h, _mm512_set1_epi8(1 << k));
            v = _mm512_mask_sub_epi8(v, !set, v, four);
        }
        // SAFETY: runs k and 4 + k of the caller's 256 codes
        unsafe {
            _mm256_storeu_si256(c.add(32 * k as usize) as *mut __m256i, _mm512_castsi512_si256(v));
            _mm256_storeu_si256(c.add(32 * (4 + k as usize)) as *mut __m256i, _mm512_extracti64x4_epi64::<1>(v));
        }
    }
}
