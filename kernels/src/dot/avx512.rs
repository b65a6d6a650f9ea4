//! f32 or bf16 weight rows against several tokens in AVX-512 register tiles (a prompt's router,
//! bf16 matrices over a prompt or a server's batch), each product with the bits of one dot
//! ([`super::avx2::dot_f32`] or [`super::avx2::dot_bf16`], what decode computes: a row gets the
//! same bits in any batch).
//!
//! That dot keeps two 8-lane accumulators over each 16-value step (values `i..i + 8` and
//! `i + 8..i + 16`), takes a last 8-value step into the first alone, adds the two, sums the
//! eight lanes (`hsum_ps`'s tree) and adds the last values one by one. One 16-lane register
//! holds both accumulators side by side, so a tile of R rows x T tokens keeps one register a
//! product: each step loads R row vectors and T token vectors for R T multiply-adds (4 x 4: 8
//! loads for 16 FMAs), where the dot of one row and four tokens loaded 5 vectors for 4.

use std::arch::x86_64::*;

use super::avx2::hsum_ps;
use crate::quant::bf16_to_f32;

/// A weight row's element as the tiles load it: 16 or 8 values widened to f32 lanes, as the
/// AVX2 dot of that format widens them.
pub trait Lanes: Copy {
    /// Values `p..p + 16` (the lanes of `mask` alone: the others zero and not read).
    ///
    /// # Safety
    /// AVX-512 F; the lanes read lie inside the row.
    unsafe fn load(p: *const Self, mask: __mmask16) -> __m512;
    fn to_f32(self) -> f32;
}

impl Lanes for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const f32, mask: __mmask16) -> __m512 {
        // SAFETY: the caller's
        unsafe { if mask == 0xFFFF { _mm512_loadu_ps(p) } else { _mm512_maskz_loadu_ps(mask, p) } }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl Lanes for u16 {
    /// bf16 bits: the upper half of an f32's. A partial load is the low 8 lanes (the only one
    /// the tiles make), read as 8 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn load(p: *const u16, mask: __mmask16) -> __m512 {
        // SAFETY: the caller's
        unsafe {
            if mask == 0xFFFF {
                let v = _mm256_loadu_si256(p.cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
            } else {
                debug_assert_eq!(mask, 0x00FF);
                let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())));
                _mm512_maskz_mov_ps(0x00FF, _mm512_castps256_ps512(_mm256_castsi256_ps(v)))
            }
        }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self)
    }
}

/// Rows and tokens of the full tile.
pub const TILE_ROWS: usize = 4;
pub const TILE_TOKENS: usize = 4;

/// `out[i * stride + t] = w[i] · x[t]` for the `R` rows of `w` (`[R, c]`) and the `T` tokens
/// of `x` (`[T, c]`), each the bits of `avx2::dot_f32` (f32 rows) or `avx2::dot_bf16` (bf16).
///
/// # Safety
/// AVX-512 F, AVX2 and FMA; `w` holds `R c` values, `x` `T c`, `out` `(R - 1) stride + T`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn tile<W: Lanes, const R: usize, const T: usize>(
    c: usize,
    w: &[W],
    x: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    debug_assert!(w.len() >= R * c && x.len() >= T * c && out.len() > (R - 1) * stride + T - 1);
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut i = 0;
    // SAFETY: every load reads values below c of a row of `w` or of `x` (the masked ones, the
    // first 8 of the last 8 or more)
    unsafe {
        while i + 16 <= c {
            let wv: [__m512; R] = std::array::from_fn(|r| W::load(pw.add(r * c + i), 0xFFFF));
            for t in 0..T {
                let xv = _mm512_loadu_ps(px.add(t * c + i));
                for r in 0..R {
                    acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
                }
            }
            i += 16;
        }
        if i + 8 <= c {
            // the first accumulator's lanes alone (the second keeps its bits, -0.0 included)
            let low = 0x00FF;
            let wv: [__m512; R] = std::array::from_fn(|r| W::load(pw.add(r * c + i), low));
            for t in 0..T {
                let xv = _mm512_maskz_loadu_ps(low, px.add(t * c + i));
                for r in 0..R {
                    acc[r][t] = _mm512_mask3_fmadd_ps(wv[r], xv, acc[r][t], low);
                }
            }
            i += 8;
        }
    }
    for r in 0..R {
        for t in 0..T {
            let v = acc[r][t];
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let mut s = hsum_ps(_mm256_add_ps(lo, hi));
            for j in i..c {
                s += w[r * c + j].to_f32() * x[t * c + j];
            }
            out[r * stride + t] = s;
        }
    }
}
