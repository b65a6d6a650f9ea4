//! Eviction policies for the expert pool. A policy sees the evictable entries (resident, not in
//! use, not being read) and the position of the forward pass, and picks one to evict. The same
//! code serves the engine's cache and the simulator (`moescope sim`), so a policy is judged in
//! the simulator exactly as it runs.
//!
//! Positions: MoE layers are numbered `0..n_layers` in forward order; a token visits them all
//! in order. "Distance" to an entry is how many layer steps until its layer comes around again.

use std::collections::HashMap;

/// Per-expert decayed use counts: every token multiplies them by 31/32 and each use adds 1,
/// so a score near 32·p means "used by about a fraction p of tokens lately" (mollm's decay).
#[derive(Debug, Clone, Default)]
pub struct Scores {
    /// (layer, expert) -> (score, token it was last brought up to date)
    s: HashMap<(usize, usize), (f32, u64)>,
}

pub const DECAY: f32 = 31.0 / 32.0;

impl Scores {
    pub fn get(&self, key: (usize, usize), token: u64) -> f32 {
        match self.s.get(&key) {
            Some(&(v, t)) => v * DECAY.powi(token.saturating_sub(t).min(10_000) as i32),
            None => 0.0,
        }
    }

    pub fn bump(&mut self, key: (usize, usize), token: u64) {
        let v = self.get(key, token) + 1.0;
        self.s.insert(key, (v, token));
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
        if cands.is_empty() {
            return None;
        }
        let i = match self {
            PolicyKind::Lru => argmin_by(cands, |e| (e.last_use, 0.0)),
            PolicyKind::LeastStale => least_stale(cands, ctx),
            PolicyKind::Foresight => argmin_by(cands, |e| (0, foresight_value(e, ctx))).min(cands.len() - 1),
        };
        Some(i)
    }
}

fn argmin_by(c: &[Entry], key: impl Fn(&Entry) -> (u64, f32)) -> usize {
    let mut best = 0;
    let mut bk = key(&c[0]);
    for (i, e) in c.iter().enumerate().skip(1) {
        let k = key(e);
        if k.0 < bk.0 || (k.0 == bk.0 && k.1 < bk.1) || (k == bk && e.last_use < c[best].last_use) {
            best = i;
            bk = k;
        }
    }
    best
}

/// mollm's Least-Stale: evict entries not touched this token first, then entries of layers this
/// token has finished, then entries touched this token; entries its layer is likely to reuse
/// (its last route, then its highest decayed scores, up to the layer's fair share of the pool)
/// go last. Ties: among untouched entries of layers still ahead, the farthest layer first; then
/// unpredicted before predicted, lower confidence first; then least recently used.
fn least_stale(c: &[Entry], ctx: &Ctx) -> usize {
    let share = (ctx.capacity / ctx.n_layers.max(1)).max(1);
    // retained: the last route, then the best-scored entries per layer, up to `share`
    let mut per_layer: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, e) in c.iter().enumerate() {
        per_layer.entry(e.layer).or_default().push(i);
    }
    let mut retained = vec![false; c.len()];
    for idx in per_layer.values_mut() {
        idx.sort_by(|&a, &b| c[b].in_last_route.cmp(&c[a].in_last_route).then(c[b].score.total_cmp(&c[a].score)));
        for &i in idx.iter().take(share) {
            retained[i] = true;
        }
    }
    let rank = |i: usize| -> (u32, i64, u32, f32, u64) {
        let e = &c[i];
        let touched = e.last_token == ctx.token;
        let cat = if !touched {
            0
        } else if e.layer < ctx.active_layer {
            1
        } else {
            2
        };
        let cat = cat + if retained[i] { 6 } else { 0 };
        let future = !touched && e.layer >= ctx.active_layer;
        let far = if future { -(e.layer as i64) } else { 0 };
        let (pred, conf) = match e.predicted {
            Some(c) => (1, c),
            None => (0, 0.0),
        };
        (cat, far, pred, conf, e.last_use)
    };
    let mut best = 0;
    for i in 1..c.len() {
        let (a, b) = (rank(i), rank(best));
        let less = (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)).then(a.3.total_cmp(&b.3)).then(a.4.cmp(&b.4));
        if less == std::cmp::Ordering::Less {
            best = i;
        }
    }
    best
}

/// Ours: the expected benefit of keeping an entry per layer step it must wait, p(use) /
/// distance, evicting the smallest. p(use) is the entry's recent frequency (decayed score / 32,
/// i.e. the fraction of recent tokens that routed to it), floored at the uniform rate k/E and
/// raised to a prediction's confidence when one loaded it. With uniform routing this evicts the
/// farthest layers first (Belady's choice when nothing else is known); with skewed routing it
/// keeps the hot experts of every layer.
fn foresight_value(e: &Entry, ctx: &Ctx) -> f32 {
    let uniform = ctx.top_k as f32 / ctx.num_experts.max(1) as f32;
    let mut p = (e.score / 32.0).clamp(uniform, 1.0);
    if let Some(c) = e.predicted {
        p = p.max(c);
    }
    let d = if e.layer == ctx.active_layer && e.last_token == ctx.token {
        // used by this layer for this token already: back next token
        ctx.n_layers
    } else {
        ctx.distance(e.layer)
    };
    p / d as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(layer: usize, expert: usize, last_use: u64, last_token: u64) -> Entry {
        Entry { layer, expert, last_use, last_token, in_last_route: false, predicted: None, score: 0.0 }
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
    fn foresight_keeps_hot_experts() {
        let mut hot = e(0, 1, 1, 4);
        hot.score = 30.0;
        let cold = e(3, 2, 2, 4);
        // at layer 2 of token 5: the hot one is 2 steps away, the cold one 1; value
        // 30/32/2 > (2/8)/1
        assert_eq!(PolicyKind::Foresight.victim(&[hot, cold], &ctx(5, 2)), Some(1));
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
