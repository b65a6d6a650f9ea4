//! Eviction policies for the expert pool. A policy sees the evictable entries (resident, not in
//! use, not being read) and the position of the forward pass, and picks one to evict. The same
//! code serves the engine's cache and the simulator (`moescope sim`), so a policy is judged in
//! the simulator exactly as it runs.
//!
//! Positions: MoE layers are numbered `0..n_layers` in forward order; a token visits them all
//! in order. "Distance" to an entry is how many layer steps until its layer comes around again.

/// Per-expert decayed use counts: every token multiplies them by 31/32 and each use adds 1,
/// so a score near 32·p means "used by about a fraction p of tokens lately" (mollm's decay).
#[derive(Debug, Clone, Default)]
pub struct Scores {
    /// `[layer][expert]` -> (fast score, slow score, token they were last brought up to date),
    /// grown as experts are first used (indexed, not hashed: the foresight policy reads every
    /// candidate's scores at each eviction, under the pool's lock)
    s: Vec<Vec<(f32, f32, u64)>>,
}

pub const DECAY: f32 = 31.0 / 32.0;
/// A slower average (about the last 200 tokens) for popularity estimates.
pub const SLOW_DECAY: f32 = 0.995;

impl Scores {
    /// The fast score (mollm's): decays by 31/32 a token.
    pub fn get(&self, key: (usize, usize), token: u64) -> f32 {
        match self.entry(key) {
            Some(&(v, _, t)) => v * DECAY.powi(token.saturating_sub(t).min(10_000) as i32),
            None => 0.0,
        }
    }

    fn slow(&self, key: (usize, usize), token: u64) -> f32 {
        match self.entry(key) {
            Some(&(_, v, t)) => v * SLOW_DECAY.powi(token.saturating_sub(t).min(100_000) as i32),
            None => 0.0,
        }
    }

    /// The expert's record; None (all zero) when it was never used.
    fn entry(&self, (l, e): (usize, usize)) -> Option<&(f32, f32, u64)> {
        self.s.get(l).and_then(|r| r.get(e))
    }

    /// The fraction of recent tokens (about the last 200; all of them early on) that used it.
    pub fn popularity(&self, key: (usize, usize), token: u64) -> f32 {
        let n = token.clamp(1, 100_000) as i32;
        let norm = (1.0 - SLOW_DECAY.powi(n)) / (1.0 - SLOW_DECAY);
        (self.slow(key, token) / norm).min(1.0)
    }

    pub fn bump(&mut self, key: (usize, usize), token: u64) {
        let (f, s) = (self.get(key, token) + 1.0, self.slow(key, token) + 1.0);
        let (l, e) = key;
        if self.s.len() <= l {
            self.s.resize_with(l + 1, Vec::new);
        }
        let row = &mut self.s[l];
        if row.len() <= e {
            // never-used experts read as zero scores, as before
            row.resize(e + 1, (0.0, 0.0, 0));
        }
        row[e] = (f, s, token);
    }
}

/// What each layer's routing has shown about reuse: its last route, how often an expert of one
/// token's route is routed again at the next token (`rate`), and, per age a (tokens since an
/// expert was last routed, 1 to [`MAX_AGE`]), how often an expert of that age is routed at the
/// layer's next turn. The age curve is what tells routing with locality (high at small ages,
/// falling), drifting routing (experts hot for a while, then not) and random routing (flat at
/// k/E) apart, without being told which it is. Counts decay slowly so the model follows a
/// conversation's changes.
#[derive(Debug, Clone)]
pub struct RouteModel {
    rate: Vec<f32>,
    last: Vec<Vec<usize>>,
    /// Per layer and expert: the token it was last routed (0 = never).
    last_used: Vec<Vec<u64>>,
    /// Per layer and age: (trials, hits), decayed.
    age: Vec<Vec<(f32, f32)>>,
    /// Per layer: decayed squared error of the three estimates of "routed at the next turn"
    /// ([`Estimate`]), scored on every expert at every turn.
    loss: Vec<[f32; 3]>,
    uniform: f32,
}

/// How a layer's next-turn probabilities are estimated: from the age curve (recency), from
/// popularity, or the larger of the two. Each layer uses the one that has predicted its routing
/// best lately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimate {
    Age,
    Popularity,
    Max,
}

pub const MAX_AGE: usize = 32;
const AGE_DECAY: f32 = 0.998;
const LOSS_DECAY: f32 = 0.99;

impl RouteModel {
    pub fn new(n_layers: usize, top_k: usize, num_experts: usize) -> RouteModel {
        let uniform = top_k as f32 / num_experts.max(1) as f32;
        RouteModel {
            rate: vec![uniform; n_layers],
            last: vec![Vec::new(); n_layers],
            last_used: vec![vec![0; num_experts]; n_layers],
            age: vec![vec![(0.0, 0.0); MAX_AGE + 1]; n_layers],
            loss: vec![[0.0; 3]; n_layers],
            uniform,
        }
    }

    /// The three estimates for expert `e` of layer `l` at the layer's turn `token`, given its
    /// popularity.
    fn estimates(&self, l: usize, e: usize, token: u64, popularity: f32) -> [f32; 3] {
        let f = popularity.max(0.5 * self.uniform);
        let t = self.last_used[l][e];
        let a = if t == 0 || t >= token { None } else { self.reuse(l, token - t) };
        match a {
            Some(r) => [r, f, r.max(f)],
            None => [f, f, f],
        }
    }

    /// The estimate layer `l` trusts now.
    pub fn estimate(&self, l: usize) -> Estimate {
        // the larger of the two unless one alone predicts clearly better (by 5%): a close call
        // does not pay for dropping either kind of evidence
        let x = self.loss[l];
        if x[0] < 0.95 * x[2] && x[0] <= x[1] {
            Estimate::Age
        } else if x[1] < 0.95 * x[2] {
            Estimate::Popularity
        } else {
            Estimate::Max
        }
    }

    /// Chance that expert `e` of layer `l` is routed at the layer's next turn, seen from MoE
    /// layer `active` of `token` (layers up to `active` have had their turn this token), by the
    /// layer's trusted estimate.
    pub fn p_next(&self, l: usize, e: usize, token: u64, active: usize, popularity: f32) -> f32 {
        let turn = token + u64::from(l <= active);
        let est = self.estimates(l, e, turn, popularity);
        est[self.estimate(l) as usize]
    }

    /// Layer `l` routed `route` (distinct experts) at `token` (tokens count from 1);
    /// `popularity(e)` is expert e's popularity before this route.
    pub fn observe(&mut self, l: usize, route: &[usize], token: u64, popularity: impl Fn(usize) -> f32) {
        // score the three estimates on what happened
        let mut add = [0f32; 3];
        for e in 0..self.last_used[l].len() {
            let y = if route.contains(&e) { 1.0 } else { 0.0 };
            let est = self.estimates(l, e, token, popularity(e));
            for (a, p) in add.iter_mut().zip(est) {
                *a += (p - y) * (p - y);
            }
        }
        for (x, a) in self.loss[l].iter_mut().zip(add) {
            *x = LOSS_DECAY * *x + a;
        }
        let prev = &self.last[l];
        if !prev.is_empty() {
            let kept = prev.iter().filter(|e| route.contains(e)).count() as f32 / prev.len() as f32;
            self.rate[l] = 0.9 * self.rate[l] + 0.1 * kept;
        }
        self.last[l] = route.to_vec();
        let curve = &mut self.age[l];
        for c in curve.iter_mut() {
            c.0 *= AGE_DECAY;
            c.1 *= AGE_DECAY;
        }
        for (e, &t) in self.last_used[l].iter().enumerate() {
            if t == 0 || t >= token {
                continue;
            }
            let a = (token - t) as usize;
            if a <= MAX_AGE {
                curve[a].0 += 1.0;
                if route.contains(&e) {
                    curve[a].1 += 1.0;
                }
            }
        }
        for &e in route {
            if let Some(t) = self.last_used[l].get_mut(e) {
                *t = token;
            }
        }
    }

    pub fn rate(&self, l: usize) -> f32 {
        self.rate[l]
    }

    /// Chance that an expert of layer `l` last routed `age` tokens before the layer's next turn
    /// is routed at that turn (None past [`MAX_AGE`]); a few pseudo-trials at k/E keep thin
    /// evidence near chance.
    pub fn reuse(&self, l: usize, age: u64) -> Option<f32> {
        let a = usize::try_from(age).ok().filter(|&a| (1..=MAX_AGE).contains(&a))?;
        let (n, h) = self.age[l][a];
        Some((h + 4.0 * self.uniform) / (n + 4.0))
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
    /// Estimated fraction of tokens that route to it (see [`Scores::popularity`]).
    pub popularity: f32,
    /// How often its layer has lately kept an expert of one token's route for the next token
    /// (0..1; routing with locality is high, random routing near k/E).
    pub repeat_rate: f32,
    /// The chance it is routed at its layer's next turn, by the layer's trusted estimate (see
    /// [`RouteModel::p_next`]).
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

/// Ours ("foresight"): keep what is most likely to be routed at its layer's next turn, nearer
/// turns first among equals.
///
/// The chance of use comes from the layer's [`RouteModel`]: by the age curve (how often an
/// expert last routed a tokens ago is routed again, learnt online; this captures locality and
/// drift), by popularity (the fraction of about the last 200 tokens that routed to it, floored
/// at half the uniform rate k/E), or the larger of the two, whichever has lately predicted that
/// layer's routing best; raised to a prediction's confidence when one loaded the entry. It is
/// weighted by L / (L + d), d the layer steps until the layer comes round again: chances repeat
/// every token while distance only orders this one, so distance decides between equally likely
/// experts (farthest first, as Belady would) without letting a near but unlikely expert outrank
/// a likely one.
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
        Entry {
            layer,
            expert,
            last_use,
            last_token,
            in_last_route: false,
            predicted: None,
            score: 0.0,
            popularity: 0.0,
            repeat_rate: 0.0,
            p_next: 0.25,
        }
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
    fn model_of(tokens: u64, mut route: impl FnMut(u64) -> Vec<usize>) -> RouteModel {
        let mut m = RouteModel::new(1, 2, 8);
        let mut s = Scores::default();
        for t in 1..=tokens {
            let r = route(t);
            m.observe(0, &r, t, |e| s.popularity((0, e), t));
            for &e in &r {
                s.bump((0, e), t);
            }
        }
        m
    }

    #[test]
    fn the_age_curve_learns_locality_and_picks_its_estimate() {
        // drifting routing: each pair of experts is used for 10 tokens, then the next pair
        let drift = model_of(300, |t| vec![(2 * (t / 10) % 8) as usize, (2 * (t / 10) % 8 + 1) as usize]);
        // used last token: very likely again; used 9 tokens ago: unlikely
        assert!(drift.reuse(0, 1).unwrap() > 0.8, "{:?}", drift.reuse(0, 1));
        assert!(drift.reuse(0, 9).unwrap() < 0.2, "{:?}", drift.reuse(0, 9));
        assert_eq!(drift.estimate(0), Estimate::Age, "recency predicts drift, popularity does not");
        // random routing: the curve stays near k/E at every age
        let mut x = 7u64;
        let random = model_of(600, |_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let a = (x >> 60) as usize % 8;
            vec![a, (a + 1 + (x >> 40) as usize % 7) % 8]
        });
        for age in [1, 2, 5] {
            let r = random.reuse(0, age).unwrap();
            assert!((r - 0.25).abs() < 0.08, "age {age}: {r}");
        }
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
