//! AVX-512 VNNI kernels for q4 and q6 weights: tiles of rows x tokens (prefill; one token:
//! decode). q8's are in `avx512_q8.rs`.
//!
//! `vpdpbusd` multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four
//! products into one of 16 int32 lanes. Both formats make their weights unsigned for it:
//! q4 nibbles are stored biased (`n = q + 8`, in `[0, 15]`) and q8 bytes get their sign bit
//! flipped (`w + 128`); the bias times the group's activation sum is taken off once per group
//! (q8: exactly, in lane 0; q4: in f32 over the groups at the end). Each group's int32 lanes
//! are converted to f32 and accumulated with the group's scale (weight scale times activation
//! scale) by one FMA, and the 16 float lanes are summed at the end: the same products as the
//! scalar reference, summed in another order: held bit for bit to a scalar model of that order
//! (`avx512_model.rs`), and near the scalar reference.
//!
//! q4 layout (`q4_lohi32`, groups of at least 32): a 64-byte load covers 128 values in four
//! 32-value blocks; the low nibbles hold values 0-15, 32-47, 64-79, 96-111 of them and the high
//! nibbles 16-31, 48-63, 80-95, 112-127. The activation row is permuted once per call into that
//! order (`permute_q4_act`), so one AND and one shift feed two `vpdpbusd`. The layout is the
//! same for groups of 32 and 64 (ggml's Q4_0 is groups of 32): then a chunk holds 4 or 2
//! groups, and int32 lane `l` of a chunk's products belongs to its group `l * groups / 16`, so
//! the lanes are scaled by a vector of the groups' scales, each repeated over its lanes.

use std::arch::x86_64::*;
use std::ops::Range;

pub(super) use super::avx512_finish::finish;
use super::avx512_nibbles::row_nibbles;
use crate::act::QuantAct;
use crate::isa::Isa;
use crate::quant::{PANEL_ROWS, ROW_BLOCK};

/// The mask of the first `n` of 16 lanes (all of them from 16 on): a row's last groups, fewer
/// than a vector.
pub(super) fn first_lanes(n: usize) -> __mmask16 {
    if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 }
}

/// Whether these kernels take a q4 matrix with groups of `group`: whole 128-value chunks per
/// group, or 2 or 4 groups per chunk.
pub fn supports_q4(group: usize) -> bool {
    group.is_multiple_of(128) || group == 32 || group == 64
}

/// Whether these kernels take a q6 matrix with groups of `group`: whole 128-value chunks per
/// group, or 8 groups per chunk (GGUF's Q6_K).
pub fn supports_q6(group: usize) -> bool {
    group.is_multiple_of(128) || group == 16
}

/// A q4 or q6 matrix's scales: f32 per group (`[rows, cols / group]`; and q4's mins, asymmetric
/// groups: value `scale * n - min` of the unsigned nibble `n`), or q4's k4 records or q6's k6
/// records (GGUF's Q4_K and Q6_K at their own size, [`crate::kscales`]).
#[derive(Clone, Copy)]
pub(super) enum WeightScales<'a> {
    F32 {
        scales: &'a [f32],
        mins: Option<&'a [f32]>,
    },
    K4(&'a [u8]),
    K6(&'a [u8]),
    /// f16 bits, `[rows, cols / group]`; with `mins`, each row's scales followed by its mins
    F16 {
        scales: &'a [u16],
        mins: bool,
    },
}

/// `out[i * n + t] = W[rows.start + i] · x[t]` for q4 weights `q` (`[rows, cols / 2]`), or with
/// `six` q6 weights (`q6_lo4hi2`: `[rows, cols / 128 * 96]`, the same low-nibble unpacking with
/// the high bits ORed in from each chunk's last 32 bytes, and a bias of 32), rows interleaved by
/// [`ROW_BLOCK`] when `x4` (see [`crate::quant`]; and in panel-major superblocks of
/// [`PANEL_ROWS`] when `panels` too), with scales `ws` (f32: `[rows, cols / group]`) and the
/// `n` activation rows of `a`; `ap` is `a.q` (all `n` rows) permuted by
/// [`permute_q4_act`](crate::act::permute_q4_act).
///
/// Tiles of rows x tokens share their loads: a weight chunk is unpacked once for every token of
/// the tile, an activation chunk loaded once for every row. Each (row, token) product goes
/// through the same operations in the same order whatever the tile, so a prompt's products equal
/// those of its tokens one at a time, bit for bit.
///
/// At tier [`Isa::Amx`] the q4 lanes kernel runs prompts on AMX tiles (`amx_q4.rs`), the same
/// bits.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI (and `tier` must be one it runs);
/// `supports_q4(a.group)`; slices sized as above.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn q_matmul(
    tier: Isa,
    six: bool,
    (x4, panels, lanes): (bool, bool, bool),
    q: &[u8],
    ws: WeightScales<'_>,
    cols: usize,
    a: &QuantAct,
    ap: &[i8],
    n: usize,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let row_bytes = if six { cols / 128 * 96 } else { cols / 2 };
    // decode over interleaved rows reads one stream: prefetch along it where that pays
    let pf = if x4 && n == 1 { crate::prefetch::distance() } else { 0 };
    let (cpg, gpc) = (a.group / 128, 128 / a.group.min(128));
    let ws = match ws {
        WeightScales::F32 { scales, mins } => WeightScales::F32 { scales, mins: mins.filter(|_| !six) },
        records => records,
    };
    let m = QMat {
        q,
        ws,
        wd_row0: 0,
        cols,
        row_bytes,
        ng: cols / a.group,
        cpg,
        gpc,
        a,
        ap,
        pf,
        lanes,
        amx: tier >= Isa::Amx,
    };
    // the row order is a type parameter, so each order's offsets compile to their own code:
    // IL = 1 row-major, ROW_BLOCK x4, PANEL_ROWS panel-major (blocks of 4 within superblocks)
    // SAFETY (all six): the caller's guarantees
    unsafe {
        match (six, x4, x4 && panels) {
            (false, false, _) => matmul::<false, 1>(&m, n, rows, out),
            (false, true, false) => matmul::<false, ROW_BLOCK>(&m, n, rows, out),
            (false, true, true) => matmul::<false, PANEL_ROWS>(&m, n, rows, out),
            (true, false, _) => matmul::<true, 1>(&m, n, rows, out),
            (true, true, false) => matmul::<true, ROW_BLOCK>(&m, n, rows, out),
            (true, true, true) => matmul::<true, PANEL_ROWS>(&m, n, rows, out),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn matmul<const SIX: bool, const IL: usize>(m: &QMat<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
    debug_assert!(supports_q4(m.a.group) && m.ap.len() >= n * m.cols && out.len() == rows.len() * n);
    // more tokens than one tile: rows in blocks of ROWS_IN_CACHE (from multiples of it), every
    // token tile over a block before the next, so a block's weights come from memory once
    // rather than once per tile (an expert's 2 x 4 tiles over its 5-12 tokens of a prompt
    // streamed its matrices 2-3 times); each product is computed as before, the same bits
    if !SIX && super::avx512_q4_rows::takes(m.a.group, m) {
        // SAFETY: the caller's guarantees
        unsafe { super::avx512_q4_rows::q4_rows::<IL>(m, n, rows, super::avx512_q4_rows::Dst::rows(out, n)) };
        return;
    }
    if n == 1 && IL == PANEL_ROWS {
        // SAFETY: the caller's guarantees
        unsafe { super::avx512_panels::panel_matvec::<SIX>(m, rows, out) };
        return;
    }
    // records over several tokens: decoded once per block of rows, not once per token tile
    // (f16 scales are widened as loaded: decoding them first was no faster)
    let decode = n > 1 && matches!(m.ws, WeightScales::K4(_) | WeightScales::K6(_));
    let block = if n > 4 || decode { ROWS_IN_CACHE } else { rows.end.max(1) };
    let mut r = rows.start;
    while r < rows.end {
        let end = ((r / block + 1) * block).min(rows.end);
        let o = &mut out[(r - rows.start) * n..(end - rows.start) * n];
        if decode {
            // a buffer of the thread's own: a product is cut into pieces of a few rows, and a
            // buffer allocated per piece cost prefill 5% (Q4_K_M, 8-layer Qwen3-30B-A3B shape)
            super::avx512_records::DECODED.with(|b| {
                let mut b = b.borrow_mut();
                let len = b.len().max(2 * ROWS_IN_CACHE * m.ng);
                b.resize(len, 0.0);
                // SAFETY: the caller's guarantees, for rows r..end
                let d = unsafe { super::avx512_records::with_decoded_records(m, r..end, &mut b) };
                // SAFETY: as above
                unsafe { token_tiles::<SIX, IL>(&d, n, r..end, o) };
            });
        } else {
            // SAFETY: the caller's guarantees, for rows r..end
            unsafe { token_tiles::<SIX, IL>(m, n, r..end, o) };
        }
        r = end;
    }
}

/// Rows a block of [`matmul`] holds: 32 rows of 2048 q4 values with scales and mins are 48 KiB.
const ROWS_IN_CACHE: usize = 32;

/// Every token of `0..n` for rows `rows`, tile by tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn token_tiles<const SIX: bool, const IL: usize>(m: &QMat<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
    let mut t0 = 0;
    while t0 < n {
        // SAFETY (all calls): the caller's guarantees; tiles stay inside rows and 0..n
        // 2 rows x 4 tokens when the batch allows (the best of the tile shapes tried for
        // prefill: see CHANGELOG), else one token and, interleaved, a block of
        // rows at a time (decode: one stream of weights either way), else one row
        // (an expert's few tokens leave 2 or 3 at the end more often than not: a tile of them
        // reads the weights once, not once per token)
        if IL == ROW_BLOCK && (2..=8).contains(&n) && n - t0 >= 2 {
            // a server's batch of decode tokens over interleaved rows (the output layer): a whole
            // 4-row block a tile, so each row's values are unpacked once for up to 4 tokens
            match n - t0 {
                2 => unsafe { tiles::<ROW_BLOCK, 2, SIX, IL>(m, rows.clone(), t0, n, out) },
                3 => unsafe { tiles::<ROW_BLOCK, 3, SIX, IL>(m, rows.clone(), t0, n, out) },
                _ => unsafe { tiles::<ROW_BLOCK, 4, SIX, IL>(m, rows.clone(), t0, n, out) },
            }
            t0 += (n - t0).min(4);
        } else if n - t0 >= 4 {
            unsafe { tiles::<2, 4, SIX, IL>(m, rows.clone(), t0, n, out) };
            t0 += 4;
        } else if n - t0 == 3 {
            unsafe { tiles::<2, 3, SIX, IL>(m, rows.clone(), t0, n, out) };
            t0 += 3;
        } else if n - t0 == 2 {
            unsafe { tiles::<2, 2, SIX, IL>(m, rows.clone(), t0, n, out) };
            t0 += 2;
        } else if IL > ROW_BLOCK {
            // panel-major: a 4-row block at a time, as x4 (16-row tiles would not fit the registers)
            unsafe { tiles::<ROW_BLOCK, 1, SIX, IL>(m, rows.clone(), t0, n, out) };
            t0 += 1;
        } else {
            unsafe { tiles::<IL, 1, SIX, IL>(m, rows.clone(), t0, n, out) };
            t0 += 1;
        }
    }
}

/// A q4 or q6 matrix and the activations it multiplies.
pub(super) struct QMat<'a> {
    pub(super) q: &'a [u8],
    pub(super) ws: WeightScales<'a>,
    /// the row f32 scales (and mins) start at: 0, or the first of a block whose records were
    /// decoded into them ([`super::avx512_records::with_decoded_records`])
    pub(super) wd_row0: usize,
    pub(super) cols: usize,
    /// bytes of one weight row
    pub(super) row_bytes: usize,
    /// groups per row, 128-value chunks per group (0 when groups are smaller), groups per chunk
    /// (1 when groups are whole chunks)
    pub(super) ng: usize,
    pub(super) cpg: usize,
    pub(super) gpc: usize,
    pub(super) a: &'a QuantAct,
    pub(super) ap: &'a [i8],
    /// software prefetch distance in bytes, 0: none ([`crate::prefetch`])
    pub(super) pf: usize,
    /// q4 rows in lane order ([`crate::quant::lanes_offset`]; x4 otherwise)
    pub(super) lanes: bool,
    /// AMX tiles granted and the tier allows them: the q4 lanes kernel's prompts run on them
    pub(super) amx: bool,
}

/// Tokens `t0..t0 + T` for every row of `rows`, `R` rows at a time (the rest one by one; with
/// interleaved rows (`IL` > 1) the rows before the first whole block too, so an `R`-row tile
/// of a decode reads its block's bytes in order).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tiles<const R: usize, const T: usize, const SIX: bool, const IL: usize>(
    m: &QMat<'_>,
    rows: Range<usize>,
    t0: usize,
    n: usize,
    out: &mut [f32],
) {
    let mut r = rows.start;
    let mut res = [[0f32; T]; R];
    let mut one = [[0f32; T]; 1];
    while r < rows.end {
        let aligned = IL == 1 || r.is_multiple_of(R.min(IL));
        let got: &[[f32; T]] = if aligned && rows.end - r >= R {
            // SAFETY: rows r..r + R and tokens t0..t0 + T exist
            unsafe { tile::<R, T, SIX, IL>(m, r, t0, &mut res) };
            &res
        } else {
            // SAFETY: as above, for one row
            unsafe { tile::<1, T, SIX, IL>(m, r, t0, &mut one) };
            &one
        };
        for (i, row) in got.iter().enumerate() {
            for (t, v) in row.iter().enumerate() {
                out[(r - rows.start + i) * n + t0 + t] = *v;
            }
        }
        r += got.len();
    }
}

/// Rows `r0..r0 + R` times tokens `t0..t0 + T`, by the tile kernel for the matrix's group.
///
/// # Safety
/// As [`q_tile`]'s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const T: usize, const SIX: bool, const IL: usize>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    out: &mut [[f32; T]; R],
) {
    // SAFETY (all): the caller's guarantees; q6 groups are whole chunks (the format's rule)
    unsafe {
        match (m.gpc, m.cpg) {
            (8, _) if SIX => q_tile_sub::<R, T, 8, true, IL>(m, r0, t0, out),
            (4, _) if !SIX => q_tile_sub::<R, T, 4, false, IL>(m, r0, t0, out),
            (2, _) if !SIX => q_tile_sub::<R, T, 2, false, IL>(m, r0, t0, out),
            (_, 1) => q_tile::<R, T, true, SIX, IL>(m, r0, t0, out),
            _ => q_tile::<R, T, false, SIX, IL>(m, r0, t0, out),
        }
    }
}

/// Rows `r0..r0 + R` times tokens `t0..t0 + T`. Per (row, token): int32 lanes per group (low
/// and high nibbles in separate accumulators: two chains), then one FMA per group into a float
/// accumulator with the group's weight x activation scale; at the end the 16 lanes are summed
/// and the bias term added: the values are stored as `n = q + bias` (q4: 8, q6: 32), so the dot
/// product is `sum_g s_g (sum n a - bias sum a)`, and the second part is
/// `sum_g wd_g (-bias sum_g a as_g)`, done in f32 over the groups (q6: [`chunk_nibbles`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q_tile<const R: usize, const T: usize, const G128: bool, const SIX: bool, const IL: usize>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    out: &mut [[f32; T]; R],
) {
    let ng = m.ng;
    if T == 1 && IL > 1 {
        // decode: the scales of the rows a few blocks on
        m.scales_ahead(r0, R);
    }
    // group gi's products, folded into `acc` with the group's scales
    let group = |gi: usize, sc: &[[[f32; 16]; T]; R], acc: &mut [[__m512; T]; R]| {
        let mut lo = [[_mm512_setzero_si512(); T]; R];
        let mut hi = [[_mm512_setzero_si512(); T]; R];
        // groups of 128 (the default) are one chunk: a loop the compiler can drop
        let cpg = if G128 { 1 } else { m.cpg };
        for ch in 0..cpg {
            let ci = gi * cpg + ch;
            // SAFETY: the caller's guarantees
            unsafe { chunk_dots::<R, T, SIX, IL, false>(m, r0, t0, ci, &mut lo, &mut hi) };
        }
        for i in 0..R {
            for t in 0..T {
                // the scale from the block's table: one FMA with a broadcast memory operand
                let v = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[i][t], hi[i][t]));
                acc[i][t] = _mm512_fmadd_ps(v, _mm512_set1_ps(sc[i][t][gi % 16]), acc[i][t]);
            }
        }
    };
    // one float accumulator per product: its FMA chain (4 cycles a group of 128 values, 48
    // GB/s of q4 at 3 GHz) is not the limit, and a second set would not fit the 2 x 4 tile in
    // the 32 registers (even/odd accumulators spilled pointers to the stack)
    let mut f = [[_mm512_setzero_ps(); T]; R];
    // per block of 16 groups, each product's group scales (weight x activation), 16 at a time
    let mut sc = [[[0f32; 16]; T]; R];
    for gb in (0..ng).step_by(16) {
        let k = (ng - gb).min(16);
        // SAFETY: the caller's guarantees
        unsafe { scale_products(m, r0, t0, gb, &mut sc) };
        for gi in gb..gb + k {
            if G128 && R * T >= 8 {
                // SAFETY: the caller's guarantees; a group is chunk gi
                unsafe { chunk_fused::<R, T, SIX, IL>(m, r0, t0, gi, &sc, &mut f) };
            } else {
                group(gi, &sc, &mut f);
            }
        }
    }
    // SAFETY: the caller's guarantees
    unsafe { finish::<R, T, SIX>(m, r0, t0, &mut f, out) }
}

/// [`q_tile`] for groups smaller than a chunk: `GPC` groups per 128-value chunk, 4 or 2 (q4 and
/// q6: a chunk's int32 lane `l` holds products of its group `l * GPC / 16`, low and high nibbles
/// of a 16-byte block being values of one 32-value block) or 8 (q6's groups of 16, GGUF's Q6_K:
/// lane `l` of the low nibbles holds group `2 (l / 4)`, of the high nibbles the next one, so the
/// two are scaled apart). One FMA per chunk (two at 8) scales the lanes with the groups' scales
/// spread over them by a permute. Per (row, token) the same operations in the same order
/// whatever the tile.
///
/// # Safety
/// As [`q_tile`]'s; `m.gpc == GPC`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q_tile_sub<const R: usize, const T: usize, const GPC: usize, const SIX: bool, const IL: usize>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    out: &mut [[f32; T]; R],
) {
    if T == 1 && IL > 1 {
        m.scales_ahead(r0, R);
    }
    let lane_group = lane_groups::<GPC>();
    let one = _mm512_set1_epi32(1);
    let mut f = [[_mm512_setzero_ps(); T]; R];
    let mut sc = [[[0f32; 16]; T]; R];
    let chunks = m.cols / 128;
    // 16 groups of scales at a time: 16 / GPC chunks
    for cb in (0..chunks).step_by(16 / GPC) {
        // SAFETY: the caller's guarantees
        unsafe { scale_products(m, r0, t0, cb * GPC, &mut sc) };
        for ci in cb..chunks.min(cb + 16 / GPC) {
            let mut lo = [[_mm512_setzero_si512(); T]; R];
            let mut hi = [[_mm512_setzero_si512(); T]; R];
            // SAFETY (both): the caller's guarantees
            if GPC == 8 {
                unsafe { chunk_dots::<R, T, SIX, IL, true>(m, r0, t0, ci, &mut lo, &mut hi) };
            } else {
                unsafe { chunk_dots::<R, T, SIX, IL, false>(m, r0, t0, ci, &mut lo, &mut hi) };
            }
            let idx = _mm512_add_epi32(lane_group, _mm512_set1_epi32(((ci - cb) * GPC) as i32));
            for i in 0..R {
                for t in 0..T {
                    // SAFETY: 16 floats
                    let s = unsafe { _mm512_loadu_ps(sc[i][t].as_ptr()) };
                    if GPC == 8 {
                        let (vl, vh) = (_mm512_cvtepi32_ps(lo[i][t]), _mm512_cvtepi32_ps(hi[i][t]));
                        f[i][t] = _mm512_fmadd_ps(vl, _mm512_permutexvar_ps(idx, s), f[i][t]);
                        let hidx = _mm512_add_epi32(idx, one);
                        f[i][t] = _mm512_fmadd_ps(vh, _mm512_permutexvar_ps(hidx, s), f[i][t]);
                    } else {
                        let v = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[i][t], hi[i][t]));
                        f[i][t] = _mm512_fmadd_ps(v, _mm512_permutexvar_ps(idx, s), f[i][t]);
                    }
                }
            }
        }
    }
    // SAFETY: the caller's guarantees
    unsafe { finish::<R, T, SIX>(m, r0, t0, &mut f, out) }
}

/// Lane `l` of a chunk with `GPC` groups: its group's place among the chunk's groups (at 8: the
/// low nibbles' group; the high nibbles' is the next).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn lane_groups<const GPC: usize>() -> __m512i {
    let lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    if GPC == 8 {
        _mm512_slli_epi32::<1>(_mm512_srli_epi32::<2>(lanes))
    } else {
        _mm512_srli_epi32::<4>(_mm512_mullo_epi32(lanes, _mm512_set1_epi32(GPC as i32)))
    }
}

/// The int32 lanes of chunk `ci` for rows `r0..r0 + R` and tokens `t0..t0 + T`, added to `lo`
/// and `hi` (low- and high-nibble products; with enough products in the tile and unless
/// `SPLIT` (the two hold different groups), both into `lo`: integer sums, the same result).
///
/// # Safety
/// As [`q_tile`]'s; chunk `ci` exists.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn chunk_dots<const R: usize, const T: usize, const SIX: bool, const IL: usize, const SPLIT: bool>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    ci: usize,
    lo: &mut [[__m512i; T]; R],
    hi: &mut [[__m512i; T]; R],
) {
    // SAFETY: the caller's guarantees
    let (wl, wh) = unsafe { row_nibbles::<R, SIX, IL>(m, r0, ci) };
    for t in 0..T {
        let base = (t0 + t) * m.cols + ci * 128;
        // SAFETY: token t0 + t's permuted row holds cols bytes
        let (al, ah) = unsafe {
            (
                _mm512_loadu_si512(m.ap.as_ptr().add(base) as *const _),
                _mm512_loadu_si512(m.ap.as_ptr().add(base + 64) as *const _),
            )
        };
        for i in 0..R {
            if R * T >= 4 && !SPLIT {
                // chains enough: one accumulator per product leaves registers for a bigger tile
                lo[i][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(lo[i][t], wl[i], al), wh[i], ah);
            } else {
                lo[i][t] = _mm512_dpbusd_epi32(lo[i][t], wl[i], al);
                hi[i][t] = _mm512_dpbusd_epi32(hi[i][t], wh[i], ah);
            }
        }
    }
}

/// [`q_tile`]'s group `gi` where a group is one chunk, token by token: each product's integer
/// sum is converted and scaled as soon as it is made, so only a token's R sums are live beside
/// the R x T float accumulators (made all at once, as [`chunk_dots`] makes them, a 4 x 4 tile's
/// 16 sums and 16 accumulators spilled). The same integer sums and float steps: the same bits.
///
/// # Safety
/// As [`q_tile`]'s; chunk `gi` exists and groups are whole chunks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn chunk_fused<const R: usize, const T: usize, const SIX: bool, const IL: usize>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    gi: usize,
    sc: &[[[f32; 16]; T]; R],
    f: &mut [[__m512; T]; R],
) {
    // a row at a time, the activations loaded at each use (from L1, folded into the
    // `vpdpbusd`s): a row's two vectors and the accumulators are all that stay in registers
    // SAFETY: the caller's guarantees
    let (wl, wh) = unsafe { row_nibbles::<R, SIX, IL>(m, r0, gi) };
    for i in 0..R {
        for t in 0..T {
            let base = (t0 + t) * m.cols + gi * 128;
            // SAFETY: token t0 + t's permuted row holds cols bytes
            let (al, ah) = unsafe {
                (
                    _mm512_loadu_si512(m.ap.as_ptr().add(base) as *const _),
                    _mm512_loadu_si512(m.ap.as_ptr().add(base + 64) as *const _),
                )
            };
            let sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wl[i], al), wh[i], ah);
            f[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(sc[i][t][gi % 16]), f[i][t]);
        }
    }
}

/// Groups `gb..gb + 16` (fewer at the row's end) of each (row, token): weight scale times
/// activation scale, into `sc`.
///
/// # Safety
/// AVX-512 F; rows `r0..r0 + R`, tokens `t0..t0 + T` and group `gb` exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn scale_products<const R: usize, const T: usize>(
    m: &QMat<'_>,
    r0: usize,
    t0: usize,
    gb: usize,
    sc: &mut [[[f32; 16]; T]; R],
) {
    let ng = m.ng;
    let k = (ng - gb).min(16);
    let mask = first_lanes(k);
    for (i, sc) in sc.iter_mut().enumerate() {
        // SAFETY: groups gb..gb + k of row r0 + i and of each token exist; masked lanes are not
        // read
        let w = unsafe { m.weight_scales(r0 + i, gb, mask).0 };
        for (t, sc) in sc.iter_mut().enumerate() {
            let a = unsafe { _mm512_maskz_loadu_ps(mask, m.a.scales.as_ptr().add((t0 + t) * ng + gb)) };
            // SAFETY: 16 floats into a 16-float array
            unsafe { _mm512_storeu_ps(sc.as_mut_ptr(), _mm512_mul_ps(w, a)) };
        }
    }
}
