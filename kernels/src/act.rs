//! Activations quantized to int8 once per matrix product, so quantized weights can use integer
//! dot products (the weight bytes, not the arithmetic, are what decode must stream).

use crate::Isa;
use crate::act_tiles::{self, ActTiles, TilesMut};

/// One or more activation rows (`x` of `[n, cols]`), int8 with one f32 scale per `group`, plus
/// the integer sum of each group (a q4 kernel stores weights biased by +8 and subtracts
/// `8 * sum` once per group instead of sign-extending every nibble).
#[derive(Debug, Default, Clone)]
pub struct QuantAct {
    pub cols: usize,
    pub group: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
    pub sums: Vec<i32>,
    /// `sums[g] as f32 * scales[g]` per group: the q4/q6 kernels' bias term is each weight
    /// scale times this times the bias (a power of two, so the order of the two products
    /// changes no bit), made once here rather than for every row.
    pub scaled_sums: Vec<f32>,
    /// `q` in the order the AVX-512 q4/q6 kernels read it ([`permute_q4_act`]), made
    /// once here rather than by each chunk of each product; empty where rows are not whole
    /// 128-value chunks, below the AVX-512 tier, or off x86-64.
    pub permuted: Vec<i8>,
    /// The tier whose code quantized it (the same bits at every tier).
    pub tier: Isa,
    /// The tier the products that read it run at (the cap `prepare` was given).
    pub products: Isa,
    /// The rows in the order the q4 lanes kernel's prompt tiles read them at that tier, placed
    /// as each row is quantized or gathered ([`act_tiles`]).
    pub(crate) tiles: ActTiles,
}

impl QuantAct {
    /// Quantize `n` rows of `x` (`[n, cols]`) with groups of `group` values, with the code of
    /// tier `isa` at most (`MOESCOPE_ISA` caps this as it caps the products).
    pub fn quantize(&mut self, x: &[f32], cols: usize, group: usize, isa: Isa) {
        let n = x.len().checked_div(cols).unwrap_or(0);
        self.prepare(n, cols, group, isa);
        // every row as one part, made here rather than by `parts` (no list to allocate)
        let wide = self.tier == Isa::Avx512;
        let QuantAct { q, scales, sums, scaled_sums, permuted, tiles, .. } = self;
        let tiles = tiles.all_mut();
        QuantPart { first: 0, cols, group, wide, q, scales, sums, scaled_sums, permuted, tiles }.quantize(x);
    }

    /// Size the buffers for `n` rows of `cols` values in groups of `group`, quantized with the
    /// code of tier `isa` at most; then [`parts`](Self::parts) fill them (several threads may
    /// quantize a prompt's rows at once, the same bits as [`quantize`](Self::quantize)).
    pub fn prepare(&mut self, n: usize, cols: usize, group: usize, isa: Isa) {
        debug_assert!(cols.is_multiple_of(group));
        let ng = n * cols / group;
        self.cols = cols;
        self.group = group;
        self.q.resize(n * cols, 0);
        self.scales.resize(ng, 0.0);
        self.sums.resize(ng, 0);
        self.scaled_sums.resize(ng, 0.0);
        #[cfg(target_arch = "x86_64")]
        let wide = isa >= Isa::Avx512 && group.is_multiple_of(16) && avx512_available();
        #[cfg(not(target_arch = "x86_64"))]
        let wide = false;
        self.tier = if wide { Isa::Avx512 } else { Isa::Scalar };
        // only the AVX-512 q4/q6 kernels read it
        let permute = cfg!(target_arch = "x86_64") && isa >= Isa::Avx512 && cols.is_multiple_of(128);
        self.permuted.resize(if permute { n * cols } else { 0 }, 0);
        self.products = isa;
        self.tiles.prepare(act_tiles::order_for(n, cols, group, isa), n, cols, group);
    }

    /// The prepared rows in parts of `rows` rows or a little more (whole tiles of tokens, so
    /// each part places its own: [`act_tiles::TILE_TOKENS`]; the last may hold fewer), each with
    /// its own slices of every buffer.
    pub fn parts(&mut self, rows: usize) -> impl Iterator<Item = QuantPart<'_>> {
        let rows = rows.max(1).next_multiple_of(act_tiles::TILE_TOKENS);
        let (cols, group, wide) = (self.cols, self.group, self.tier == Isa::Avx512);
        let (vals, groups) = (rows * cols, rows * cols / group);
        // an empty `permuted`, or no tiles, gives every part an empty slice
        let permuted = self.permuted.chunks_mut(vals.max(1)).map(Some).chain(std::iter::repeat_with(|| None));
        let tiles = self.tiles.parts_mut(rows).map(Some).chain(std::iter::repeat_with(|| None));
        self.q
            .chunks_mut(vals.max(1))
            .zip(self.scales.chunks_mut(groups.max(1)))
            .zip(self.sums.chunks_mut(groups.max(1)))
            .zip(self.scaled_sums.chunks_mut(groups.max(1)))
            .zip(permuted.zip(tiles))
            .enumerate()
            .map(move |(i, ((((q, scales), sums), scaled_sums), (permuted, tiles)))| QuantPart {
                first: i * rows,
                cols,
                group,
                wide,
                q,
                scales,
                sums,
                scaled_sums,
                permuted: permuted.unwrap_or_default(),
                tiles: tiles.unwrap_or_default(),
            })
    }

    /// Room for `values` activations (groups of 32 at the smallest) without growing later.
    pub fn reserve(&mut self, values: usize) {
        let groups = values.div_ceil(32);
        fn room<T>(v: &mut Vec<T>, n: usize) {
            v.reserve(n.saturating_sub(v.len()));
        }
        room(&mut self.q, values);
        room(&mut self.permuted, values);
        room(&mut self.scales, groups);
        room(&mut self.sums, groups);
        room(&mut self.scaled_sums, groups);
        self.tiles.reserve(values);
    }

    /// Bytes its buffers hold.
    pub fn bytes(&self) -> usize {
        self.q.capacity()
            + self.permuted.capacity()
            + 4 * (self.scales.capacity() + self.sums.capacity() + self.scaled_sums.capacity())
            + self.tiles.bytes()
    }

    /// Row `t` as borrowed slices.
    #[inline]
    pub fn row(&self, t: usize) -> QuantRow<'_> {
        let ng = self.cols / self.group;
        QuantRow {
            group: self.group,
            q: &self.q[t * self.cols..(t + 1) * self.cols],
            scales: &self.scales[t * ng..(t + 1) * ng],
            sums: &self.sums[t * ng..(t + 1) * ng],
            scaled_sums: &self.scaled_sums[t * ng..(t + 1) * ng],
        }
    }

    pub fn rows(&self) -> usize {
        self.q.len().checked_div(self.cols).unwrap_or(0)
    }

    /// Rows `rows` of `src`, in that order, as this one's rows: what quantizing those rows of
    /// the input would give (each row is quantized by itself), for a product over some of the
    /// tokens of an input quantized once (a layer's routed experts).
    pub fn gather_rows(&mut self, src: &QuantAct, rows: impl ExactSizeIterator<Item = usize>) {
        let (cols, ng) = (src.cols, src.cols / src.group.max(1));
        let n = rows.len();
        (self.cols, self.group, self.tier, self.products) = (src.cols, src.group, src.tier, src.products);
        self.tiles.prepare(act_tiles::order_for(n, cols, src.group, src.products), n, cols, src.group);
        self.q.resize(n * cols, 0);
        self.scales.resize(n * ng, 0.0);
        self.sums.resize(n * ng, 0);
        self.scaled_sums.resize(n * ng, 0.0);
        let permuted = !src.permuted.is_empty();
        self.permuted.resize(if permuted { n * cols } else { 0 }, 0);
        let mut tiles = self.tiles.all_mut();
        for (i, r) in rows.enumerate() {
            let (sv, sg) = (r * cols..(r + 1) * cols, r * ng..(r + 1) * ng);
            let (v, g) = (i * cols..(i + 1) * cols, i * ng..(i + 1) * ng);
            self.q[v.clone()].copy_from_slice(&src.q[sv.clone()]);
            self.scales[g.clone()].copy_from_slice(&src.scales[sg.clone()]);
            self.sums[g.clone()].copy_from_slice(&src.sums[sg.clone()]);
            self.scaled_sums[g].copy_from_slice(&src.scaled_sums[sg.clone()]);
            if permuted {
                self.permuted[v].copy_from_slice(&src.permuted[sv.clone()]);
            }
            tiles.put(i, &src.q[sv], &src.sums[sg.clone()], &src.scales[sg]);
        }
    }
}

/// Consecutive rows of a prepared [`QuantAct`], from row `first`: what one thread quantizes.
pub struct QuantPart<'a> {
    first: usize,
    cols: usize,
    group: usize,
    /// AVX-512 code (the tier `prepare` chose)
    wide: bool,
    q: &'a mut [i8],
    scales: &'a mut [f32],
    sums: &'a mut [i32],
    scaled_sums: &'a mut [f32],
    /// empty when the rows are not permuted
    permuted: &'a mut [i8],
    /// the part's places in the tiles (none where the input has none)
    tiles: TilesMut<'a>,
}

impl QuantPart<'_> {
    /// Quantize this part's rows of `x` (all the rows, `[n, cols]`).
    pub fn quantize(&mut self, x: &[f32]) {
        let x = &x[self.first * self.cols..][..self.q.len()];
        let group = self.group;
        for (gi, xs) in x.chunks_exact(group).enumerate() {
            let qs = &mut self.q[gi * group..(gi + 1) * group];
            // SAFETY: AVX-512 F and BW were detected; the group is whole 16-float vectors
            #[cfg(target_arch = "x86_64")]
            if self.wide {
                (self.scales[gi], self.sums[gi]) = unsafe { quantize_group_avx512(xs, qs) };
                continue;
            }
            (self.scales[gi], self.sums[gi]) = quantize_group(xs, qs);
        }
        for ((o, &s), &d) in self.scaled_sums.iter_mut().zip(self.sums.iter()).zip(self.scales.iter()) {
            *o = s as f32 * d;
        }
        if !self.permuted.is_empty() {
            permute_q4_act(self.q, self.permuted);
        }
        let (cols, ng) = (self.cols, self.cols / group);
        for t in 0..self.q.len() / cols {
            let (v, g) = (t * cols..(t + 1) * cols, t * ng..(t + 1) * ng);
            self.tiles.put(self.first + t, &self.q[v], &self.sums[g.clone()], &self.scales[g]);
        }
    }
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct QuantRow<'a> {
    pub group: usize,
    pub q: &'a [i8],
    pub scales: &'a [f32],
    pub sums: &'a [i32],
    pub scaled_sums: &'a [f32],
}

/// The activation row in the order the AVX-512 q4/q6 kernels' nibbles come in (`q4_lohi32`: per
/// 128 values, the first half of each 32-value block, then the second halves; see
/// `mat/avx512.rs`).
/// `a.len()` must be a multiple of 128.
pub fn permute_q4_act(a: &[i8], out: &mut [i8]) {
    debug_assert_eq!(a.len(), out.len());
    for (chunk, o) in a.chunks_exact(128).zip(out.chunks_exact_mut(128)) {
        // low nibbles: the first half of each 32-value block; then the high nibbles
        for (k, half) in [0usize, 16].into_iter().enumerate() {
            for b in 0..4 {
                o[k * 64 + b * 16..k * 64 + b * 16 + 16].copy_from_slice(&chunk[b * 32 + half..b * 32 + half + 16]);
            }
        }
    }
}

/// One group to int8: `q = round(x / d)` with `d = absmax / 127`; returns `(d, sum of q)`.
/// The reference the vector version matches bit for bit.
fn quantize_group(xs: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (qo, &v) in q.iter_mut().zip(xs) {
        let qv = round_even_small(v * id).clamp(-127.0, 127.0) as i8;
        *qo = qv;
        sum += qv as i32;
    }
    (d, sum)
}

#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
}

/// [`quantize_group`] 16 values at a time, the same operations per value (the max is exact in
/// any order; the rounding is the same add and subtract; a NaN, which `f32::max` skips and `as
/// i8` turns into 0, is skipped and zeroed here too), so the same bits. It runs serially on the
/// calling thread before every product, where the other threads wait for it.
///
/// # Safety
/// The CPU must support AVX-512 F and BW; `xs.len() == q.len()`, a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_group_avx512(xs: &[f32], q: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    let mut m = _mm512_setzero_ps();
    for c in xs.chunks_exact(16) {
        // SAFETY: 16 floats
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        // a NaN lane is the first operand: vmaxps then gives the second, as f32::max skips it
        m = _mm512_max_ps(_mm512_abs_ps(v), m);
    }
    let amax = _mm512_reduce_max_ps(m);
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let (idv, magic, lo, hi) =
        (_mm512_set1_ps(id), _mm512_set1_ps(12_582_912.0), _mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let mut sum = _mm512_setzero_si512();
    for (c, o) in xs.chunks_exact(16).zip(q.chunks_exact_mut(16)) {
        // SAFETY: 16 floats in, 16 bytes out
        let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, idv), magic), magic);
        let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
        let r = _mm512_maskz_mov_ps(ordered, _mm512_min_ps(_mm512_max_ps(r, lo), hi));
        let i = _mm512_cvttps_epi32(r);
        sum = _mm512_add_epi32(sum, i);
        unsafe { _mm_storeu_si128(o.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(i)) };
    }
    (d, _mm512_reduce_add_epi32(sum))
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^22` (here `|x| <= 127`):
/// adding and taking off 1.5 x 2^23 leaves no fraction bits. Plain SSE2 arithmetic, so the
/// quantization loop vectorizes, where `round` and `round_ties_even` are libm calls on the
/// baseline x86-64 target.
#[inline]
fn round_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_group_quantization_is_the_scalar_bits() {
        if !avx512_available() {
            return;
        }
        let mut s = 7u64;
        let mut r = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let mut groups: Vec<Vec<f32>> =
            (0..200).map(|i| (0..16 * (1 + i % 8)).map(|_| r() * 10f32.powi(i % 7 - 3)).collect()).collect();
        // ties at every half step, zeros, a lone extreme, NaN and infinities
        groups.push((0..128).map(|j| (j as f32 - 64.0) * 0.5).collect());
        groups.push(vec![0.0; 32]);
        let mut g = vec![1e-3f32; 64];
        g[17] = -5.0;
        groups.push(g.clone());
        g[3] = f32::NAN;
        groups.push(g.clone());
        g[40] = f32::INFINITY;
        groups.push(g);
        for xs in &groups {
            let (mut a, mut b) = (vec![0i8; xs.len()], vec![0i8; xs.len()]);
            let want = quantize_group(xs, &mut a);
            // SAFETY: detected above; the groups are whole 16-float vectors
            let got = unsafe { quantize_group_avx512(xs, &mut b) };
            assert_eq!((want.0.to_bits(), want.1), (got.0.to_bits(), got.1), "{xs:?}");
            assert_eq!(a, b, "{xs:?}");
        }
    }

    #[test]
    fn parts_quantized_apart_are_the_whole_bits() {
        // several threads quantize a prompt's rows in parts: every part size, every tier, the
        // same buffers as one call
        let (n, cols) = (40, 256);
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.731).sin() * (1 + i % 5) as f32).collect();
        for isa in Isa::available() {
            for group in [32, 128] {
                let mut whole = QuantAct::default();
                whole.quantize(&x, cols, group, isa);
                for rows in [1, 2, 3, 7, 9, 17, 40] {
                    let mut apart = QuantAct::default();
                    apart.prepare(n, cols, group, isa);
                    let mut parts: Vec<_> = apart.parts(rows).collect();
                    // whole tiles of tokens a part
                    assert_eq!(parts.len(), n.div_ceil(rows.next_multiple_of(act_tiles::TILE_TOKENS)));
                    // in reverse: no part depends on another
                    for p in parts.iter_mut().rev() {
                        p.quantize(&x);
                    }
                    drop(parts);
                    assert_eq!(
                        (&apart.q, &apart.sums, &apart.permuted, apart.tier),
                        (&whole.q, &whole.sums, &whole.permuted, whole.tier),
                        "{isa} group {group}, parts of {rows}"
                    );
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&apart.scales), bits(&whole.scales));
                    assert_eq!(bits(&apart.scaled_sums), bits(&whole.scaled_sums));
                    assert_eq!(apart.tiles.values(), whole.tiles.values(), "{isa} group {group}, parts of {rows}");
                    assert_eq!((apart.tiles.bias(), apart.tiles.order()), (whole.tiles.bias(), whole.tiles.order()));
                }
            }
        }
    }

    #[test]
    fn gathered_rows_are_the_rows_quantized_alone() {
        // a layer's routed experts gather their tokens' rows of the input quantized once: the
        // same buffers as quantizing those rows (repeats, any order, none) by themselves
        let (n, cols) = (9, 256);
        let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.577).cos() * (1 + i % 7) as f32).collect();
        for isa in Isa::available() {
            for group in [32, 64, 128] {
                let mut all = QuantAct::default();
                all.quantize(&x, cols, group, isa);
                for rows in [vec![3], vec![8, 0, 5], vec![2, 2, 7, 1], vec![]] {
                    let mut got = QuantAct::default();
                    got.gather_rows(&all, rows.iter().copied());
                    let xs: Vec<f32> = rows.iter().flat_map(|&r| x[r * cols..(r + 1) * cols].iter().copied()).collect();
                    let mut want = QuantAct::default();
                    want.quantize(&xs, cols, group, isa);
                    let tag = format!("{isa} group {group}, rows {rows:?}");
                    assert_eq!(
                        (&got.q, &got.sums, &got.permuted, got.tier, got.cols, got.group),
                        (&want.q, &want.sums, &want.permuted, want.tier, want.cols, want.group),
                        "{tag}"
                    );
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got.scales), bits(&want.scales), "{tag}");
                    assert_eq!(bits(&got.scaled_sums), bits(&want.scaled_sums), "{tag}");
                }
            }
        }
    }

    #[test]
    fn the_isa_cap_reaches_the_quantizer() {
        let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut capped = QuantAct::default();
        capped.quantize(&x, 256, 128, Isa::Scalar);
        assert_eq!(capped.tier, Isa::Scalar, "MOESCOPE_ISA=scalar runs the scalar quantizer");
        assert!(capped.permuted.is_empty(), "no AVX-512 layout below its tier");
        let best = Isa::detect();
        let mut own = QuantAct::default();
        own.quantize(&x, 256, 128, best);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(own.tier == Isa::Avx512, best >= Isa::Avx512 && avx512_available());
        assert_eq!((own.q, own.scales, own.sums), (capped.q, capped.scales, capped.sums), "same bits either way");
    }

    #[test]
    fn small_rounding_is_round_ties_even() {
        for i in -140_000..=140_000 {
            let x = i as f32 / 1000.0;
            assert_eq!(round_even_small(x), x.round_ties_even(), "{x}");
        }
        for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 0.49999997, -0.49999997, 127.49999] {
            assert_eq!(round_even_small(x), x.round_ties_even(), "{x}");
        }
    }
}
