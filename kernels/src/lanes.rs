//! The lane order of q4 matrices (in memory only, made at load for the AVX-512 q4 kernel,
//! `mat/avx512_q4_rows.rs`): where each row's 4-byte words and scales lie, which matrices take
//! it, and the reordering from the x4 order.

use crate::quant::{Format, interleaved_offset};

/// Rows of a block of the lane order ([`lanes_offset`]).
pub const LANE_ROWS: usize = 16;

/// Offset of the first 4-byte word of 128-value chunk `c` of row `r` in a q4 matrix in lane order
/// (rows of `row_bytes`); its word `d` lies `64 d` bytes on. In memory only, made at load for the
/// AVX-512 q4 kernel (`mat/avx512_q4_rows.rs`): blocks of [`LANE_ROWS`] rows, each stored chunk
/// by chunk, a chunk as its 16 words (bytes `4 d..4 d + 4`), each word of the 16 rows side by
/// side, so one 64-byte load puts row `i`'s word in lane `i`.
#[inline]
pub fn lanes_offset(r: usize, c: usize, row_bytes: usize) -> usize {
    let chunks = row_bytes / 64;
    ((r / LANE_ROWS) * chunks + c) * 1024 + (r % LANE_ROWS) * 4
}

/// Whether a row-interleaved `[rows, cols]` q4 matrix with symmetric groups (f32 or f16 scales,
/// no mins, no records) goes to lane order when loaded for the AVX-512 kernels: groups of whole
/// 32-value blocks and rows a multiple of [`LANE_ROWS`].
pub fn lanes_pay(format: Format, rows: usize, cols: usize) -> bool {
    matches!(format, Format::Q4 { group } if group.is_multiple_of(32))
        && format.interleaves(rows, cols)
        && rows.is_multiple_of(LANE_ROWS)
}

/// A row-interleaved q4 matrix `src` (rows of `row_bytes`) in lane order, into `out` (same
/// length; the rows a multiple of [`LANE_ROWS`]).
pub fn lane_rows(src: &[u8], row_bytes: usize, out: &mut [u8]) {
    debug_assert!(src.len() == out.len() && src.len().is_multiple_of(row_bytes * LANE_ROWS));
    for r in 0..src.len() / row_bytes {
        for c in 0..row_bytes / 64 {
            let from = interleaved_offset(r, c, row_bytes, 64);
            for d in 0..16 {
                let to = lanes_offset(r, c, row_bytes) + d * 64;
                out[to..to + 4].copy_from_slice(&src[from + 4 * d..from + 4 * d + 4]);
            }
        }
    }
}

/// Index of row `r`'s scale of group `g` (of `ng` a row) in a q4 matrix's scales in lane order:
/// blocks of [`LANE_ROWS`] rows, each group's 16 scales side by side, so a block's scales are
/// the vectors the kernel scales its lanes by, and lie where the row-major ones of its rows do.
#[inline]
pub fn lane_scale_index(r: usize, g: usize, ng: usize) -> usize {
    (r / LANE_ROWS * ng + g) * LANE_ROWS + r % LANE_ROWS
}

/// Row-major scales `src` (`[rows, ng]`: f32 or f16, or their bytes as arrays; the rows a
/// multiple of [`LANE_ROWS`]) in lane order, into `out` (same length).
pub fn lane_scales<T: Copy>(src: &[T], ng: usize, out: &mut [T]) {
    debug_assert!(src.len() == out.len() && src.len().is_multiple_of(ng * LANE_ROWS));
    for (i, v) in src.iter().enumerate() {
        out[lane_scale_index(i / ng, i % ng, ng)] = *v;
    }
}

/// Row `r`'s `out.len()` scales of a matrix whose scales are in lane order.
pub fn lane_row_scales<T: Copy>(scales: &[T], r: usize, out: &mut [T]) {
    let ng = out.len();
    for (g, o) in out.iter_mut().enumerate() {
        *o = scales[lane_scale_index(r, g, ng)];
    }
}
