//! AVX-512 BF16 tiles for bf16 weights over several tokens (prefill).

use std::arch::x86_64::*;
use std::ops::Range;

/// `out[i * n + t] = W[rows.start + i] · x[t]` for bf16 weights `w` (`[rows, cols]`, bits) and
/// `n` f32 activation rows `x` (`[n, cols]`), with `vdpbf16ps`: each activation is split into
/// two bf16 parts, `hi = bf16(x)` and `lo = bf16(x - hi)`, which carry 16 of its 24 mantissa
/// bits (a relative error below 2^-16, against 2^-8 for `hi` alone), and each weight pair is
/// multiplied by both (products of two bf16 values are exact in f32). Tiles of 4 rows x 4
/// tokens share their loads. For prefill; decode keeps the exact f32 path (`dot_bf16`).
///
/// # Safety
/// The CPU must support AVX-512 F, BW and BF16 ([`crate::Isa::bf16_dot`]); `w` holds the rows,
/// `x.len() == n * cols`, `out.len() == rows.len() * n`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn bf16_matmul(w: &[u16], cols: usize, x: &[f32], n: usize, rows: Range<usize>, out: &mut [f32]) {
    assert!(w.len() >= rows.end * cols && x.len() == n * cols && out.len() == rows.len() * n);
    // the activations' two parts, [n, cols] each
    let (mut hi, mut lo) = (vec![0u16; n * cols], vec![0u16; n * cols]);
    for ((h, l), &v) in hi.iter_mut().zip(lo.iter_mut()).zip(x) {
        *h = crate::quant::f32_to_bf16(v);
        *l = crate::quant::f32_to_bf16(v - crate::quant::bf16_to_f32(*h));
    }
    let m = Bf16Mat { w, cols, hi: &hi, lo: &lo };
    let mut r = rows.start;
    while r < rows.end {
        let nr = if rows.end - r >= 4 { 4 } else { 1 };
        let mut t = 0;
        while t < n {
            let nt = if n - t >= 4 { 4 } else { 1 };
            let o = &mut out[(r - rows.start) * n..];
            // SAFETY (each): rows r..r + nr and tokens t..t + nt exist, as asserted
            unsafe {
                match (nr, nt) {
                    (4, 4) => m.put::<4, 4>(r, t, n, o),
                    (4, _) => m.put::<4, 1>(r, t, n, o),
                    (_, 4) => m.put::<1, 4>(r, t, n, o),
                    _ => m.put::<1, 1>(r, t, n, o),
                }
            }
            t += nt;
        }
        r += nr;
    }
}

/// bf16 weights and the two bf16 parts of the activations (see [`bf16_matmul`]).
struct Bf16Mat<'a> {
    w: &'a [u16],
    cols: usize,
    hi: &'a [u16],
    lo: &'a [u16],
}

impl Bf16Mat<'_> {
    /// [`Bf16Mat::tile`] into `out` (`[R, n]` from row `r0`, weight-row-major).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn put<const R: usize, const T: usize>(&self, r0: usize, t0: usize, n: usize, out: &mut [f32]) {
        // SAFETY: the caller's
        let res = unsafe { self.tile::<R, T>(r0, t0) };
        for (i, row) in res.iter().enumerate() {
            out[i * n + t0..i * n + t0 + T].copy_from_slice(row);
        }
    }

    /// Rows `r0..r0 + R` times tokens `t0..t0 + T`: 32 values a step, the last step masked.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn tile<const R: usize, const T: usize>(&self, r0: usize, t0: usize) -> [[f32; T]; R] {
        let cols = self.cols;
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        let mut c = 0;
        while c < cols {
            let k = (cols - c).min(32);
            let mask: __mmask32 = if k == 32 { u32::MAX } else { (1u32 << k) - 1 };
            // SAFETY (the loads): values c..c + k of each row and token exist; masked lanes
            // are not read
            let load = |p: *const u16| -> __m512bh {
                unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(mask, p as *const i16)) }
            };
            let mut wv = [unsafe { std::mem::zeroed::<__m512bh>() }; R];
            for (i, v) in wv.iter_mut().enumerate() {
                *v = load(unsafe { self.w.as_ptr().add((r0 + i) * cols + c) });
            }
            for t in 0..T {
                let at = (t0 + t) * cols + c;
                let (xh, xl) = (load(unsafe { self.hi.as_ptr().add(at) }), load(unsafe { self.lo.as_ptr().add(at) }));
                for i in 0..R {
                    acc[i][t] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[i][t], wv[i], xh), wv[i], xl);
                }
            }
            c += k;
        }
        let mut out = [[0f32; T]; R];
        for i in 0..R {
            for t in 0..T {
                out[i][t] = _mm512_reduce_add_ps(acc[i][t]);
            }
        }
        out
    }
}
