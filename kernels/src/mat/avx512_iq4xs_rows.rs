//! IQ4_XS products for a prompt at the AVX-512 tier, 16 rows in a vector's lanes as
//! `avx512_k23_rows.rs` has Q2_K's: a tile of 16 rows decoded once, every token against it. A
//! codebook value times its sub-block's scale needs 13 bits (|value| <= 127, |scale| <= 32), so
//! the weights are i16 and meet the activations widened to i16 (`vpdpwssd`: each 128-bit lane
//! four rows' 8 values); a block's integer sums end in one i32 lane per row, and `k23.rs`'s
//! float operations run on 16 rows at once. The same bits as the one-row kernel.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512_k23_rows::{Line, ROWS, store_tile, tile_sums, token_spans};
use super::k23::K23_GROUP;
use crate::act::QuantAct;
use crate::ggml::{BlockType, IQ4_VALUES, f16_at};

/// 64-byte lines of a tile's block: the weights, `[32 groups of 8 values][4 vectors]` (vector
/// `m`'s 128-bit lane `l` holds row `4l + m`'s 8 values, as `reduce` wants them), then the 16
/// rows' `d`.
const LINES: usize = 128 + 1;
const D: usize = 128;

/// Tokens a tile's decoded weights serve at a time.
const TOKENS: usize = 4;

thread_local! {
    /// A tile's blocks, decoded, and the tokens' codes as i16.
    static TILE: RefCell<(Vec<Line>, Vec<i16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// As `avx512_k23_rows::matmul_tiles`, for IQ4_XS.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI; `q` holds the rows of IQ4_XS blocks, `a` `n` tokens quantized in
/// groups of 256, `out` `rows.len() * n` products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul_tiles(
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) -> usize {
    let nb = cols / K23_GROUP;
    let tiles = rows.len() / ROWS;
    // out of the cell: a closure would not inherit this function's features
    let (mut buf, mut wide) = TILE.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.resize(nb * LINES, Line([0; 64]));
    wide.clear();
    wide.extend(a.q[..n * cols].iter().map(|&v| v as i16));
    for tile in 0..tiles {
        // SAFETY (both): the caller's features; rows r0..r0 + 16 are among the matrix's, the
        // buffer holds nb blocks, the tokens as the caller promises
        unsafe { decode_tile(q, cols, rows.start + tile * ROWS, &mut buf) };
        let o = &mut out[tile * ROWS * n..(tile + 1) * ROWS * n];
        for (t0, w) in token_spans::<TOKENS>(n) {
            // SAFETY: as above, tokens t0..t0 + w
            unsafe {
                match w {
                    TOKENS => tokens::<TOKENS>(&buf, &wide, nb, a, t0, n, o),
                    2 => tokens::<2>(&buf, &wide, nb, a, t0, n, o),
                    _ => tokens::<1>(&buf, &wide, nb, a, t0, n, o),
                }
            }
        }
    }
    TILE.with(|b| *b.borrow_mut() = (buf, wide));
    tiles * ROWS
}

/// Rows `r0..r0 + 16`'s blocks into `buf` as [`LINES`] describes.
///
/// # Safety
/// As [`matmul_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_tile(q: &[u8], cols: usize, r0: usize, buf: &mut [Line]) {
    let t = BlockType::Iq4Xs;
    let (rb, bb, nb) = (t.bytes_of(cols), t.block_bytes(), cols / K23_GROUP);
    // SAFETY: 16 bytes of the codebook
    let table = unsafe { _mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i) };
    let nib = _mm_set1_epi8(15);
    for r in 0..ROWS {
        let row = &q[(r0 + r) * rb..(r0 + r + 1) * rb];
        let (m, l) = (r % 4, r / 4);
        for (b, lines) in buf.chunks_exact_mut(LINES).take(nb).enumerate() {
            let blk = &row[b * bb..(b + 1) * bb];
            let high = u16::from_le_bytes([blk[2], blk[3]]);
            for j in 0..8 {
                // sub-block j: values 32j.. from the low nibbles of 16 bytes, then the high ones
                let ls = (blk[4 + j / 2] >> (4 * (j % 2))) & 15 | (((high >> (2 * j)) & 3) as u8) << 4;
                let sc = _mm256_set1_epi16(ls as i16 - 32);
                // SAFETY: 16 bytes within the block
                let qb = unsafe { _mm_loadu_si128(blk.as_ptr().add(8 + 16 * j) as *const __m128i) };
                let halves = [_mm_and_si128(qb, nib), _mm_and_si128(_mm_srli_epi16::<4>(qb), nib)];
                for (h, codes) in halves.into_iter().enumerate() {
                    let w = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, codes)), sc);
                    // SAFETY: a 32-byte vector as two 16-byte groups
                    let w: [[u8; 16]; 2] = unsafe { std::mem::transmute(w) };
                    for (k, v) in w.iter().enumerate() {
                        let g = 4 * j + 2 * h + k;
                        lines[4 * g + m].0[16 * l..16 * l + 16].copy_from_slice(v);
                    }
                }
            }
            lines[D].0[4 * r..4 * r + 4].copy_from_slice(&f16_at(blk, 0).to_le_bytes());
        }
    }
}

/// Tokens `t0..t0 + T` against a decoded tile; `wide` the tokens' codes as i16.
///
/// # Safety
/// As [`matmul_tiles`]; `buf` a decoded tile, `o` the tile's `16 * n` products.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens<const T: usize>(
    buf: &[Line],
    wide: &[i16],
    nb: usize,
    a: &QuantAct,
    t0: usize,
    n: usize,
    o: &mut [f32],
) {
    let cols = nb * K23_GROUP;
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, lines) in buf.chunks_exact(LINES).take(nb).enumerate() {
        // SAFETY (all): the caller's features; the tile's lines, the tokens' codes and scales
        // within the caller's spans
        unsafe {
            let at = wide.as_ptr().add(t0 * cols + K23_GROUP * b) as *const u8;
            let isum = tile_sums::<T, 32, true>(lines, at, 2 * cols);
            let d = _mm512_load_ps(lines[D].0.as_ptr() as *const f32);
            for tt in 0..T {
                // `k23::dot_scalar`'s operations, a row a lane (IQ4_XS has no mins)
                let scale = _mm512_set1_ps(*a.scales.get_unchecked((t0 + tt) * nb + b));
                let s = _mm512_cvtepi32_ps(isum[tt]);
                acc[tt] = _mm512_add_ps(acc[tt], _mm512_mul_ps(s, _mm512_mul_ps(d, scale)));
            }
        }
    }
    store_tile(&acc, t0, n, o);
}
