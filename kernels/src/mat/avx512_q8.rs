//! AVX-512 VNNI kernels for q8 weights: matrix-vector (decode) and tiles of rows x tokens
//! (prefill). The bytes get their sign bit flipped (`w + 128`, unsigned for `vpdpbusd`) and
//! 128 times the group's activation sum comes off exactly, in lane 0 (see `avx512.rs` for the
//! instruction and how the groups' lanes are scaled and summed). Groups smaller than a 64-byte
//! vector (GGUF's Q8_0 at 32 values, Q6_K at 16) have kernels of their own, [`q8_put_sub`].

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512::first_lanes;
use crate::act::{QuantAct, QuantRow};

/// Whether these kernels take a q8 matrix of `cols` columns with groups of `group`: whole
/// 64-byte vectors, or 2 or 4 groups per vector in rows of whole vectors.
pub fn supports_q8(group: usize, cols: usize) -> bool {
    group.is_multiple_of(64) || ((group == 32 || group == 16) && cols.is_multiple_of(64))
}

/// Whether [`q8_matvec`] and [`q8_matmul`] add the mins' term (`scale * q - min`) themselves
/// at this group: the sub-vector kernels do; over whole vectors the caller adds it.
pub fn with_mins(group: usize) -> bool {
    !group.is_multiple_of(64)
}

/// A q8 matrix's weight scales as the kernels read them (`[rows, cols / group]`): f32, or f16
/// bits (GGUF's Q8_0 at its own size) widened as they are loaded, the same floats either way.
pub trait Scales: Copy {
    /// Bytes a scale takes.
    const BYTES: usize;

    /// Scales held.
    fn len(self) -> usize;

    /// Where scale `i` lies (for prefetches).
    fn at(self, i: usize) -> *const u8;

    /// Scale `i`.
    fn one(self, i: usize) -> f32;

    /// Scales `i..i + 16` in lanes, those past `m` zero.
    ///
    /// # Safety
    /// AVX-512 F and BW; the lanes of `m` are inside the scales.
    unsafe fn lanes(self, i: usize, m: __mmask16) -> __m512;
}

impl Scales for &[f32] {
    const BYTES: usize = 4;

    fn len(self) -> usize {
        <[f32]>::len(self)
    }

    fn at(self, i: usize) -> *const u8 {
        self.as_ptr().wrapping_add(i) as *const u8
    }

    #[inline(always)]
    fn one(self, i: usize) -> f32 {
        self[i]
    }

    #[inline(always)]
    unsafe fn lanes(self, i: usize, m: __mmask16) -> __m512 {
        // SAFETY: the caller's guarantees
        unsafe { _mm512_maskz_loadu_ps(m, self.as_ptr().add(i)) }
    }
}

/// f16 scales' bits.
#[derive(Debug, Clone, Copy)]
pub struct Halves<'a>(pub &'a [u16]);

impl Scales for Halves<'_> {
    const BYTES: usize = 2;

    fn len(self) -> usize {
        self.0.len()
    }

    fn at(self, i: usize) -> *const u8 {
        self.0.as_ptr().wrapping_add(i) as *const u8
    }

    #[inline(always)]
    fn one(self, i: usize) -> f32 {
        half::f16::from_bits(self.0[i]).to_f32()
    }

    #[inline(always)]
    unsafe fn lanes(self, i: usize, m: __mmask16) -> __m512 {
        // SAFETY: the caller's guarantees; the 16-bit lanes past `m` are not read
        unsafe {
            let bits = _mm512_maskz_loadu_epi16(m as __mmask32, self.0.as_ptr().add(i) as *const i16);
            _mm512_cvtph_ps(_mm512_castsi512_si256(bits))
        }
    }
}

/// `out[i * n + t] = W[rows.start + i] · a[t]` for q8 weights: [`q8_matmul`]'s tiles for
/// several tokens (prefill), [`q8_matvec`] row by row for one (decode), each row's scales asked
/// for a few rows ahead.
///
/// # Safety
/// As [`q8_matmul`]'s.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q8_products<W: Scales>(
    q: &[i8],
    scales: W,
    mins: Option<&[f32]>,
    cols: usize,
    a: &QuantAct,
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    if n > 1 {
        // SAFETY: the caller's guarantees
        return unsafe { q8_matmul(q, scales, mins, cols, a, n, rows, out) };
    }
    let ng = cols / a.group;
    assert!(q.len() >= rows.end * cols && scales.len() >= rows.end * ng && out.len() == rows.len() * n);
    for (i, r) in rows.enumerate() {
        crate::prefetch::rows_ahead(scales.at(0), ng * W::BYTES, r, 1);
        // SAFETY: the caller's guarantees, row r as asserted
        unsafe { q8_matvec(q, scales, mins, cols, a.row(0), r..r + 1, &mut out[i..i + 1]) };
    }
}

/// `out[i] = W[rows.start + i] · a` for q8 weights `q` (`[rows, cols]`) with `scales` (and
/// `mins` where [`with_mins`]).
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI; `supports_q8(a.group, cols)`; slices sized as above.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_matvec<W: Scales>(
    q: &[i8],
    scales: W,
    mins: Option<&[f32]>,
    cols: usize,
    a: QuantRow<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    debug_assert!(supports_q8(a.group, cols) && out.len() == rows.len());
    let ng = cols / a.group;
    if !a.group.is_multiple_of(64) {
        for (o, r) in out.iter_mut().zip(rows) {
            let mut res = [[0f32; 1]; 1];
            // SAFETY: as above
            unsafe { put_sub::<1, 1, W>(q, scales, mins, cols, r, [a], &mut res) };
            *o = res[0][0];
        }
        return;
    }
    for (o, r) in out.iter_mut().zip(rows) {
        // SAFETY: as above
        *o = unsafe { q8_row(&q[r * cols..(r + 1) * cols], scales, r * ng, a) };
    }
}

/// `out[i * n + t] = W[rows.start + i] · a[t]` for q8 weights (as [`q8_matvec`]) and all `n`
/// activation rows of `a`: tiles of 2 rows x 2 tokens share their loads (prefill). Each (row,
/// token) goes through the same operations in the same order as [`q8_matvec`]'s, so a
/// prompt's products equal its tokens' one by one, bit for bit.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI; `supports_q8(a.group, cols)`; `q` and `scales` hold
/// the rows; `out.len() == rows.len() * n`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_matmul<W: Scales>(
    q: &[i8],
    scales: W,
    mins: Option<&[f32]>,
    cols: usize,
    a: &QuantAct,
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let ng = cols / a.group;
    assert!(
        supports_q8(a.group, cols)
            && q.len() >= rows.end * cols
            && scales.len() >= rows.end * ng
            && a.q.len() >= n * cols
            && out.len() == rows.len() * n
    );
    let sub = !a.group.is_multiple_of(64);
    let mut r = rows.start;
    while r < rows.end {
        let nr = (rows.end - r).min(2);
        let mut t = 0;
        while t < n {
            // groups under a vector: 4 tokens a tile where there are 4 (their chunks' bias and
            // permutes are per token and per product, the weights' loads per row)
            let nt = if sub && n - t >= 4 { 4 } else { (n - t).min(2) };
            let o = &mut out[(r - rows.start) * n..];
            // SAFETY (each): rows r..r + nr and tokens t..t + nt exist, as asserted
            unsafe {
                match (nr, nt) {
                    (2, 4) => q8_put::<2, 4, W>(q, scales, mins, cols, a, r, t, n, o),
                    (_, 4) => q8_put::<1, 4, W>(q, scales, mins, cols, a, r, t, n, o),
                    (2, 2) => q8_put::<2, 2, W>(q, scales, mins, cols, a, r, t, n, o),
                    (2, _) => q8_put::<2, 1, W>(q, scales, mins, cols, a, r, t, n, o),
                    (_, 2) => q8_put::<1, 2, W>(q, scales, mins, cols, a, r, t, n, o),
                    _ => q8_put::<1, 1, W>(q, scales, mins, cols, a, r, t, n, o),
                }
            }
            t += nt;
        }
        r += nr;
    }
}

/// Rows `r0..r0 + R` times tokens `t0..t0 + T` of q8 weights into `out` (`[R, n]` from row
/// `r0`): per (row, token) the operations of [`q8_row`] and [`sum_groups`], in their order.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_put<const R: usize, const T: usize, W: Scales>(
    q: &[i8],
    wd: W,
    mins: Option<&[f32]>,
    cols: usize,
    a: &QuantAct,
    r0: usize,
    t0: usize,
    n: usize,
    out: &mut [f32],
) {
    let (g, ng) = (a.group, cols / a.group);
    let flip = _mm512_set1_epi8(-128);
    let rows: [QuantRow<'_>; T] = std::array::from_fn(|t| a.row(t0 + t));
    if !g.is_multiple_of(64) {
        let mut res = [[0f32; T]; R];
        // SAFETY: the caller's guarantees
        unsafe { put_sub::<R, T, W>(q, wd, mins, cols, r0, rows, &mut res) };
        for (i, row) in res.iter().enumerate() {
            out[i * n + t0..i * n + t0 + T].copy_from_slice(row);
        }
        return;
    }
    // float accumulators per (row, token): even groups into [0], odd into [1]
    let mut f = [[[_mm512_setzero_ps(); 2]; T]; R];
    for gi in 0..ng {
        // the group's int32 lanes: even 64-byte chunks into e, odd into o
        let mut e = [[_mm512_setzero_si512(); T]; R];
        let mut o = [[_mm512_setzero_si512(); T]; R];
        let end = (gi + 1) * g;
        let mut c = gi * g;
        while c < end {
            for (half, acc) in [(0, &mut e), (64, &mut o)] {
                let cc = c + half;
                if cc >= end {
                    break;
                }
                // SAFETY (the loads): chunk cc of each row and token is inside them (groups are
                // whole 64-byte chunks)
                let w: [__m512i; R] = std::array::from_fn(|i| unsafe {
                    _mm512_xor_si512(_mm512_loadu_si512(q.as_ptr().add((r0 + i) * cols + cc) as *const _), flip)
                });
                for (t, row) in rows.iter().enumerate() {
                    let x = unsafe { _mm512_loadu_si512(row.q.as_ptr().add(cc) as *const _) };
                    for i in 0..R {
                        acc[i][t] = _mm512_dpbusd_epi32(acc[i][t], w[i], x);
                    }
                }
            }
            c += 128;
        }
        for i in 0..R {
            for (t, row) in rows.iter().enumerate() {
                let b = _mm512_maskz_set1_epi32(1, -128 * row.sums[gi]);
                let v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(e[i][t], o[i][t]), b));
                let fp = &mut f[i][t][gi % 2];
                *fp = _mm512_fmadd_ps(v, _mm512_set1_ps(wd.one((r0 + i) * ng + gi) * row.scales[gi]), *fp);
            }
        }
    }
    for i in 0..R {
        for t in 0..T {
            out[i * n + t0 + t] = _mm512_reduce_add_ps(_mm512_add_ps(f[i][t][0], f[i][t][1]));
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_row<W: Scales>(q: &[i8], wd: W, at: usize, a: QuantRow<'_>) -> f32 {
    let g = a.group;
    let ng = q.len() / g;
    let flip = _mm512_set1_epi8(-128);
    // one 64-byte chunk at c into an accumulator: w + 128 as an unsigned byte times a
    let chunk = |acc: __m512i, c: usize| -> __m512i {
        // SAFETY: c + 64 <= cols (groups are whole 64-byte chunks)
        unsafe {
            let w = _mm512_loadu_si512(q.as_ptr().add(c) as *const _);
            let x = _mm512_loadu_si512(a.q.as_ptr().add(c) as *const _);
            _mm512_dpbusd_epi32(acc, _mm512_xor_si512(w, flip), x)
        }
    };
    // even and odd 64-byte chunks of group gi in separate accumulators
    let group = |gi: usize| -> (__m512i, __m512i) {
        let (mut e, mut o) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        let end = (gi + 1) * g;
        let mut c = gi * g;
        while c < end {
            e = chunk(e, c);
            if c + 64 < end {
                o = chunk(o, c + 64);
            }
            c += 128;
        }
        (e, o)
    };
    // the bias: sum ((w + 128) - 128) a = sum (w + 128) a - 128 sum a
    // SAFETY: as above
    unsafe { sum_groups(ng, 128, |gi| wd.one(at + gi), a, group) }
}

/// The row's dot product from its groups' int32 lanes: `group(gi)` gives two accumulators of
/// group gi's biased products; `bias` times the group's activation sum comes off exactly, in
/// lane 0, then one FMA scales the group by weight scale `wd(gi)` times activation scale. Two groups at a
/// time into separate float accumulators keep two chains in flight.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sum_groups(
    ng: usize,
    bias: i32,
    wd: impl Fn(usize) -> f32,
    a: QuantRow<'_>,
    group: impl Fn(usize) -> (__m512i, __m512i),
) -> f32 {
    let fold = |gi: usize, (x, y): (__m512i, __m512i), f: __m512| -> __m512 {
        let b = _mm512_maskz_set1_epi32(1, -bias * a.sums[gi]);
        let v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(x, y), b));
        _mm512_fmadd_ps(v, _mm512_set1_ps(wd(gi) * a.scales[gi]), f)
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

/// [`q8_put_sub`] for the group of `xs` (16 or 32).
///
/// # Safety
/// As [`q8_put_sub`]'s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn put_sub<const R: usize, const T: usize, W: Scales>(
    q: &[i8],
    wd: W,
    mins: Option<&[f32]>,
    cols: usize,
    r0: usize,
    xs: [QuantRow<'_>; T],
    out: &mut [[f32; T]; R],
) {
    // SAFETY (both): the caller's guarantees
    match xs[0].group {
        16 => unsafe { q8_put_sub::<R, T, 4, W>(q, wd, mins, cols, r0, xs, out) },
        _ => unsafe { q8_put_sub::<R, T, 2, W>(q, wd, mins, cols, r0, xs, out) },
    }
}

/// Rows `r0..r0 + R` of q8 weights times the `T` activation rows `xs`, for groups smaller than
/// a 64-byte chunk: `GPC` (4 or 2) groups per chunk. A chunk's int32 lane `l` sums 4 products
/// of its group `l * GPC / 16`; the lanes start from -128 times their 4 activations' sum (the
/// flip's bias, exact: one `vpdpbusd` of 128s per token, shared by the tile's rows), take the
/// flipped weights' products, and one FMA per chunk scales them with the groups' weight x
/// activation scales spread over their lanes by one permute; with `mins`, their term last. Per
/// (row, token) the same operations in the same order whatever the tile, so decode and prefill
/// agree bit for bit.
///
/// # Safety
/// AVX-512 F, BW and VNNI; `64 / GPC` is the rows' group; rows `r0..r0 + R` of `q` (`cols`
/// each) and their scales (`wd`) exist; each of `xs` holds `cols` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_put_sub<const R: usize, const T: usize, const GPC: usize, W: Scales>(
    q: &[i8],
    wd: W,
    mins: Option<&[f32]>,
    cols: usize,
    r0: usize,
    xs: [QuantRow<'_>; T],
    out: &mut [[f32; T]; R],
) {
    let ng = cols / (64 / GPC);
    debug_assert!(xs.iter().all(|x| x.group * GPC == 64 && x.q.len() >= cols && x.scales.len() >= ng));
    debug_assert!(q.len() >= (r0 + R) * cols);
    let flip = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    // lane l of a chunk: its group's place among the chunk's groups
    let lane_group = _mm512_srli_epi32::<4>(_mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(GPC as i32),
    ));
    let mut f = [[_mm512_setzero_ps(); T]; R];
    // 16 groups' scale products at a time: 16 / GPC chunks
    let mut sc = [[_mm512_setzero_ps(); T]; R];
    for ci in 0..cols / 64 {
        let k = ci % (16 / GPC);
        if k == 0 {
            let gb = ci * GPC;
            let m = first_lanes(ng - gb);
            // SAFETY (the loads): the masked lanes are groups gb.. of each token and each row
            let xsc: [__m512; T] =
                std::array::from_fn(|t| unsafe { _mm512_maskz_loadu_ps(m, xs[t].scales.as_ptr().add(gb)) });
            for (i, s) in sc.iter_mut().enumerate() {
                let w = unsafe { wd.lanes((r0 + i) * ng + gb, m) };
                for (s, x) in s.iter_mut().zip(xsc) {
                    *s = _mm512_mul_ps(w, x);
                }
            }
        }
        let idx = _mm512_add_epi32(lane_group, _mm512_set1_epi32((k * GPC) as i32));
        let c = ci * 64;
        // SAFETY: chunk c of each row is inside it
        let w: [__m512i; R] = std::array::from_fn(|i| unsafe {
            _mm512_xor_si512(_mm512_loadu_si512(q.as_ptr().add((r0 + i) * cols + c) as *const _), flip)
        });
        for (t, xr) in xs.iter().enumerate() {
            // SAFETY: chunk c of the token is inside it
            let x = unsafe { _mm512_loadu_si512(xr.q.as_ptr().add(c) as *const _) };
            let bias = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, flip, x));
            for i in 0..R {
                let v = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, w[i], x));
                f[i][t] = _mm512_fmadd_ps(v, _mm512_permutexvar_ps(idx, sc[i][t]), f[i][t]);
            }
        }
    }
    // asymmetric groups (`scale * q - min`): `- min_g * sum_g a * as_g`, 16 groups at a time
    if let Some(mins) = mins {
        for gb in (0..ng).step_by(16) {
            let m = first_lanes(ng - gb);
            for (i, f) in f.iter_mut().enumerate() {
                // SAFETY: the masked lanes are groups gb.. of the row and of each token
                let mv = unsafe { _mm512_maskz_loadu_ps(m, mins.as_ptr().add((r0 + i) * ng + gb)) };
                for (f, x) in f.iter_mut().zip(&xs) {
                    let ss = unsafe { _mm512_maskz_loadu_ps(m, x.scaled_sums.as_ptr().add(gb)) };
                    *f = _mm512_fnmadd_ps(mv, ss, *f);
                }
            }
        }
    }
    for i in 0..R {
        for t in 0..T {
            out[i][t] = _mm512_reduce_add_ps(f[i][t]);
        }
    }
}
