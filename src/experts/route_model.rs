//! What the routing so far says about each expert's next use: the model the `foresight`
//! eviction policy ranks entries by (see [`RouteModel`]). Learnt online from every layer's
//! route, identically in the engine's pool and in the simulator.

use std::cell::RefCell;

use super::policy::{DECAY, SLOW_DECAY, Scores};

/// What each layer's routing has shown about reuse, learnt online: the chance that an expert is
/// routed at its layer's next turn, given how many tokens ago it was last routed (its age) and
/// how often it has been used lately (a decayed count, [`Scores`]). Either alone misleads: on a
/// trained model's routing an expert routed by the last token is routed again 8% of the time
/// when it is rarely used and 68% when it is used often, and a popular expert not seen for 30
/// tokens has gone cold. So the model keeps, per layer, decayed (trials, hits) over a grid of
/// age x count cells, shrunk towards the same grid pooled over all layers, itself shrunk
/// towards chance (k/E). The grid tells routing with locality, drifting routing and near-uniform
/// routing apart without being told which it is, and its counts decay so it follows a
/// conversation's changes.
///
/// From the grid, [`p_next`](Self::p_next) gives the chance of use within a horizon of H turns
/// (an expert not routed moves along the grid: its age grows by one a turn, its count decays),
/// H being how long an entry lives in this pool now: half the capacity over the entries loaded
/// per token. A small pool turns over fast and the next turns decide (recency, and the fast
/// count); a large one keeps entries for many tokens and steady popularity decides (the slow
/// count, ages up to hundreds of tokens). That is where SLRU/LFRU-style policies win at small
/// budgets and lose at large ones; here one rule adapts. Two grids are kept, one per count.
#[derive(Debug, Clone)]
pub struct RouteModel {
    last: Vec<Vec<usize>>,
    /// Per layer and expert: the token it was last routed (0 = never).
    last_used: Vec<Vec<u64>>,
    /// One grid per [`Count`].
    grids: [Grid; 2],
    uniform: f32,
    /// Entries loaded per token (decayed), entries loaded this token so far, and that token.
    turnover: f32,
    loads: u32,
    cur: u64,
    /// Per layer, bumped by its [`observe`](Self::observe): [`p_next`](Self::p_next) answers
    /// from `memo` while nothing it reads has changed (a pool asks it for every resident entry
    /// at every eviction, and an entry's answer changes only at its layer's turn, when the
    /// horizon changes, or when the turn it looks from does).
    generation: Vec<u64>,
    /// Per layer and expert.
    memo: RefCell<Vec<Vec<Memo>>>,
}

/// A remembered [`RouteModel::p_next`]: (its layer's generation, horizon, turn) -> chance.
type Memo = (u64, u64, u64, f32);

/// Age buckets: 1 to 8 tokens one by one, then doubling spans up to 512, then older or never.
const AGE_BUCKETS: usize = 15;
/// The last age of each bucket.
const AGE_LAST: [u64; AGE_BUCKETS] = [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, 512, u64::MAX];
const COUNT_BUCKETS: usize = 8;
const CELLS: usize = AGE_BUCKETS * COUNT_BUCKETS;
/// Per layer turn: counts forget with a half-life of about 350 turns.
const GRID_DECAY: f32 = 0.998;
/// Pseudo-trials a layer's cell borrows from the pooled cell, and the pooled cell from chance.
const LAYER_PRIOR: f32 = 16.0;
const POOLED_PRIOR: f32 = 4.0;
/// The horizon: this share of an entry's expected life in the pool, at most this many turns.
const HORIZON_SHARE: f32 = 0.5;
const MAX_HORIZON: u64 = 256;
/// Horizons longer than this are judged by the slow count.
const SLOW_FROM: u64 = 16;

/// Which decayed use count a grid is indexed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// [`DECAY`], about the last 32 tokens; buckets floor(log2(1 + 4x)).
    Fast,
    /// [`SLOW_DECAY`], about the last 200 tokens; buckets floor(log2(1 + x/3)).
    Slow,
}

impl Count {
    fn decay(self) -> f32 {
        match self {
            Count::Fast => DECAY,
            Count::Slow => SLOW_DECAY,
        }
    }

    fn of(self, (fast, slow): (f32, f32)) -> f32 {
        match self {
            Count::Fast => fast,
            Count::Slow => slow,
        }
    }

    fn bucket(self, x: f32) -> usize {
        let x = x.max(0.0);
        let b = match self {
            Count::Fast => (1.0 + 4.0 * x).log2(),
            Count::Slow => (1.0 + x / 3.0).log2(),
        };
        (b as usize).min(COUNT_BUCKETS - 1)
    }

    /// The smallest count in bucket `b`.
    fn floor(self, b: usize) -> f32 {
        let span = (1u32 << b) as f32 - 1.0;
        match self {
            Count::Fast => span / 4.0,
            Count::Slow => span * 3.0,
        }
    }
}

/// Decayed (trials, hits) per age x count cell, per layer and pooled over layers, and the
/// resulting ln(1 - chance) per layer and cell, brought up to date at the layer's turn.
#[derive(Debug, Clone)]
struct Grid {
    count: Count,
    layers: Vec<Vec<(f32, f32)>>,
    pooled: Vec<(f32, f32)>,
    log_miss: Vec<Vec<f32>>,
}

impl Grid {
    fn new(count: Count, n_layers: usize, uniform: f32) -> Grid {
        Grid {
            count,
            layers: vec![vec![(0.0, 0.0); CELLS]; n_layers],
            pooled: vec![(0.0, 0.0); CELLS],
            log_miss: vec![vec![(1.0 - uniform.min(0.999)).ln(); CELLS]; n_layers],
        }
    }

    fn cell(&self, age: u64, counts: (f32, f32)) -> usize {
        age_bucket(age) * COUNT_BUCKETS + self.count.bucket(self.count.of(counts))
    }

    /// A layer's turn starts: its counts and the pooled ones (a layer's turn being 1/L of a
    /// token for them) forget a little.
    fn decay(&mut self, l: usize) {
        let pooled_decay = GRID_DECAY.powf(1.0 / self.layers.len().max(1) as f32);
        for c in self.layers[l].iter_mut() {
            c.0 *= GRID_DECAY;
            c.1 *= GRID_DECAY;
        }
        for c in self.pooled.iter_mut() {
            c.0 *= pooled_decay;
            c.1 *= pooled_decay;
        }
    }

    fn add(&mut self, l: usize, c: usize, hit: bool) {
        let y = if hit { 1.0 } else { 0.0 };
        for x in [&mut self.layers[l][c], &mut self.pooled[c]] {
            x.0 += 1.0;
            x.1 += y;
        }
    }

    fn refresh(&mut self, l: usize, uniform: f32) {
        for c in 0..CELLS {
            let (pn, ph) = self.pooled[c];
            let q = (ph + POOLED_PRIOR * uniform) / (pn + POOLED_PRIOR);
            let (n, h) = self.layers[l][c];
            let p = ((h + LAYER_PRIOR * q) / (n + LAYER_PRIOR)).min(0.999);
            self.log_miss[l][c] = (1.0 - p).ln();
        }
    }

    /// ln of the chance that an expert of layer `l`, last routed at `last` (0 = never), with
    /// counts `counts` at turn `turn`, is not routed at any of the `horizon` turns from there:
    /// walks the cells it passes through if not routed (its age grows by one a turn, its count
    /// decays), a run of turns in one cell at a time.
    fn log_survival(&self, l: usize, last: u64, turn: u64, counts: (f32, f32), horizon: u64) -> f32 {
        let x0 = self.count.of(counts);
        let decay = self.count.decay();
        let log_miss = &self.log_miss[l];
        let (mut i, mut acc) = (0u64, 0f32);
        while i < horizon {
            let age = if last == 0 || last >= turn { u64::MAX } else { turn + i - last };
            let ab = age_bucket(age);
            let x = x0 * decay.powi(i.min(100_000) as i32);
            let cb = self.count.bucket(x);
            // turns until the age leaves its bucket, and until the count drops below its
            // bucket's floor
            let age_run = AGE_LAST[ab].saturating_sub(age).saturating_add(1);
            let count_run = turns_above(x, self.count.floor(cb), decay);
            let n = age_run.min(count_run).min(horizon - i);
            acc += n as f32 * log_miss[ab * COUNT_BUCKETS + cb];
            i += n;
        }
        acc
    }
}

fn age_bucket(age: u64) -> usize {
    AGE_LAST.iter().position(|&last| age <= last).unwrap_or(AGE_BUCKETS - 1)
}

/// Turns until a count `x` decaying by `decay` a turn falls below `floor` (at least 1; never
/// when the floor is 0).
fn turns_above(x: f32, floor: f32, decay: f32) -> u64 {
    if floor <= 0.0 || x <= 0.0 { u64::MAX } else { ((floor / x).ln() / decay.ln()).floor().max(0.0) as u64 + 1 }
}

impl RouteModel {
    pub fn new(n_layers: usize, top_k: usize, num_experts: usize) -> RouteModel {
        let uniform = top_k as f32 / num_experts.max(1) as f32;
        RouteModel {
            last: vec![Vec::new(); n_layers],
            last_used: vec![vec![0; num_experts]; n_layers],
            grids: [Grid::new(Count::Fast, n_layers, uniform), Grid::new(Count::Slow, n_layers, uniform)],
            uniform,
            turnover: 0.0,
            loads: 0,
            cur: 0,
            generation: vec![1; n_layers],
            memo: RefCell::new(vec![vec![(0, 0, 0, 0.0); num_experts]; n_layers]),
        }
    }

    /// An entry was loaded into the pool (demand or prefetch): the pool's turnover.
    pub fn loaded(&mut self) {
        self.loads += 1;
    }

    /// Turns ahead that an entry's worth is judged over in a pool of `capacity` entries.
    pub fn horizon(&self, capacity: usize) -> u64 {
        ((HORIZON_SHARE * capacity as f32 / self.turnover.max(1.0)) as u64).clamp(1, MAX_HORIZON)
    }

    /// Chance that expert `e` of layer `l` is routed within its layer's next `horizon` turns,
    /// seen from MoE layer `active` of `token` (layers up to `active` have had their turn this
    /// token).
    pub fn p_next(&self, l: usize, e: usize, token: u64, active: usize, scores: &Scores, horizon: u64) -> f32 {
        let turn = token + u64::from(l <= active);
        let mut memo = self.memo.borrow_mut();
        let slot = memo.get_mut(l).and_then(|r| r.get_mut(e));
        if let Some(&(g, h, t, p)) = slot.as_deref()
            && (g, h, t) == (self.generation[l], horizon, turn)
        {
            return p;
        }
        let last = self.last_used.get(l).and_then(|r| r.get(e)).copied().unwrap_or(0);
        let grid = &self.grids[usize::from(horizon > SLOW_FROM)];
        let p = 1.0 - grid.log_survival(l, last, turn, scores.both((l, e), turn), horizon).exp();
        if let Some(m) = slot {
            *m = (self.generation[l], horizon, turn, p);
        }
        p
    }

    /// Layer `l` routed `route` (distinct experts) at `token` (tokens count from 1): learn from
    /// it, then count the uses in `scores` (the only place they change, so that
    /// [`p_next`](Self::p_next)'s memo stays true).
    pub fn observe(&mut self, l: usize, route: &[usize], token: u64, scores: &mut Scores) {
        self.generation[l] += 1;
        if token != self.cur {
            self.turnover = 0.8 * self.turnover + 0.2 * self.loads as f32;
            self.loads = 0;
            self.cur = token;
        }
        for g in &mut self.grids {
            g.decay(l);
        }
        for (e, t) in self.last_used[l].iter_mut().enumerate() {
            let hit = route.contains(&e);
            let age = if *t == 0 || *t >= token { u64::MAX } else { token - *t };
            let counts = scores.both((l, e), token);
            for g in &mut self.grids {
                let c = g.cell(age, counts);
                g.add(l, c, hit);
            }
            if hit {
                *t = token;
            }
        }
        for g in &mut self.grids {
            g.refresh(l, self.uniform);
        }
        for &e in route {
            scores.bump((l, e), token);
        }
        self.last[l] = route.to_vec();
    }

    pub fn last_route(&self, l: usize) -> &[usize] {
        &self.last[l]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `tokens` routes of one layer (8 experts, top-2) from `route(t)`.
    fn model_of(tokens: u64, mut route: impl FnMut(u64) -> Vec<usize>) -> (RouteModel, Scores) {
        let mut m = RouteModel::new(1, 2, 8);
        let mut s = Scores::default();
        for t in 1..=tokens {
            m.observe(0, &route(t), t, &mut s);
        }
        (m, s)
    }

    #[test]
    fn the_grid_learns_locality_and_chance() {
        // drifting routing: each pair of experts is used for 10 tokens, then the next pair
        let (drift, s) = model_of(305, |t| vec![(2 * (t / 10) % 8) as usize, (2 * (t / 10) % 8 + 1) as usize]);
        // at token 306: (4, 5) have been routed since 300 and are very likely again; (2, 3)
        // went at 299, (6, 7) at 279
        let p = |e: usize, h: u64| drift.p_next(0, e, 305, 0, &s, h);
        assert!(p(4, 1) > 0.8 && p(5, 1) > 0.8, "{} {}", p(4, 1), p(5, 1));
        for e in [0, 1, 2, 3, 6, 7] {
            assert!(p(e, 1) < 0.2, "expert {e}: {}", p(e, 1));
            // over a longer horizon the cycle brings every pair back
            assert!(p(e, 64) > p(e, 1), "expert {e}: {} <= {}", p(e, 64), p(e, 1));
        }
        // random routing: every expert near k/E at the next turn, whatever its age and count
        let mut x = 7u64;
        let (random, s) = model_of(2000, |_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let a = (x >> 60) as usize % 8;
            vec![a, (a + 1 + (x >> 40) as usize % 7) % 8]
        });
        for e in 0..8 {
            let r = random.p_next(0, e, 2000, 0, &s, 1);
            assert!((r - 0.25).abs() < 0.08, "expert {e}: {r}");
        }
    }

    #[test]
    fn the_horizon_follows_the_pool_turnover() {
        let mut m = RouteModel::new(1, 2, 8);
        let mut s = Scores::default();
        // 10 loads a token: a 100-entry pool keeps an entry ~10 tokens, judged over half that
        for t in 1..=40 {
            m.observe(0, &[0, 1], t, &mut s);
            for _ in 0..10 {
                m.loaded();
            }
        }
        assert_eq!(m.horizon(100), 5);
        // nothing loaded: the longest horizon
        assert_eq!(RouteModel::new(1, 2, 8).horizon(100_000), MAX_HORIZON);
        assert_eq!(m.horizon(1), 1);
    }
}
