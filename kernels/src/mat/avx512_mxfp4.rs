//! AVX-512 VNNI kernels for MXFP4 weights (ggml's 17-byte blocks). Over several tokens
//! (prefill, [`mxfp4_matmul`]), 4 rows' blocks are decoded two at a time
//! into 64-byte vectors in a buffer, then taken with the tokens two at a time, each token's
//! activations, offset sums and scales shared by the 4 rows.
//!
//! Two blocks' 16 code bytes make one 256-bit load pair; their low and high nibbles are
//! arranged `[lo g, hi g, lo g+1, hi g+1]` (each block's 32 values in order), looked up in a
//! table of the codes' doubled values plus 12 (so unsigned, as `vpdpbusd` wants its first
//! operand), and multiplied with the activations: lane `l` of each half is the exact sum over
//! values `4l..4l + 4` of `(w + 12) * x`, from which `12 * (x's sum)` (the same instruction on a
//! vector of 12s) comes off, exactly. Those are the AVX2 kernel's lanes (`dot/avx2.rs`), and each
//! is fused-multiply-added with `2^(e - 128) * activation scale` into accumulator `block % 4` as
//! there, and reduced by the same [`crate::dot::mxfp4_reduce`]: every tier gives the same bits,
//! and a prompt's products equal its tokens' one by one.
//!
//! One token ([`mxfp4_matvec`], decode) takes the same lanes on 256-bit vectors, two rows at a
//! time straight from the blocks (no buffer), with the rows' block scales made first, eight at a
//! time: 18.7 vs 10.6 GB/s for the AVX2 row kernel on a [5760, 2880] matrix from memory, one
//! Zen 4 thread (`benches/matvec.rs`).

use std::arch::x86_64::*;
use std::ops::Range;

use crate::act::{QuantAct, QuantRow};
use crate::mxfp4::{BLOCK_BYTES, E2M1_X2, half_scale};

/// The codes' doubled values plus 12, in each 128-bit lane (`vpshufb` looks up per lane).
const LUT: [i8; 64] = {
    let mut t = [0i8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = E2M1_X2[i % 16] + 12;
        i += 1;
    }
    t
};

/// `out[i * n + t] = W[rows.start + i] · a[t]`.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI; `q` holds the rows (`cols / 32 * 17` bytes
/// each), `a` the `n` rows quantized in groups of 32, `out.len() == rows.len() * n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn mxfp4_matmul(q: &[u8], cols: usize, a: &QuantAct, n: usize, rows: Range<usize>, out: &mut [f32]) {
    let rb = cols / 32 * BLOCK_BYTES;
    let pairs = (cols / 32).div_ceil(2);
    SCRATCH.with_borrow_mut(|s| {
        s.row_w.resize(ROWS * pairs, _mm512_setzero_si512());
        s.row_e.resize(ROWS * pairs, _mm512_setzero_ps());
        let mut i = 0;
        while i < rows.len() {
            let rn = (rows.len() - i).min(ROWS);
            for k in 0..rn {
                let r = rows.start + i + k;
                let row = &q[r * rb..(r + 1) * rb];
                for p in 0..pairs {
                    // SAFETY: as above
                    (s.row_w[k * pairs + p], s.row_e[k * pairs + p]) = unsafe { decode_pair(row, 2 * p) };
                }
            }
            let mut t = 0;
            while t < n {
                let tn = (n - t).min(2);
                // SAFETY: as above (the buffer holds `rn` decoded rows)
                unsafe {
                    match (rn, tn) {
                        (ROWS, 2) => tile::<ROWS, 2>(s, pairs, cols, a, t, n, i, out),
                        (ROWS, _) => tile::<ROWS, 1>(s, pairs, cols, a, t, n, i, out),
                        (3, 2) => tile::<3, 2>(s, pairs, cols, a, t, n, i, out),
                        (3, _) => tile::<3, 1>(s, pairs, cols, a, t, n, i, out),
                        (2, 2) => tile::<2, 2>(s, pairs, cols, a, t, n, i, out),
                        (2, _) => tile::<2, 1>(s, pairs, cols, a, t, n, i, out),
                        (_, 2) => tile::<1, 2>(s, pairs, cols, a, t, n, i, out),
                        _ => tile::<1, 1>(s, pairs, cols, a, t, n, i, out),
                    }
                }
                t += tn;
            }
            i += rn;
        }
    });
}

/// Rows decoded together in the prefill path.
const ROWS: usize = 4;

/// Decoded rows `0..R` of the buffer times tokens `t..t + T`, into `out` (rows from `i`).
///
/// # Safety
/// AVX-512 F, BW, VNNI; the buffer holds `R` decoded rows of `pairs` pairs.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const T: usize>(
    s: &Scratch,
    pairs: usize,
    cols: usize,
    a: &QuantAct,
    t: usize,
    n: usize,
    i: usize,
    out: &mut [f32],
) {
    let last_mask: __mmask16 = if (cols / 32).is_multiple_of(2) { 0xFFFF } else { 0x00FF };
    let twelve = _mm512_set1_epi8(12);
    let acts: [QuantRow<'_>; T] = std::array::from_fn(|j| a.row(t + j));
    let mut acc = [[[_mm512_setzero_ps(); 2]; T]; R];
    for p in 0..pairs {
        let mask = if p + 1 == pairs { last_mask } else { 0xFFFF };
        let g = 2 * p;
        for (j, x) in acts.iter().enumerate() {
            // SAFETY: the caller's
            let xv = unsafe { load_acts(*x, p, cols) };
            let c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, xv);
            let s1 = if mask == 0xFFFF { x.scales[g + 1] } else { 0.0 };
            let xs = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(x.scales[g]), _mm512_set1_ps(s1));
            for (k, acc) in acc.iter_mut().enumerate() {
                let d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), s.row_w[k * pairs + p], xv);
                let lanes = _mm512_cvtepi32_ps(_mm512_sub_epi32(d, c));
                let sc = _mm512_mul_ps(s.row_e[k * pairs + p], xs);
                acc[j][p % 2] = _mm512_mask3_fmadd_ps(lanes, sc, acc[j][p % 2], mask);
            }
        }
    }
    for (k, acc) in acc.iter().enumerate() {
        for (j, acc) in acc.iter().enumerate() {
            out[(i + k) * n + t + j] = reduce(acc);
        }
    }
}

/// Per-thread buffers of the prefill path (grown once, then reused: a warm pass allocates
/// nothing).
#[derive(Default)]
struct Scratch {
    /// per pair of the row: its looked-up codes, and its blocks' scales
    row_w: Vec<__m512i>,
    row_e: Vec<__m512>,
    /// the one-token path: per block, `-12 *` the sums of its activations' fours
    neg_sums: Vec<__m256i>,
    /// ... and the row's blocks' scales times the activation scales
    block_scales: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// The activations of blocks `2p` and `2p + 1` (zero past a lone last block).
///
/// # Safety
/// AVX-512 BW; `x` holds `cols` activations.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_acts(x: QuantRow<'_>, p: usize, cols: usize) -> __m512i {
    let xp = x.q.as_ptr().wrapping_add(p * 64);
    // SAFETY: 64 bytes, or the lone block's 32, are in the row
    unsafe {
        if (p + 1) * 64 <= cols {
            _mm512_loadu_si512(xp as *const __m512i)
        } else {
            _mm512_maskz_loadu_epi8(0xFFFF_FFFF, xp)
        }
    }
}

/// Blocks `g` and `g + 1` of `row` (or `g` alone, the other half then zero-scaled): the
/// codes' table values plus 12 in value order, and `[2^(e - 128) x 8, ...]`.
///
/// # Safety
/// AVX-512 BW; block `g` is in the row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_pair(row: &[u8], g: usize) -> (__m512i, __m512) {
    let two = (g + 1) * BLOCK_BYTES < row.len();
    let p = row.as_ptr();
    // SAFETY: the caller's; a lone last block's second half reads its codes again
    let codes = unsafe {
        let b0 = _mm_loadu_si128(p.add(g * BLOCK_BYTES + 1) as *const __m128i);
        let b1 = if two { _mm_loadu_si128(p.add((g + 1) * BLOCK_BYTES + 1) as *const __m128i) } else { b0 };
        _mm256_inserti128_si256(_mm256_castsi128_si256(b0), b1, 1)
    };
    let low4 = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(codes, low4);
    let hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), low4);
    // [lo g, lo g+1, hi g, hi g+1] -> [lo g, hi g, lo g+1, hi g+1]
    let idx = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    let idx = _mm512_shuffle_i64x2(idx, idx, 0b11_01_10_00);
    // SAFETY: 64 bytes
    let w = _mm512_shuffle_epi8(unsafe { _mm512_loadu_si512(LUT.as_ptr() as *const __m512i) }, idx);
    let e1 = if two { half_scale(row[(g + 1) * BLOCK_BYTES]) } else { 0.0 };
    let e = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(half_scale(row[g * BLOCK_BYTES])), _mm512_set1_ps(e1));
    (w, e)
}

/// A token's two accumulators (halves: blocks 0, 1 and 2, 3 mod 4) reduced as every tier does.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce(acc: &[__m512; 2]) -> f32 {
    let mut l = [0f32; 32];
    // SAFETY: 32 f32 into an array of 32
    unsafe {
        _mm512_storeu_ps(l.as_mut_ptr(), acc[0]);
        _mm512_storeu_ps(l.as_mut_ptr().add(16), acc[1]);
    }
    let part = |k: usize| -> [f32; 8] { std::array::from_fn(|i| l[k * 8 + i]) };
    crate::dot::mxfp4_reduce([part(0), part(1), part(2), part(3)])
}

/// `out[i] = W[rows.start + i] · x`, one token, two rows at a time (two streams of bytes read
/// in order, which the hardware prefetchers follow; four were slower): per block, its 16 code bytes in both halves of a
/// 256-bit vector, the high nibbles shifted down in the upper half, looked up in the table of
/// doubled values plus 12, and `vpdpbusd` onto `-12 * (x's sums)` (made once per call): lane
/// `l` is then the exact sum over values `4l..4l + 4`, the AVX2 kernel's lane. Eight blocks'
/// exponent bytes come out of two 64-byte loads with one `vpermt2b`, and `vscalefps` makes
/// `activation scale * 2^(e - 128)`: the exact product rounded once, as the other tiers'
/// `half_scale(e) * scale`. Each block's lanes are fused-multiply-added into accumulator
/// `block % 4`: the same operations in the same order as the other tiers, so the same bits,
/// in about a third of the AVX2 kernel's instructions.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL, VNNI and VBMI; `q` holds the rows (`cols / 32 * 17`
/// bytes each), `x` the token quantized in groups of 32, `out.len() == rows.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")]
pub unsafe fn mxfp4_matvec(q: &[u8], cols: usize, x: QuantRow<'_>, rows: Range<usize>, out: &mut [f32]) {
    let nb = cols / 32;
    assert!(
        q.len() >= rows.end * nb * BLOCK_BYTES && x.q.len() >= cols && x.scales.len() >= nb && out.len() == rows.len()
    );
    let twelve = _mm256_set1_epi8(12);
    SCRATCH.with_borrow_mut(|s| {
        s.neg_sums.resize(nb, _mm256_setzero_si256());
        for (g, c) in s.neg_sums.iter_mut().enumerate() {
            // SAFETY: block g's 32 activations are in the row
            let xv = unsafe { _mm256_loadu_si256(x.q.as_ptr().add(g * 32) as *const __m256i) };
            *c = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), twelve, xv));
        }
        s.block_scales.resize(VEC_ROWS * nb, 0.0);
        let mut i = 0;
        while i < rows.len() {
            let rn = (rows.len() - i).min(VEC_ROWS);
            let (r, o) = (rows.start + i, &mut out[i..i + rn]);
            // SAFETY: as above
            unsafe {
                match rn {
                    VEC_ROWS => matvec_rows::<VEC_ROWS>(q, nb, x, r, s, o),
                    _ => matvec_rows::<1>(q, nb, x, r, s, o),
                }
            }
            i += rn;
        }
    });
}

/// Rows decoded side by side in the one-token path (sharing each block's activation loads).
const VEC_ROWS: usize = 2;

/// Rows `r..r + R` of [`mxfp4_matvec`], `s.neg_sums` made.
///
/// # Safety
/// As [`mxfp4_matvec`] (its asserts hold).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma")]
unsafe fn matvec_rows<const R: usize>(
    q: &[u8],
    nb: usize,
    x: QuantRow<'_>,
    r: usize,
    s: &mut Scratch,
    out: &mut [f32],
) {
    let rb = nb * BLOCK_BYTES;
    let rp: [*const u8; R] = std::array::from_fn(|k| q[(r + k) * rb..].as_ptr());
    for (k, &p) in rp.iter().enumerate() {
        // SAFETY: the row is in q; the buffer holds R rows of nb
        unsafe { row_scales(p, nb, x.scales, &mut s.block_scales[k * nb..(k + 1) * nb]) };
    }
    // SAFETY: 32 bytes
    let lut = unsafe { _mm256_loadu_si256(LUT.as_ptr() as *const __m256i) };
    let shift = _mm256_set_epi64x(0x0004_0004_0004_0004, 0x0004_0004_0004_0004, 0, 0);
    let (ns, scales) = (s.neg_sums.as_ptr(), s.block_scales.as_ptr());
    // block g of every row, into accumulator `a` (= g % 4)
    let block = |g: usize, a: usize, acc: &mut [[__m256; 4]; R]| {
        // SAFETY: block g's 32 activations are in x, its sums in `neg_sums`
        let (xv, c) = unsafe { (_mm256_loadu_si256(x.q.as_ptr().add(g * 32) as *const __m256i), *ns.add(g)) };
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: block g's 16 code bytes follow its exponent in row k; its scale is in the
            // buffer
            let (codes, sc) = unsafe {
                (
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(rp[k].add(g * BLOCK_BYTES + 1) as *const __m128i)),
                    *scales.add(k * nb + g),
                )
            };
            let w = _mm256_permutexvar_epi8(_mm256_srlv_epi16(codes, shift), lut);
            let lanes = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(c, w, xv));
            acc[a] = _mm256_fmadd_ps(lanes, _mm256_set1_ps(sc), acc[a]);
        }
    };
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let mut g = 0;
    while g + 4 <= nb {
        for a in 0..4 {
            block(g + a, a, &mut acc);
        }
        g += 4;
    }
    for a in 0..nb - g {
        block(g + a, a, &mut acc);
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = crate::dot::avx2::mxfp4_reduce_lanes(acc);
    }
}

/// `out[g] = 2^(e_g - 128) * scales[g]` for the `nb` blocks of the row at `rp`: eight blocks'
/// exponent bytes picked out of two 64-byte loads by one `vpermt2b`, then `vscalefps` (the
/// rest one by one through [`half_scale`]).
///
/// # Safety
/// AVX-512 F, VL, VBMI; `rp` points at `nb` whole blocks, `scales` and `out` hold `nb`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2")]
unsafe fn row_scales(rp: *const u8, nb: usize, scales: &[f32], out: &mut [f32]) {
    // SAFETY: 64 bytes
    let picks = unsafe { _mm512_loadu_si512(EXPONENTS.as_ptr() as *const __m512i) };
    let bias = _mm256_set1_epi32(128);
    let mut g = 0;
    while g + 8 <= nb {
        // SAFETY: blocks g..g + 8 (136 bytes) are in the row; scales and out hold them
        unsafe {
            let e = _mm512_permutex2var_epi8(
                _mm512_loadu_si512(rp.add(g * BLOCK_BYTES) as *const __m512i),
                picks,
                _mm512_loadu_si512(rp.add(g * BLOCK_BYTES + 64) as *const __m512i),
            );
            let e = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm512_castsi512_si128(e)), bias);
            let sc = _mm256_scalef_ps(_mm256_loadu_ps(scales.as_ptr().add(g)), _mm256_cvtepi32_ps(e));
            _mm256_storeu_ps(out.as_mut_ptr().add(g), sc);
        }
        g += 8;
    }
    for g in g..nb {
        // SAFETY: block g's exponent is in the row
        out[g] = half_scale(unsafe { *rp.add(g * BLOCK_BYTES) }) * scales[g];
    }
}

/// `vpermt2b` indices of eight consecutive blocks' exponent bytes (17 apart) in 128 bytes.
const EXPONENTS: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 8 {
        t[i] = (i * BLOCK_BYTES) as u8;
        i += 1;
    }
    t
};
