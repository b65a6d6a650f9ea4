//! The AVX-512 q4/q6 tiles' last step (`avx512.rs`, `avx512_panels.rs`): each (row, token)'s
//! bias or mins term and the sum of its 16 float lanes, in a fixed order.

use std::arch::x86_64::*;

use super::avx512::{QMat, first_lanes};

/// The groups of 16 float lanes per (row, token), `f`, to the tile's products: the bias term,
/// 16 groups at a time (`sum_g wd_g * (-bias * sum_g a * as_g)`, or with mins
/// `sum_g mins_g * (-sum_g a * as_g)`, added to the float lanes
/// before the one reduction: a scalar loop over the groups is one long chain of dependent adds;
/// `sum_g a * as_g` comes made per token, `scaled_sums`), then the lanes summed.
///
/// # Safety
/// AVX-512 F; rows `r0..r0 + R` and tokens `t0..t0 + T` exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn finish<const R: usize, const T: usize, const SIX: bool>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    f: &mut [[__m512; T]; R],
    out: &mut [[f32; T]; R],
) {
    let ng = m.ng;
    // asymmetric groups: `- min_g * sum_g a * as_g` in place of the bias term; either as
    // `f - w * (bias * ss)`, one fused operation (the bias a power of two: exact, and 1 with
    // mins: no multiply). 16 groups at a time, each row's and each token's lanes loaded once
    // for the tile; per (row, token) the groups in order, so the same bits whatever the tile.
    let bias = (!m.has_mins()).then(|| _mm512_set1_ps(if SIX { 32.0 } else { 8.0 }));
    for g in (0..ng).step_by(16) {
        let k = (ng - g).min(16);
        let mask = first_lanes(k);
        let b: [__m512; T] = std::array::from_fn(|t| {
            // SAFETY: lanes g..g + k of the token's sums exist; masked lanes are not read
            let ss = unsafe { _mm512_maskz_loadu_ps(mask, m.a.scaled_sums.as_ptr().add((t0 + t) * ng + g)) };
            bias.map_or(ss, |b| _mm512_mul_ps(b, ss))
        });
        for (i, f) in f.iter_mut().enumerate() {
            // SAFETY: as above, for the row's scales or mins
            let (wd, mins) = unsafe { m.weight_scales(r0 + i, g, mask) };
            let w = if m.has_mins() { mins } else { wd };
            for (f, b) in f.iter_mut().zip(&b) {
                *f = _mm512_fnmadd_ps(w, *b, *f);
            }
        }
    }
    if (R * T).is_multiple_of(4) {
        // four reductions at once (decode's 4-row blocks, prefill's 2 x 4 tiles), each the
        // same sums as `hsum`
        for k in (0..R * T).step_by(4) {
            let s = hsum4(std::array::from_fn(|j| f[(k + j) / T][(k + j) % T]));
            for (j, v) in s.into_iter().enumerate() {
                out[(k + j) / T][(k + j) % T] = v;
            }
        }
    } else {
        for (o, f) in out.iter_mut().zip(f.iter()) {
            for (o, &f) in o.iter_mut().zip(f) {
                *o = hsum(f);
            }
        }
    }
}

/// The sum of the 16 lanes as a fixed tree: lanes `i` and `i + 8`, then `i` and `i + 4`, `i` and
/// `i + 2`, `0` and `1` (as `_mm512_reduce_add_ps` compiles here, but fixed, so that [`hsum4`]
/// can give the same bits).
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_permute_ps::<0b01_00_11_10>(s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// [`hsum`] of four vectors at once, with the same additions lane for lane (so the same bits):
/// two rows per register after the first step, four after the second (decode's tiles reduce four
/// rows each; one at a time the reductions were a long chain each).
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum4(v: [__m512; 4]) -> [f32; 4] {
    // [a lanes 0-7 | b lanes 0-7] + [a lanes 8-15 | b lanes 8-15]: a8 | b8, and c8 | d8
    let ab = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v[0], v[1]),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(v[0], v[1]),
    );
    let cd = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(v[2], v[3]),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(v[2], v[3]),
    );
    // [a8 0-3 | b8 0-3 | c8 0-3 | d8 0-3] + the 4-7 quarters: a4 | b4 | c4 | d4
    let q = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd), _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd));
    // within each quarter: lanes 0 + 2 and 1 + 3, then 0 + 1
    let h = _mm512_add_ps(q, _mm512_permute_ps::<0b01_00_11_10>(q));
    let o = _mm512_add_ps(h, _mm512_movehdup_ps(h));
    let mut lanes = [0f32; 16];
    // SAFETY: 16 floats into a 16-float array
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), o) };
    [lanes[0], lanes[4], lanes[8], lanes[12]]
}
