//! Replaying a routing trace against the pool's policies, and against Belady's optimum (evict
//! the expert whose next use is farthest away: the best hit rate any policy could reach on this
//! trace, given the future), at any budget. No model is needed.
//!
//! The replay follows the engine's access pattern: pass by pass, MoE layer by MoE layer, the
//! layer asks for the distinct experts its tokens picked, in ascending id order; those are in
//! use (not evictable) while the layer runs. No prefetch: this compares eviction choices.

use std::collections::{HashMap, HashSet, VecDeque};

use serde::Serialize;

use super::policy::{Ctx, Entry, PolicyKind, Scores};
use super::routing_log::{Header, Record};

/// One step of the replay: a layer of a pass and the distinct experts it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub pass: u64,
    pub layer: usize,
    pub experts: Vec<usize>,
}

/// Group records into steps (records are in the order the engine produced them).
pub fn steps(recs: &[Record]) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut index: HashMap<(u64, usize), usize> = HashMap::new();
    for r in recs {
        let i = *index.entry((r.p, r.l)).or_insert_with(|| {
            out.push(Step { pass: r.p, layer: r.l, experts: Vec::new() });
            out.len() - 1
        });
        out[i].experts.extend_from_slice(&r.e);
    }
    for s in &mut out {
        s.experts.sort_unstable();
        s.experts.dedup();
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimPolicy {
    Policy(PolicyKind),
    Belady,
}

impl SimPolicy {
    pub fn parse(s: &str) -> Result<SimPolicy, String> {
        if s == "belady" { Ok(SimPolicy::Belady) } else { PolicyKind::parse(s).map(SimPolicy::Policy) }
    }

    pub fn name(self) -> &'static str {
        match self {
            SimPolicy::Policy(p) => p.name(),
            SimPolicy::Belady => "belady",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SimResult {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub hit_pct: f64,
}

struct Resident {
    last_use: u64,
    last_token: u64,
}

/// Replay `steps` with a pool of `capacity` experts.
pub fn simulate(h: &Header, steps: &[Step], capacity: usize, policy: SimPolicy) -> SimResult {
    let n_layers = h.moe_layers.len();
    let capacity = capacity.max(1);
    // for Belady: each key's future uses, as (step, position in the step): the position
    // matters when two candidates are next used by the same step
    let mut future: HashMap<(usize, usize), VecDeque<(usize, usize)>> = HashMap::new();
    if policy == SimPolicy::Belady {
        for (i, s) in steps.iter().enumerate() {
            for (j, &e) in s.experts.iter().enumerate() {
                future.entry((s.layer, e)).or_default().push_back((i, j));
            }
        }
    }
    let mut res: HashMap<(usize, usize), Resident> = HashMap::new();
    let mut scores = Scores::default();
    let mut last_route: Vec<Vec<usize>> = vec![Vec::new(); n_layers];
    let (mut hits, mut misses, mut tick) = (0u64, 0u64, 0u64);
    let mut token = 0u64;
    let mut cur_pass = None;
    for s in steps {
        if cur_pass != Some(s.pass) {
            cur_pass = Some(s.pass);
            token += 1;
        }
        for &e in &s.experts {
            scores.bump((s.layer, e), token);
            if let Some(q) = future.get_mut(&(s.layer, e)) {
                q.pop_front();
            }
        }
        last_route[s.layer] = s.experts.clone();
        // in use while the layer runs: the experts it has not computed yet
        let mut pending: HashSet<usize> = s.experts.iter().copied().collect();
        for &e in &s.experts {
            tick += 1;
            let key = (s.layer, e);
            if let Some(r) = res.get_mut(&key) {
                hits += 1;
                r.last_use = tick;
                r.last_token = token;
                pending.remove(&e);
                continue;
            }
            misses += 1;
            if res.len() >= capacity {
                let cands: Vec<((usize, usize), Entry)> = res
                    .iter()
                    .filter(|(k, _)| !(k.0 == s.layer && pending.contains(&k.1)))
                    .map(|(k, r)| {
                        (
                            *k,
                            Entry {
                                layer: k.0,
                                expert: k.1,
                                last_use: r.last_use,
                                last_token: r.last_token,
                                in_last_route: last_route[k.0].contains(&k.1),
                                predicted: None,
                                score: scores.get(*k, token),
                            },
                        )
                    })
                    .collect();
                let victim = match policy {
                    SimPolicy::Belady => cands
                        .iter()
                        .max_by_key(|(k, en)| {
                            let next = future.get(k).and_then(|q| q.front().copied()).unwrap_or((usize::MAX, 0));
                            (next, u64::MAX - en.last_use)
                        })
                        .map(|(k, _)| *k),
                    SimPolicy::Policy(p) => {
                        let entries: Vec<Entry> = cands.iter().map(|c| c.1).collect();
                        let ctx = Ctx {
                            token,
                            active_layer: s.layer,
                            n_layers,
                            top_k: h.top_k,
                            num_experts: h.num_experts,
                            capacity,
                        };
                        p.victim(&entries, &ctx).map(|v| cands[v].0)
                    }
                };
                match victim {
                    Some(k) => {
                        res.remove(&k);
                    }
                    // everything resident is in use by this layer: it streams through
                    None => {
                        pending.remove(&e);
                        continue;
                    }
                }
            }
            res.insert(key, Resident { last_use: tick, last_token: token });
            pending.remove(&e);
        }
    }
    let n = hits + misses;
    SimResult {
        hits,
        misses,
        bytes_read: misses * h.bytes_per_expert,
        hit_pct: if n == 0 { 0.0 } else { 100.0 * hits as f64 / n as f64 },
    }
}

/// A synthetic routing trace with locality: expert popularity per layer follows a Zipf law of
/// exponent `zipf` (a random permutation per layer decides which experts are popular), and each
/// token keeps each of the previous token's experts in a layer with probability `repeat`
/// before drawing the rest from the popularity. Deterministic for a seed.
pub fn synthetic(
    layers: usize,
    experts: usize,
    top_k: usize,
    tokens: usize,
    zipf: f64,
    repeat: f64,
    seed: u64,
    bytes: u64,
) -> (Header, Vec<Record>) {
    let mut rng = crate::engine::sampler::Rng::new(seed);
    let weights: Vec<f64> = (1..=experts).map(|r| 1.0 / (r as f64).powf(zipf)).collect();
    let total: f64 = weights.iter().sum();
    let perms: Vec<Vec<usize>> = (0..layers)
        .map(|_| {
            let mut p: Vec<usize> = (0..experts).collect();
            for i in (1..experts).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                p.swap(i, j);
            }
            p
        })
        .collect();
    let mut prev: Vec<Vec<usize>> = vec![Vec::new(); layers];
    let mut recs = Vec::with_capacity(tokens * layers);
    for t in 0..tokens {
        for l in 0..layers {
            let mut pick: Vec<usize> = prev[l].iter().copied().filter(|_| rng.next_f64() < repeat).collect();
            while pick.len() < top_k {
                let mut x = rng.next_f64() * total;
                let mut r = 0;
                while r + 1 < experts && x >= weights[r] {
                    x -= weights[r];
                    r += 1;
                }
                let e = perms[l][r];
                if !pick.contains(&e) {
                    pick.push(e);
                }
            }
            prev[l] = pick.clone();
            let w = vec![1.0 / top_k as f32; top_k];
            recs.push(Record { p: t as u64, t, l, e: pick, w });
        }
    }
    let h = Header {
        moescope_routing: 1,
        model: format!("synthetic zipf {zipf} repeat {repeat} seed {seed}"),
        moe_layers: (0..layers).collect(),
        num_experts: experts,
        top_k,
        bytes_per_expert: bytes,
    };
    (h, recs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(layers: usize, experts: usize, k: usize) -> Header {
        Header {
            moescope_routing: 1,
            model: "t".into(),
            moe_layers: (0..layers).collect(),
            num_experts: experts,
            top_k: k,
            bytes_per_expert: 10,
        }
    }

    /// Brute force: the fewest misses any eviction sequence achieves (tiny traces only).
    fn optimal_misses(steps: &[Step], cap: usize) -> u64 {
        fn go(
            steps: &[Step],
            i: usize,
            j: usize,
            res: &mut Vec<(usize, usize)>,
            cap: usize,
            memo: &mut HashMap<(usize, usize, Vec<(usize, usize)>), u64>,
        ) -> u64 {
            if i == steps.len() {
                return 0;
            }
            if j == steps[i].experts.len() {
                return go(steps, i + 1, 0, res, cap, memo);
            }
            let mut key_res = res.clone();
            key_res.sort();
            let mk = (i, j, key_res);
            if let Some(&v) = memo.get(&mk) {
                return v;
            }
            let key = (steps[i].layer, steps[i].experts[j]);
            let v = if res.contains(&key) {
                go(steps, i, j + 1, res, cap, memo)
            } else if res.len() < cap {
                res.push(key);
                let v = 1 + go(steps, i, j + 1, res, cap, memo);
                res.pop();
                v
            } else {
                // the layer's experts still to come are in use; those done may go
                let pinned: Vec<(usize, usize)> =
                    steps[i].experts[j + 1..].iter().map(|&e| (steps[i].layer, e)).collect();
                let mut best = u64::MAX;
                for v in 0..res.len() {
                    if pinned.contains(&res[v]) {
                        continue;
                    }
                    let old = res[v];
                    res[v] = key;
                    best = best.min(1 + go(steps, i, j + 1, res, cap, memo));
                    res[v] = old;
                }
                if best == u64::MAX { 1 + go(steps, i, j + 1, res, cap, memo) } else { best }
            };
            memo.insert(mk, v);
            v
        }
        go(steps, 0, 0, &mut Vec::new(), cap, &mut HashMap::new())
    }

    #[test]
    fn belady_matches_brute_force_and_bounds_every_policy() {
        for seed in 0..6 {
            let (h, recs) = synthetic(3, 6, 2, 6, 0.8, 0.3, seed, 10);
            let st = steps(&recs);
            for cap in [2, 3, 4, 6] {
                let opt = optimal_misses(&st, cap);
                let b = simulate(&h, &st, cap, SimPolicy::Belady);
                assert_eq!(b.misses, opt, "seed {seed} cap {cap}: Belady is optimal");
                for p in super::super::policy::POLICIES {
                    let r = simulate(&h, &st, cap, SimPolicy::Policy(p));
                    assert!(r.misses >= opt, "{} beat the optimum", p.name());
                    assert_eq!(r.hits + r.misses, b.hits + b.misses);
                }
            }
        }
    }

    #[test]
    fn a_pool_holding_everything_only_misses_once_per_expert() {
        let (h, recs) = synthetic(4, 16, 4, 50, 1.0, 0.5, 3, 7);
        let st = steps(&recs);
        let distinct: HashSet<(usize, usize)> = recs.iter().flat_map(|r| r.e.iter().map(move |&e| (r.l, e))).collect();
        for p in [SimPolicy::Belady, SimPolicy::Policy(PolicyKind::Lru), SimPolicy::Policy(PolicyKind::Foresight)] {
            let r = simulate(&h, &st, 64, p);
            assert_eq!(r.misses, distinct.len() as u64);
            assert_eq!(r.bytes_read, 7 * distinct.len() as u64);
        }
    }

    #[test]
    fn steps_merge_a_prefill_pass_per_layer() {
        let recs = vec![
            Record { p: 0, t: 0, l: 0, e: vec![3, 1], w: vec![0.5, 0.5] },
            Record { p: 0, t: 1, l: 0, e: vec![1, 2], w: vec![0.5, 0.5] },
            Record { p: 1, t: 2, l: 0, e: vec![0, 3], w: vec![0.5, 0.5] },
        ];
        let s = steps(&recs);
        assert_eq!(
            s,
            vec![Step { pass: 0, layer: 0, experts: vec![1, 2, 3] }, Step { pass: 1, layer: 0, experts: vec![0, 3] }]
        );
        let _ = header(1, 4, 2);
    }
}
