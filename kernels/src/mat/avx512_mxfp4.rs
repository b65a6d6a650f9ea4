//! AVX-512 VNNI kernel for MXFP4 weights (ggml's 17-byte blocks) over several tokens (prefill;
//! one token is faster through the AVX2 row kernel): 4 rows' blocks are decoded two at a time
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
