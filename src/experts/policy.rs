//! Eviction policies for the expert pool. A policy sees the evictable entries (resident, not in
//! use, not being read) and the position of the forward pass, and picks one to evict. The same
//! code serves the engine's cache and the simulator (`moescope sim`), so a policy is judged in
//! the simulator exactly as it runs.
//!
//! Positions: MoE layers are numbered `0..n_layers` in forward order; a token visits them all
//! in order. "Distance" to an entry is how many layer steps until its layer comes around again.

use std::cell::RefCell;

/// Per-expert decayed use counts at two speeds. The fast one (mollm's) multiplies by 31/32 a
/// token, so a score near 32·p means "used by about a fraction p of the last ~32 tokens"; the
/// slow one by 0.995, about the last 200 tokens.
#[derive(Debug, Clone, Default)]
pub struct Scores {
    /// `[layer][expert]` -> (fast, slow, token both were last brought up to date), grown as
    /// experts are first used (indexed, not hashed: policies read every candidate's scores at
    /// each eviction, under the pool's lock)
    s: Vec<Vec<(f32, f32, u64)>>,
}

pub const DECAY: f32 = 31.0 / 32.0;
pub const SLOW_DECAY: f32 = 0.995;

impl Scores {
    /// The fast score at `token` (0 when never used).
    pub fn get(&self, key: (usize, usize), token: u64) -> f32 {
        self.both(key, token).0
    }

    /// The slow score at `token`.
    pub fn slow(&self, key: (usize, usize), token: u64) -> f32 {
        self.both(key, token).1
    }

    pub fn both(&self, (l, e): (usize, usize), token: u64) -> (f32, f32) {
        match self.s.get(l).and_then(|r| r.get(e)) {
            Some(&(f, s, t)) => {
                let n = token.saturating_sub(t).min(100_000) as i32;
                (f * DECAY.powi(n), s * SLOW_DECAY.powi(n))
            }
            None => (0.0, 0.0),
        }
    }

    pub(crate) fn bump(&mut self, key: (usize, usize), token: u64) {
        let (f, s) = self.both(key, token);
        let (l, e) = key;
        if self.s.len() <= l {
            self.s.resize_with(l + 1, Vec::new);
        }
        let row = &mut self.s[l];
        if row.len() <= e {
            // never-used experts read as zero scores
            row.resize(e + 1, (0.0, 0.0, 0));
        }
        row[e] = (f + 1.0, s + 1.0, token);
    }
}

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

/// What a policy knows about one evictable entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    /// MoE layer index (0-based, forward order).
    pub layer: usize,
    pub expert: usize,
    /// Logical time of the last use (or load), increasing.
    pub last_use: u64,
    /// Token of the last use (or load).
    pub last_token: u64,
    /// Whether it is in its layer's most recent route.
    pub in_last_route: bool,
    /// Loaded by a prediction and not used yet, with the prediction's confidence.
    pub predicted: Option<f32>,
    /// Decayed use count (see [`Scores`]).
    pub score: f32,
    /// The chance it is routed at its layer's next turn (see [`RouteModel::p_next`]).
    pub p_next: f32,
}

/// Where the forward pass is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ctx {
    pub token: u64,
    /// The MoE layer being computed (or about to be).
    pub active_layer: usize,
    pub n_layers: usize,
    /// Experts a layer picks per token.
    pub top_k: usize,
    pub num_experts: usize,
    /// Slots in the pool.
    pub capacity: usize,
}

impl Ctx {
    /// Layer steps until `layer` is computed again: later layers of this token come first;
    /// the active layer and earlier ones wait for the next token.
    pub fn distance(&self, layer: usize) -> usize {
        if layer > self.active_layer { layer - self.active_layer } else { self.n_layers - self.active_layer + layer }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Lru,
    LeastStale,
    Foresight,
}

pub const POLICIES: [PolicyKind; 3] = [PolicyKind::Lru, PolicyKind::LeastStale, PolicyKind::Foresight];

impl PolicyKind {
    pub fn parse(s: &str) -> Result<PolicyKind, String> {
        match s {
            "lru" => Ok(PolicyKind::Lru),
            "least-stale" => Ok(PolicyKind::LeastStale),
            "foresight" => Ok(PolicyKind::Foresight),
            o => Err(format!("unknown cache policy '{o}' (lru, least-stale, foresight)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::LeastStale => "least-stale",
            PolicyKind::Foresight => "foresight",
        }
    }

    /// Whether its keys read [`Entry::p_next`] (the others need not pay for it).
    pub fn reads_p_next(self) -> bool {
        self == PolicyKind::Foresight
    }

    /// Index in `cands` of the entry to evict (None only when `cands` is empty).
    pub fn victim(self, cands: &[Entry], ctx: &Ctx) -> Option<usize> {
        let keys = self.eviction_keys(cands, ctx);
        (0..keys.len()).min_by(|&a, &b| keys[a].cmp(&keys[b]))
    }

    /// Indices of `cands` in eviction order (first = evicted first).
    pub fn eviction_order(self, cands: &[Entry], ctx: &Ctx) -> Vec<usize> {
        let keys = self.eviction_keys(cands, ctx);
        let mut idx: Vec<usize> = (0..cands.len()).collect();
        idx.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
        idx
    }

    /// One key per candidate; the smallest is evicted first.
    pub fn eviction_keys(self, cands: &[Entry], ctx: &Ctx) -> Vec<EvictKey> {
        match self {
            PolicyKind::Lru => cands.iter().map(|e| EvictKey::new([0.0; 3], e.last_use)).collect(),
            PolicyKind::LeastStale => {
                let retained = least_stale_retained(cands, ctx);
                cands.iter().zip(retained).map(|(e, r)| least_stale_key(e, r, ctx)).collect()
            }
            PolicyKind::Foresight => cands.iter().map(|e| foresight_key(e, ctx)).collect(),
        }
    }

    /// The key of one entry known to be retained or not (least-stale's retention depends on
    /// the other entries; the others do not).
    pub fn eviction_key(self, e: &Entry, retained: bool, ctx: &Ctx) -> EvictKey {
        match self {
            PolicyKind::Lru => EvictKey::new([0.0; 3], e.last_use),
            PolicyKind::LeastStale => least_stale_key(e, retained, ctx),
            PolicyKind::Foresight => foresight_key(e, ctx),
        }
    }
}

/// An eviction key: three numbers compared in order, then a logical time (older first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictKey {
    pub v: [f64; 3],
    pub t: u64,
}

impl EvictKey {
    pub fn new(v: [f64; 3], t: u64) -> EvictKey {
        EvictKey { v, t }
    }
}

impl Eq for EvictKey {}

impl PartialOrd for EvictKey {
    fn partial_cmp(&self, o: &EvictKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for EvictKey {
    fn cmp(&self, o: &EvictKey) -> std::cmp::Ordering {
        self.v[0]
            .total_cmp(&o.v[0])
            .then(self.v[1].total_cmp(&o.v[1]))
            .then(self.v[2].total_cmp(&o.v[2]))
            .then(self.t.cmp(&o.t))
    }
}

/// mollm's Least-Stale: evict entries not touched this token first, then entries of layers this
/// token has finished, then entries touched this token; entries its layer is likely to reuse
/// (its last route, then its highest decayed scores, up to the layer's fair share of the pool)
/// go last. Ties: among untouched entries of layers still ahead, the farthest layer first; then
/// unpredicted before predicted, lower confidence first; then least recently used.
fn least_stale_retained(c: &[Entry], ctx: &Ctx) -> Vec<bool> {
    let share = (ctx.capacity / ctx.n_layers.max(1)).max(1);
    let mut per_layer: Vec<Vec<usize>> = vec![Vec::new(); ctx.n_layers.max(1)];
    for (i, e) in c.iter().enumerate() {
        per_layer[e.layer.min(ctx.n_layers.saturating_sub(1))].push(i);
    }
    let mut retained = vec![false; c.len()];
    for idx in per_layer.iter_mut() {
        if idx.len() > share {
            idx.sort_by(|&a, &b| c[b].in_last_route.cmp(&c[a].in_last_route).then(c[b].score.total_cmp(&c[a].score)));
        }
        for &i in idx.iter().take(share) {
            retained[i] = true;
        }
    }
    retained
}

fn least_stale_key(e: &Entry, retained: bool, ctx: &Ctx) -> EvictKey {
    let touched = e.last_token == ctx.token;
    let cat = if !touched {
        0.0
    } else if e.layer < ctx.active_layer {
        1.0
    } else {
        2.0
    };
    let cat = cat + if retained { 6.0 } else { 0.0 };
    let future = !touched && e.layer >= ctx.active_layer;
    let far = if future { -(e.layer as f64) } else { 0.0 };
    let pred = match e.predicted {
        Some(c) => 1.0 + c as f64 / 2.0,
        None => 0.0,
    };
    EvictKey::new([cat, far, pred], e.last_use)
}

/// Ours ("foresight"): keep what is most likely to be routed soon, nearer turns first among
/// equals.
///
/// The chance of use is [`RouteModel::p_next`]: learnt online from the routing so far by age and
/// use count, over a horizon that follows the pool's turnover; raised to a prediction's
/// confidence when one loaded the entry. It is weighted by L / (L + d), d the layer steps until
/// the layer comes round again: chances repeat every token while distance only orders this one,
/// so distance decides between equally likely experts (farthest first, as Belady would) without
/// letting a near but unlikely expert outrank a likely one.
fn foresight_key(e: &Entry, ctx: &Ctx) -> EvictKey {
    let mut p = e.p_next;
    if let Some(c) = e.predicted {
        p = p.max(c);
    }
    let d = if e.layer == ctx.active_layer && e.last_token == ctx.token {
        // used by this layer for this token already: back next token
        ctx.n_layers
    } else {
        ctx.distance(e.layer)
    };
    let l = ctx.n_layers.max(1) as f32;
    EvictKey::new([(p * l / (l + d as f32)) as f64, -(d as f64), 0.0], e.last_use)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(layer: usize, expert: usize, last_use: u64, last_token: u64) -> Entry {
        Entry { layer, expert, last_use, last_token, in_last_route: false, predicted: None, score: 0.0, p_next: 0.25 }
    }

    fn ctx(token: u64, active: usize) -> Ctx {
        Ctx { token, active_layer: active, n_layers: 4, top_k: 2, num_experts: 8, capacity: 64 }
    }

    #[test]
    fn lru_evicts_the_oldest() {
        let c = [e(0, 1, 5, 1), e(1, 2, 3, 1), e(2, 3, 9, 1)];
        assert_eq!(PolicyKind::Lru.victim(&c, &ctx(1, 0)), Some(1));
    }

    #[test]
    fn least_stale_prefers_stale_then_finished_layers() {
        // token 2, at layer 2: an entry untouched this token goes first
        let c = [e(0, 1, 10, 2), e(3, 2, 3, 1), e(2, 3, 11, 2)];
        assert_eq!(PolicyKind::LeastStale.victim(&c, &ctx(2, 2)), Some(1));
        // everything touched this token: a finished layer goes before the current one
        let c = [e(2, 1, 10, 2), e(0, 2, 12, 2)];
        let mut x = ctx(2, 2);
        x.capacity = 1; // one slot per layer: retention keeps the best per layer, both alike
        assert_eq!(PolicyKind::LeastStale.victim(&c, &x), Some(1));
    }

    #[test]
    fn foresight_evicts_the_farthest_when_routing_is_uniform() {
        // at layer 1 of token 5: layer 0 (just finished) is 3 steps away, layer 3 is 2 away,
        // layer 2 is next
        let c = [e(2, 1, 1, 4), e(0, 2, 2, 5), e(3, 3, 3, 4)];
        assert_eq!(PolicyKind::Foresight.victim(&c, &ctx(5, 1)), Some(1));
    }

    #[test]
    fn foresight_keeps_likely_experts_over_near_ones() {
        let mut hot = e(0, 1, 1, 4);
        hot.p_next = 0.9;
        let cold = e(3, 2, 2, 4);
        // at layer 2 of token 5: the likely one is 2 steps away, the unlikely one 1
        assert_eq!(PolicyKind::Foresight.victim(&[hot, cold], &ctx(5, 2)), Some(1));
        // a prediction's confidence counts as a chance of use
        let mut pred = e(3, 3, 3, 5);
        pred.predicted = Some(0.8);
        assert_eq!(PolicyKind::Foresight.victim(&[pred, e(3, 4, 4, 4)], &ctx(5, 2)), Some(1));
    }

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

    #[test]
    fn scores_decay_per_token() {
        let mut s = Scores::default();
        s.bump((0, 1), 0);
        s.bump((0, 1), 0);
        assert_eq!(s.get((0, 1), 0), 2.0);
        assert!((s.get((0, 1), 32) - 2.0 * DECAY.powi(32)).abs() < 1e-6);
        assert_eq!(s.get((1, 1), 3), 0.0);
    }
}
