//! AMX int8 tiles for the q4 lanes kernel's prompts (`avx512_q4_rows.rs`): a 16-row block in
//! lane order times up to 32 tokens a pass, each group's exact integer sums from `tdpbssd`, then
//! the lanes kernel's float steps in its order, so a prompt's products keep the bits a decode
//! step (the VNNI tile) gives them.
//!
//! Tiles (palette 1), K a step of `kb` = 32 values (groups of 32) or 64 (larger groups, whose
//! sums build up over their steps): `tmm0..4` int32 sums, two 16-token tiles for each of two
//! groups in flight (`[tokens, 16 rows]`: row `t` is token `t`'s 16 rows, one vector, lanes as
//! the lanes kernel's), so one group's sums are stored and scaled while the next one's products
//! run; `tmm4, 5` the two token tiles' activation bytes (`[16 tokens, kb]`); `tmm6, 7` weights
//! (`[kb / 4, 64]`: row `k` holds values `4k..4k+4` of each of the 16 rows, the lane order's
//! 4-byte words as they lie, unpacked to signed bytes `n - 8`), alternating by step.
//!
//! Both operands are copied into tile order first, each tile's bytes one contiguous run: the
//! activations once per product input (placed as it is quantized, `act_tiles.rs`; else by
//! [`Tiles::new`]; read in place, a tile's 16 rows lay a row's
//! length apart, 2 KiB at 2048 values, all in two sets of the L1 cache), the weights once per
//! block (a tile load right after the stores that wrote it would wait for them). Then:
//!
//! ```text
//! isum = sum_j (n_j - 8) a_j             (tdpbssd, exact: the VNNI tile's -8 sum a + sum n a)
//! f    = fma(f32(isum), ws_g * as_g, f)  (per group, in order, as the VNNI tile)
//! ```

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::avx512::QMat;
use super::avx512_q4_rows::Dst;
use crate::act_tiles::{ActTiles, Line, TileOrder};
use crate::amx::{self, TileConfig};

/// Whether a prompt of `n` tokens runs on the tiles, groups of `group` (else the VNNI tile).
pub(super) use crate::act_tiles::amx_pays as pays;

/// Tokens a sum tile holds (its rows).
const TILE_TOKENS: usize = crate::act_tiles::TILE_TOKENS;

/// Tokens a pass over a block's groups takes: two sum tiles.
const PASS: usize = 2 * TILE_TOKENS;

thread_local! {
    /// A product's activations in tile order where its input holds another order ([`Tiles::new`]),
    /// then a block's weights ([`unpack`]).
    static TILED: RefCell<(ActTiles, Vec<Line>)> = RefCell::new((ActTiles::default(), Vec::new()));
}

/// One product's tiles on this thread: the activations in tile order and the shape loaded; the
/// tiles are released when it drops (a context switch then saves no tile data).
pub(super) struct Tiles {
    loaded: Option<TileConfig>,
    /// bytes of K a step: 32 (groups of 32) or 64
    kb: usize,
    /// the activations in tile order: the input's own ([`TileOrder::Amx`]) or this thread's
    /// `TILED` copy, which only `new` on this thread writes (a thread holds one `Tiles` at a time)
    acts: *const Line,
}

impl Tiles {
    /// `m`'s `n` activation rows in tile order (token tile `tt`, step `k`: `16 x kb` bytes at
    /// line `(tt * steps + k) * kb / 4`): the input's, when it was quantized for these tiles and
    /// this token count, else laid out here.
    ///
    /// # Safety
    /// [`amx::granted`] returned true (the drop releases the tiles); `m.a` holds `n` rows of
    /// `m.cols` values.
    pub(super) unsafe fn new(m: &QMat<'_>, n: usize) -> Tiles {
        let kb = m.a.group.min(64);
        let order = TileOrder::Amx { kb };
        if m.a.tiles.order() == (order, n) {
            return Tiles { loaded: None, kb, acts: m.a.tiles.lines().as_ptr() };
        }
        let acts = TILED.with(|t| {
            let acts = &mut t.borrow_mut().0;
            acts.prepare(order, n, m.cols, m.a.group);
            let mut all = acts.all_mut();
            for t in 0..n {
                let r = m.a.row(t);
                all.put(t, r.q, r.sums, r.scales);
            }
            acts.lines().as_ptr()
        });
        Tiles { loaded: None, kb, acts }
    }

    /// The shape of a pass of `tokens` tokens (1..=32), loaded unless it is the one loaded.
    fn shape(&mut self, tokens: usize) {
        let mut c = TileConfig::new();
        for tt in 0..2 {
            let rows = tokens.saturating_sub(tt * TILE_TOKENS).min(TILE_TOKENS);
            let on = rows > 0;
            // sums of the two groups in flight, then the activations
            c.set(tt, rows, if on { 64 } else { 0 });
            c.set(2 + tt, rows, if on { 64 } else { 0 });
            c.set(4 + tt, rows, if on { self.kb } else { 0 });
        }
        c.set(6, self.kb / 4, 64);
        c.set(7, self.kb / 4, 64);
        if self.loaded != Some(c) {
            // SAFETY: granted (`new`'s contract)
            unsafe { c.load() };
            self.loaded = Some(c);
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        if self.loaded.is_some() {
            // SAFETY: granted (`new`'s contract)
            unsafe { amx::release() };
        }
    }
}

/// The block's weights as tiles into `wt`, `kb / 4` lines a step: row `8 h + j` of a step's
/// 32-value block `h` takes the block's word `j`'s low nibbles (values `4j..4j+4`), row
/// `8 h + 4 + j` its high ones (`16 + 4j..`), as signed `n - 8`.
///
/// # Safety
/// AVX-512 F and BW; `bq` a whole block in lane order of `cols` values; `wt` holds `cols / 4`
/// lines.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack(bq: &[u8], cols: usize, wt: &mut [Line]) {
    let (nibble, eight) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(8));
    for b in 0..cols / 32 {
        for j in 0..4 {
            // SAFETY: word j of block b of the 16 rows; lines of `wt` (the caller's size)
            unsafe {
                let w = _mm512_loadu_si512(bq.as_ptr().add((4 * b + j) * 64) as *const _);
                let lo = _mm512_sub_epi8(_mm512_and_si512(w, nibble), eight);
                let hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16::<4>(w), nibble), eight);
                _mm512_store_si512(wt.as_mut_ptr().add(8 * b + j) as *mut _, lo);
                _mm512_store_si512(wt.as_mut_ptr().add(8 * b + 4 + j) as *mut _, hi);
            }
        }
    }
}

/// One step of one group: activation tiles 4 (and 5) from `$a` (`$a2` the second token tile),
/// weight tile `$b` from `$w`, into sum tiles `$c` (and `$c + 1`), zeroed first when `$first`.
macro_rules! step {
    ($c:literal, $b:literal, $first:expr, $used:expr, $a:expr, $a2:expr, $w:expr, $kb:expr) => {{
        // SAFETY (all): tiles configured by `Tiles::shape` for this pass; the tiles' bytes lie
        // inside the tiled activations and weights
        unsafe {
            amx::load::<$b>($w, 64);
            amx::load::<4>($a, $kb);
            if $first {
                amx::zero::<$c>();
            }
            amx::dot_ss::<$c, 4, $b>();
            if $used > 1 {
                amx::load::<5>($a2, $kb);
                if $first {
                    amx::zero::<{ $c + 1 }>();
                }
                amx::dot_ss::<{ $c + 1 }, 5, $b>();
            }
        }
    }};
}

/// Sum tiles `$c`, `$c + 1` into `$sums` (1 KiB each).
macro_rules! store_sums {
    ($c:literal, $sums:expr, $used:expr) => {{
        let sp = $sums.as_mut_ptr() as *mut u8;
        // SAFETY (both): configured; 16 rows of 64 bytes each
        unsafe { amx::store::<$c>(sp, 64) };
        if $used > 1 {
            unsafe { amx::store::<{ $c + 1 }>(sp.add(1024), 64) };
        }
    }};
}

/// Every token of `0..n` over one block in lane order (`bq`, its scales `bs`: as the VNNI
/// tile's), 32 tokens a pass; lanes `keep` of each product into `out`'s destination from its
/// row `out.1`.
///
/// # Safety
/// AVX-512 F and BW; `tiles` made for `m` and `n` ([`Tiles::new`]); `bq`, `bs` a whole block of
/// `m` in lane order; `m.cols` a multiple of 128.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn block(
    m: &QMat<'_>,
    tiles: &mut Tiles,
    bq: &[u8],
    bs: &[f32],
    n: usize,
    keep: Range<usize>,
    out: (Dst, usize),
) {
    let (a, cols, ng, group, kb) = (m.a, m.cols, m.ng, m.a.group, tiles.kb);
    let (steps, per_group) = (cols / kb, group / kb);
    let acts = tiles.acts;
    TILED.with(|t| {
        let wt = &mut t.borrow_mut().1;
        wt.resize(cols / 4, Line([0; 64]));
        // SAFETY: the caller's guarantees; sized above
        unsafe { unpack(bq, cols, wt) };
        // step k's weight tile, and token tile tt's activations (the second token tile's
        // address is made, not read, when a pass has one)
        let w = |k: usize| wt.as_ptr().wrapping_add(k * kb / 4) as *const u8;
        let x = |tt: usize, k: usize| acts.wrapping_add((tt * steps + k) * kb / 4) as *const u8;
        let mut sums = [Line([0; 64]); 64];
        let mut f = [[0f32; 16]; PASS];
        let mut t0 = 0;
        while t0 < n {
            let tn = (n - t0).min(PASS);
            let (used, tt) = (tn.div_ceil(TILE_TOKENS), t0 / TILE_TOKENS);
            tiles.shape(tn);
            f[..tn].iter_mut().for_each(|v| *v = [0.0; 16]);
            // group g's sums (`sums`, a token a line) scaled into `f`
            let scale = |f: &mut [[f32; 16]; PASS], g: usize, sums: &[Line]| {
                // SAFETY: group g's 16 scales
                let ws = unsafe { _mm512_loadu_ps(bs.as_ptr().add(16 * g)) };
                // token t0's scale of group g, then a row (ng scales) a token
                let sa = a.scales[t0 * ng + g..].as_ptr();
                for (t, f) in f[..tn].iter_mut().enumerate() {
                    // SAFETY: token t's row of its sum tile; token t0 + t's scales (t0 + t < n)
                    unsafe {
                        let isum = _mm512_load_si512(sums.as_ptr().add(t) as *const _);
                        let sc = _mm512_mul_ps(ws, _mm512_set1_ps(*sa.add(t * ng)));
                        let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, _mm512_loadu_ps(f.as_ptr()));
                        _mm512_storeu_ps(f.as_mut_ptr(), v);
                    }
                }
            };
            // software-pipelined over three groups, so no instruction waits on the one just
            // before it: group g's products are issued, then group g - 1's sums (their products
            // issued an iteration earlier) stored, then group g - 2's (stored an iteration
            // earlier) scaled; the sum tiles and their buffers alternate by group
            for g in 0..ng + 2 {
                if g < ng {
                    for s in 0..per_group {
                        let k = g * per_group + s;
                        let (xa, xb, wk) = (x(tt, k), x(tt + 1, k), w(k));
                        match (g % 2, k % 2) {
                            (0, 0) => step!(0, 6, s == 0, used, xa, xb, wk, kb),
                            (0, _) => step!(0, 7, s == 0, used, xa, xb, wk, kb),
                            (_, 0) => step!(2, 6, s == 0, used, xa, xb, wk, kb),
                            _ => step!(2, 7, s == 0, used, xa, xb, wk, kb),
                        }
                    }
                }
                let (even, odd) = sums.split_at_mut(32);
                if (1..=ng).contains(&g) {
                    if (g - 1) % 2 == 0 {
                        store_sums!(0, even, used);
                    } else {
                        store_sums!(2, odd, used);
                    }
                }
                if g >= 2 {
                    scale(&mut f, g - 2, if g % 2 == 0 { even } else { odd });
                }
            }
            for (t, f) in f[..tn].iter().enumerate() {
                // SAFETY: the product's rows out.1.., token t0 + t
                unsafe { out.0.put(out.1, t0 + t, &f[keep.clone()]) };
            }
            t0 += tn;
        }
    });
}
