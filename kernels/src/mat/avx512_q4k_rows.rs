//! Q4_K products for a prompt at the AVX-512 tier, 16 rows in a vector's lanes. A sub-block's
//! scale (up to 63) times a code (up to 15) does not fit the u8 that `vpdpbusd` takes, so the
//! tile keeps the codes and each 32-value sub-block's sum is weighted after: a line holds four
//! codes of each of 16 rows (one i32 lane a row), each token's four matching activations are
//! broadcast to all lanes, and eight `vpdpbusd` leave the sub-block's sum in the row's own lane,
//! which `vpmulld` weights by the row's scale. No lane is summed across, and `k23.rs`'s float
//! operations run on 16 rows at once (`avx512_k23_rows::block_floats`); the same bits as the
//! one-row kernel.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512_k23_rows::{D, DMIN, LINES, Line, MINS, ROWS, TILE, block_floats, store_tile, token_spans};
use super::k23::K23_GROUP;
use crate::act::QuantAct;
use crate::ggml::{BlockType, f16_at, k_scale_min};

/// Lines of a tile's block: the codes, line `8g + j` holding bytes `4j..4j + 4` of sub-block `g`
/// (of 32 values) of each row in its i32 lane; then, as `avx512_k23_rows` has them, the mins'
/// lines (line `MINS + g`: each row's min of sub-block `g` twice, an i16 pair against the
/// token's two sums of 16), `d` and `dmin`; then line `SC + g`: each row's scale of sub-block `g`.
const Q4K_LINES: usize = LINES + 8;
const SC: usize = LINES;

/// Tokens a tile's decoded codes serve at a time (eight sums in flight hide `vpdpbusd`'s
/// latency).
const TOKENS: usize = 8;

/// Products of whole tiles of 16 rows from `rows.start`, as `avx512_k23_rows::matmul_tiles`
/// gives them for the other types; returns the rows done.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI; `q` holds the rows of Q4_K blocks, `a` `n` tokens quantized in
/// groups of 256, `sums` their sums per 16, `out` `rows.len() * n` products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul_tiles(
    (q, cols): (&[u8], usize),
    a: &QuantAct,
    sums: &[i16],
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) -> usize {
    let nb = cols / K23_GROUP;
    let tiles = rows.len() / ROWS;
    // out of the cell: a closure would not inherit this function's features
    let mut buf = TILE.with(|b| std::mem::take(&mut *b.borrow_mut()));
    buf.resize(nb * Q4K_LINES, Line([0; 64]));
    let (rb, spans) = (BlockType::Q4K.bytes_of(cols), token_spans::<TOKENS>(n).count());
    for tile in 0..tiles {
        let r0 = rows.start + tile * ROWS;
        // SAFETY (both): the caller's features; rows r0..r0 + 16 are among the matrix's, the
        // buffer holds nb blocks, the tokens as the caller promises
        unsafe { decode_tile(q, cols, r0, &mut buf) };
        let o = &mut out[tile * ROWS * n..(tile + 1) * ROWS * n];
        // the next tile's rows come in while this one's tokens run, a part a span (the tile's
        // 16 rows are 16 streams, more than the hardware prefetchers follow)
        let next = q.as_ptr().wrapping_add((r0 + ROWS) * rb);
        let ahead = if tile + 1 < tiles { ROWS * rb } else { 0 };
        for (span, (t0, w)) in token_spans::<TOKENS>(n).enumerate() {
            crate::prefetch::part_of(next, ahead, span, spans);
            // SAFETY: as above, tokens t0..t0 + w
            unsafe {
                match w {
                    TOKENS => tokens::<TOKENS>(&buf, nb, a, sums, t0, n, o),
                    2 => tokens::<2>(&buf, nb, a, sums, t0, n, o),
                    _ => tokens::<1>(&buf, nb, a, sums, t0, n, o),
                }
            }
        }
    }
    TILE.with(|b| *b.borrow_mut() = buf);
    tiles * ROWS
}

/// Rows `r0..r0 + 16`'s blocks into `buf` as [`Q4K_LINES`] describes: the codes gathered four
/// bytes of 16 rows at a time, the scales and mins row by row.
///
/// # Safety
/// As [`matmul_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_tile(q: &[u8], cols: usize, r0: usize, buf: &mut [Line]) {
    let t = BlockType::Q4K;
    let (rb, bb, nb) = (t.bytes_of(cols), t.block_bytes(), cols / K23_GROUP);
    let first = &q[r0 * rb..(r0 + ROWS) * rb];
    // SAFETY (all): the caller's features; every gathered dword lies in the 16 rows' bytes
    unsafe {
        let offsets = _mm512_mullo_epi32(
            _mm512_set1_epi32(rb as i32),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        );
        let nib = _mm512_set1_epi8(15);
        for (b, lines) in buf.chunks_exact_mut(Q4K_LINES).take(nb).enumerate() {
            // bytes 16 + 32c.. of a block: the low nibbles are sub-block 2c, the high 2c + 1
            for c in 0..4 {
                for j in 0..8 {
                    let at = first.as_ptr().add(b * bb + 16 + 32 * c + 4 * j);
                    let v = _mm512_i32gather_epi32::<1>(offsets, at as *const _);
                    let (lo, hi) = (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
                    _mm512_store_si512(lines[8 * (2 * c) + j].0.as_mut_ptr() as *mut _, lo);
                    _mm512_store_si512(lines[8 * (2 * c + 1) + j].0.as_mut_ptr() as *mut _, hi);
                }
            }
            for r in 0..ROWS {
                let blk = &first[r * rb + b * bb..r * rb + (b + 1) * bb];
                for g in 0..8 {
                    let (sc, m) = k_scale_min(&blk[4..16], g);
                    lines[SC + g].0[4 * r..4 * r + 4].copy_from_slice(&(sc as u32).to_le_bytes());
                    lines[MINS + g].0[4 * r..4 * r + 4].copy_from_slice(&(m as u32 * 0x1_0001).to_le_bytes());
                }
                lines[D].0[4 * r..4 * r + 4].copy_from_slice(&f16_at(blk, 0).to_le_bytes());
                lines[DMIN].0[4 * r..4 * r + 4].copy_from_slice(&f16_at(blk, 2).to_le_bytes());
            }
        }
    }
}

/// Tokens `t0..t0 + T` against a decoded tile.
///
/// # Safety
/// As [`matmul_tiles`]; `buf` a decoded tile, `o` the tile's `16 * n` products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens<const T: usize>(
    buf: &[Line],
    nb: usize,
    a: &QuantAct,
    sums: &[i16],
    t0: usize,
    n: usize,
    o: &mut [f32],
) {
    let cols = nb * K23_GROUP;
    let mut acc = [_mm512_setzero_ps(); T];
    for (b, lines) in buf.chunks_exact(Q4K_LINES).take(nb).enumerate() {
        // SAFETY (all): the caller's features; the tile's lines, the tokens' codes, sums and
        // scales within the caller's spans
        unsafe {
            let at = a.q.as_ptr().add(t0 * cols + K23_GROUP * b) as *const i32;
            let mut isum = [_mm512_setzero_si512(); T];
            for g in 0..8 {
                let mut part = [_mm512_setzero_si512(); T];
                for j in 0..8 {
                    let w = _mm512_load_si512(lines[8 * g + j].0.as_ptr() as *const _);
                    for (tt, p) in part.iter_mut().enumerate() {
                        let four = _mm512_set1_epi32(at.add(tt * cols / 4 + 8 * g + j).read_unaligned());
                        *p = _mm512_dpbusd_epi32(*p, w, four);
                    }
                }
                let sc = _mm512_load_si512(lines[SC + g].0.as_ptr() as *const _);
                for (s, p) in isum.iter_mut().zip(part) {
                    *s = _mm512_add_epi32(*s, _mm512_mullo_epi32(p, sc));
                }
            }
            block_floats::<T, true>(&mut acc, isum, lines, (a, sums), t0, b, nb);
        }
    }
    store_tile(&acc, t0, n, o);
}
