//! Scaled dot-product attention of query rows over one KV head's cached keys and values, as an
//! online softmax: keys are taken a block at a time, and each query keeps a running maximum
//! score `m`, the running sum `l` of `exp(score - m)`, and the unnormalised output
//! `o = Σ exp(score - m) v`, rescaled whenever `m` grows. No score vector as long as the
//! context is ever held, and the keys and values of a block are read once for every query of a
//! tile (the heads of a GQA group, and in prefill several tokens too) while they sit in L1.
//!
//! Keys come in blocks of [`KEY_BLOCK`] positions stored transposed (`[hd, KEY_BLOCK]` each, as
//! the KV cache keeps them; [`pack_keys`] makes that layout from rows), so a block's scores
//! are `KEY_BLOCK`-wide vector multiply-adds down the head dimension, with no horizontal sum
//! per key; each score is the plain sum over `d` in order, whatever the tier. Values stay
//! `[positions, hd]`, and a query's output is accumulated [`VCHUNK`] dimensions at a time, in
//! registers, over a block's values.
//!
//! Positions are cut into splits of [`SPLIT`] positions. Each split is folded into a fresh
//! state and the splits' states are merged in position order ([`merge`]), so a long context's
//! splits can run in parallel during decode (flash-decoding) while prefill folds them one after
//! another: every query goes through the same operations in the same order either way, and
//! whatever else shares its tile, so a prompt's attention equals that of its tokens decoded one
//! by one, bit for bit, at any thread count.

use std::ops::Range;

use crate::Isa;

/// Keys per step of the online softmax: its scores stay on the stack, its keys and values
/// (`2 x 64 x head_dim` f32: 64 KiB at head_dim 128) in L1/L2 across a tile's queries.
pub const KEY_BLOCK: usize = 64;

/// Positions per split: the unit decode spreads over threads on a long context. A multiple
/// of [`KEY_BLOCK`], so blocks never straddle splits.
pub const SPLIT: usize = 1024;

/// Output dimensions a query accumulates at once over a block's values (one AVX-512 register).
pub const VCHUNK: usize = 16;

/// Keys as rows (`[n, hd]`) in the layout [`fold`] takes: blocks of [`KEY_BLOCK`] positions,
/// each `[hd, KEY_BLOCK]`, the last block padded with zeros.
pub fn pack_keys(rows: &[f32], hd: usize) -> Vec<f32> {
    let n = rows.len() / hd;
    let mut out = vec![0f32; n.next_multiple_of(KEY_BLOCK) * hd];
    for (j, row) in rows.chunks_exact(hd).enumerate() {
        let block = j / KEY_BLOCK * hd * KEY_BLOCK;
        for (d, &x) in row.iter().enumerate() {
            out[block + d * KEY_BLOCK + j % KEY_BLOCK] = x;
        }
    }
    out
}

/// The running softmax state of `nq` queries: `m` and `l` (`[nq]`) and `o` (`[nq, hd]`).
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub hd: usize,
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    pub o: Vec<f32>,
}

impl State {
    /// The state before any key: no maximum yet, nothing summed.
    pub fn new(nq: usize, hd: usize) -> State {
        State { hd, m: vec![f32::NEG_INFINITY; nq], l: vec![0.0; nq], o: vec![0.0; nq * hd] }
    }

    /// Back to [`State::new`] for `nq` queries, keeping the allocations.
    pub fn reset(&mut self, nq: usize) {
        self.m.clear();
        self.m.resize(nq, f32::NEG_INFINITY);
        self.l.clear();
        self.l.resize(nq, 0.0);
        self.o.clear();
        self.o.resize(nq * self.hd, 0.0);
    }

    pub fn queries(&self) -> usize {
        self.m.len()
    }

    /// Fold the state `p` of the same queries over later positions into this one (the merge
    /// of flash-decoding): both rescaled to the larger maximum and summed. A query `p` saw no
    /// key of leaves this one as it is.
    pub fn merge(&mut self, p: &State) {
        merge(self, p);
    }

    /// Query `i`'s attention output, `o / l`, into `out` (`[hd]`).
    pub fn finish(&self, i: usize, out: &mut [f32]) {
        let inv = 1.0 / self.l[i];
        for (y, &x) in out.iter_mut().zip(&self.o[i * self.hd..(i + 1) * self.hd]) {
            *y = x * inv;
        }
    }
}

/// See [`State::merge`].
pub fn merge(acc: &mut State, p: &State) {
    debug_assert_eq!((acc.queries(), acc.hd), (p.queries(), p.hd));
    let hd = acc.hd;
    for i in 0..acc.queries() {
        let pm = p.m[i];
        if pm == f32::NEG_INFINITY {
            continue;
        }
        let m = acc.m[i].max(pm);
        // a fresh accumulator (m = -inf) takes the partial exactly: exp(-inf) = 0, exp(0) = 1
        let (ca, cp) = ((acc.m[i] - m).exp(), (pm - m).exp());
        acc.l[i] = acc.l[i] * ca + p.l[i] * cp;
        for (a, &b) in acc.o[i * hd..(i + 1) * hd].iter_mut().zip(&p.o[i * hd..(i + 1) * hd]) {
            *a = *a * ca + b * cp;
        }
        acc.m[i] = m;
    }
}

/// The splits a query at `end` keys (it sees positions `0..end`) is cut into.
pub fn splits(end: usize) -> impl Iterator<Item = Range<usize>> {
    (0..end.div_ceil(SPLIT)).map(move |s| s * SPLIT..((s + 1) * SPLIT).min(end))
}

/// Fold the keys and values of positions `range` (`keys`: whole transposed blocks from
/// position 0 as [`pack_keys`] lays them out; `vals`: `[positions, hd]`, row `j` at position
/// `j`) into `st`, for the queries `q` (`[nq, hd]`), query `i` seeing only the
/// positions below `ends[i]` (causal masking). Scores are `q · k * scale`. Blocks of
/// [`KEY_BLOCK`] positions start at multiples of it, so where a range begins never changes how
/// a query's keys are grouped. The element-wise loops (rescaling, exponentials, the weighted
/// sum of values) are compiled for the tier `isa` names.
#[allow(clippy::too_many_arguments)]
pub fn fold(
    isa: Isa,
    q: &[f32],
    ends: &[usize],
    keys: &[f32],
    vals: &[f32],
    range: Range<usize>,
    scale: f32,
    st: &mut State,
) {
    debug_assert!(q.len() == ends.len() * st.hd && st.queries() == ends.len());
    let a = FoldArgs { isa, q, ends, keys, vals, range, scale };
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: the tier says AVX-512 F is present
            return unsafe { fold_avx512(a, st) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says AVX2 and FMA are present
            return unsafe { fold_avx2(a, st) };
        }
    }
    fold_body(a, st)
}

/// [`fold`]'s inputs, handed to the body compiled for each tier.
struct FoldArgs<'a> {
    isa: Isa,
    q: &'a [f32],
    ends: &'a [usize],
    keys: &'a [f32],
    vals: &'a [f32],
    range: Range<usize>,
    scale: f32,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn fold_avx512(a: FoldArgs<'_>, st: &mut State) {
    fold_body(a, st)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fold_avx2(a: FoldArgs<'_>, st: &mut State) {
    fold_body(a, st)
}

#[inline(always)]
fn fold_body(a: FoldArgs<'_>, st: &mut State) {
    let FoldArgs { isa, q, ends, keys, vals, range, scale } = a;
    let hd = st.hd;
    let mut b0 = range.start;
    while b0 < range.end {
        let blk = b0 / KEY_BLOCK;
        let b1 = ((blk + 1) * KEY_BLOCK).min(range.end);
        // this block's keys, [hd, KEY_BLOCK]
        let kt = &keys[blk * hd * KEY_BLOCK..(blk + 1) * hd * KEY_BLOCK];
        let blk_ = Block { isa, b0, b1, kt, vals, hd, scale };
        // the queries that see part of this block, QUERIES at a time (the scores of each are
        // the same whatever it is grouped with)
        let mut group = [0usize; QUERIES];
        let mut n = 0;
        for (i, &end) in ends.iter().enumerate() {
            if end.min(b1) > b0 {
                group[n] = i;
                n += 1;
                if n == QUERIES {
                    blk_.queries::<QUERIES>(&group, q, ends, st);
                    n = 0;
                }
            }
        }
        for &i in &group[..n] {
            blk_.queries::<1>(&[i], q, ends, st);
        }
        b0 = b1;
    }
}

/// Queries whose block scores are computed together: 4 x 4 vector accumulators of
/// `KEY_BLOCK` lanes, independent chains enough to keep the multiply-adds busy.
const QUERIES: usize = 4;

/// One block of keys (positions `b0..b1`, transposed keys `kt`) and the values.
struct Block<'a> {
    isa: Isa,
    b0: usize,
    b1: usize,
    kt: &'a [f32],
    vals: &'a [f32],
    hd: usize,
    scale: f32,
}

impl Block<'_> {
    /// Fold this block into the states of the queries `idx` (each sees part of it).
    #[inline(always)]
    fn queries<const Q: usize>(&self, idx: &[usize; Q], q: &[f32], ends: &[usize], st: &mut State) {
        let hd = self.hd;
        // every lane's score, each summed over d in order (lanes past the cache's end are
        // zeros or stale, and unused)
        let lane0 = self.b0 / KEY_BLOCK * KEY_BLOCK;
        // only the lanes up to the block's last position (a short context's one block is
        // mostly past the cache's end: its keys are neither read nor multiplied)
        let mut sc = scores::<Q>(self.isa, idx, q, self.kt, hd, self.b1 - lane0);
        for (sc, &i) in sc.iter_mut().zip(idx) {
            let e = ends[i].min(self.b1);
            let s = &mut sc[self.b0 - lane0..e - lane0];
            for sj in s.iter_mut() {
                *sj *= self.scale;
            }
            let m = st.m[i].max(lanes(s, f32::NEG_INFINITY, f32::max));
            // the output so far is rescaled to the new maximum (0 before the first key)
            let alpha = (st.m[i] - m).exp();
            for sj in s.iter_mut() {
                *sj = exp_le0(*sj - m);
            }
            let sum = lanes(s, 0.0, |a, b| a + b);
            let o = &mut st.o[i * hd..(i + 1) * hd];
            let vb = &self.vals[self.b0 * hd..e * hd];
            // VCHUNK dimensions per register, up to 8 registers at once; any rest alone
            let mut c = 0;
            while c < hd {
                let left = (hd - c) / VCHUNK;
                let (isa, o, vb) = (self.isa, &mut o[c..], &vb[c..]);
                c += match left {
                    8.. => weighted::<8>(isa, o, alpha, s, vb, hd),
                    4.. => weighted::<4>(isa, o, alpha, s, vb, hd),
                    2.. => weighted::<2>(isa, o, alpha, s, vb, hd),
                    1 => weighted::<1>(isa, o, alpha, s, vb, hd),
                    _ => weighted_rest(o, alpha, s, vb, hd),
                };
            }
            st.l[i] = st.l[i] * alpha + sum;
            st.m[i] = m;
        }
    }
}

/// The scores of the queries `idx` (rows of `q`, `[.., hd]`) over one block of transposed keys
/// `kt` (`[hd, KEY_BLOCK]`), unscaled: each lane a sum over `d` in order. Lanes from `lanes` on
/// (`1..=KEY_BLOCK`) may be left unset: the vectors that hold none of the first `lanes` are
/// skipped.
#[inline(always)]
fn scores<const Q: usize>(
    isa: Isa,
    idx: &[usize; Q],
    q: &[f32],
    kt: &[f32],
    hd: usize,
    lanes: usize,
) -> [[f32; KEY_BLOCK]; Q] {
    debug_assert!((1..=KEY_BLOCK).contains(&lanes));
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY (each arm): the tier says AVX-512 F is present
            return match lanes.div_ceil(16) {
                1 => unsafe { x86::scores::<Q, 1>(idx, q, kt, hd) },
                2 => unsafe { x86::scores::<Q, 2>(idx, q, kt, hd) },
                3 => unsafe { x86::scores::<Q, 3>(idx, q, kt, hd) },
                _ => unsafe { x86::scores::<Q, 4>(idx, q, kt, hd) },
            };
        }
        if isa.has_avx2() {
            // SAFETY (each arm): the tier says AVX2 and FMA are present
            return match lanes.div_ceil(8) {
                1 => unsafe { x86::scores_avx2::<Q, 1>(idx, q, kt, hd) },
                2 => unsafe { x86::scores_avx2::<Q, 2>(idx, q, kt, hd) },
                3 | 4 => unsafe { x86::scores_avx2::<Q, 4>(idx, q, kt, hd) },
                _ => unsafe { x86::scores_avx2::<Q, 8>(idx, q, kt, hd) },
            };
        }
    }
    let _ = isa;
    let mut sc = [[0f32; KEY_BLOCK]; Q];
    for (d, col) in kt.chunks_exact(KEY_BLOCK).take(hd).enumerate() {
        for (s, &i) in sc.iter_mut().zip(idx) {
            let qd = q[i * hd + d];
            for (a, &k) in s[..lanes].iter_mut().zip(col) {
                *a += qd * k;
            }
        }
    }
    sc
}

/// `o[..C * VCHUNK] = o * alpha + Σ_j p[j] v[j]` with `v[j]` at `vb[j * hd..]`, in registers;
/// returns the dimensions done. Each dimension: the rescale, then the keys in order.
#[inline(always)]
fn weighted<const C: usize>(isa: Isa, o: &mut [f32], alpha: f32, p: &[f32], vb: &[f32], hd: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: the tier says AVX-512 F is present
            return unsafe { x86::weighted::<C>(o, alpha, p, vb, hd) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says AVX2 and FMA are present
            return unsafe { x86::weighted_avx2::<C>(o, alpha, p, vb, hd) };
        }
    }
    let _ = isa;
    for c in 0..C {
        let mut acc = [0f32; VCHUNK];
        for (a, &x) in acc.iter_mut().zip(&o[c * VCHUNK..(c + 1) * VCHUNK]) {
            *a = x * alpha;
        }
        for (j, &pj) in p.iter().enumerate() {
            let v = &vb[j * hd + c * VCHUNK..j * hd + (c + 1) * VCHUNK];
            for (a, &x) in acc.iter_mut().zip(v) {
                *a += pj * x;
            }
        }
        o[c * VCHUNK..(c + 1) * VCHUNK].copy_from_slice(&acc);
    }
    C * VCHUNK
}

/// [`weighted`] for the last `o.len() < VCHUNK` dimensions.
#[inline(always)]
fn weighted_rest(o: &mut [f32], alpha: f32, p: &[f32], vb: &[f32], hd: usize) -> usize {
    let n = o.len();
    for x in o.iter_mut() {
        *x *= alpha;
    }
    for (j, &pj) in p.iter().enumerate() {
        for (x, &v) in o.iter_mut().zip(&vb[j * hd..j * hd + n]) {
            *x += pj * v;
        }
    }
    n
}

/// `s` folded with `f` (a sum, a maximum) over 16 lanes, then the lanes pairwise: a fixed order
/// the compiler vectorizes (a plain left fold of floats it may not reorder, so cannot).
#[inline(always)]
fn lanes(s: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut p = [init; 16];
    let mut chunks = s.chunks_exact(16);
    for c in &mut chunks {
        for (a, &x) in p.iter_mut().zip(c) {
            *a = f(*a, x);
        }
    }
    for (a, &x) in p.iter_mut().zip(chunks.remainder()) {
        *a = f(*a, x);
    }
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            p[l] = f(p[l], p[l + w]);
        }
        w /= 2;
    }
    p[0]
}

/// `e^x` for `x <= 0` (a score minus the running maximum), within 3 ulp; 0 below -87.3.
/// Straight-line arithmetic the compiler turns into vector code in a loop (libm's `expf` is a
/// call per value): `x = n ln2 + r` with `n` the nearest integer to `x / ln2` and
/// `|r| <= ln2 / 2`, `e^r` by its degree-7 Taylor polynomial (error below 6e-9 there), times
/// `2^n` built in the exponent bits.
#[inline(always)]
pub fn exp_le0(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first exact in few bits, so n * LN2_HI is exact
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // adding and subtracting 1.5 * 2^23 rounds to the nearest integer
    const ROUND: f32 = 12_582_912.0;
    let xc = x.max(-87.3);
    // t = 1.5 * 2^23 + n exactly (n in [-126, 0] keeps t in [2^23, 2^24), where the ulp is 1)
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^n for n in [-126, 0]: the exponent field alone. n as an integer is t's bits less
    // ROUND's (t and ROUND share the exponent), integer arithmetic that vectorizes with the
    // rest, where `n as i32` (a saturating conversion) was scalar code per value: attention
    // decode's exponentials ran one value at a time
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let pow2 = f32::from_bits(((ni + 127) as u32) << 23);
    let v = p * pow2;
    if x < -87.3 { 0.0 } else { v }
}

/// Attention of the queries `q` (`[nq, hd]`, query `i` seeing positions `0..ends[i]`) over
/// `keys` and `vals`, every split folded and merged in order, into `out` (`[nq, hd]`).
/// `acc` and `part` are scratch states of `hd`-sized rows. What prefill runs for a tile of
/// queries; decode runs the splits in parallel and merges the same states in the same order.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    isa: Isa,
    q: &[f32],
    ends: &[usize],
    keys: &[f32],
    vals: &[f32],
    scale: f32,
    acc: &mut State,
    part: &mut State,
    out: &mut [f32],
) {
    let nq = ends.len();
    acc.reset(nq);
    let end = ends.iter().copied().max().unwrap_or(0);
    for r in splits(end) {
        part.reset(nq);
        fold(isa, q, ends, keys, vals, r, scale, part);
        acc.merge(part);
    }
    let hd = acc.hd;
    for i in 0..nq {
        acc.finish(i, &mut out[i * hd..(i + 1) * hd]);
    }
}

/// The AVX-512 and AVX2 forms of [`scores`] and [`weighted`]: the same sums in the same order,
/// with fused multiply-adds (so within rounding of the scalar tier, not bit for bit). AVX2 has
/// 16 registers: one query's 8 score accumulators at a time, and at most 4 value chunks (8
/// accumulators) per pass.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KEY_BLOCK, VCHUNK};

    const _: () = assert!(KEY_BLOCK == 4 * 16 && VCHUNK == 16);

    /// The first `V` vectors of 16 lanes of [`super::scores`].
    ///
    /// # Safety
    /// AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores<const Q: usize, const V: usize>(
        idx: &[usize; Q],
        q: &[f32],
        kt: &[f32],
        hd: usize,
    ) -> [[f32; KEY_BLOCK]; Q] {
        assert!(V <= 4 && kt.len() >= hd * KEY_BLOCK && idx.iter().all(|&i| (i + 1) * hd <= q.len()));
        let mut acc = [[_mm512_setzero_ps(); V]; Q];
        for d in 0..hd {
            // SAFETY (the loads): inside `kt` and `q`, as asserted
            let col = unsafe { kt.as_ptr().add(d * KEY_BLOCK) };
            let k: [__m512; V] = std::array::from_fn(|r| unsafe { _mm512_loadu_ps(col.add(16 * r)) });
            for (a, &i) in acc.iter_mut().zip(idx) {
                let qd = _mm512_set1_ps(unsafe { *q.get_unchecked(i * hd + d) });
                for (a, &k) in a.iter_mut().zip(&k) {
                    *a = _mm512_fmadd_ps(qd, k, *a);
                }
            }
        }
        let mut out = [[0f32; KEY_BLOCK]; Q];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (r, &v) in a.iter().enumerate() {
                // SAFETY: 16 floats at 16 r of a 64-float array
                unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(16 * r), v) };
            }
        }
        out
    }

    /// # Safety
    /// AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted<const C: usize>(o: &mut [f32], alpha: f32, p: &[f32], vb: &[f32], hd: usize) -> usize {
        let n = C * VCHUNK;
        assert!(o.len() >= n && (p.is_empty() || vb.len() >= (p.len() - 1) * hd + n));
        let al = _mm512_set1_ps(alpha);
        let mut acc = [_mm512_setzero_ps(); C];
        for (c, a) in acc.iter_mut().enumerate() {
            // SAFETY: inside `o`, as asserted
            *a = _mm512_mul_ps(unsafe { _mm512_loadu_ps(o.as_ptr().add(16 * c)) }, al);
        }
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm512_set1_ps(pj);
            // SAFETY: row j's first n values are inside `vb`, as asserted
            let v = unsafe { vb.as_ptr().add(j * hd) };
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(pv, unsafe { _mm512_loadu_ps(v.add(16 * c)) }, *a);
            }
        }
        for (c, a) in acc.iter().enumerate() {
            // SAFETY: inside `o`, as asserted
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(16 * c), *a) };
        }
        n
    }

    /// The first `V` vectors of 8 lanes of [`super::scores`].
    ///
    /// # Safety
    /// AVX2 and FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores_avx2<const Q: usize, const V: usize>(
        idx: &[usize; Q],
        q: &[f32],
        kt: &[f32],
        hd: usize,
    ) -> [[f32; KEY_BLOCK]; Q] {
        assert!(V <= 8 && kt.len() >= hd * KEY_BLOCK && idx.iter().all(|&i| (i + 1) * hd <= q.len()));
        let mut out = [[0f32; KEY_BLOCK]; Q];
        for (o, &i) in out.iter_mut().zip(idx) {
            let mut acc = [_mm256_setzero_ps(); V];
            for d in 0..hd {
                // SAFETY (the loads): inside `kt` and `q`, as asserted
                let col = unsafe { kt.as_ptr().add(d * KEY_BLOCK) };
                let qd = _mm256_set1_ps(unsafe { *q.get_unchecked(i * hd + d) });
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qd, unsafe { _mm256_loadu_ps(col.add(8 * r)) }, *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                // SAFETY: 8 floats at 8 r of a 64-float array
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * r), *a) };
            }
        }
        out
    }

    /// # Safety
    /// AVX2 and FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted_avx2<const C: usize>(o: &mut [f32], alpha: f32, p: &[f32], vb: &[f32], hd: usize) -> usize {
        let n = C * VCHUNK;
        assert!(o.len() >= n && (p.is_empty() || vb.len() >= (p.len() - 1) * hd + n));
        let al = _mm256_set1_ps(alpha);
        // passes of up to 32 dimensions (8 registers)
        let mut d0 = 0;
        while d0 < n {
            let w = (n - d0).min(32) / 8;
            let mut acc = [_mm256_setzero_ps(); 4];
            for (c, a) in acc.iter_mut().enumerate().take(w) {
                // SAFETY: inside `o`, as asserted
                *a = _mm256_mul_ps(unsafe { _mm256_loadu_ps(o.as_ptr().add(d0 + 8 * c)) }, al);
            }
            for (j, &pj) in p.iter().enumerate() {
                let pv = _mm256_set1_ps(pj);
                // SAFETY: row j's first n values are inside `vb`, as asserted
                let v = unsafe { vb.as_ptr().add(j * hd + d0) };
                for (c, a) in acc.iter_mut().enumerate().take(w) {
                    *a = _mm256_fmadd_ps(pv, unsafe { _mm256_loadu_ps(v.add(8 * c)) }, *a);
                }
            }
            for (c, a) in acc.iter().enumerate().take(w) {
                // SAFETY: inside `o`, as asserted
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(d0 + 8 * c), *a) };
            }
            d0 += 8 * w;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::uniform;

    /// softmax(q k^T * scale) v in f64, the whole score row at once: the textbook formula.
    fn reference(q: &[f32], keys: &[f32], vals: &[f32], end: usize, scale: f32, hd: usize) -> Vec<f64> {
        let s: Vec<f64> = (0..end)
            .map(|j| (0..hd).map(|d| q[d] as f64 * keys[j * hd + d] as f64).sum::<f64>() * scale as f64)
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = p.iter().sum();
        (0..hd).map(|d| (0..end).map(|j| p[j] * vals[j * hd + d] as f64).sum::<f64>() / l).collect()
    }

    #[test]
    fn attention_matches_the_textbook_formula_across_blocks_and_splits() {
        // head sizes the models use and an awkward one; contexts short of a block (the last
        // block filled to each count of score vectors: 16 lanes of AVX-512, 8 of AVX2), across
        // blocks, and across several splits (queries at staggered causal ends)
        for isa in Isa::available() {
            for (hd, n) in [(128, 5), (128, 20), (64, 40), (128, 100), (64, 200), (72, 1100), (128, 2 * SPLIT + 77)] {
                let mut r = uniform(hd as u64 * 31 + n as u64);
                // large scores, so the running maximum moves and the rescaling matters
                let keys: Vec<f32> = (0..n * hd).map(|_| r() * 6.0).collect();
                let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
                let nq = 5;
                let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
                let ends: Vec<usize> = (0..nq).map(|i| n - i * (n / 7)).collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
                let mut out = vec![0f32; nq * hd];
                let packed = pack_keys(&keys, hd);
                attend(isa, &q, &ends, &packed, &vals, scale, &mut acc, &mut part, &mut out);
                for i in 0..nq {
                    let want = reference(&q[i * hd..(i + 1) * hd], &keys, &vals, ends[i], scale, hd);
                    for (d, (&a, &b)) in out[i * hd..(i + 1) * hd].iter().zip(&want).enumerate() {
                        assert!(
                            (a as f64 - b).abs() <= 2e-5 * (1.0 + b.abs()),
                            "{isa} hd {hd} n {n} query {i} (end {}) dim {d}: {a} vs {b}",
                            ends[i]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_query_gets_the_same_bits_alone_in_a_tile_and_from_parallel_splits() {
        let (hd, n) = (64, SPLIT + 300);
        let mut r = uniform(7);
        let keys: Vec<f32> = (0..n * hd).map(|_| r() * 4.0).collect();
        let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
        let nq = 6;
        let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
        let ends: Vec<usize> = (0..nq).map(|i| n - 37 * i).collect();
        let scale = 0.125;
        let keys = pack_keys(&keys, hd);
        for isa in Isa::available() {
            // the tile, as prefill runs it
            let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
            let mut tile = vec![0f32; nq * hd];
            attend(isa, &q, &ends, &keys, &vals, scale, &mut acc, &mut part, &mut tile);
            for i in 0..nq {
                // alone
                let (mut a1, mut p1) = (State::new(1, hd), State::new(1, hd));
                let mut alone = vec![0f32; hd];
                let qi = &q[i * hd..(i + 1) * hd];
                attend(isa, qi, &ends[i..=i], &keys, &vals, scale, &mut a1, &mut p1, &mut alone);
                assert_eq!(alone, tile[i * hd..(i + 1) * hd], "{isa} query {i}: alone vs in the tile");
                // as decode runs it: each split folded on its own (in reverse, as threads may
                // finish), the partial states merged in position order afterwards
                let parts: Vec<State> = splits(ends[i])
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .map(|rg| {
                        let mut p = State::new(1, hd);
                        fold(isa, qi, &ends[i..=i], &keys, &vals, rg, scale, &mut p);
                        p
                    })
                    .collect();
                let mut acc1 = State::new(1, hd);
                for p in parts.iter().rev() {
                    acc1.merge(p);
                }
                let mut dec = vec![0f32; hd];
                acc1.finish(0, &mut dec);
                assert_eq!(dec, alone, "{isa} query {i}: merged splits vs one pass");
            }
        }
    }

    #[test]
    fn exp_le0_is_within_three_ulp_of_exp() {
        let mut worst = 0f64;
        for k in 0..=2_000_000u32 {
            let x = -87.3 * k as f32 / 2_000_000.0;
            let want = (x as f64).exp();
            let got = exp_le0(x) as f64;
            // one ulp of the true value
            let ulp = f32::from_bits((want as f32).to_bits() + 1) as f64 - want as f32 as f64;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 3.0, "worst error {worst} ulp");
        assert_eq!(exp_le0(0.0), 1.0);
        assert_eq!(exp_le0(-100.0), 0.0);
        assert_eq!(exp_le0(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn merging_a_partial_that_saw_nothing_changes_nothing() {
        let mut a = State { hd: 2, m: vec![1.5], l: vec![2.0], o: vec![0.25, -1.0] };
        let before = a.clone();
        a.merge(&State::new(1, 2));
        assert_eq!(a, before);
    }
}
