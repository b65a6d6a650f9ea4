//! Q4_K and IQ4_XS products for a prompt at the AVX-512 tier, 16 rows in a vector's lanes. A
//! sub-block's scale (Q4_K up to 63, IQ4_XS signed) times a code does not fit the u8 that
//! `vpdpbusd` takes, so the
//! tile keeps the codes and each 32-value sub-block's sum is weighted after: a line holds four
//! codes of each of 16 rows (one i32 lane a row), each token's four matching activations are
//! broadcast to all lanes, and eight `vpdpbusd` leave the sub-block's sum in the row's own lane,
//! which `vpmulld` weights by the row's scale. No lane is summed across, and `k23.rs`'s float
//! operations run on 16 rows at once (`avx512_k23_rows::block_floats`); the same bits as the
//! one-row kernel. IQ4_XS's signed values go in as value + 128 (a u8): the 128 times the
//! activations' sum of each sub-block comes off as an offset does (Q3_K's in `k23.rs`), through
//! the mins' lines holding `128 sc` for each sub-block.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512_k23_rows::{D, DMIN, LINES, Line, MINS, ROWS, TILE, block_floats, store_tile, token_spans};
use super::k23::K23_GROUP;
use crate::act::QuantAct;
use crate::ggml::{BlockType, IQ4_VALUES, f16_at, k_scale_min};

/// Lines of a tile's block: the codes, line `8g + j` holding values `32g + 4j..32g + 4j + 4` of
/// each row in its i32 lane; then, as `avx512_k23_rows` has them, the mins' lines (line `MINS +
/// g`: each row's min of sub-block `g` (IQ4_XS: `128 sc`) twice, an i16 pair against the token's
/// two sums of 16), `d` and `dmin`; then line `SC + g`: each row's scale of sub-block `g`.
const Q4K_LINES: usize = LINES + 8;
const SC: usize = LINES;

/// Tokens a tile's decoded codes serve at a time (eight sums in flight hide `vpdpbusd`'s
/// latency).
const TOKENS: usize = 8;

/// Products of whole tiles of 16 rows from `rows.start`, as `avx512_k23_rows::matmul_tiles`
/// gives them for the other types; returns the rows done.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI; `t` is Q4_K or IQ4_XS, `q` holds the rows of its blocks, `a` `n` tokens quantized in
/// groups of 256, `sums` their sums per 16, `out` `rows.len() * n` products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul_tiles(
    t: BlockType,
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
    let (rb, spans, q4k) = (t.bytes_of(cols), token_spans::<TOKENS>(n).count(), t == BlockType::Q4K);
    for tile in 0..tiles {
        let r0 = rows.start + tile * ROWS;
        // SAFETY (both): the caller's features; rows r0..r0 + 16 are among the matrix's, the
        // buffer holds nb blocks, the tokens as the caller promises
        unsafe { decode_tile(t, q, cols, r0, &mut buf) };
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
                    TOKENS if q4k => tokens::<TOKENS, true>(&buf, nb, a, sums, t0, n, o),
                    TOKENS => tokens::<TOKENS, false>(&buf, nb, a, sums, t0, n, o),
                    2 if q4k => tokens::<2, true>(&buf, nb, a, sums, t0, n, o),
                    2 => tokens::<2, false>(&buf, nb, a, sums, t0, n, o),
                    _ if q4k => tokens::<1, true>(&buf, nb, a, sums, t0, n, o),
                    _ => tokens::<1, false>(&buf, nb, a, sums, t0, n, o),
                }
            }
        }
    }
    TILE.with(|b| *b.borrow_mut() = buf);
    tiles * ROWS
}

/// Rows `r0..r0 + 16`'s blocks of `t` into `buf` as [`Q4K_LINES`] describes: the codes
/// gathered four bytes of 16 rows at a time, the scales and mins row by row.
///
/// # Safety
/// As [`matmul_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_tile(t: BlockType, q: &[u8], cols: usize, r0: usize, buf: &mut [Line]) {
    let (rb, bb, nb) = (t.bytes_of(cols), t.block_bytes(), cols / K23_GROUP);
    let first = &q[r0 * rb..(r0 + ROWS) * rb];
    // SAFETY (all): the caller's features; every gathered dword lies in the 16 rows' bytes
    unsafe {
        let offsets = _mm512_mullo_epi32(
            _mm512_set1_epi32(rb as i32),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        );
        let nib = _mm512_set1_epi8(15);
        // IQ4_XS: code c's value + 128, a u8 for `vpdpbusd` (the 128 comes off with the offsets)
        let biased = _mm512_add_epi8(
            _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i)),
            _mm512_set1_epi8(-128),
        );
        for (b, lines) in buf.chunks_exact_mut(Q4K_LINES).take(nb).enumerate() {
            let blocks = first.as_ptr().add(b * bb);
            for i in 0..32 {
                // Q4_K: dword j of bytes 16 + 32c.., low nibbles sub-block 2c, high 2c + 1;
                // IQ4_XS: dword j of bytes 8 + 16g.., low nibbles values 4j.., high 16 + 4j..
                let (at, lo_line, hi_line) = if t == BlockType::Q4K {
                    let (c, j) = (i / 8, i % 8);
                    (16 + 32 * c + 4 * j, 8 * (2 * c) + j, 8 * (2 * c + 1) + j)
                } else {
                    let (g, j) = (i / 4, i % 4);
                    (8 + 16 * g + 4 * j, 8 * g + j, 8 * g + 4 + j)
                };
                let v = _mm512_i32gather_epi32::<1>(offsets, blocks.add(at) as *const _);
                let (mut lo, mut hi) = (_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
                if t == BlockType::Iq4Xs {
                    (lo, hi) = (_mm512_shuffle_epi8(biased, lo), _mm512_shuffle_epi8(biased, hi));
                }
                _mm512_store_si512(lines[lo_line].0.as_mut_ptr() as *mut _, lo);
                _mm512_store_si512(lines[hi_line].0.as_mut_ptr() as *mut _, hi);
            }
            for r in 0..ROWS {
                let blk = &first[r * rb + b * bb..r * rb + (b + 1) * bb];
                for g in 0..8 {
                    // the scale, and the mins' (Q4_K) or the bias's (IQ4_XS: 128 sc) weight
                    let (sc, m) = if t == BlockType::Q4K {
                        let (sc, m) = k_scale_min(&blk[4..16], g);
                        (sc as i32, m as i32)
                    } else {
                        let high = u16::from_le_bytes([blk[2], blk[3]]);
                        let ls = (blk[4 + g / 2] >> (4 * (g % 2))) & 15 | (((high >> (2 * g)) & 3) as u8) << 4;
                        (ls as i32 - 32, 128 * (ls as i32 - 32))
                    };
                    let pair = (m as u16 as u32) * 0x1_0001;
                    lines[SC + g].0[4 * r..4 * r + 4].copy_from_slice(&sc.to_le_bytes());
                    lines[MINS + g].0[4 * r..4 * r + 4].copy_from_slice(&pair.to_le_bytes());
                }
                let dm = if t == BlockType::Q4K { f16_at(blk, 2) } else { 0.0 };
                lines[D].0[4 * r..4 * r + 4].copy_from_slice(&f16_at(blk, 0).to_le_bytes());
                lines[DMIN].0[4 * r..4 * r + 4].copy_from_slice(&dm.to_le_bytes());
            }
        }
    }
}

/// Tokens `t0..t0 + T` against a decoded tile.
///
/// # Safety
/// As [`matmul_tiles`]; `buf` a decoded tile, `o` the tile's `16 * n` products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tokens<const T: usize, const Q4K: bool>(
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
            block_floats::<T, Q4K>(&mut acc, isum, lines, (a, sums), t0, b, nb);
        }
    }
    store_tile(&acc, t0, n, o);
}
