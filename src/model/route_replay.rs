//! Replayed routing (`--route-from TRACE`): the MoE blocks take their routes, and the predictor
//! its candidates, from a recorded routing trace instead of their own routers, so any package
//! (the benchmark's random-weight ones included) reads and caches the experts a trained model
//! would. The routers still run (their time stays in the measurement); only their choice is
//! replaced.
//!
//! Mapping: the trace's tokens are taken in the order they first appear, one per token the
//! engine routes, wrapping at the end; the package's MoE layer `li` follows the trace's layer
//! `li % L` (L = the trace's MoE layers). Each pass's first MoE layer claims the next tokens of
//! the trace, so a run walks through the trace whatever its prompts and passes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One token's route through one trace layer.
struct Route {
    experts: Vec<usize>,
    weights: Vec<f32>,
    /// The predictor's candidates for the next MoE layer, most probable first (may be empty).
    candidates: Vec<usize>,
}

pub struct RouteReplay {
    name: String,
    layers: usize,
    num_experts: usize,
    top_k: usize,
    /// `[token][trace layer]`, flat.
    routes: Vec<Route>,
    tokens: usize,
    /// First trace token of the current pass, and of the next one (both unwrapped).
    base: AtomicUsize,
    next: AtomicUsize,
}

/// One record of a trace, as [`RouteReplay::new`] takes it.
pub struct TraceRoute {
    /// The token: the trace's (pass, position).
    pub key: (u64, usize),
    pub layer: usize,
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
    pub candidates: Vec<usize>,
}

/// Where in a replay one MoE block of one pass is.
#[derive(Clone, Copy)]
pub struct ReplayAt<'a> {
    pub replay: &'a RouteReplay,
    pub moe_layer: usize,
    /// The pass's first trace token (see [`RouteReplay::begin`]).
    pub base: usize,
}

impl<'a> ReplayAt<'a> {
    /// Experts and weights of token `t` of the pass, in rank order.
    pub fn route(&self, t: usize) -> (&'a [usize], &'a [f32]) {
        let r = self.replay.at(self.base + t, self.moe_layer);
        (&r.experts, &r.weights)
    }

    /// The trace's predictor candidates (for the next MoE layer) of token `t` of the pass.
    pub fn candidates(&self, t: usize) -> &'a [usize] {
        &self.replay.at(self.base + t, self.moe_layer).candidates
    }
}

impl RouteReplay {
    /// Build from a trace's records, in the trace's order: `key` names the token (a trace's
    /// pass and position), `layer` is the trace's MoE layer (of `layers`). Every token must
    /// have a route for every layer, of exactly `top_k` experts below `num_experts`.
    pub fn new<I>(name: &str, layers: usize, num_experts: usize, top_k: usize, recs: I) -> Result<RouteReplay, String>
    where
        I: IntoIterator<Item = TraceRoute>,
    {
        if layers == 0 {
            return Err(format!("{name}: the trace has no MoE layers"));
        }
        let mut index: HashMap<(u64, usize), usize> = HashMap::new();
        let mut slots: Vec<Option<Route>> = Vec::new();
        for r in recs {
            let (p, t) = r.key;
            let next = index.len();
            let tok = *index.entry(r.key).or_insert(next);
            if tok == slots.len() / layers {
                slots.resize_with(slots.len() + layers, || None);
            }
            if r.layer >= layers {
                return Err(format!("{name}: pass {p} position {t}: MoE layer {} of {layers}", r.layer));
            }
            if r.experts.len() != top_k || r.weights.len() != top_k {
                return Err(format!(
                    "{name}: pass {p} position {t} layer {}: {} experts, the header says top-{top_k}",
                    r.layer,
                    r.experts.len()
                ));
            }
            if let Some(e) = r.experts.iter().chain(&r.candidates).find(|&&e| e >= num_experts) {
                return Err(format!("{name}: pass {p} position {t}: expert {e} of {num_experts}"));
            }
            slots[tok * layers + r.layer] =
                Some(Route { experts: r.experts, weights: r.weights, candidates: r.candidates });
        }
        if slots.is_empty() {
            return Err(format!("{name}: the trace has no routes"));
        }
        let tokens = slots.len() / layers;
        let mut keys: Vec<(&(u64, usize), &usize)> = index.iter().collect();
        keys.sort_by_key(|&(_, &i)| i);
        let mut routes = Vec::with_capacity(slots.len());
        for (i, s) in slots.into_iter().enumerate() {
            let Some(s) = s else {
                let (p, t) = keys[i / layers].0;
                return Err(format!("{name}: pass {p} position {t} has no route for MoE layer {}", i % layers));
            };
            routes.push(s);
        }
        Ok(RouteReplay {
            name: name.to_string(),
            layers,
            num_experts,
            top_k,
            routes,
            tokens,
            base: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
        })
    }

    /// The model must route among as many experts, as many at a time.
    pub fn check_model(&self, num_experts: usize, top_k: usize) -> Result<(), String> {
        if (num_experts, top_k) != (self.num_experts, self.top_k) {
            return Err(format!(
                "{}: the trace routes top-{} of {} experts; this model routes top-{top_k} of {num_experts}",
                self.name, self.top_k, self.num_experts
            ));
        }
        Ok(())
    }

    /// A pass of `t_n` tokens reaches MoE layer `moe_layer`: its first trace token. The first
    /// MoE layer of every pass claims the next `t_n` tokens of the trace.
    pub fn begin(&self, moe_layer: usize, t_n: usize) -> usize {
        if moe_layer == 0 {
            let b = self.next.fetch_add(t_n, Ordering::Relaxed);
            self.base.store(b, Ordering::Relaxed);
        }
        self.base.load(Ordering::Relaxed)
    }

    fn at(&self, token: usize, moe_layer: usize) -> &Route {
        // `new` refuses an empty trace: tokens >= 1
        &self.routes[(token % self.tokens) * self.layers + moe_layer % self.layers]
    }

    /// Tokens routed from the trace so far (past its end when it wrapped).
    pub fn tokens_replayed(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    /// Whether the trace carries predictor candidates.
    pub fn has_candidates(&self) -> bool {
        self.routes.iter().any(|r| !r.candidates.is_empty())
    }

    /// One line for a run's header.
    pub fn describe(&self) -> String {
        format!(
            "routes replayed from {} ({} tokens x {} MoE layers, top-{} of {}; predictor candidates {})",
            self.name,
            self.tokens,
            self.layers,
            self.top_k,
            self.num_experts,
            if self.has_candidates() { "from the trace" } else { "from the router" }
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(p: u64, t: usize, layer: usize, experts: Vec<usize>, weights: Vec<f32>) -> TraceRoute {
        TraceRoute { key: (p, t), layer, experts, weights, candidates: vec![] }
    }

    #[test]
    fn tokens_follow_first_appearance_and_layers_wrap() {
        // a prefill pass of two tokens written layer by layer, then one decode token
        let recs = vec![
            rec(0, 0, 0, vec![1, 2], vec![0.6, 0.4]),
            rec(0, 1, 0, vec![3, 4], vec![0.5, 0.5]),
            rec(0, 0, 1, vec![5, 6], vec![0.7, 0.3]),
            rec(0, 1, 1, vec![7, 0], vec![0.9, 0.1]),
            rec(1, 2, 0, vec![2, 3], vec![0.8, 0.2]),
            rec(1, 2, 1, vec![4, 5], vec![0.55, 0.45]),
        ];
        let r = RouteReplay::new("t", 2, 8, 2, recs).unwrap();
        assert_eq!(r.tokens, 3);
        // a pass of 2 tokens on a 4-MoE-layer model: layers 2 and 3 follow trace layers 0 and 1
        assert_eq!(r.begin(0, 2), 0);
        let at = |l| ReplayAt { replay: &r, moe_layer: l, base: r.begin(l, 2) };
        assert_eq!(at(1).route(1).0, &[7, 0]);
        assert_eq!(at(2).route(0), (&[1usize, 2][..], &[0.6f32, 0.4][..]));
        assert_eq!(at(3).route(1).0, &[7, 0]);
        // the next pass takes trace token 2, then wraps to token 0
        assert_eq!(r.begin(0, 2), 2);
        assert_eq!(ReplayAt { replay: &r, moe_layer: 1, base: 2 }.route(0).0, &[4, 5]);
        assert_eq!(ReplayAt { replay: &r, moe_layer: 1, base: 2 }.route(1).0, &[5, 6]);
        assert_eq!(r.tokens_replayed(), 4);
    }

    #[test]
    fn a_missing_layer_a_wrong_top_k_or_another_shape_is_named() {
        let e = RouteReplay::new("t.jsonl", 2, 8, 2, vec![rec(0, 0, 0, vec![1, 2], vec![0.5, 0.5])]).err().unwrap();
        assert!(e.contains("pass 0 position 0 has no route for MoE layer 1"), "{e}");
        let e = RouteReplay::new("t.jsonl", 1, 8, 2, vec![rec(0, 0, 0, vec![1], vec![1.0])]).err().unwrap();
        assert!(e.contains("1 experts, the header says top-2"), "{e}");
        let e = RouteReplay::new("t.jsonl", 1, 8, 2, vec![rec(0, 0, 0, vec![1, 8], vec![0.5, 0.5])]).err().unwrap();
        assert!(e.contains("expert 8 of 8"), "{e}");
        let r = RouteReplay::new("t.jsonl", 1, 8, 2, vec![rec(0, 0, 0, vec![1, 2], vec![0.5, 0.5])]).unwrap();
        assert!(r.check_model(8, 2).is_ok());
        let e = r.check_model(128, 8).err().unwrap();
        assert!(e.contains("top-2 of 8 experts; this model routes top-8 of 128"), "{e}");
    }
}
