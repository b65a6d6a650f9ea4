//! k4 and k6 records (Q4_K's scales and mins, Q6_K's scales, as the file stores them,
//! [`crate::kscales`]) decoded in the AVX-512 tiles: two k4 records (16 groups of 32) into 16
//! float lanes of scales and 16 of mins, one k6 record (16 groups of 16) into 16 of scales. Each
//! lane is `d * sc` (or `dmin * m`), an exact f32 product, so the tiles see the values that f32
//! scales and mins would hold. Also where a tile finds a row's scales (`QMat::weight_scales`:
//! f32, f16 widened, or decoded from records) and a block of rows' records decoded once for a
//! prompt's tiles (`with_decoded_records`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512::{QMat, WeightScales, first_lanes};
use crate::kscales::{K4_RECORD, K6_RECORD};

/// Groups `g..g + 16` of row `r` (`ng` groups of 16 a row; `g` a multiple of 16) of a matrix
/// with k6 records: one record's 16 scales, `d * sc`.
///
/// # Safety
/// AVX-512 F and BW; `k` holds row `r`'s records (`ng / 16` of them) and `g < ng`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn k6_lanes(k: &[u8], ng: usize, r: usize, g: usize) -> __m512 {
    debug_assert!(g.is_multiple_of(16) && g < ng && (r + 1) * ng / 16 * K6_RECORD <= k.len());
    // SAFETY: the caller's guarantees: the record's 18 bytes
    let (d, s) = unsafe {
        let p = k.as_ptr().add((r * ng + g) / 16 * K6_RECORD);
        ((p as *const u16).read_unaligned(), _mm_loadu_si128(p.add(2) as *const __m128i))
    };
    let d = _mm512_cvtph_ps(_mm256_set1_epi16(d as i16));
    _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s)), d)
}

/// Groups `g..g + 16` of row `r` (`ng` groups a row, a multiple of 8; `g` a multiple of 16):
/// (scales, mins); when only 8 groups are left, lanes 8-15 are zero.
///
/// # Safety
/// AVX-512 F and BW; `k` holds row `r`'s records (`ng / 8` of them) and `g < ng`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn k4_lanes(k: &[u8], ng: usize, r: usize, g: usize) -> (__m512, __m512) {
    debug_assert!(g.is_multiple_of(16) && g < ng && (r + 1) * ng / 8 * K4_RECORD <= k.len());
    // SAFETY: the caller's guarantees; the second record only where the row has it
    let p = unsafe { k.as_ptr().add((r * ng + g) / 8 * K4_RECORD) };
    let (v0, h0) = unsafe { (k4_codes(p), (p as *const u32).read_unaligned()) };
    let (v1, h1) = if ng - g >= 16 {
        unsafe { (k4_codes(p.add(K4_RECORD)), (p.add(K4_RECORD) as *const u32).read_unaligned()) }
    } else {
        (_mm_setzero_si128(), 0)
    };
    // d (the low half of each record's first 4 bytes) and dmin (the high half), f16, over the
    // lanes of each record's groups
    let halves = |shift: u32| {
        let h = |x: u32| _mm_set1_epi16((x >> shift) as u16 as i16);
        _mm512_cvtph_ps(_mm256_set_m128i(h(h1), h(h0)))
    };
    let lanes = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
    let (sc, mn) = (lanes(_mm_unpacklo_epi64(v0, v1)), lanes(_mm_unpackhi_epi64(v0, v1)));
    (_mm512_mul_ps(sc, halves(0)), _mm512_mul_ps(mn, halves(16)))
}

/// One record's 6-bit codes as bytes: scales 0-7, then mins 0-7 (ggml's `get_scale_min_k4`).
/// With `b` the 12 packed bytes: scale j < 4 is `b[j] & 63`, min j < 4 `b[j + 4] & 63`; scale
/// j >= 4 is `b[j + 4] & 15` with `b[j - 4] >> 6` above it, min j >= 4 `b[j + 4] >> 4` with
/// `b[j] >> 6` above it.
///
/// # Safety
/// 16 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn k4_codes(p: *const u8) -> __m128i {
    // SAFETY: the caller's guarantee
    let s = unsafe { _mm_loadu_si128(p as *const __m128i) };
    // the packed bytes start at 4: a = [b0-3, b8-11, b4-7, b8-11], t = the bytes with the top
    // bits of scales 4-7 and of mins 4-7 in lanes 4-7 and 12-15 (-1: zero)
    let a = _mm_shuffle_epi8(s, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    let t = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    let low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    // mins 4-7: the high nibbles (16-bit shifts: the mask drops what crosses bytes)
    let high_nibbles =
        _mm_and_si128(_mm_srli_epi16::<4>(a), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    let top = _mm_and_si128(_mm_srli_epi16::<2>(t), _mm_set1_epi8(0x30));
    _mm_or_si128(_mm_or_si128(low, high_nibbles), top)
}

impl QMat<'_> {
    /// Row `r`'s scales and mins (zero without mins) of groups `g..g + 16`, lanes past `mask`
    /// zero.
    ///
    /// # Safety
    /// AVX-512 F and BW; row `r` and group `g` exist (with records, `g` a multiple of 16).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn weight_scales(&self, r: usize, g: usize, mask: __mmask16) -> (__m512, __m512) {
        let at = (r - self.wd_row0) * self.ng + g;
        // SAFETY (all): the caller's guarantees; masked lanes are not read
        match self.ws {
            WeightScales::K4(k) => unsafe { k4_lanes(k, self.ng, r, g) },
            WeightScales::K6(k) => unsafe { (k6_lanes(k, self.ng, r, g), _mm512_setzero_ps()) },
            WeightScales::F32 { scales, mins: Some(mins) } => unsafe {
                (
                    _mm512_maskz_loadu_ps(mask, scales.as_ptr().add(at)),
                    _mm512_maskz_loadu_ps(mask, mins.as_ptr().add(at)),
                )
            },
            WeightScales::F32 { scales, mins: None } => unsafe {
                (_mm512_maskz_loadu_ps(mask, scales.as_ptr().add(at)), _mm512_setzero_ps())
            },
            WeightScales::F16 { scales, mins } => unsafe {
                let lanes = |at: usize| {
                    let bits = _mm512_maskz_loadu_epi16(mask as __mmask32, scales.as_ptr().add(at) as *const i16);
                    _mm512_cvtph_ps(_mm512_castsi512_si256(bits))
                };
                if mins {
                    // each row: its scales, then its mins
                    let at = (r - self.wd_row0) * 2 * self.ng + g;
                    (lanes(at), lanes(at + self.ng))
                } else {
                    (lanes(at), _mm512_setzero_ps())
                }
            },
        }
    }

    /// Bytes of `groups` groups' scales (or records; a whole number of records).
    pub(super) fn scale_span(&self, groups: usize) -> usize {
        match self.ws {
            WeightScales::K4(_) => groups / 8 * K4_RECORD,
            WeightScales::K6(_) => groups / 16 * K6_RECORD,
            WeightScales::F32 { .. } => groups * 4,
            // with mins, a row's groups take 4 bytes each (a scale and a min): whole rows are
            // spanned right, a start inside a row lies past it (only prefetches ask for one)
            WeightScales::F16 { mins, .. } => groups * if mins { 4 } else { 2 },
        }
    }

    /// Where row `r`'s scales (or records) from group `g` on lie, for prefetches.
    pub(super) fn scales_at(&self, r: usize, g: usize) -> *const u8 {
        let base = match self.ws {
            WeightScales::K4(k) | WeightScales::K6(k) => k.as_ptr(),
            WeightScales::F16 { scales, .. } => scales.as_ptr() as *const u8,
            WeightScales::F32 { scales, .. } => scales.as_ptr().wrapping_sub(self.wd_row0 * self.ng) as *const u8,
        };
        base.wrapping_add(self.scale_span(r * self.ng) + self.scale_span(g))
    }

    /// Ask for the scales of the rows a few blocks on (decode).
    #[inline(always)]
    pub(super) fn scales_ahead(&self, r0: usize, rows: usize) {
        crate::prefetch::rows_ahead(self.scales_at(0, 0), self.scale_span(self.ng), r0, rows);
    }

    /// Whether the groups are asymmetric (mins, f32 or in k4 records).
    pub(super) fn has_mins(&self) -> bool {
        matches!(
            self.ws,
            WeightScales::F32 { mins: Some(_), .. } | WeightScales::K4(_) | WeightScales::F16 { mins: true, .. }
        )
    }
}

thread_local! {
    /// A block of rows' records decoded into f32 scales and mins ([`with_decoded_records`]).
    pub(super) static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `m` with the records of rows `rows` decoded into f32 scales (and mins) in `buf` (at least
/// `2 * rows.len() * ng` floats): the values the records stand for, so the same products.
///
/// # Safety
/// AVX-512 F and BW; `m` has records and rows `rows`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn with_decoded_records<'b>(m: &QMat<'b>, rows: Range<usize>, buf: &'b mut [f32]) -> QMat<'b> {
    let ng = m.ng;
    let (s, mn) = buf.split_at_mut(rows.len() * ng);
    for (i, r) in rows.clone().enumerate() {
        for g in (0..ng).step_by(16) {
            let mask = first_lanes(ng - g);
            // SAFETY: the caller's guarantees; the masked lanes are the ones inside the row
            unsafe {
                let (w, v) = m.weight_scales(r, g, mask);
                _mm512_mask_storeu_ps(s.as_mut_ptr().add(i * ng + g), mask, w);
                _mm512_mask_storeu_ps(mn.as_mut_ptr().add(i * ng + g), mask, v);
            }
        }
    }
    let mins = m.has_mins().then_some(&mn[..rows.len() * ng]);
    QMat { ws: WeightScales::F32 { scales: &s[..rows.len() * ng], mins }, wd_row0: rows.start, ..*m }
}
