//! The AVX2 form of `k23.rs` (Q2_K, Q3_K, Q4_K and IQ4_XS blocks against activations quantized per 256): the
//! AVX-512 kernel's 64-byte code vectors as two 32-byte halves, whose i32 lanes are that
//! kernel's lanes 0..8 and 8..16, the same integer sums (`vpmaddubsw`, then `vpmaddwd` with the
//! scales, or with ones where Q2_K's codes already carry them), the same float operations lane
//! for lane, so the same bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::k23::K23_GROUP;
use crate::act::QuantAct;
use crate::ggml::{BlockType, IQ4_VALUES, f16_at, k_scale_min, q3_k_scale_bytes};

/// Tokens a block's decoded codes serve at a time.
const TOKENS: usize = 4;

/// The tiles' block types.
const Q2K: u8 = 0;
const Q3K: u8 = 1;
const IQ4XS: u8 = 2;
const Q4K: u8 = 3;

/// A block decoded: code vector `k`'s halves at `2k` and `2k + 1` (Q2_K: times their scales),
/// the scale of each i16 lane of each half (Q3_K, Q4_K, IQ4_XS), the mins' weights, and the two
/// factors.
struct Block {
    codes: [__m256i; 8],
    scales: [__m256i; 8],
    /// IQ4_XS: the signed codes, whose magnitudes are `codes`
    signs: [__m256i; 8],
    mins: __m256i,
    d: f32,
    dm: f32,
}

impl Block {
    /// A block of zero vectors with factors `d` and `dm`, for a decoder to fill.
    #[inline(always)]
    fn zero(d: f32, dm: f32) -> Block {
        // SAFETY: all-zero bits are a valid vector
        let z: __m256i = unsafe { std::mem::zeroed() };
        Block { codes: [z; 8], scales: [z; 8], signs: [z; 8], mins: z, d, dm }
    }
}

/// Block `b` of `t`, for callers with AVX2 enabled.
///
/// # Safety
/// AVX2; `b` is a whole block.
#[inline(always)]
unsafe fn decode(t: BlockType, b: &[u8]) -> Block {
    let bp = b.as_ptr();
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        if t == BlockType::Iq4Xs {
            return decode_iq4_xs(b);
        }
        if t == BlockType::Q4K {
            return decode_q4_k(b);
        }
        let three = _mm256_set1_epi8(3);
        let q2 = t == BlockType::Q2K;
        let (at, sc) = if q2 {
            (16, std::array::from_fn(|j| (b[j] & 15) as i16))
        } else {
            let [x, y] = q3_k_scale_bytes(&b[96..108]);
            let bytes: Vec<u8> = x.to_le_bytes().into_iter().chain(y.to_le_bytes()).collect();
            (32, std::array::from_fn::<i16, 16, _>(|j| bytes[j] as i16 - 32))
        };
        let mins: [i16; 16] = std::array::from_fn(|j| if q2 { (b[j] >> 4) as i16 } else { 4 * sc[j] });
        let hm = _mm256_loadu_si256(bp as *const __m256i);
        let mut codes = [_mm256_setzero_si256(); 8];
        let mut scales = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let qs = _mm256_loadu_si256(bp.add(at + 32 * h) as *const __m256i);
            for k in 0..4 {
                let mut c = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * k as i32)), three);
                // the sub-blocks of this half's two 128-bit lanes
                let (s0, s1) = (sc[8 * h + 2 * k], sc[8 * h + 2 * k + 1]);
                if q2 {
                    // code c's value c * s by a table per 128-bit lane, as the AVX-512 kernel
                    let table = |s: i16| {
                        _mm_setr_epi8(0, s as i8, 2 * s as i8, 3 * s as i8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
                    };
                    c = _mm256_shuffle_epi8(_mm256_setr_m128i(table(s0), table(s1)), c);
                } else {
                    // the high bit (bit 4h + k of the mask byte) set: code + 4
                    let hb = _mm256_and_si256(
                        _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + k) as i32)),
                        _mm256_set1_epi8(1),
                    );
                    c = _mm256_add_epi8(c, _mm256_slli_epi16::<2>(hb));
                    scales[2 * k + h] = _mm256_setr_m128i(_mm_set1_epi16(s0), _mm_set1_epi16(s1));
                }
                codes[2 * k + h] = c;
            }
        }
        let (d, dm) = if q2 { (f16_at(b, 80), f16_at(b, 82)) } else { (f16_at(b, 108), f16_at(b, 108)) };
        let mins = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
        Block { codes, scales, signs: [_mm256_setzero_si256(); 8], mins, d, dm }
    }
}

/// An IQ4_XS block: half `h` of code vector `k` is sub-block `2k + h`, its 16 low nibbles'
/// values then its 16 high ones', as magnitudes and signed values, with its scale.
///
/// # Safety
/// As [`decode`].
#[inline(always)]
unsafe fn decode_iq4_xs(b: &[u8]) -> Block {
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        let table = _mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i);
        let nib = _mm_set1_epi8(15);
        let high = u16::from_le_bytes([b[2], b[3]]);
        let mut blk = Block::zero(f16_at(b, 0), f16_at(b, 0));
        for j in 0..8 {
            let q = _mm_loadu_si128(b.as_ptr().add(8 + 16 * j) as *const __m128i);
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, nib));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), nib));
            let v = _mm256_setr_m128i(lo, hi);
            blk.signs[j] = v;
            blk.codes[j] = _mm256_sign_epi8(v, v);
            let ls = (b[4 + j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4;
            blk.scales[j] = _mm256_set1_epi16(ls as i16 - 32);
        }
        blk
    }
}

/// A Q4_K block: half `h` of code vector `k` is sub-block `2k + h` of 32, the low nibbles of
/// bytes `16 + 32k..` (h = 0) or their high ones, with its scale; its min for both its 16s.
///
/// # Safety
/// As [`decode`].
#[inline(always)]
unsafe fn decode_q4_k(b: &[u8]) -> Block {
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        let mut blk = Block::zero(f16_at(b, 0), f16_at(b, 2));
        let mut mins = [0i16; 16];
        for j in 0..8 {
            let (sc, m) = k_scale_min(&b[4..16], j);
            let q = _mm256_loadu_si256(b.as_ptr().add(16 + 32 * (j / 2)) as *const __m256i);
            let shifted = _mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (j % 2) as i32));
            blk.codes[j] = _mm256_and_si256(shifted, _mm256_set1_epi8(15));
            blk.scales[j] = _mm256_set1_epi16(sc as i16);
            (mins[2 * j], mins[2 * j + 1]) = (m as i16, m as i16);
        }
        blk.mins = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
        blk
    }
}

/// `k23::matmul_rows` at the AVX2 tier (arguments as the AVX-512 kernel's).
///
/// # Safety
/// AVX2 and FMA detected; spans as the AVX-512 kernel's.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matmul_rows(
    t: BlockType,
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    (perm, sums): (&[i8], &[i16]),
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    debug_assert!(perm.len() >= n * cols && sums.len() >= n * cols / 16 && out.len() >= rows.len() * n);
    let rb = t.bytes_of(cols);
    for (i, r) in rows.enumerate() {
        let row = &q[r * rb..(r + 1) * rb];
        let o = &mut out[i * n..(i + 1) * n];
        let mut t0 = 0;
        while t0 < n {
            let w = if n - t0 >= TOKENS { TOKENS } else { 1 };
            let (sp, o) = ((a, perm, sums), &mut o[t0..t0 + w]);
            // SAFETY: as the caller promises, for tokens t0..t0 + w
            unsafe {
                match (w, t) {
                    (TOKENS, BlockType::Q2K) => tile::<TOKENS, Q2K>(t, row, cols, sp, t0, o),
                    (TOKENS, BlockType::Q3K) => tile::<TOKENS, Q3K>(t, row, cols, sp, t0, o),
                    (TOKENS, BlockType::Q4K) => tile::<TOKENS, Q4K>(t, row, cols, sp, t0, o),
                    (TOKENS, _) => tile::<TOKENS, IQ4XS>(t, row, cols, sp, t0, o),
                    (_, BlockType::Q2K) => tile::<1, Q2K>(t, row, cols, sp, t0, o),
                    (_, BlockType::Q3K) => tile::<1, Q3K>(t, row, cols, sp, t0, o),
                    (_, BlockType::Q4K) => tile::<1, Q4K>(t, row, cols, sp, t0, o),
                    (_, _) => tile::<1, IQ4XS>(t, row, cols, sp, t0, o),
                }
            }
            t0 += w;
        }
    }
}

/// One row's products with tokens `t0..t0 + T`.
///
/// # Safety
/// As [`matmul_rows`]; `o` has `T` products.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const T: usize, const KIND: u8>(
    t: BlockType,
    row: &[u8],
    cols: usize,
    (a, perm, sums): (&QuantAct, &[i8], &[i16]),
    t0: usize,
    o: &mut [f32],
) {
    let (nb, bb) = (cols / K23_GROUP, t.block_bytes());
    let mut acc = [0f32; T];
    let ones = _mm256_set1_epi16(1);
    for b in 0..nb {
        // SAFETY: block b of the row; the tokens' codes and sums within the caller's spans
        unsafe {
            let blk = decode(t, &row[b * bb..(b + 1) * bb]);
            for tt in 0..T {
                let tok = t0 + tt;
                let at = perm.as_ptr().add(tok * cols + K23_GROUP * b);
                let mut s = _mm256_setzero_si256();
                for (v, c) in blk.codes.iter().enumerate() {
                    let mut av = _mm256_loadu_si256(at.add(32 * v) as *const __m256i);
                    if KIND == IQ4XS {
                        // the activations with the codes' signs, against their magnitudes
                        av = _mm256_sign_epi8(av, blk.signs[v]);
                    }
                    let pairs = _mm256_maddubs_epi16(*c, av);
                    let w = if KIND == Q2K { ones } else { blk.scales[v] };
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(pairs, w));
                }
                let scale = *a.scales.get_unchecked(tok * nb + b);
                let bs = _mm256_loadu_si256(sums.as_ptr().add(tok * cols / 16 + 16 * b) as *const __m256i);
                let mins = sum_i32x8(_mm256_madd_epi16(bs, blk.mins));
                let mut sum = sum_i32x8(s);
                // `k23::dot_scalar`'s operations (Q2_K and Q4_K: mins of their own factor)
                let own_mins = KIND == Q2K || KIND == Q4K;
                if !own_mins {
                    sum -= mins;
                }
                acc[tt] += sum as f32 * (blk.d * scale);
                if own_mins {
                    acc[tt] -= mins as f32 * (blk.dm * scale);
                }
            }
        }
    }
    o.copy_from_slice(&acc);
}

/// The sum of a vector's 8 i32 lanes (exact, so in any order).
#[inline(always)]
pub(super) unsafe fn sum_i32x8(v: __m256i) -> i32 {
    // SAFETY: the caller's features (AVX2)
    unsafe {
        let a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let b = _mm_add_epi32(a, _mm_shuffle_epi32::<0b01_00_11_10>(a));
        _mm_cvtsi128_si32(_mm_add_epi32(b, _mm_shuffle_epi32::<0b10_11_00_01>(b)))
    }
}
