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
use block::{Block, QUERIES};
pub use cached::{Cached, attend_cached, fold_cached};
pub use elem::{Bf16, F16, KvElem, as_elems, stored};
pub use latent::Expansion;
pub use q8::{Q8Keys, Q8Rows};
pub use read::KvRead;

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

    /// Query `i`'s attention output, `o / l`, into `out` (`[hd]`). A `sink` (gpt-oss's
    /// learned per-head logit) is one more term of the softmax's denominator, `exp(sink - m)`,
    /// with no value: it only takes weight away from the keys.
    pub fn finish(&self, i: usize, sink: Option<f32>, out: &mut [f32]) {
        let l = match sink {
            Some(s) => self.l[i] + (s - self.m[i]).exp(),
            None => self.l[i],
        };
        let inv = 1.0 / l;
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

/// How a query's scores are made: `q · k * scale`, over the keys of its window: with
/// `window` W, a query that sees positions `0..end` attends only `end - W..end` (the W latest,
/// itself included: transformers' `kv_idx > q_idx - W`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    pub scale: f32,
    pub window: Option<usize>,
}

impl Scoring {
    /// Every key up to the query's own position.
    pub fn full(scale: f32) -> Scoring {
        Scoring { scale, window: None }
    }

    /// The first position a query that sees `0..end` attends.
    pub fn first(&self, end: usize) -> usize {
        self.window.map_or(0, |w| end.saturating_sub(w))
    }
}

/// The splits a query at `end` keys (it sees positions `0..end`) is cut into.
pub fn splits(end: usize) -> impl Iterator<Item = Range<usize>> {
    (0..end.div_ceil(SPLIT)).map(move |s| s * SPLIT..((s + 1) * SPLIT).min(end))
}

/// Fold the keys and values of positions `range` (`keys`: whole transposed blocks from
/// position 0 as [`pack_keys`] lays them out; `vals`: `[positions, hd]`, row `j` at position
/// `j`) into `st`, for the queries `q` (`[nq, hd]`), query `i` seeing only the
/// positions below `ends[i]` (causal masking) and, with a window, none before
/// `sc.first(ends[i])`. Scores are `q · k * sc.scale`. Blocks of
/// [`KEY_BLOCK`] positions start at multiples of it, so where a range begins never changes how
/// a query's keys are grouped. The element-wise loops (rescaling, exponentials, the weighted
/// sum of values) are compiled for the tier `isa` names.
#[allow(clippy::too_many_arguments)]
pub fn fold<K: KvRead, V: KvRead>(
    isa: Isa,
    q: &[f32],
    ends: &[usize],
    keys: K,
    vals: V,
    range: Range<usize>,
    sc: Scoring,
    st: &mut State,
) {
    fold_keyed(isa, (q, st.hd), ends, keys, Values::Rows(vals), range, sc, st)
}

/// Where a fold reads the values: rows of their own, or the keys' first `st.hd` dims.
#[derive(Debug, Clone, Copy)]
pub enum Values<V> {
    /// `[positions, st.hd]`, row `j` at position `j`
    Rows(V),
    /// Each key's first `st.hd` dims (DeepSeek-V3's absorbed latent attention: the compressed
    /// kv is both the keys' first part and the values). A block's value rows are copied out of
    /// its transposed keys once for every query of the fold, into a buffer of this thread, so
    /// a query's output has the bits [`Values::Rows`] of the same values gives.
    KeyPrefix,
}

/// [`fold`] with queries and keys `hk` wide (`q`: `[nq, hk]`), values as `vals` says, the state
/// `st.hd` wide (`st.hd <= hk` for [`Values::KeyPrefix`]).
#[allow(clippy::too_many_arguments)]
pub fn fold_keyed<K: KvRead, V: KvRead>(
    isa: Isa,
    (q, hk): (&[f32], usize),
    ends: &[usize],
    keys: K,
    vals: Values<V>,
    range: Range<usize>,
    sc: Scoring,
    st: &mut State,
) {
    debug_assert!(q.len() == ends.len() * hk && st.queries() == ends.len());
    debug_assert!(matches!(vals, Values::Rows(_)) || st.hd <= hk);
    // this thread's block buffers, taken here: a closure inside the tier's function would be
    // compiled without its features
    SCRATCH.with_borrow_mut(|scratch| {
        let a = FoldArgs { isa, q, hk, ends, keys, vals, range, sc };
        fold_tier(a, st, scratch)
    })
}

/// [`fold_keyed`] in the function compiled for `a.isa`'s tier.
fn fold_tier<K: KvRead, V: KvRead>(a: FoldArgs<'_, K, V>, st: &mut State, scratch: &mut Scratch) {
    let isa = a.isa;
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: the tier says AVX-512 F is present
            return unsafe { fold_avx512(a, st, scratch) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says AVX2 and FMA are present
            return unsafe { fold_avx2(a, st, scratch) };
        }
    }
    fold_body(a, st, scratch)
}

/// [`fold`]'s inputs, handed to the body compiled for each tier.
struct FoldArgs<'a, K, V> {
    isa: Isa,
    q: &'a [f32],
    hk: usize,
    ends: &'a [usize],
    keys: K,
    vals: Values<V>,
    range: Range<usize>,
    sc: Scoring,
}

/// A thread's buffers of one block.
#[derive(Default)]
struct Scratch {
    /// [`Values::KeyPrefix`]'s value rows, `[KEY_BLOCK, hd]`, or those of [`KvRead::WIDEN`]
    /// values
    values: Vec<f32>,
    /// The keys of a [`KvRead::WIDEN`] type, widened (`[hk, KEY_BLOCK]`)
    keys: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

#[cfg(target_arch = "x86_64")]
// under cargo-fuzz's coverage instrumentation, LLVM cannot select this loop's mask operations
// without VL/BW (which the Avx512 tier has anyway); the normal build keeps the features it
// was measured with
#[cfg_attr(not(fuzzing), target_feature(enable = "avx512f,avx2,fma"))]
#[cfg_attr(fuzzing, target_feature(enable = "avx512f,avx512vl,avx512bw,avx2,fma"))]
unsafe fn fold_avx512<K: KvRead, V: KvRead>(a: FoldArgs<'_, K, V>, st: &mut State, scratch: &mut Scratch) {
    fold_body(a, st, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_avx2<K: KvRead, V: KvRead>(a: FoldArgs<'_, K, V>, st: &mut State, scratch: &mut Scratch) {
    fold_body(a, st, scratch)
}

#[inline(always)]
fn fold_body<K: KvRead, V: KvRead>(a: FoldArgs<'_, K, V>, st: &mut State, scratch: &mut Scratch) {
    let hv = st.hd;
    let Scratch { values: buf, keys } = scratch;
    match a.vals {
        Values::Rows(v) if V::WIDEN => {
            buf.resize(KEY_BLOCK * hv, 0.0);
            fold_blocks(&a, &mut WideRows { isa: a.isa, v, buf, hv }, st, keys)
        }
        Values::Rows(v) => fold_blocks(&a, &mut Rows(v), st, keys),
        Values::KeyPrefix => {
            buf.resize(KEY_BLOCK * hv, 0.0);
            fold_blocks(&a, &mut KeyRows { buf, hv }, st, keys)
        }
    }
}

/// Where [`fold_blocks`] finds a block's values.
trait BlockValues {
    type W<'s>: KvRead
    where
        Self: 's;
    /// Given the block's keys `kt` and (its first position, its lanes up to the range's
    /// end): the value rows and the position of the first.
    fn block<K: KvRead>(&mut self, kt: K, lanes: (usize, usize)) -> (Self::W<'_>, usize);
}

/// Values as rows of their own, from position 0.
struct Rows<V>(V);

impl<V: KvRead> BlockValues for Rows<V> {
    type W<'s>
        = V
    where
        Self: 's;
    #[inline(always)]
    fn block<K>(&mut self, _: K, _: (usize, usize)) -> (V, usize) {
        (self.0, 0)
    }
}

/// Values as rows of their own, each block's widened into a buffer of this thread once for
/// all the queries that weigh them ([`KvRead::WIDEN`]).
struct WideRows<'b, V> {
    isa: Isa,
    v: V,
    buf: &'b mut Vec<f32>,
    hv: usize,
}

impl<V: KvRead> BlockValues for WideRows<'_, V> {
    type W<'s>
        = &'s [f32]
    where
        Self: 's;
    #[inline(always)]
    fn block<K>(&mut self, _: K, (lane0, lanes): (usize, usize)) -> (&[f32], usize) {
        let n = lanes * self.hv;
        self.v.skip(lane0 * self.hv).widen(self.isa, &mut self.buf[..n]);
        (&self.buf[..n], lane0)
    }
}

/// [`Values::KeyPrefix`]: each block's values copied out of its keys (their first `hv` dims,
/// transposed back to rows and widened: only the lanes up to the block's last position, the
/// rest never being weighted).
struct KeyRows<'b> {
    buf: &'b mut Vec<f32>,
    hv: usize,
}

impl BlockValues for KeyRows<'_> {
    type W<'s>
        = &'s [f32]
    where
        Self: 's;
    #[inline(always)]
    fn block<K: KvRead>(&mut self, kt: K, (lane0, lanes): (usize, usize)) -> (&[f32], usize) {
        for d in 0..self.hv {
            for j in 0..lanes {
                self.buf[j * self.hv + d] = kt.get(d * KEY_BLOCK + j);
            }
        }
        (&self.buf[..], lane0)
    }
}

/// The blocks of `a.range` folded into `st`, each block's values where `values` finds them.
#[inline(always)]
fn fold_blocks<K: KvRead, B: BlockValues>(
    a: &FoldArgs<'_, K, impl KvRead>,
    values: &mut B,
    st: &mut State,
    wide: &mut Vec<f32>,
) {
    let (keys, hk, range) = (a.keys, a.hk, a.range.clone());
    if K::WIDEN {
        wide.resize(hk * KEY_BLOCK, 0.0);
    }
    let mut b0 = range.start;
    while b0 < range.end {
        let blk = b0 / KEY_BLOCK;
        let b1 = ((blk + 1) * KEY_BLOCK).min(range.end);
        // this block's keys, [hk, KEY_BLOCK]
        let kt = keys.skip(blk * hk * KEY_BLOCK);
        if K::WIDEN {
            kt.widen(a.isa, wide);
            fold_block(a, values, st, &wide[..], (b0, b1));
        } else {
            fold_block(a, values, st, kt, (b0, b1));
        }
        b0 = b1;
    }
}

/// The block of keys `kt` (positions `b0..b1` of it) folded into `st`, its values where
/// `values` finds them.
#[inline(always)]
fn fold_block<K: KvRead, B: BlockValues>(
    a: &FoldArgs<'_, impl KvRead, impl KvRead>,
    values: &mut B,
    st: &mut State,
    kt: K,
    (b0, b1): (usize, usize),
) {
    let FoldArgs { isa, q, hk, ends, sc, .. } = *a;
    let (hv, lane0) = (st.hd, b0 / KEY_BLOCK * KEY_BLOCK);
    let (vals, vbase) = values.block(kt, (lane0, b1 - lane0));
    let blk_ = Block { isa, b0, b1, kt, vals, vbase, hk, hv, sc };
    // the queries that see part of this block, QUERIES at a time (the scores of each are
    // the same whatever it is grouped with)
    let mut group = [0usize; QUERIES];
    let mut n = 0;
    for (i, &end) in ends.iter().enumerate() {
        if end.min(b1) > b0.max(sc.first(end)) {
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

/// Attention of the queries `q` (`[nq, hd]`, query `i` seeing positions `0..ends[i]`, or its
/// window of them) over `keys` and `vals`, every split folded and merged in order, into `out`
/// (`[nq, hd]`); `sinks` (`[nq]`, or empty for none) are the queries' sink logits.
/// `acc` and `part` are scratch states of `hd`-sized rows. What prefill runs for a tile of
/// queries; decode runs the splits in parallel and merges the same states in the same order
/// (a split no query reaches leaves nothing to merge, so it is skipped).
#[allow(clippy::too_many_arguments)]
pub fn attend<K: KvRead, V: KvRead>(
    isa: Isa,
    q: &[f32],
    ends: &[usize],
    keys: K,
    vals: V,
    sc: Scoring,
    sinks: &[f32],
    acc: &mut State,
    part: &mut State,
    out: &mut [f32],
) {
    attend_keyed(isa, (q, acc.hd), ends, keys, Values::Rows(vals), sc, sinks, (acc, part), out)
}

/// [`attend`] with queries and keys `hk` wide and the values as `vals` says (see
/// [`fold_keyed`]); `out` is `[nq, acc.hd]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_keyed<K: KvRead, V: KvRead>(
    isa: Isa,
    (q, hk): (&[f32], usize),
    ends: &[usize],
    keys: K,
    vals: Values<V>,
    sc: Scoring,
    sinks: &[f32],
    (acc, part): (&mut State, &mut State),
    out: &mut [f32],
) {
    let nq = ends.len();
    acc.reset(nq);
    let end = ends.iter().copied().max().unwrap_or(0);
    let first = ends.iter().map(|&e| sc.first(e)).min().unwrap_or(0);
    for r in splits(end).filter(|r| r.end > first) {
        part.reset(nq);
        fold_keyed(isa, (q, hk), ends, keys, vals, r, sc, part);
        acc.merge(part);
    }
    let hd = acc.hd;
    for i in 0..nq {
        acc.finish(i, sinks.get(i).copied(), &mut out[i * hd..(i + 1) * hd]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod block;
mod cached;
mod elem;
mod latent;
pub mod q8;
mod read;
#[cfg(test)]
mod tests;
