//! Eviction policies for the expert pool. A policy sees the evictable entries (resident, not in
//! use, not being read) and the position of the forward pass, and picks one to evict. The same
//! code serves the engine's cache and the simulator (`moescope sim`), so a policy is judged in
//! the simulator exactly as it runs.
//!
//! Positions: MoE layers are numbered `0..n_layers` in forward order; a token visits them all
//! in order. "Distance" to an entry is how many layer steps until its layer comes around again.

pub use super::route_model::RouteModel;

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

    /// The (fast, slow) scores at `token`.
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
            PolicyKind::Foresight => {
                let hole = route_bound_hole(cands, ctx);
                cands.iter().map(|e| foresight_key(e, hole, ctx)).collect()
            }
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

fn chance(e: &Entry) -> f32 {
    match e.predicted {
        Some(c) => e.p_next.max(c),
        None => e.p_next,
    }
}

/// What keeping an entry outside its layer's last route costs beyond its victim, in a pool of
/// at most one token's routes (L x k slots): such a pool holds the layers' last routes and
/// nothing else, so an older expert kept evicts a route entry, and the slot it took is missing
/// from some layer's route at every later eviction until the kept expert's turn comes (each
/// layer that then misses evicts another route entry in its place). So it costs at least the
/// cheapest route entry's chance once more: that is subtracted from its weighted chance.
/// Without it, a pool of exactly one token's routes kept older experts and trailed lru's "keep
/// each layer's last route"; with it, a pool smaller than one token's routed experts loses a
/// little hit rate yet stays above lru and least-stale, and larger pools are not affected
/// (`moescope sim`'s figures: CHANGELOG).
fn route_bound_hole(cands: &[Entry], ctx: &Ctx) -> f32 {
    if ctx.capacity > ctx.n_layers * ctx.top_k {
        return 0.0;
    }
    cands.iter().filter(|e| e.in_last_route).map(chance).reduce(f32::min).unwrap_or(0.0)
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
fn foresight_key(e: &Entry, hole: f32, ctx: &Ctx) -> EvictKey {
    let p = chance(e);
    let d = if e.layer == ctx.active_layer && e.last_token == ctx.token {
        // used by this layer for this token already: back next token
        ctx.n_layers
    } else {
        ctx.distance(e.layer)
    };
    let l = ctx.n_layers.max(1) as f32;
    let hole = if e.in_last_route { 0.0 } else { hole };
    EvictKey::new([(p * l / (l + d as f32) - hole) as f64, -(d as f64), 0.0], e.last_use)
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
