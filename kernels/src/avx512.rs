//! AVX-512 VNNI matrix-vector kernels for q4 and q8 weights (decode: one activation row).
//!
//! `vpdpbusd` multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four
//! products into one of 16 int32 lanes. Both formats make their weights unsigned for it:
//! q4 nibbles are stored biased (`n = q + 8`, in `[0, 15]`) and q8 bytes get their sign bit
//! flipped (`w + 128`); the bias times the group's activation sum is subtracted once per group,
//! exactly, in lane 0. Each group's int32 lanes are converted to f32 and accumulated with the
//! group's scale (weight scale times activation scale) by one FMA, and the row's 16 float lanes
//! are summed at the end: the same products as the scalar reference, summed in another order
//! (tested within a relative tolerance, not bit for bit).
//!
//! q4 layout (`q4_lohi32`, groups of at least 32): a 64-byte load covers 128 values in four
//! 32-value blocks; the low nibbles hold values 0-15, 32-47, 64-79, 96-111 of them and the high
//! nibbles 16-31, 48-63, 80-95, 112-127. The activation row is permuted once per call into that
//! order (`permute_q4_act`), so one AND and one shift feed two `vpdpbusd`.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::act::QuantRow;

/// Whether these kernels take a quantized matrix with groups of `group` (q4: whole 128-value
/// chunks per group; q8: whole 64-byte vectors per group).
pub fn supports_q4(group: usize) -> bool {
    group % 128 == 0
}

pub fn supports_q8(group: usize) -> bool {
    group % 64 == 0
}

/// The activation row in the order the q4 kernel's nibbles come in (see the module doc).
/// `a.len()` must be a multiple of 128.
pub fn permute_q4_act(a: &[i8], out: &mut Vec<i8>) {
    out.clear();
    out.reserve(a.len());
    for chunk in a.chunks_exact(128) {
        // low nibbles: the first half of each 32-value block; then the high nibbles
        for half in [0usize, 16] {
            for b in 0..4 {
                out.extend_from_slice(&chunk[b * 32 + half..b * 32 + half + 16]);
            }
        }
    }
}

/// `out[i] = W[rows.start + i] · a` for q4 weights `q` (`[rows, cols / 2]`) with `scales`
/// (`[rows, cols / group]`); `ap` is `a.q` permuted by [`permute_q4_act`].
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI; `supports_q4(a.group)`; slices sized as above.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q4_matvec(
    q: &[u8],
    scales: &[f32],
    cols: usize,
    a: QuantRow<'_>,
    ap: &[i8],
    rows: Range<usize>,
    out: &mut [f32],
) {
    debug_assert!(supports_q4(a.group) && ap.len() == cols && out.len() == rows.len());
    let ng = cols / a.group;
    for (o, r) in out.iter_mut().zip(rows) {
        // SAFETY: the caller's guarantees; row r is inside q and scales
        *o = unsafe { q4_row(&q[r * cols / 2..(r + 1) * cols / 2], &scales[r * ng..(r + 1) * ng], a, ap) };
    }
}

/// One row, one sequential stream (rows interleaved measured slower: the prefetchers follow one
/// stream best). Two groups at a time and separate accumulators for the low and high nibbles
/// keep four independent `vpdpbusd` chains in flight.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q4_row(q: &[u8], wd: &[f32], a: QuantRow<'_>, ap: &[i8]) -> f32 {
    let g = a.group;
    let ng = wd.len();
    let mask = _mm512_set1_epi8(0x0F);
    // sum over the chunks of group gi, as (low, high) int32 lanes
    let group = |gi: usize| -> (__m512i, __m512i) {
        let (mut lo_acc, mut hi_acc) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        let mut c = gi * g;
        while c < (gi + 1) * g {
            // SAFETY: c + 128 <= cols: the 64 weight bytes and 128 activations are in bounds
            unsafe {
                let wb = _mm512_loadu_si512(q.as_ptr().add(c / 2) as *const _);
                let alo = _mm512_loadu_si512(ap.as_ptr().add(c) as *const _);
                let ahi = _mm512_loadu_si512(ap.as_ptr().add(c + 64) as *const _);
                lo_acc = _mm512_dpbusd_epi32(lo_acc, _mm512_and_si512(wb, mask), alo);
                hi_acc = _mm512_dpbusd_epi32(hi_acc, _mm512_and_si512(_mm512_srli_epi16(wb, 4), mask), ahi);
            }
            c += 128;
        }
        (lo_acc, hi_acc)
    };
    // the bias: sum (n - 8) a = sum n a - 8 sum a
    // SAFETY: the caller's guarantees (CPU features; wd and a cover the row's groups)
    unsafe { sum_groups(ng, 8, wd, a, group) }
}

/// `out[i] = W[rows.start + i] · a` for q8 weights `q` (`[rows, cols]`) with `scales`.
///
/// # Safety
/// As for [`q4_matvec`], with `supports_q8(a.group)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q8_matvec(q: &[i8], scales: &[f32], cols: usize, a: QuantRow<'_>, rows: Range<usize>, out: &mut [f32]) {
    debug_assert!(supports_q8(a.group) && out.len() == rows.len());
    let ng = cols / a.group;
    for (o, r) in out.iter_mut().zip(rows) {
        // SAFETY: as above
        *o = unsafe { q8_row(&q[r * cols..(r + 1) * cols], &scales[r * ng..(r + 1) * ng], a) };
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_row(q: &[i8], wd: &[f32], a: QuantRow<'_>) -> f32 {
    let g = a.group;
    let ng = wd.len();
    let flip = _mm512_set1_epi8(-128);
    // even and odd 64-byte chunks of group gi in separate accumulators
    let group = |gi: usize| -> (__m512i, __m512i) {
        let (mut e, mut o) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        let mut c = gi * g;
        let end = (gi + 1) * g;
        while c < end {
            // SAFETY: c + 64 <= cols (groups are whole 64-byte chunks)
            unsafe {
                let w = _mm512_loadu_si512(q.as_ptr().add(c) as *const _);
                let x = _mm512_loadu_si512(a.q.as_ptr().add(c) as *const _);
                // w + 128 as an unsigned byte
                e = _mm512_dpbusd_epi32(e, _mm512_xor_si512(w, flip), x);
            }
            c += 64;
            if c < end {
                // SAFETY: as above
                unsafe {
                    let w = _mm512_loadu_si512(q.as_ptr().add(c) as *const _);
                    let x = _mm512_loadu_si512(a.q.as_ptr().add(c) as *const _);
                    o = _mm512_dpbusd_epi32(o, _mm512_xor_si512(w, flip), x);
                }
                c += 64;
            }
        }
        (e, o)
    };
    // the bias: sum ((w + 128) - 128) a = sum (w + 128) a - 128 sum a
    // SAFETY: as above
    unsafe { sum_groups(ng, 128, wd, a, group) }
}

/// The row's dot product from its groups' int32 lanes: `group(gi)` gives two accumulators of
/// group gi's biased products; `bias` times the group's activation sum comes off exactly, in
/// lane 0, then one FMA scales the group by weight scale times activation scale. Two groups at a
/// time into separate float accumulators keep two chains in flight.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sum_groups(
    ng: usize,
    bias: i32,
    wd: &[f32],
    a: QuantRow<'_>,
    group: impl Fn(usize) -> (__m512i, __m512i),
) -> f32 {
    let fold = |gi: usize, (x, y): (__m512i, __m512i), f: __m512| -> __m512 {
        let b = _mm512_maskz_set1_epi32(1, -bias * a.sums[gi]);
        let v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(x, y), b));
        _mm512_fmadd_ps(v, _mm512_set1_ps(wd[gi] * a.scales[gi]), f)
    };
    let (mut f0, mut f1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut gi = 0;
    while gi + 1 < ng {
        let (s0, s1) = (group(gi), group(gi + 1));
        f0 = fold(gi, s0, f0);
        f1 = fold(gi + 1, s1, f1);
        gi += 2;
    }
    if gi < ng {
        f0 = fold(gi, group(gi), f0);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(f0, f1))
}
