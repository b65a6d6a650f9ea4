//! The AVX-512 q4 kernel with 16 rows in a vector's lanes, for q4 matrices with symmetric groups
//! of 32 values or more (f32 or f16 scales): prefill and decode alike.
//!
//! Where the tiles of `avx512.rs` give each (row, token) product 16 int32 lanes of partial sums,
//! converted and scaled once per 128-value chunk and summed across lanes at the end (three or
//! four float operations per two `vpdpbusd`), here lane `i` of a vector is row `i` of a 16-row
//! block: one `vpdpbusd` multiplies 4 values of each of the 16 rows by the same 4 activation
//! bytes (broadcast from memory, a load rather than a shuffle), so a group's integer sum builds
//! up in its lane and meets the float unit once per group: 8 `vpdpbusd` per 32 values of 16
//! rows and token, then one conversion, one multiply and one FMA.
//!
//! The rows come in the package's orders (row-major, x4 or panel-major); each 16-row block is
//! first gathered into that lane order in a buffer of the thread's own ([`gather_block`]: per
//! 128-value chunk a 16 x 16 transpose of 4-byte words), with its scales as 16 floats a group,
//! then every token runs over it. A product's bits are a fixed order of exact integer sums and
//! float operations per (row, token) (the test model: `avx512_model.rs`), whatever the block, tile or layout:
//!
//! ```text
//! f = 0
//! for each group g:  f = fma(f32(sum_j q_j a_j), (ws_g * as_g), f)    (q_j = n_j - 8, exact)
//! ```
//!
//! The bias of the stored nibbles (`n = q + 8`) comes off as an integer: each group's int32
//! accumulator starts at `-8 * sum_j a_j`, the activation group's sum.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::amx_q4;
use super::avx512::{QMat, WeightScales};
use super::avx512_q4_prompt::{self as prompt, PromptActs};
use crate::act::QuantAct;
use crate::isa::Isa;
use crate::quant::{PANEL_ROWS, ROW_BLOCK, interleaved_offset, panel_offset};

/// Rows a vector holds: one per int32 lane (the lane order's blocks).
pub(super) const LANES: usize = crate::lanes::LANE_ROWS;

/// Tokens a tile runs at most: 8 int32 and 8 float accumulators, two weight vectors and the
/// scales fit the 32 registers.
const MAX_TOKENS: usize = prompt::MAX_TOKENS;

/// Chunk `c` of rows `r0..r0 + k` (k <= 16) in lane order: word `d` of the chunk of row `r0 + i`
/// in lane `i` of vector `d` (lanes from `k` on zero). A macro rather than a function: as a
/// function it was not inlined, and its 1 KiB result went through memory.
macro_rules! chunk_words {
    ($il:ident, $m:expr, $r0:expr, $k:expr, $c:expr) => {{
        let (m, r0, k, c) = ($m, $r0, $k, $c);
        let mut w = [_mm512_setzero_si512(); LANES];
        for (i, w) in w.iter_mut().enumerate().take(k) {
            // SAFETY: the caller's guarantees: the chunk lies inside the matrix
            *w = unsafe { _mm512_loadu_si512(chunk_at::<$il>(m, r0 + i, c) as *const _) };
        }
        transpose16(w)
    }};
}

/// Where chunk `c` of row `r` starts in `m.q`, rows in the order `IL` names; with `m.pf` (decode
/// over interleaved rows) the line that far on is asked for.
#[inline(always)]
pub(super) fn chunk_at<const IL: usize>(m: &QMat<'_>, r: usize, c: usize) -> *const u8 {
    let off = match IL {
        1 => r * m.row_bytes + c * 64,
        ROW_BLOCK => interleaved_offset(r, c, m.row_bytes, 64),
        _ => panel_offset(r, c, m.row_bytes, 64),
    };
    let p = m.q.as_ptr().wrapping_add(off);
    if m.pf != 0 {
        crate::prefetch::line(p, m.pf);
    }
    p
}

thread_local! {
    /// A 16-row block in lane order ([`gather_block`]): values, then scales.
    static BLOCK: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Where a product's results go: `[rows, n]` row-major (every kernel), or token-major, each
/// token's results a run of a larger `[n, ld]` matrix (the q4 lanes kernel only: its tiles hold
/// a token's 16 rows in one vector, so a token's results are one store rather than 16).
#[derive(Clone, Copy)]
pub(super) struct Dst {
    ptr: *mut f32,
    /// elements between a row's results and the next row's, and between tokens
    row: usize,
    tok: usize,
}

impl Dst {
    /// `out`, `[rows, n]` row-major.
    pub(super) fn rows(out: &mut [f32], n: usize) -> Dst {
        Dst { ptr: out.as_mut_ptr(), row: n, tok: 1 }
    }

    /// Token `t`'s results at `ptr + t ld`, the product's first row first.
    ///
    /// # Safety
    /// Every element the product writes (its rows, `n` tokens) is inside one allocation and
    /// written by nobody else meanwhile.
    pub(super) unsafe fn tokens(ptr: *mut f32, ld: usize) -> Dst {
        Dst { ptr, row: 1, tok: ld }
    }

    /// Rows `r..r + v.len()` (from the product's first) of token `t`.
    ///
    /// # Safety
    /// Those results are the product's (see the constructors).
    #[inline]
    pub(super) unsafe fn put(&self, r: usize, t: usize, v: &[f32]) {
        // SAFETY (both): the caller's guarantee
        if self.row == 1 {
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(t * self.tok + r), v.len()) };
        } else {
            for (i, x) in v.iter().enumerate() {
                unsafe { *self.ptr.add((r + i) * self.row + t * self.tok) = *x };
            }
        }
    }
}

/// [`q_matmul`] for q4 with symmetric groups of whole 32-value blocks (the q4 lanes kernel's
/// matrices: f32 or f16 scales without mins), results token-major into `dst`.
///
/// # Safety
/// As [`q_matmul`]'s, with `ws` f32 or f16 scales without mins and `a.group` a multiple of 32;
/// `dst` as its constructor requires.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q4_matmul_tokens(
    tier: Isa,
    (x4, panels, lanes): (bool, bool, bool),
    q: &[u8],
    ws: WeightScales<'_>,
    cols: usize,
    a: &QuantAct,
    n: usize,
    rows: Range<usize>,
    dst: Dst,
) {
    let (cpg, gpc) = (a.group / 128, 128 / a.group.min(128));
    let pf = if x4 && n == 1 { crate::prefetch::distance() } else { 0 };
    let (ng, row_bytes, ap) = (cols / a.group, cols / 2, &a.permuted[..]);
    let m = QMat { q, ws, wd_row0: 0, cols, row_bytes, ng, cpg, gpc, a, ap, pf, lanes, amx: tier >= Isa::Amx };
    debug_assert!(takes(a.group, &m));
    // SAFETY (all three): the caller's guarantees
    unsafe {
        match (x4, x4 && panels) {
            (false, _) => q4_rows::<1>(&m, n, rows, dst),
            (true, false) => q4_rows::<ROW_BLOCK>(&m, n, rows, dst),
            (true, true) => q4_rows::<PANEL_ROWS>(&m, n, rows, dst),
        }
    }
}

/// Whether this kernel takes a q4 matrix with groups of `group` and these scales: symmetric
/// groups of whole 32-value blocks (f32 or f16 scales; not mins, not k4 records).
pub(super) fn takes(group: usize, m: &QMat<'_>) -> bool {
    // k4 records carry mins: `has_mins` refuses them
    group.is_multiple_of(32) && !m.has_mins()
}

/// `W[r] · a[t]` for every row of `rows` and token of `0..n` into `dst` (row `r - rows.start`),
/// 16 rows at a time (the last block may be short: its missing lanes are zero and dropped).
///
/// # Safety
/// AVX-512 F, BW and VNNI; [`takes`]; the rows' chunks exist in `m.q` in the order `IL` names
/// (1 row-major, [`ROW_BLOCK`] x4, [`PANEL_ROWS`] panel-major); `m.a` holds `n` rows of `m.cols`
/// values with their sums; `dst` holds `rows.len()` rows of `n` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q4_rows<const IL: usize>(m: &QMat<'_>, n: usize, rows: Range<usize>, dst: Dst) {
    debug_assert!(m.a.q.len() >= n * m.cols && m.a.sums.len() >= n * m.ng);
    // prompts on AMX tiles where granted (the same integer sums, the same float steps)
    // SAFETY: `m.amx` only where the tier is Amx, which only a granted process detects
    let mut tiles = (m.amx && amx_q4::pays(n, m.a.group)).then(|| unsafe { amx_q4::Tiles::new(m, n) });
    // prompts on the VNNI tiles: the activations laid out for them once ([`prompt`])
    if n >= 2 && tiles.is_none() && matches!(m.a.group, 32 | 64 | 128) {
        // SAFETY: the caller's guarantees
        prompt::with_prompt_acts(m.a, n, |p| unsafe { rows_blocks::<IL>(m, &mut tiles, Some(p), n, rows, dst) });
    } else {
        // SAFETY: the caller's guarantees
        unsafe { rows_blocks::<IL>(m, &mut tiles, None, n, rows, dst) };
    }
}

/// [`q4_rows`]'s blocks of 16 rows, with `prep` the activations laid out for the prompt tiles
/// (where they take the groups), `tiles` the AMX tiles where they run the prompt.
///
/// # Safety
/// As [`q4_rows`]'s; `tiles` made only where AMX is granted, `prep` filled from `m.a`'s `n` tokens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows_blocks<const IL: usize>(
    m: &QMat<'_>,
    tiles: &mut Option<amx_q4::Tiles>,
    prep: Option<&PromptActs>,
    n: usize,
    rows: Range<usize>,
    dst: Dst,
) {
    BLOCK.with(|b| {
        let mut b = b.borrow_mut();
        let (bq, bs) = &mut *b;
        // (grown only where used: a thread's buffers grow once per size it meets, and a matrix
        // in lane order reads its own words, and its own scales unless they are f16)
        if !m.lanes {
            bq.resize(m.cols / 2 * LANES, 0);
        }
        if !m.lanes || matches!(m.ws, WeightScales::F16 { .. }) {
            bs.resize(m.ng * LANES, 0.0);
        }
        if m.lanes {
            // the matrix is in lane order already: each block is its own gathered block
            let block_bytes = m.cols / 2 * LANES;
            let mut r0 = rows.start;
            while r0 < rows.end {
                let b0 = r0 / LANES * LANES;
                let end = (b0 + LANES).min(rows.end);
                if n == 1 {
                    // decode: the next block's scales (its weights are asked for as they stream)
                    m.scales_ahead(b0, LANES);
                }
                // the block's scales, in lane order as its words are: 16 floats a group
                let block_scales = match m.ws {
                    WeightScales::F32 { scales, .. } => &scales[b0 * m.ng..(b0 + LANES) * m.ng],
                    WeightScales::F16 { scales, .. } => {
                        super::packed_scales::widen(&scales[b0 * m.ng..(b0 + LANES) * m.ng], bs);
                        &bs[..]
                    }
                    _ => unreachable!("the lanes kernel takes f32 or f16 scales alone (`takes`)"),
                };
                let words = &m.q[b0 / LANES * block_bytes..][..block_bytes];
                // SAFETY: as above
                unsafe {
                    any_tiles(m, (tiles, prep), words, block_scales, n, r0 - b0..end - b0, (dst, r0 - rows.start))
                };
                r0 = end;
            }
            return;
        }
        let mut r0 = rows.start;
        while r0 < rows.end {
            let k = (rows.end - r0).min(LANES);
            if n == 1 {
                // decode: the words straight from the chunks, no buffer between
                // SAFETY: the caller's guarantees, for rows r0..r0 + k
                let f = unsafe {
                    gather_scales(m, r0, k, bs);
                    super::avx512_q4_decode::decode_block::<IL>(m, r0, k, bs, bq)
                };
                // SAFETY: rows r0..r0 + k of the product
                unsafe { dst.put(r0 - rows.start, 0, &f[..k]) };
                r0 += k;
                continue;
            }
            // SAFETY: the caller's guarantees, for rows r0..r0 + k
            unsafe { gather_block::<IL>(m, r0, k, bq, bs) };
            // SAFETY: gathered above
            unsafe { any_tiles(m, (tiles, prep), bq, bs, n, 0..k, (dst, r0 - rows.start)) };
            r0 += k;
        }
    });
}

/// [`block_tiles`] (with `prep`, the activations laid out for the prompt tiles), or with `tiles` the AMX
/// tiles' ([`amx_q4::block`]): the same bits.
///
/// # Safety
/// As [`block_tiles`]'s; `tiles` made only where AMX is granted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn any_tiles(
    m: &QMat<'_>,
    (tiles, prep): (&mut Option<amx_q4::Tiles>, Option<&PromptActs>),
    bq: &[u8],
    bs: &[f32],
    n: usize,
    keep: Range<usize>,
    out: (Dst, usize),
) {
    // SAFETY (both): the caller's guarantees
    match tiles {
        Some(t) => unsafe { amx_q4::block(m, t, bq, bs, n, keep, out) },
        None => unsafe { block_tiles(m, prep, bq, bs, n, keep, out) },
    }
}

/// Every token of `0..n` over one block in lane order (`bq`, its scales `bs`), tile by tile
/// (runs of 2 tokens or more on the prompt tiles where `prep` has the activations laid out
/// for them); lanes `keep` of each product into `out`'s destination from its row `out.1`.
///
/// # Safety
/// AVX-512 F, BW and VNNI; `bq` and `bs` a whole block of `m` in lane order; `m.a` holds `n`
/// tokens, and `prep` those tokens laid out, with groups of 32, 64 or 128 values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn block_tiles(
    m: &QMat<'_>,
    prep: Option<&PromptActs>,
    bq: &[u8],
    bs: &[f32],
    n: usize,
    keep: Range<usize>,
    out: (Dst, usize),
) {
    let mut t0 = 0;
    let mut lanes = [[0f32; LANES]; MAX_TOKENS];
    while t0 < n {
        let tn = (n - t0).min(MAX_TOKENS);
        // SAFETY (all): the caller's guarantees; tokens t0..t0 + tn exist
        unsafe {
            if let Some(p) = prep.filter(|_| tn >= 2) {
                prompt_tile(p, m.a.group / 32, bq, bs, t0, tn, &mut lanes);
            } else {
                match tn {
                    1 => tile::<1>(m, bq, bs, t0, &mut lanes),
                    2 => tile::<2>(m, bq, bs, t0, &mut lanes),
                    3 => tile::<3>(m, bq, bs, t0, &mut lanes),
                    4 => tile::<4>(m, bq, bs, t0, &mut lanes),
                    5 => tile::<5>(m, bq, bs, t0, &mut lanes),
                    6 => tile::<6>(m, bq, bs, t0, &mut lanes),
                    7 => tile::<7>(m, bq, bs, t0, &mut lanes),
                    _ => tile::<MAX_TOKENS>(m, bq, bs, t0, &mut lanes),
                }
            }
        }
        for (t, lanes) in lanes[..tn].iter().enumerate() {
            // SAFETY: the product's rows out.1.., token t0 + t
            unsafe { out.0.put(out.1, t0 + t, &lanes[keep.clone()]) };
        }
        t0 += tn;
    }
}

/// The prompt tile ([`prompt::tile`]) of `tn` tokens (2 to 8) from `t0`, groups of `blocks`
/// 32-value blocks (1, 2 or 4), with the accumulators a token of [`tile`].
///
/// # Safety
/// As [`prompt::tile`]'s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn prompt_tile(
    p: &PromptActs,
    blocks: usize,
    bq: &[u8],
    bs: &[f32],
    t0: usize,
    tn: usize,
    out: &mut [[f32; LANES]; MAX_TOKENS],
) {
    macro_rules! by_blocks {
        ($t:literal, $a:literal, $a1:literal) => {
            // SAFETY (all): the caller's guarantees
            match blocks {
                1 => unsafe { prompt::tile::<$t, $a1, 1>(p, bq, bs, t0, out) },
                2 => unsafe { prompt::tile::<$t, $a, 2>(p, bq, bs, t0, out) },
                _ => unsafe { prompt::tile::<$t, $a, 4>(p, bq, bs, t0, out) },
            }
        };
    }
    // two accumulators a token up to 4 tokens, and past 4 for groups of more than 32 values
    match tn {
        2 => by_blocks!(2, 2, 2),
        3 => by_blocks!(3, 2, 2),
        4 => by_blocks!(4, 2, 2),
        5 => by_blocks!(5, 2, 1),
        6 => by_blocks!(6, 2, 1),
        7 => by_blocks!(7, 2, 1),
        _ => by_blocks!(8, 2, 1),
    }
}

/// Rows `r0..r0 + k` (k <= 16) into lane order (`chunk_words!`): value word `d` (bytes `4d..4d + 4`) of 128-value
/// chunk `c` of row `r0 + i` at `bq[(16 c + d) * 64 + 4 i]`, so the 64 bytes at `(4 b + j) * 64`
/// are bytes `4j..4j + 4` of 32-value block `b` of each row (the `q4_lohi32` block's low nibbles:
/// values `4j..4j + 4`, high: `16 + 4j..`); and group `g`'s scales at `bs[16 g..16 g + 16]`. Lanes
/// from `k` on are zero.
///
/// # Safety
/// As [`q4_rows`]'s, for rows `r0..r0 + k`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gather_block<const IL: usize>(m: &QMat<'_>, r0: usize, k: usize, bq: &mut [u8], bs: &mut [f32]) {
    for c in 0..m.cols / 128 {
        let t = chunk_words!(IL, m, r0, k, c);
        for (d, v) in t.iter().enumerate() {
            // SAFETY: bq holds chunks * 1 KiB
            unsafe { _mm512_storeu_si512(bq.as_mut_ptr().add((16 * c + d) * 64) as *mut _, *v) };
        }
    }
    // SAFETY: the caller's guarantees
    unsafe { gather_scales(m, r0, k, bs) };
}

/// The scales of rows `r0..r0 + k` in lane order: group `g`'s at `bs[16 g..16 g + 16]`.
///
/// # Safety
/// As [`q4_rows`]'s, for rows `r0..r0 + k`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gather_scales(m: &QMat<'_>, r0: usize, k: usize, bs: &mut [f32]) {
    let mut s = [_mm512_setzero_si512(); LANES];
    for g in (0..m.ng).step_by(16) {
        let mask = super::avx512::first_lanes(m.ng - g);
        for (i, s) in s.iter_mut().enumerate().take(k) {
            // SAFETY: row r0 + i and groups g.. exist; masked lanes are not read
            *s = _mm512_castps_si512(unsafe { m.weight_scales(r0 + i, g, mask).0 });
        }
        let t = transpose16(s);
        for (j, v) in t.iter().enumerate().take(m.ng - g) {
            // SAFETY: bs holds ng * 16 floats
            unsafe { _mm512_storeu_si512(bs.as_mut_ptr().add((g + j) * 16) as *mut _, *v) };
        }
    }
}

/// The 16 x 16 transpose of 4-byte words: word `i` of output `d` is word `d` of input `i`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(v: [__m512i; 16]) -> [__m512i; 16] {
    let z = _mm512_setzero_si512();
    // pairs of rows: per 128-bit lane [a0 b0 a1 b1], [a2 b2 a3 b3]
    let mut p = [z; 16];
    for i in (0..16).step_by(2) {
        p[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        p[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    // quads: per 128-bit lane the same word of four rows; q[4 h + s] holds word s of each lane
    // of rows 4h..4h + 4
    let mut q = [z; 16];
    for h in 0..4 {
        for half in 0..2 {
            let (a, b) = (p[4 * h + half], p[4 * h + 2 + half]);
            q[4 * h + 2 * half] = _mm512_unpacklo_epi64(a, b);
            q[4 * h + 2 * half + 1] = _mm512_unpackhi_epi64(a, b);
        }
    }
    // 128-bit lanes of quad pairs: e[8 pair + 4 odd + s] = [lanes odd, 2 + odd of quad 2 pair,
    // the same of quad 2 pair + 1] of word s
    let mut e = [z; 16];
    for pair in 0..2 {
        for s in 0..4 {
            let (a, b) = (q[8 * pair + s], q[8 * pair + 4 + s]);
            e[8 * pair + s] = _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b);
            e[8 * pair + 4 + s] = _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b);
        }
    }
    // word 4 l + s: lane l of every quad, in order
    let mut out = [z; 16];
    for odd in 0..2 {
        for s in 0..4 {
            let (a, b) = (e[4 * odd + s], e[8 + 4 * odd + s]);
            out[4 * odd + s] = _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b);
            out[4 * (2 + odd) + s] = _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b);
        }
    }
    out
}

/// The gathered block's 16 rows times tokens `t0..t0 + T`: per token, 16 lanes of products, into
/// `out[..T]`.
/// Each token's group sum builds up in `8 / T` accumulators (at least one; two for groups past
/// 32 values, whose chains are 16 `vpdpbusd` long or more) taking the block's words in turn and
/// added at the group's end (integer sums: the same whatever the split): `vpdpbusd` takes 5
/// cycles and two can start each cycle, so one chain per token held a decode to a fifth of the
/// unit (8 tokens of groups of 128 gained 10% with two, groups of 32 lost 4%: the extra add).
///
/// # Safety
/// AVX-512 F, BW and VNNI; `bq`, `bs` gathered for `m` ([`gather_block`]); tokens `t0..t0 + T`
/// exist in `m.a`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const T: usize>(m: &QMat<'_>, bq: &[u8], bs: &[f32], t0: usize, out: &mut [[f32; LANES]; MAX_TOKENS]) {
    match T {
        // SAFETY (all): the caller's guarantees
        1 => unsafe { tile_split::<T, 4>(m, bq, bs, t0, out) },
        2..=4 => unsafe { tile_split::<T, 2>(m, bq, bs, t0, out) },
        _ if m.a.group > 32 => unsafe { tile_split::<T, 2>(m, bq, bs, t0, out) },
        _ => unsafe { tile_split::<T, 1>(m, bq, bs, t0, out) },
    }
}

/// [`tile`] with `A` accumulators a token (1, 2 or 4).
///
/// # Safety
/// As [`tile`]'s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_split<const T: usize, const A: usize>(
    m: &QMat<'_>,
    bq: &[u8],
    bs: &[f32],
    t0: usize,
    out: &mut [[f32; LANES]; MAX_TOKENS],
) {
    let (a, cols, ng) = (m.a, m.cols, m.ng);
    let blocks = a.group / 32;
    let nibble = _mm512_set1_epi8(0x0F);
    let mut f = [_mm512_setzero_ps(); T];
    for g in 0..ng {
        // the group's integer sums, the first accumulator from the bias term: -8 * the sum of
        // the activations
        let mut acc = [[_mm512_setzero_si512(); A]; T];
        for (t, acc) in acc.iter_mut().enumerate() {
            acc[0] = _mm512_set1_epi32(-8 * a.sums[(t0 + t) * ng + g]);
        }
        for b in g * blocks..(g + 1) * blocks {
            for j in 0..4 {
                // SAFETY: the block's word j of 16 rows
                let p = unsafe { bq.as_ptr().add((4 * b + j) * 64) };
                if m.pf != 0 {
                    // decode of a matrix in lane order: the stream a few KiB on
                    crate::prefetch::line(p, m.pf);
                }
                let w = unsafe { _mm512_loadu_si512(p as *const _) };
                let (lo, hi) = (_mm512_and_si512(w, nibble), _mm512_and_si512(_mm512_srli_epi16::<4>(w), nibble));
                for (t, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: values 32 b + 4 j.. and 32 b + 16 + 4 j.. of token t0 + t
                    let (xl, xh) = unsafe {
                        let p = a.q.as_ptr().add((t0 + t) * cols + 32 * b + 4 * j);
                        ((p as *const i32).read_unaligned(), (p.add(16) as *const i32).read_unaligned())
                    };
                    let (kl, kh) = ((2 * j) % A, (2 * j + 1) % A);
                    acc[kl] = _mm512_dpbusd_epi32(acc[kl], lo, _mm512_set1_epi32(xl));
                    acc[kh] = _mm512_dpbusd_epi32(acc[kh], hi, _mm512_set1_epi32(xh));
                }
            }
        }
        // SAFETY: group g's 16 scales
        let ws = unsafe { _mm512_loadu_ps(bs.as_ptr().add(16 * g)) };
        for (t, f) in f.iter_mut().enumerate() {
            let isum = acc[t].iter().skip(1).fold(acc[t][0], |s, v| _mm512_add_epi32(s, *v));
            let sc = _mm512_mul_ps(ws, _mm512_set1_ps(a.scales[(t0 + t) * ng + g]));
            *f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, *f);
        }
    }
    for (o, f) in out.iter_mut().zip(f) {
        // SAFETY: 16 floats
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), f) };
    }
}
