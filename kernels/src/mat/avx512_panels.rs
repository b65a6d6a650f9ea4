//! The AVX-512 decode kernel over panel-major rows ([`crate::quant::panel_offset`]): a 16-row
//! superblock's 4-row blocks run over one panel of the activations after another, so the panel
//! stays in L1 while the weights stream past it. Each row's groups are added in the order the
//! 4-row tiles of `avx512.rs` add them (`q_tile`, `q_tile_sub`: the same operations, here over a
//! panel's chunks at a time with the float accumulators kept between panels), so the products
//! are theirs, bit for bit. The tiles themselves stay whole-row loops: cut into spans, their
//! prefill lost 5-13% (measured when this was added).

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512::{QMat, chunk_dots, finish, lane_groups, scale_products, tiles};
use crate::quant::{PANEL_CHUNKS, PANEL_ROWS, ROW_BLOCK};

/// A 4-row block's float accumulators over one token.
type Acc = [[__m512; 1]; ROW_BLOCK];

/// One token over panel-major rows: each whole superblock of [`PANEL_ROWS`] rows by
/// [`panel_superblock`], the rows around them (a piece of the rows need not start on one) by the
/// 4-row tiles. The same operations per row as the tiles, so the same bits.
///
/// # Safety
/// As [`super::avx512::q_matmul`]'s, with the rows panel-major and one token.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn panel_matvec<const SIX: bool>(m: &QMat<'_>, rows: Range<usize>, out: &mut [f32]) {
    let first = rows.start.next_multiple_of(PANEL_ROWS).min(rows.end);
    let whole = first + (rows.end - first) / PANEL_ROWS * PANEL_ROWS;
    let at = |r: usize| r - rows.start;
    // SAFETY (all): the caller's guarantees, for the rows given
    unsafe {
        tiles::<ROW_BLOCK, 1, SIX, PANEL_ROWS>(m, rows.start..first, 0, 1, &mut out[..at(first)]);
        for r0 in (first..whole).step_by(PANEL_ROWS) {
            panel_superblock::<SIX>(m, r0, &mut out[at(r0)..at(r0) + PANEL_ROWS]);
        }
        tiles::<ROW_BLOCK, 1, SIX, PANEL_ROWS>(m, whole..rows.end, 0, 1, &mut out[at(whole)..]);
    }
}

/// Rows `r0..r0 + 16` (a superblock) times the one token: panel by panel, every 4-row block
/// over the panel before the next panel, in the order the bytes are stored.
///
/// # Safety
/// As [`panel_matvec`]'s; `r0` a multiple of [`PANEL_ROWS`] with the superblock inside the matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn panel_superblock<const SIX: bool>(m: &QMat<'_>, r0: usize, out: &mut [f32]) {
    const BLOCKS: usize = PANEL_ROWS / ROW_BLOCK;
    let (chunks, ng) = (m.cols / 128, m.ng);
    let mut f: [Acc; BLOCKS] = [[[_mm512_setzero_ps(); 1]; ROW_BLOCK]; BLOCKS];
    for p0 in (0..chunks).step_by(PANEL_CHUNKS) {
        let panel = p0..(p0 + PANEL_CHUNKS).min(chunks);
        // the panel's groups (whole: a group divides a panel, `panels_pay`)
        let groups = panel.start * ng / chunks..panel.end * ng / chunks;
        for (b, f) in f.iter_mut().enumerate() {
            let r = r0 + b * ROW_BLOCK;
            // the same block's scales for this panel one superblock on, a few lines a block:
            // the scales of all 16 rows at once held the weights' stream up
            for i in r + PANEL_ROWS..r + PANEL_ROWS + ROW_BLOCK {
                let at = m.scales_at(i, groups.start);
                for l in (0..m.scale_span(groups.len())).step_by(64) {
                    crate::prefetch::line(at, l);
                }
            }
            // SAFETY: the caller's guarantees (q6 groups are whole chunks: the format's rule)
            *f = unsafe {
                match (m.gpc, m.cpg) {
                    (8, _) if SIX => sub_span::<8, SIX>(m, r, panel.clone(), *f),
                    (4, _) if !SIX => sub_span::<4, SIX>(m, r, panel.clone(), *f),
                    (2, _) if !SIX => sub_span::<2, SIX>(m, r, panel.clone(), *f),
                    _ => group_span::<SIX>(m, r, groups.clone(), *f),
                }
            };
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

/// `q_tile`'s groups `groups` (of a chunk or more each) for the 4 rows from `r`, added to `f`.
///
/// # Safety
/// As [`panel_superblock`]'s; the groups exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn group_span<const SIX: bool>(m: &QMat<'_>, r: usize, groups: Range<usize>, mut f: Acc) -> Acc {
    let mut sc = [[[0f32; 16]; 1]; ROW_BLOCK];
    for gb in groups.clone().step_by(16) {
        // SAFETY: the caller's guarantees
        unsafe { scale_products(m, r, 0, gb, &mut sc) };
        for gi in gb..groups.end.min(gb + 16) {
            let mut lo = [[_mm512_setzero_si512(); 1]; ROW_BLOCK];
            let mut hi = [[_mm512_setzero_si512(); 1]; ROW_BLOCK];
            for ci in gi * m.cpg..(gi + 1) * m.cpg {
                // SAFETY: the caller's guarantees
                unsafe { chunk_dots::<ROW_BLOCK, 1, SIX, PANEL_ROWS, false>(m, r, 0, ci, &mut lo, &mut hi) };
            }
            for i in 0..ROW_BLOCK {
                let v = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[i][0], hi[i][0]));
                f[i][0] = _mm512_fmadd_ps(v, _mm512_set1_ps(sc[i][0][gi - gb]), f[i][0]);
            }
        }
    }
    f
}

/// `q_tile_sub`'s chunks `chunks` (`GPC` groups each) for the 4 rows from `r`, added to `f`.
///
/// # Safety
/// As [`panel_superblock`]'s; the chunks exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sub_span<const GPC: usize, const SIX: bool>(m: &QMat<'_>, r: usize, chunks: Range<usize>, mut f: Acc) -> Acc {
    let lane_group = lane_groups::<GPC>();
    let one = _mm512_set1_epi32(1);
    let mut sc = [[[0f32; 16]; 1]; ROW_BLOCK];
    for cb in chunks.clone().step_by(16 / GPC) {
        // SAFETY: the caller's guarantees
        unsafe { scale_products(m, r, 0, cb * GPC, &mut sc) };
        for ci in cb..chunks.end.min(cb + 16 / GPC) {
            let mut lo = [[_mm512_setzero_si512(); 1]; ROW_BLOCK];
            let mut hi = [[_mm512_setzero_si512(); 1]; ROW_BLOCK];
            // SAFETY (both): the caller's guarantees
            if GPC == 8 {
                unsafe { chunk_dots::<ROW_BLOCK, 1, SIX, PANEL_ROWS, true>(m, r, 0, ci, &mut lo, &mut hi) };
            } else {
                unsafe { chunk_dots::<ROW_BLOCK, 1, SIX, PANEL_ROWS, false>(m, r, 0, ci, &mut lo, &mut hi) };
            }
            let idx = _mm512_add_epi32(lane_group, _mm512_set1_epi32(((ci - cb) * GPC) as i32));
            for i in 0..ROW_BLOCK {
                // SAFETY: 16 floats
                let s = unsafe { _mm512_loadu_ps(sc[i][0].as_ptr()) };
                if GPC == 8 {
                    let (vl, vh) = (_mm512_cvtepi32_ps(lo[i][0]), _mm512_cvtepi32_ps(hi[i][0]));
                    f[i][0] = _mm512_fmadd_ps(vl, _mm512_permutexvar_ps(idx, s), f[i][0]);
                    f[i][0] = _mm512_fmadd_ps(vh, _mm512_permutexvar_ps(_mm512_add_epi32(idx, one), s), f[i][0]);
                } else {
                    let v = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[i][0], hi[i][0]));
                    f[i][0] = _mm512_fmadd_ps(v, _mm512_permutexvar_ps(idx, s), f[i][0]);
                }
            }
        }
    }
    f
}
