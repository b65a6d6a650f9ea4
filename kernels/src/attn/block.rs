//! One block of keys folded into the states of the queries that see part of it: the scores
//! (`KEY_BLOCK` lanes, each summed over the head dimension in order), the online softmax's
//! step, and the weighted values (alone, or four queries that see the same keys at once).

use super::{KEY_BLOCK, KvRead, Scoring, State, VCHUNK, exp_le0};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::Isa;

/// Queries whose block scores are computed together: 4 x 4 vector accumulators of
/// `KEY_BLOCK` lanes, independent chains enough to keep the multiply-adds busy.
pub(super) const QUERIES: usize = 4;

/// One block of keys (positions `b0..b1`, transposed keys `kt`, `hk` rows) and the values
/// (`hv` wide, row 0 at position `vbase`), in the cache's elements.
pub(super) struct Block<K, V> {
    pub(super) isa: Isa,
    pub(super) b0: usize,
    pub(super) b1: usize,
    pub(super) kt: K,
    pub(super) vals: V,
    pub(super) vbase: usize,
    pub(super) hk: usize,
    pub(super) hv: usize,
    pub(super) sc: Scoring,
}

impl<K: KvRead, V: KvRead> Block<K, V> {
    /// Fold this block into the states of the queries `idx` (each sees part of it).
    #[inline(always)]
    pub(super) fn queries<const Q: usize>(&self, idx: &[usize; Q], q: &[f32], ends: &[usize], st: &mut State) {
        let (hk, hd) = (self.hk, self.hv);
        // every lane's score, each summed over d in order (lanes past the cache's end are
        // zeros or stale, and unused)
        let lane0 = self.b0 / KEY_BLOCK * KEY_BLOCK;
        // only the lanes up to the block's last position (a short context's one block is
        // mostly past the cache's end: its keys are neither read nor multiplied)
        let mut sc = scores::<Q, K>(self.isa, idx, q, self.kt, hk, self.b1 - lane0);
        #[cfg(target_arch = "x86_64")]
        if Q == 4 && self.isa >= Isa::Avx512 && hd % (4 * VCHUNK) == 0 && idx.iter().all(|&i| ends[i] == ends[idx[0]]) {
            return self.weigh_together(idx, &mut sc, lane0, ends[idx[0]], st);
        }
        for (sc, &i) in sc.iter_mut().zip(idx) {
            let keys = self.keys_seen(ends[i]);
            let s = &mut sc[keys.start - lane0..keys.end - lane0];
            let (m, alpha, sum) = self.softmax_step(s, st.m[i]);
            let o = &mut st.o[i * hd..(i + 1) * hd];
            let vb = self.vals.skip((keys.start - self.vbase) * hd);
            // VCHUNK dimensions per register, up to 8 registers at once; any rest alone
            let mut c = 0;
            while c < hd {
                let left = (hd - c) / VCHUNK;
                let (isa, o, vb) = (self.isa, &mut o[c..], vb.skip(c));
                c += match left {
                    8.. => weighted::<8, V>(isa, o, alpha, s, vb, hd),
                    4.. => weighted::<4, V>(isa, o, alpha, s, vb, hd),
                    2.. => weighted::<2, V>(isa, o, alpha, s, vb, hd),
                    1 => weighted::<1, V>(isa, o, alpha, s, vb, hd),
                    _ => weighted_rest(o, alpha, s, vb, hd),
                };
            }
            st.l[i] = st.l[i] * alpha + sum;
            st.m[i] = m;
        }
    }

    /// [`queries`](Self::queries) for four queries that see the same keys of the block (they
    /// end at `end`: a token's heads), their scores `sc`: they weigh its values together, each
    /// value vector read once for the four (AVX-512, `hv` a multiple of 64).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn weigh_together<const Q: usize>(
        &self,
        idx: &[usize; Q],
        sc: &mut [[f32; KEY_BLOCK]; Q],
        lane0: usize,
        end: usize,
        st: &mut State,
    ) {
        let (hd, keys) = (self.hv, self.keys_seen(end));
        let (l0, l1) = (keys.start - lane0, keys.end - lane0);
        let mut steps = [(0f32, 0f32, 0f32); Q];
        for ((sc, &i), step) in sc.iter_mut().zip(idx).zip(&mut steps) {
            *step = self.softmax_step(&mut sc[l0..l1], st.m[i]);
        }
        let alpha = steps.map(|(_, a, _)| a);
        let p: [&[f32]; Q] = std::array::from_fn(|k| &sc[k][l0..l1]);
        let vb = self.vals.skip((keys.start - self.vbase) * hd);
        let mut c = 0;
        while c < hd {
            let at = idx.map(|i| i * hd + c);
            // SAFETY: the caller checked the tier for AVX-512 F
            c += unsafe { avx512::weighted_shared::<Q, 4, V>(&mut st.o, at, alpha, p, vb.skip(c), hd) };
        }
        for (&i, (m, alpha, sum)) in idx.iter().zip(steps) {
            st.l[i] = st.l[i] * alpha + sum;
            st.m[i] = m;
        }
    }

    /// The positions of this block a query ending at `end` sees: from the block's start (or
    /// its window's, where that is later; the same either way a range is cut, as ranges start
    /// at blocks) to its end or the query's.
    #[inline(always)]
    fn keys_seen(&self, end: usize) -> std::ops::Range<usize> {
        self.b0.max(self.sc.first(end))..end.min(self.b1)
    }

    /// One query's scores of this block `s` scaled and turned into weights `exp(s - m)` in
    /// place, against its running maximum `m_old`: the new maximum, the factor its output so
    /// far is rescaled by (0 before the first key), and the weights' sum.
    #[inline(always)]
    fn softmax_step(&self, s: &mut [f32], m_old: f32) -> (f32, f32, f32) {
        for sj in s.iter_mut() {
            *sj *= self.sc.scale;
        }
        let m = m_old.max(lanes(s, f32::NEG_INFINITY, f32::max));
        let alpha = (m_old - m).exp();
        for sj in s.iter_mut() {
            *sj = exp_le0(*sj - m);
        }
        (m, alpha, lanes(s, 0.0, |a, b| a + b))
    }
}

/// The scores of the queries `idx` (rows of `q`, `[.., hd]`) over one block of transposed keys
/// `kt` (`[hd, KEY_BLOCK]`, widened as they are read), unscaled: each lane a sum over `d` in order. Lanes from `lanes` on
/// (`1..=KEY_BLOCK`) may be left unset: the vectors that hold none of the first `lanes` are
/// skipped.
#[inline(always)]
fn scores<const Q: usize, K: KvRead>(
    isa: Isa,
    idx: &[usize; Q],
    q: &[f32],
    kt: K,
    hd: usize,
    lanes: usize,
) -> [[f32; KEY_BLOCK]; Q] {
    debug_assert!((1..=KEY_BLOCK).contains(&lanes));
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY (each arm): the tier says AVX-512 F is present
            return match lanes.div_ceil(16) {
                1 => unsafe { avx512::scores::<Q, 1, K>(idx, q, kt, hd) },
                2 => unsafe { avx512::scores::<Q, 2, K>(idx, q, kt, hd) },
                3 => unsafe { avx512::scores::<Q, 3, K>(idx, q, kt, hd) },
                _ => unsafe { avx512::scores::<Q, 4, K>(idx, q, kt, hd) },
            };
        }
        if isa.has_avx2() {
            // SAFETY (each arm): the tier says AVX2 and FMA are present
            return match lanes.div_ceil(8) {
                1 => unsafe { avx2::scores::<Q, 1, K>(idx, q, kt, hd) },
                2 => unsafe { avx2::scores::<Q, 2, K>(idx, q, kt, hd) },
                3 | 4 => unsafe { avx2::scores::<Q, 4, K>(idx, q, kt, hd) },
                _ => unsafe { avx2::scores::<Q, 8, K>(idx, q, kt, hd) },
            };
        }
    }
    let _ = isa;
    let mut sc = [[0f32; KEY_BLOCK]; Q];
    for d in 0..hd {
        for (s, &i) in sc.iter_mut().zip(idx) {
            let qd = q[i * hd + d];
            for (j, a) in s[..lanes].iter_mut().enumerate() {
                *a += qd * kt.get(d * KEY_BLOCK + j);
            }
        }
    }
    sc
}

/// `o[..C * VCHUNK] = o * alpha + Σ_j p[j] v[j]` with `v[j]` at `vb[j * hd..]`, in registers;
/// returns the dimensions done. Each dimension: the rescale, then the keys in order.
#[inline(always)]
fn weighted<const C: usize, V: KvRead>(isa: Isa, o: &mut [f32], alpha: f32, p: &[f32], vb: V, hd: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: the tier says AVX-512 F is present
            return unsafe { avx512::weighted::<C, V>(o, alpha, p, vb, hd) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says AVX2 and FMA are present
            return unsafe { avx2::weighted::<C, V>(o, alpha, p, vb, hd) };
        }
    }
    let _ = isa;
    for c in 0..C {
        let mut acc = [0f32; VCHUNK];
        for (a, &x) in acc.iter_mut().zip(&o[c * VCHUNK..(c + 1) * VCHUNK]) {
            *a = x * alpha;
        }
        for (j, &pj) in p.iter().enumerate() {
            for (k, a) in acc.iter_mut().enumerate() {
                *a += pj * vb.get(j * hd + c * VCHUNK + k);
            }
        }
        o[c * VCHUNK..(c + 1) * VCHUNK].copy_from_slice(&acc);
    }
    C * VCHUNK
}

/// [`weighted`] for the last `o.len() < VCHUNK` dimensions.
#[inline(always)]
fn weighted_rest<V: KvRead>(o: &mut [f32], alpha: f32, p: &[f32], vb: V, hd: usize) -> usize {
    let n = o.len();
    for x in o.iter_mut() {
        *x *= alpha;
    }
    for (j, &pj) in p.iter().enumerate() {
        for (k, x) in o.iter_mut().enumerate() {
            *x += pj * vb.get(j * hd + k);
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
