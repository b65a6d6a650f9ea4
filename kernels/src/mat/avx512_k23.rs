//! The vector form of `k23.rs` (Q2_K, Q3_K, Q4_K and IQ4_XS blocks against activations
//! quantized per 256): a block's codes become four 64-byte vectors (shifts and masks, Q3_K's high
//! bits by a byte-mask test), each multiplied with the token's matching activation bytes
//! (Q2_K: the codes already times their scales through a table per sub-block, `vpdpbusd`;
//! the others: `vpmaddubsw`, then the sub-blocks' scales by `vpdpwssd`), the four summed in 16 i32
//! lanes; the mins' (offsets') term from the token's sums per 16 (`vpmaddwd`, 8 lanes). Floats as
//! `k23.rs` has them, lane for lane, so the same bits. A block's codes and scales serve up to
//! eight tokens at a time.

use std::arch::x86_64::*;
use std::ops::Range;

use super::k23::K23_GROUP;
use crate::act::QuantAct;
use crate::ggml::{BlockType, IQ4_VALUES, f16_at, q3_k_scale_bytes};

/// Tokens a block's decoded codes serve at a time.
const TOKENS: usize = 8;

/// The tiles' block types.
pub(super) const Q2K: u8 = 0;
pub(super) const Q3K: u8 = 1;
pub(super) const IQ4XS: u8 = 2;
pub(super) const Q4K: u8 = 3;

/// A block decoded for the products: four code vectors, the scale of each i16 lane of each
/// (its sub-block's), the 16 mins' weights as i16, and the two factors.
pub(super) struct Block {
    /// Q2_K: each code times its sub-block's scale (at most 45, a u8 for `vpdpbusd`); Q3_K: the
    /// codes + 4, their scales in `scales`
    pub codes: [__m512i; 4],
    pub scales: [__m512i; 4],
    /// IQ4_XS: the codes' signs (their magnitudes in `codes`, as `vpmaddubsw` takes them)
    pub neg: [__mmask64; 4],
    pub mins: __m256i,
    pub d: f32,
    pub dm: f32,
}

/// Block `b` of `t`. Always inlined into its callers (the tiles, which enable the features its
/// intrinsics need): out of line it returned its nine vectors through memory, and decode ran
/// at 0.055 ns a value for the inlined 0.032.
///
/// # Safety
/// AVX-512 F, BW and VL; `b` points at a whole block; `lanes` from [`scale_lanes`].
#[inline(always)]
pub(super) unsafe fn decode(t: BlockType, b: &[u8], lanes: &[__m512i; 12]) -> Block {
    let bp = b.as_ptr();
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        if t == BlockType::Iq4Xs {
            return decode_iq4_xs(b, lanes);
        }
        if t == BlockType::Q4K {
            return decode_q4_k(b, lanes);
        }
        let three = _mm512_set1_epi8(3);
        let (qs, sc, mins, d, dm) = if t == BlockType::Q2K {
            let s = _mm_loadu_si128(bp as *const __m128i);
            let nib = _mm_set1_epi8(15);
            let sc = _mm256_cvtepu8_epi16(_mm_and_si128(s, nib));
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(s), nib));
            (_mm512_loadu_si512(bp.add(16) as *const _), sc, mins, f16_at(b, 80), f16_at(b, 82))
        } else {
            // the 6-bit scales, less 32
            let [first, second] = q3_k_scale_bytes(&b[96..108]);
            let s = _mm256_cvtepu8_epi16(_mm_set_epi64x(second as i64, first as i64));
            let sc = _mm256_sub_epi16(s, _mm256_set1_epi16(32));
            let d = f16_at(b, 108);
            (_mm512_loadu_si512(bp.add(32) as *const _), sc, _mm256_slli_epi16::<2>(sc), d, d)
        };
        let mut codes = [_mm512_setzero_si512(); 4];
        let high = (t == BlockType::Q3K).then(|| {
            let hm = _mm256_loadu_si256(bp as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hm), _mm256_srli_epi16::<4>(hm))
        });
        for (k, c) in codes.iter_mut().enumerate() {
            *c = _mm512_and_si512(_mm512_srl_epi16(qs, _mm_cvtsi32_si128(2 * k as i32)), three);
            if let Some(h) = high {
                let set = _mm512_test_epi8_mask(h, _mm512_set1_epi8(1 << k));
                *c = _mm512_mask_add_epi8(*c, set, *c, _mm512_set1_epi8(4));
            }
        }
        if t == BlockType::Q2K {
            // a table per 128-bit lane (one sub-block each: `sub_lanes`) of code c's value
            // c * s = (c & 1) s + (c & 2) s, looked up by the codes
            let s = _mm512_broadcast_i32x4(_mm_and_si128(_mm_loadu_si128(bp as *const __m128i), _mm_set1_epi8(15)));
            let (one, two) = (_mm512_set1_epi32(0x0000_FF00), _mm512_set1_epi32(0x0000_FFFF_u32 as i32));
            let (one, two) = (_mm512_or_si512(one, _mm512_slli_epi32::<16>(one)), _mm512_slli_epi32::<16>(two));
            for (k, c) in codes.iter_mut().enumerate() {
                let sk = _mm512_shuffle_epi8(s, lanes[4 + k]);
                let table = _mm512_add_epi8(_mm512_and_si512(sk, one), _mm512_and_si512(_mm512_add_epi8(sk, sk), two));
                *c = _mm512_shuffle_epi8(table, *c);
            }
            return Block { codes, scales: [_mm512_setzero_si512(); 4], neg: [0; 4], mins, d, dm };
        }
        let sc = _mm512_zextsi256_si512(sc);
        let scales = std::array::from_fn(|k| _mm512_permutexvar_epi16(lanes[k], sc));
        Block { codes, scales, neg: [0; 4], mins, d, dm }
    }
}

/// An IQ4_XS block: its codebook values in order (vector k: sub-blocks 2k and 2k + 1), as
/// magnitudes and signs, and the scale of each i16 lane.
///
/// # Safety
/// As [`decode`].
#[inline(always)]
unsafe fn decode_iq4_xs(b: &[u8], lanes: &[__m512i; 12]) -> Block {
    let bp = b.as_ptr();
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i));
        let nib = _mm512_set1_epi8(15);
        let mut codes = [_mm512_setzero_si512(); 4];
        for half in 0..2 {
            // four sub-blocks of 16 bytes, one per 128-bit lane: sub-block i is lane i's low
            // nibbles' values, then its high nibbles'
            let q = _mm512_loadu_si512(bp.add(8 + 64 * half) as *const _);
            let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(q, nib));
            let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), nib));
            codes[2 * half] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi);
            codes[2 * half + 1] = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi);
        }
        let neg = std::array::from_fn(|k| _mm512_movepi8_mask(codes[k]));
        let codes = codes.map(|c| _mm512_abs_epi8(c));
        let high = u16::from_le_bytes([b[2], b[3]]);
        let sc: [i16; 16] = std::array::from_fn(|g| {
            let j = g / 2;
            ((b[4 + j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4) as i16 - 32
        });
        let sc = _mm512_zextsi256_si512(_mm256_loadu_si256(sc.as_ptr() as *const __m256i));
        let scales = std::array::from_fn(|k| _mm512_permutexvar_epi16(lanes[8 + k], sc));
        let d = f16_at(b, 0);
        Block { codes, scales, neg, mins: _mm256_setzero_si256(), d, dm: d }
    }
}

/// Byte indices `j / 2` (at 0) and `8 + j / 2` (at 16): each of a k4 record's eight scales (or
/// mins) twice, one per 16 values.
const TWICE: [u8; 32] =
    [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15];

/// A Q4_K block: its codes in order (vector k: the low nibbles of bytes `16 + 32k..`, then
/// their high ones), the scale of each i16 lane, each sub-block's min for both its 16s.
///
/// # Safety
/// As [`decode`].
#[inline(always)]
unsafe fn decode_q4_k(b: &[u8], lanes: &[__m512i; 12]) -> Block {
    let bp = b.as_ptr();
    // SAFETY: the caller's features; loads within the block's bytes
    unsafe {
        let nib = _mm512_set1_epi8(15);
        let mut codes = [_mm512_setzero_si512(); 4];
        for (k, c) in codes.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(bp.add(16 + 32 * k) as *const __m256i);
            *c = _mm512_and_si512(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi16::<4>(x)), nib);
        }
        // [sc0..8, m0..8] as bytes, each twice (one per 16 values), widened to i16
        let sm = super::avx512_records::k4_codes(bp);
        let twice = |at: usize| _mm_loadu_si128(TWICE[at..].as_ptr() as *const __m128i);
        let sc = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, twice(0))));
        let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, twice(16)));
        let scales = std::array::from_fn(|k| _mm512_permutexvar_epi16(lanes[8 + k], sc));
        Block { codes, scales, neg: [0; 4], mins, d: f16_at(b, 0), dm: f16_at(b, 2) }
    }
}

/// Indices of the scales per 16 values: for code vector `k`, at 0..4 those of each i16 lane `p`
/// (`value_at(k, 2p) / 16`, for `vpermw`), at 4..8 those of each byte of each 128-bit lane `q`
/// (one a lane: `value_at(k, 16q) / 16`, for `vpshufb`), at 8..12 those of each i16 lane of
/// vectors of values in order (IQ4_XS, Q4_K).
#[target_feature(enable = "avx512f")]
pub(super) fn scale_lanes() -> [__m512i; 12] {
    std::array::from_fn(|i| {
        let k = i % 4;
        let idx: [i16; 32] = if i < 4 {
            std::array::from_fn(|p| (8 * (p / 16) + 2 * k + (p % 16) / 8) as i16)
        } else if i >= 8 {
            std::array::from_fn(|p| (4 * k + p / 8) as i16)
        } else {
            // two bytes of the same index per i16
            std::array::from_fn(|p| {
                let q = p / 8;
                let j = (8 * (q / 2) + 2 * k + q % 2) as i16;
                j | j << 8
            })
        };
        // SAFETY: 64 bytes read from a 64-byte array
        unsafe { _mm512_loadu_si512(idx.as_ptr() as *const _) }
    })
}

/// `k23::matmul_rows` at the AVX-512 tier: `perm` the tokens' codes with each block's 256 in
/// the code vectors' byte order (`k23::value_at`), `sums` their sums per 16 codes.
///
/// # Safety
/// AVX-512 F, BW and VL; `q` holds the rows of `t`'s blocks, `a` `n` tokens quantized in groups
/// of 256, `perm` and `sums` made from them, `out` `rows.len() * n` products.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
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
    let lanes = scale_lanes();
    let rb = t.bytes_of(cols);
    for (i, r) in rows.enumerate() {
        let row = &q[r * rb..(r + 1) * rb];
        let o = &mut out[i * n..(i + 1) * n];
        // SAFETY (each): as the caller promises, for the row's tokens
        unsafe {
            let sp = (a, perm, sums);
            match t {
                BlockType::Q2K => tiles::<Q2K>(t, row, cols, sp, &lanes, o),
                BlockType::Q3K => tiles::<Q3K>(t, row, cols, sp, &lanes, o),
                BlockType::Q4K => tiles::<Q4K>(t, row, cols, sp, &lanes, o),
                _ => tiles::<IQ4XS>(t, row, cols, sp, &lanes, o),
            }
        }
    }
}

/// One row's products with all its tokens (`o`), in tiles of 8, 4, 2 or 1.
///
/// # Safety
/// As [`matmul_rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tiles<const KIND: u8>(
    t: BlockType,
    row: &[u8],
    cols: usize,
    sp: (&QuantAct, &[i8], &[i16]),
    lanes: &[__m512i; 12],
    o: &mut [f32],
) {
    let mut t0 = 0;
    while t0 < o.len() {
        let left = o.len() - t0;
        // SAFETY: tokens t0..t0 + w of the caller's
        unsafe {
            let w = match left {
                TOKENS.. => tile::<TOKENS, KIND>(t, row, cols, sp, t0, lanes, &mut o[t0..t0 + TOKENS]),
                4.. => tile::<4, KIND>(t, row, cols, sp, t0, lanes, &mut o[t0..t0 + 4]),
                2.. => tile::<2, KIND>(t, row, cols, sp, t0, lanes, &mut o[t0..t0 + 2]),
                _ => tile::<1, KIND>(t, row, cols, sp, t0, lanes, &mut o[t0..t0 + 1]),
            };
            t0 += w;
        }
    }
}

/// One row's products with tokens `t0..t0 + T`, each block decoded once for the `T`; returns `T`.
///
/// # Safety
/// As [`matmul_rows`]; `o` has `T` products.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const T: usize, const KIND: u8>(
    t: BlockType,
    row: &[u8],
    cols: usize,
    (a, perm, sums): (&QuantAct, &[i8], &[i16]),
    t0: usize,
    lanes: &[__m512i; 12],
    o: &mut [f32],
) -> usize {
    let (nb, bb) = (cols / K23_GROUP, t.block_bytes());
    let mut acc = [0f32; T];
    for b in 0..nb {
        // SAFETY: block b of the row; the tokens' codes and sums within the caller's spans
        unsafe {
            let blk = decode(t, &row[b * bb..(b + 1) * bb], lanes);
            for tt in 0..T {
                let tok = t0 + tt;
                let at = perm.as_ptr().add(tok * cols + K23_GROUP * b);
                let bs = sums.as_ptr().add(tok * cols / 16 + 16 * b);
                let (s, m) = block_sums::<KIND>(&blk, &load4(at), bs);
                // both sums at once: [s's 8 lane pairs, m] -> [s, m, s, m]
                let x = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
                let h = _mm256_hadd_epi32(x, m);
                let h = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                let h = _mm_hadd_epi32(h, h);
                let scale = *a.scales.get_unchecked(tok * nb + b);
                // `k23::dot_scalar`'s operations
                acc[tt] += _mm_cvtsi128_si32(h) as f32 * (blk.d * scale);
                if KIND == Q2K || KIND == Q4K {
                    acc[tt] -= _mm_extract_epi32::<1>(h) as f32 * (blk.dm * scale);
                }
            }
        }
    }
    o.copy_from_slice(&acc);
    T
}

/// Four 64-byte vectors from `p` on.
///
/// # Safety
/// AVX-512 F; 256 bytes at `p`.
#[inline(always)]
pub(super) unsafe fn load4(p: *const i8) -> [__m512i; 4] {
    // SAFETY: the caller's features
    let mut v = [unsafe { _mm512_setzero_si512() }; 4];
    for (k, x) in v.iter_mut().enumerate() {
        // SAFETY: the caller's features and bytes
        *x = unsafe { _mm512_loadu_si512(p.add(64 * k) as *const _) };
    }
    v
}

/// A decoded block's integer sums with one token: the codes' 16 lanes (Q3_K's offsets taken
/// from them) and the mins' 8 lanes (Q2_K, Q4_K; Q3_K the offsets; IQ4_XS zero). `av` the token's
/// four code vectors of the block, `bs` its 16 sums.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI; `bs` points at 16 i16.
#[inline(always)]
pub(super) unsafe fn block_sums<const KIND: u8>(blk: &Block, av: &[__m512i; 4], bs: *const i16) -> (__m512i, __m256i) {
    // SAFETY: the caller's features; 16 sums at `bs`
    unsafe {
        let mut s = _mm512_setzero_si512();
        for k in 0..4 {
            s = match KIND {
                // the codes already times their scales: one multiply-add of 4 bytes a lane
                Q2K => _mm512_dpbusd_epi32(s, blk.codes[k], av[k]),
                Q3K | Q4K => _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(blk.codes[k], av[k]), blk.scales[k]),
                // magnitudes times the activations with the codes' signs (none is 0)
                _ => {
                    let signed = _mm512_mask_sub_epi8(av[k], blk.neg[k], _mm512_setzero_si512(), av[k]);
                    _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(blk.codes[k], signed), blk.scales[k])
                }
            };
        }
        let mut m = _mm256_setzero_si256();
        if KIND != IQ4XS {
            m = _mm256_madd_epi16(_mm256_loadu_si256(bs as *const __m256i), blk.mins);
            // Q3_K's offsets share d: they join the integer sum
            if KIND == Q3K {
                s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(m));
            }
        }
        (s, m)
    }
}

/// Four vectors' lanes summed by row: vector `m`'s 128-bit lane `l` (four i32) is row `4l +
/// m`'s; the result's lane `j` is row `j`'s sum.
#[inline(always)]
pub(super) unsafe fn reduce(v: [__m512i; 4]) -> __m512i {
    // SAFETY: the caller's features (AVX-512 F)
    unsafe {
        let u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
        let u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
        _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23))
    }
}
