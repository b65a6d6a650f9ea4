//! The AVX-512 decode kernel over panel-major rows ([`crate::quant::panel_offset`]): a 16-row
//! superblock's 4-row blocks run over one panel of the activations after another, so the panel
//! stays in L1 while the weights stream past it. Each row's groups are added in the order the
//! 4-row tiles of `avx512.rs` add them, so the products are theirs, bit for bit.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512::{QMat, span, tiles};
use super::avx512_finish::finish;
use crate::quant::{PANEL_CHUNKS, PANEL_ROWS, ROW_BLOCK};

/// One token over panel-major rows: each whole superblock of [`PANEL_ROWS`] rows by
/// [`panel_superblock`], the rows around them (a piece of the rows need not start on one) by the
/// 4-row tiles. The same operations per row as the tiles, so the same bits.
///
/// # Safety
/// As [`super::avx512::q_matmul`]'s, with `m.panels` and one token.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn panel_matvec<const SIX: bool>(m: &QMat<'_>, rows: Range<usize>, out: &mut [f32]) {
    let first = rows.start.next_multiple_of(PANEL_ROWS).min(rows.end);
    let whole = first + (rows.end - first) / PANEL_ROWS * PANEL_ROWS;
    let at = |r: usize| r - rows.start;
    // SAFETY (all): the caller's guarantees, for the rows given
    unsafe {
        tiles::<ROW_BLOCK, 1, SIX, ROW_BLOCK>(m, rows.start..first, 0, 1, &mut out[..at(first)]);
        for r0 in (first..whole).step_by(PANEL_ROWS) {
            panel_superblock::<SIX>(m, r0, &mut out[at(r0)..at(r0) + PANEL_ROWS]);
        }
        tiles::<ROW_BLOCK, 1, SIX, ROW_BLOCK>(m, whole..rows.end, 0, 1, &mut out[at(whole)..]);
    }
}

/// Rows `r0..r0 + 16` (a superblock) times the one token: panel by panel, every 4-row block
/// over the panel before the next panel, in the order the bytes are stored; each block's float
/// accumulators kept from panel to panel, so each row's groups are added in the order the 4-row
/// tile adds them.
///
/// # Safety
/// As [`super::avx512::q_matmul`]'s; `r0` a multiple of [`PANEL_ROWS`] with the superblock inside the matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn panel_superblock<const SIX: bool>(m: &QMat<'_>, r0: usize, out: &mut [f32]) {
    const BLOCKS: usize = PANEL_ROWS / ROW_BLOCK;
    let chunks = m.cols / 128;
    let ng = m.ng;
    let mut f = [[[_mm512_setzero_ps(); 1]; ROW_BLOCK]; BLOCKS];
    for p0 in (0..chunks).step_by(PANEL_CHUNKS) {
        let panel = p0..(p0 + PANEL_CHUNKS).min(chunks);
        // the panel's groups (whole: a group divides a panel, `panels_pay`)
        let groups = panel.start * ng / chunks..panel.end * ng / chunks;
        for (b, f) in f.iter_mut().enumerate() {
            let r = r0 + b * ROW_BLOCK;
            // the same block's scales for this panel one superblock on, a few lines a block:
            // the scales of all 16 rows at once held the weights' stream up
            for i in r + PANEL_ROWS..r + PANEL_ROWS + ROW_BLOCK {
                let at = m.wd.as_ptr().wrapping_add(i * ng + groups.start) as *const u8;
                for l in (0..groups.len() * 4).step_by(64) {
                    crate::prefetch::line(at, l);
                }
            }
            // SAFETY: the caller's guarantees; the panel's groups are whole (`panels_pay`)
            unsafe { span::<ROW_BLOCK, 1, SIX, ROW_BLOCK>(m, r, 0, panel.clone(), f) };
        }
    }
    for (b, f) in f.iter_mut().enumerate() {
        let mut o = [[0f32; 1]; ROW_BLOCK];
        // SAFETY: the caller's guarantees
        unsafe { finish::<ROW_BLOCK, 1, SIX>(m, r0 + b * ROW_BLOCK, 0, f, &mut o) };
        for (i, v) in o.iter().enumerate() {
            out[b * ROW_BLOCK + i] = v[0];
        }
    }
}
