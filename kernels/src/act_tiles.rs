//! A prompt's quantized activations in the order the q4 lanes kernel's prompt tiles read them,
//! made once per product input by whoever quantizes (or gathers) its rows.
//!
//! The tiles read a token's 32-value blocks side by side with the other tokens of their tile
//! (`mat/avx512_q4_prompt.rs`, `mat/amx_q4.rs`). Laid out by the kernel, every piece of a
//! product over the threads laid out the whole input again: a 512-token product over 16
//! threads is split into some hundred pieces. Here each row is placed as it is quantized: the
//! threads that quantize a prompt's rows place them too, each its own whole tiles of tokens.
//!
//! Two orders, one per tier (the kernel takes the one [`order_for`] gives it, else lays out its
//! own copy):
//!
//! ```text
//! Runs      (VNNI tile)  runs of 8 tokens from t0 (the last shorter, tn tokens):
//!                        block b of token t0 + i at byte  t0 cols + (b tn + i) 32
//!                        -8 x sum and scale of group g at  t0 groups + g tn + i
//! Amx { kb } (AMX tiles) 16-token tiles tt, steps of kb values (32 or 64):
//!                        step k of token 16 tt + r at byte ((tt steps + k) 16 + r) kb,
//!                        the last tile's rows past n unused (its tiles load only n's)
//! ```

use crate::Isa;

/// Tokens the parts that place a prompt's rows are whole multiples of (both orders' tiles).
pub const TILE_TOKENS: usize = 16;

/// Tokens a VNNI prompt tile runs at most (a run of [`TileOrder::Runs`]).
pub const RUN_TOKENS: usize = 8;

/// One 64-byte line (the AMX tiles load whole, aligned lines).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub struct Line(pub [u8; 64]);

/// Which tiles a product input is laid out for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum TileOrder {
    #[default]
    None,
    /// The VNNI prompt tiles' runs of [`RUN_TOKENS`].
    Runs,
    /// The AMX tiles' 16-token tiles, steps of `kb` values.
    Amx { kb: usize },
}

/// Whether the AMX tiles run a prompt of `n` tokens with groups of `group` (else the VNNI tile):
/// the float steps a group cost the same either way, so groups of 32 gain only from 24 tokens
/// on, larger groups from 12 (`cargo bench --bench matvec -- q4x4l q4g32x4l avx512 amx`).
pub fn amx_pays(n: usize, group: usize) -> bool {
    n >= if group == 32 { 24 } else { 12 }
}

/// The order the q4 lanes kernel at tier `isa` reads `n` tokens of `cols` values in groups of
/// `group` in: the AMX tiles where the tier has them and they pay, the VNNI prompt tiles for
/// 2 tokens or more with groups of 32, 64 or 128, else none.
pub fn order_for(n: usize, cols: usize, group: usize, isa: Isa) -> TileOrder {
    if !cfg!(target_arch = "x86_64") || n < 2 || isa < Isa::Avx512 || !cols.is_multiple_of(128) {
        return TileOrder::None;
    }
    if isa >= Isa::Amx && group.is_multiple_of(32) && amx_pays(n, group) {
        return TileOrder::Amx { kb: group.min(64) };
    }
    if matches!(group, 32 | 64 | 128) { TileOrder::Runs } else { TileOrder::None }
}

/// A product input's tiles: `n` tokens of `cols` values, groups of `group`, in `order`.
#[derive(Debug, Default, Clone)]
pub struct ActTiles {
    order: TileOrder,
    n: usize,
    cols: usize,
    group: usize,
    q: Vec<Line>,
    /// Runs only: `-8 x` each group's sum, in run order
    bias: Vec<i32>,
    /// Runs only: each group's scale, in run order
    scales: Vec<f32>,
}

impl ActTiles {
    /// Size the buffers for `n` tokens in `order` (their contents are placed later).
    pub fn prepare(&mut self, order: TileOrder, n: usize, cols: usize, group: usize) {
        (self.order, self.n, self.cols, self.group) = (order, n, cols, group);
        let (bytes, groups) = match order {
            TileOrder::None => (0, 0),
            TileOrder::Runs => (n * cols, n * cols / group),
            TileOrder::Amx { .. } => (n.next_multiple_of(TILE_TOKENS) * cols, 0),
        };
        self.q.resize(bytes.div_ceil(64), Line([0; 64]));
        self.bias.resize(groups, 0);
        self.scales.resize(groups, 0.0);
    }

    /// Room for `values` activations laid out (in whole tiles of tokens) without growing later.
    pub fn reserve(&mut self, values: usize) {
        let lines = values.div_ceil(64);
        self.q.reserve(lines.saturating_sub(self.q.len()));
        let groups = values.div_ceil(32);
        self.bias.reserve(groups.saturating_sub(self.bias.len()));
        self.scales.reserve(groups.saturating_sub(self.scales.len()));
    }

    pub fn bytes(&self) -> usize {
        64 * self.q.capacity() + 4 * (self.bias.capacity() + self.scales.capacity())
    }

    /// The order and token count the tiles hold (the kernel checks both against its product).
    pub fn order(&self) -> (TileOrder, usize) {
        (self.order, self.n)
    }

    pub fn lines(&self) -> &[Line] {
        &self.q
    }

    /// The values in the order's bytes (as `i8`).
    pub fn values(&self) -> &[i8] {
        // SAFETY: `Line` is 64 plain bytes
        unsafe { std::slice::from_raw_parts(self.q.as_ptr() as *const i8, 64 * self.q.len()) }
    }

    pub fn bias(&self) -> &[i32] {
        &self.bias
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Every token's place, for one writer.
    pub fn all_mut(&mut self) -> TilesMut<'_> {
        let n = self.n;
        self.parts_mut(n.max(1)).next().unwrap_or_default()
    }

    /// The places of tokens in parts of `rows` tokens (a multiple of [`TILE_TOKENS`], or all of
    /// them), part `i` from token `i rows`: each writer its own tiles.
    pub fn parts_mut(&mut self, rows: usize) -> impl Iterator<Item = TilesMut<'_>> {
        debug_assert!(rows.is_multiple_of(TILE_TOKENS) || rows >= self.n);
        let (order, n, cols, ng) = (self.order, self.n, self.cols, self.cols / self.group.max(1));
        let rows = rows.max(1);
        let parts = if order == TileOrder::None { 0 } else { n.div_ceil(rows) };
        // SAFETY: `Line` is 64 plain bytes
        let mut q: &mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(self.q.as_mut_ptr() as *mut u8, 64 * self.q.len()) };
        let (mut bias, mut scales) = (&mut self.bias[..], &mut self.scales[..]);
        (0..parts).map(move |i| {
            let last = i + 1 == parts;
            // the last part takes the rest (Amx: the last tile's unused rows too)
            let (qb, gb) =
                if last { (q.len(), bias.len()) } else { (rows * cols, if bias.is_empty() { 0 } else { rows * ng }) };
            let (pq, rq) = std::mem::take(&mut q).split_at_mut(qb);
            let (pb, rb) = std::mem::take(&mut bias).split_at_mut(gb);
            let (ps, rs) = std::mem::take(&mut scales).split_at_mut(gb);
            (q, bias, scales) = (rq, rb, rs);
            TilesMut { order, n, cols, ng, first: i * rows, q: pq, bias: pb, scales: ps }
        })
    }
}

/// The places of tokens `first..` of an [`ActTiles`] (a part's, or all).
#[derive(Debug, Default)]
pub struct TilesMut<'a> {
    order: TileOrder,
    n: usize,
    cols: usize,
    ng: usize,
    first: usize,
    q: &'a mut [u8],
    bias: &'a mut [i32],
    scales: &'a mut [f32],
}

impl TilesMut<'_> {
    /// Place token `t` (of this part): its values `q` (`cols`), group sums and scales.
    #[inline]
    pub fn put(&mut self, t: usize, q: &[i8], sums: &[i32], scales: &[f32]) {
        let (cols, ng) = (self.cols, self.ng);
        match self.order {
            TileOrder::None => {}
            TileOrder::Runs => {
                let t0 = t - t % RUN_TOKENS;
                let (tn, i) = ((self.n - t0).min(RUN_TOKENS), t - t0);
                let (vq, vg) = ((t0 - self.first) * cols, (t0 - self.first) * ng);
                for (b, v) in q.chunks_exact(32).enumerate() {
                    let d = vq + (b * tn + i) * 32;
                    self.q[d..d + 32].copy_from_slice(bytes(v));
                }
                for g in 0..ng {
                    self.bias[vg + g * tn + i] = -8 * sums[g];
                    self.scales[vg + g * tn + i] = scales[g];
                }
            }
            TileOrder::Amx { kb } => {
                let (tt, r) = ((t - self.first) / TILE_TOKENS, t % TILE_TOKENS);
                let steps = cols / kb;
                for (k, v) in q.chunks_exact(kb).enumerate() {
                    let d = ((tt * steps + k) * TILE_TOKENS + r) * kb;
                    self.q[d..d + kb].copy_from_slice(bytes(v));
                }
            }
        }
    }

    /// The first token this part places.
    pub fn first(&self) -> usize {
        self.first
    }
}

fn bytes(v: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have one layout
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens whose value j of token t is (t * 7 + j) mod 251 - 125, sums and scales from t, g.
    fn token(t: usize, cols: usize, ng: usize) -> (Vec<i8>, Vec<i32>, Vec<f32>) {
        let q = (0..cols).map(|j| ((t * 7 + j) % 251) as i32 - 125).map(|v| v as i8).collect();
        ((q), (0..ng).map(|g| (t * 100 + g) as i32).collect(), (0..ng).map(|g| (t + g) as f32 * 0.5).collect())
    }

    /// Each order's places, as the module doc gives them, for every token: written in parts and
    /// whole, the same bytes.
    #[test]
    fn tokens_land_where_the_orders_say() {
        let (cols, group) = (256, 64);
        let ng = cols / group;
        for n in [2, 7, 8, 13, 16, 17, 40] {
            for order in [TileOrder::Runs, TileOrder::Amx { kb: 64 }, TileOrder::Amx { kb: 32 }] {
                let mut whole = ActTiles::default();
                whole.prepare(order, n, cols, group);
                let mut all = whole.all_mut();
                for t in 0..n {
                    let (q, s, sc) = token(t, cols, ng);
                    all.put(t, &q, &s, &sc);
                }
                let mut parted = ActTiles::default();
                parted.prepare(order, n, cols, group);
                for mut p in parted.parts_mut(TILE_TOKENS) {
                    for t in p.first()..(p.first() + TILE_TOKENS).min(n) {
                        let (q, s, sc) = token(t, cols, ng);
                        p.put(t, &q, &s, &sc);
                    }
                }
                let v = whole.values();
                assert_eq!(v, parted.values(), "{order:?} n={n}: parts and whole differ");
                assert_eq!((whole.bias(), whole.scales()), (parted.bias(), parted.scales()));
                for t in 0..n {
                    let (q, s, sc) = token(t, cols, ng);
                    match order {
                        TileOrder::Runs => {
                            let (t0, i) = (t - t % 8, t % 8);
                            let tn = (n - t0).min(8);
                            for j in 0..cols {
                                let at = t0 * cols + (j / 32 * tn + i) * 32 + j % 32;
                                assert_eq!(v[at], q[j], "runs: n={n} token {t} value {j}");
                            }
                            for g in 0..ng {
                                assert_eq!(whole.bias()[t0 * ng + g * tn + i], -8 * s[g]);
                                assert_eq!(whole.scales()[t0 * ng + g * tn + i], sc[g]);
                            }
                        }
                        TileOrder::Amx { kb } => {
                            let (tt, r) = (t / 16, t % 16);
                            for j in 0..cols {
                                let at = ((tt * (cols / kb) + j / kb) * 16 + r) * kb + j % kb;
                                assert_eq!(v[at], q[j], "amx {kb}: n={n} token {t} value {j}");
                            }
                        }
                        TileOrder::None => unreachable!(),
                    }
                }
            }
        }
    }

    #[test]
    fn the_kernel_order_follows_tier_tokens_and_groups() {
        assert_eq!(order_for(1, 2048, 32, Isa::Amx), TileOrder::None);
        assert_eq!(order_for(8, 2048, 32, Isa::Avx2), TileOrder::None);
        assert_eq!(order_for(23, 2048, 32, Isa::Amx), TileOrder::Runs);
        assert_eq!(order_for(24, 2048, 32, Isa::Amx), TileOrder::Amx { kb: 32 });
        assert_eq!(order_for(12, 2048, 128, Isa::Amx), TileOrder::Amx { kb: 64 });
        assert_eq!(order_for(512, 2048, 128, Isa::Avx512), TileOrder::Runs);
        assert_eq!(order_for(512, 2048, 256, Isa::Avx512), TileOrder::None);
        assert_eq!(order_for(512, 2000, 32, Isa::Avx512), TileOrder::None);
    }
}
