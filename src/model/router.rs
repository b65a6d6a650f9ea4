//! A MoE layer's router: the logits `hn Wr^T (+ b)`, the rule that turns a token's logits into
//! its top-k experts and their weights, and the batch's routing (the tokens each expert serves).
//! The rule is data ([`RouterRule`]): a family with another rule adds a case here, not a branch
//! in the MoE block.
//! ```text
//! Softmax       p = softmax(logits); choose the top-k of p;            w = p[chosen]
//! TopKSoftmax   choose the top-k of the logits;  w = softmax(logits[chosen])
//! Sigmoid       p = sigmoid(logits); choose the top-k of p + correction; w = p[chosen]
//! groups        the choice only among the experts of the `keep` best of `groups` equal groups,
//!               a group scored by the sum of its two best choice scores
//! then          w /= sum(w) when renormalised (Sigmoid: sum + 1e-20); w *= scale
//! ```
//! Qwen3-MoE, Qwen3-Next and Qwen3.5 use Softmax; gpt-oss TopKSoftmax (with a logit bias);
//! DeepSeek-V3 and GLM-4.5 Sigmoid with a correction bias, groups and a scale. Ties go to the
//! lower expert id. What an observer sees as a token's scores is `p` (for TopKSoftmax the
//! softmax of all its logits).

use moescope_kernels::ops::{softmax_inplace, top_k};

use super::error::ModelError;
use super::expert_source::ExpertSource;
use super::pass::{Pass, SeqRows};
use super::route_replay::ReplayAt;
use super::run_state::RunState;
use crate::exec::Chunks;
use crate::model_config::{Arch, ModelConfig};
use crate::package::{Package, TensorId};
use crate::trace;

/// How a token's logits become the scores its experts are chosen and weighted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// softmax over every expert, then the top-k of the probabilities
    Softmax,
    /// the top-k of the logits, then the softmax over those k
    TopKSoftmax,
    /// the sigmoid of each logit (chosen with the correction added, weighted without)
    Sigmoid,
}

/// The most expert groups a router may have (a group's score is kept on the stack).
pub const MAX_GROUPS: usize = 64;

/// Group-limited routing: the experts split into `groups` equal groups, only those of the
/// `keep` best groups chosen from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    pub groups: usize,
    pub keep: usize,
}

/// A router's rule, the same for every MoE layer of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterRule {
    pub num_experts: usize,
    pub top_k: usize,
    pub scoring: Scoring,
    pub groups: Option<Groups>,
    /// Divide the k weights by their sum (`norm_topk_prob`).
    pub renormalize: bool,
    /// The weights times this (`routed_scaling_factor`; 1 for most).
    pub scale: f32,
}

impl RouterRule {
    /// The rule of a model of this configuration.
    pub fn of(c: &ModelConfig) -> RouterRule {
        let sig = c.features.sigmoid_router;
        RouterRule {
            num_experts: c.num_experts,
            top_k: c.num_experts_per_tok,
            scoring: match (c.arch, sig) {
                (_, Some(_)) => Scoring::Sigmoid,
                (Arch::GptOss, None) => Scoring::TopKSoftmax,
                _ => Scoring::Softmax,
            },
            groups: sig.map(|s| Groups { groups: s.n_group, keep: s.topk_group }),
            renormalize: c.norm_topk_prob,
            scale: sig.map_or(1.0, |s| s.routed_scaling_factor),
        }
    }

    /// Whether the choice reads scores of its own (`[E]` a token) beside `p`.
    fn needs_choice_scores(&self, correction: bool) -> bool {
        correction || self.groups.is_some_and(|g| g.keep < g.groups)
    }

    /// A token's logits (`[E]`, any bias added) become its scores in place: what the choice and
    /// the weights read (TopKSoftmax leaves the logits; see [`RouterRule::report`]).
    pub fn score(&self, p: &mut [f32]) {
        match self.scoring {
            Scoring::Softmax => softmax_inplace(p),
            Scoring::Sigmoid => p.iter_mut().for_each(|x| *x = sigmoid(*x)),
            Scoring::TopKSoftmax => {}
        }
    }

    /// A token's scores as an observer sees them, in place after its choice: the softmax of
    /// all logits for TopKSoftmax, the scores themselves otherwise.
    pub fn report(&self, p: &mut [f32]) {
        if self.scoring == Scoring::TopKSoftmax {
            softmax_inplace(p);
        }
    }

    /// A token's choice from its scores `p` (after [`RouterRule::score`]): `picks` (`[k]`) get the
    /// chosen experts in rank order and their weights. `c` (`[E]`) is scratch for the choice
    /// scores when they differ from `p` (a correction, expert groups).
    pub fn choose(&self, p: &[f32], correction: Option<&[f32]>, c: &mut [f32], picks: &mut [Pick]) {
        let s = if self.needs_choice_scores(correction.is_some()) {
            c.copy_from_slice(p);
            if let Some(b) = correction {
                c.iter_mut().zip(b).for_each(|(c, &b)| *c += b);
            }
            if let Some(g) = self.groups {
                keep_best_groups(c, g);
            }
            &*c
        } else {
            p
        };
        top_k_into(s, picks);
        self.weigh(p, picks);
    }

    /// The weights of the experts in `picks` (rank order), from the scores `p`.
    pub fn weigh(&self, p: &[f32], picks: &mut [Pick]) {
        match self.scoring {
            Scoring::TopKSoftmax => {
                // the softmax over the chosen logits; the first is their largest
                let m = picks.first().map_or(0.0, |pk| p[pk.expert]);
                picks.iter_mut().for_each(|pk| pk.weight = (p[pk.expert] - m).exp());
                let sum: f32 = picks.iter().map(|pk| pk.weight).sum();
                picks.iter_mut().for_each(|pk| pk.weight /= sum);
            }
            Scoring::Softmax | Scoring::Sigmoid => picks.iter_mut().for_each(|pk| pk.weight = p[pk.expert]),
        }
        if self.renormalize {
            let sum: f32 = picks.iter().map(|pk| pk.weight).sum();
            // transformers' sigmoid routers guard the sum (a no-op above 1e-13 or so)
            let norm = if self.scoring == Scoring::Sigmoid { sum + 1e-20 } else { sum };
            picks.iter_mut().for_each(|pk| pk.weight /= norm);
        }
        if self.scale != 1.0 {
            picks.iter_mut().for_each(|pk| pk.weight *= self.scale);
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `picks[..k]`'s experts = the indices of the k largest of `s`, largest first, ties to the
/// lower index (what `ops::top_k` gives, into a slice: no allocation).
fn top_k_into(s: &[f32], picks: &mut [Pick]) {
    use std::cmp::Ordering;
    let k = picks.len();
    let mut n = 0;
    for (i, v) in s.iter().enumerate() {
        if n == k && (k == 0 || v.total_cmp(&s[picks[k - 1].expert]) != Ordering::Greater) {
            continue;
        }
        // after every kept index that is not smaller (each kept index is lower than i)
        let at = picks[..n].partition_point(|pk| s[pk.expert].total_cmp(v) != Ordering::Less);
        let end = if n < k { n + 1 } else { k };
        picks.copy_within(at..end - 1, at + 1);
        picks[at].expert = i;
        n = end;
    }
}

/// Choice scores `c` (`[E]`) with every expert outside the `g.keep` best groups set to -inf; a
/// group's score is the sum of its two best scores (its one score for groups of one).
fn keep_best_groups(c: &mut [f32], g: Groups) {
    use std::cmp::Ordering;
    if g.groups <= 1 || g.keep >= g.groups || g.groups > MAX_GROUPS {
        return;
    }
    let size = c.len() / g.groups;
    let mut score = [0f32; MAX_GROUPS];
    for (i, sc) in score.iter_mut().take(g.groups).enumerate() {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &x in &c[i * size..(i + 1) * size] {
            if x > a {
                (a, b) = (x, a);
            } else if x > b {
                b = x;
            }
        }
        *sc = if size == 1 { a } else { a + b };
    }
    let score = &score[..g.groups];
    for i in 0..g.groups {
        // groups ahead of i: a better score, or the same one at a lower index
        let ahead = score
            .iter()
            .enumerate()
            .filter(|&(j, s)| match s.total_cmp(&score[i]) {
                Ordering::Greater => true,
                Ordering::Equal => j < i,
                Ordering::Less => false,
            })
            .count();
        if ahead >= g.keep {
            c[i * size..(i + 1) * size].fill(f32::NEG_INFINITY);
        }
    }
}

/// The expert a token's rank chose, and its weight.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pick {
    pub expert: usize,
    pub weight: f32,
}

/// One of an expert's uses in a batch: token `token` chose it at rank `rank`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Use {
    pub token: usize,
    pub rank: usize,
}

/// A batch's routing, in buffers sized once for a prompt chunk and reused by every pass.
pub struct Routing {
    top_k: usize,
    num_experts: usize,
    /// `[T, k]`: token t's rank j at `t * k + j`.
    picks: Vec<Pick>,
    /// `[T, E]`: each token's choice scores, when they are not its scores (empty otherwise).
    choice: Vec<f32>,
    /// Every (token, rank) use, grouped by expert in ascending id, token order within.
    uses: Vec<Use>,
    /// `[E + 1]`: expert e's uses are `uses[starts[e]..starts[e + 1]]`.
    starts: Vec<usize>,
    /// `[E]`: where the next use of each expert goes while `uses` is filled.
    fill: Vec<usize>,
    /// The experts chosen, ascending.
    pub used: Vec<usize>,
    /// Experts cache-aware routing put in place of routed ones.
    pub substituted: usize,
    /// One token's experts and weights in rank order, as an observer takes them.
    seen: (Vec<usize>, Vec<f32>),
}

impl Routing {
    /// Buffers for batches of up to `chunk` tokens (choice scores where the rule reads them: a
    /// sigmoid router's corrected scores, expert groups).
    pub fn new(rule: &RouterRule, chunk: usize) -> Routing {
        let choice = rule.scoring == Scoring::Sigmoid || rule.groups.is_some();
        let (e_n, k_n) = (rule.num_experts, rule.top_k);
        Routing {
            top_k: k_n,
            num_experts: e_n,
            picks: Vec::with_capacity(chunk * k_n),
            choice: if choice { vec![0f32; chunk * e_n] } else { Vec::new() },
            uses: Vec::with_capacity(chunk * k_n),
            starts: Vec::with_capacity(e_n + 1),
            fill: Vec::with_capacity(e_n),
            used: Vec::with_capacity(e_n),
            substituted: 0,
            seen: (Vec::with_capacity(k_n), Vec::with_capacity(k_n)),
        }
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Token `t`'s picks in rank order.
    pub fn picks_of(&self, t: usize) -> &[Pick] {
        &self.picks[t * self.top_k..(t + 1) * self.top_k]
    }

    /// Expert `e`'s uses in the batch, token order.
    pub(super) fn uses_of(&self, e: usize) -> &[Use] {
        &self.uses[self.starts[e]..self.starts[e + 1]]
    }

    /// The weight of token `u.token`'s rank `u.rank`.
    pub(super) fn weight(&self, u: Use) -> f32 {
        self.picks[u.token * self.top_k + u.rank].weight
    }

    /// Bytes of the buffers.
    pub fn bytes(&self) -> u64 {
        let n = self.picks.capacity() * size_of::<Pick>()
            + self.choice.capacity() * 4
            + self.uses.capacity() * size_of::<Use>()
            + (self.starts.capacity() + self.fill.capacity() + self.used.capacity()) * size_of::<usize>();
        n as u64
    }

    /// The picks of every token are final: group them by expert.
    fn group(&mut self, t_n: usize) {
        let (e_n, k_n) = (self.num_experts, self.top_k);
        self.starts.clear();
        self.starts.resize(e_n + 1, 0);
        for pk in &self.picks[..t_n * k_n] {
            self.starts[pk.expert + 1] += 1;
        }
        for e in 0..e_n {
            self.starts[e + 1] += self.starts[e];
        }
        self.fill.clear();
        self.fill.extend_from_slice(&self.starts[..e_n]);
        self.uses.clear();
        self.uses.resize(t_n * k_n, Use::default());
        for t in 0..t_n {
            for rank in 0..k_n {
                let e = self.picks[t * k_n + rank].expert;
                self.uses[self.fill[e]] = Use { token: t, rank };
                self.fill[e] += 1;
            }
        }
        self.used.clear();
        self.used.extend((0..e_n).filter(|&e| self.starts[e + 1] > self.starts[e]));
    }
}

/// What may replace the router's own top-k for a batch.
#[derive(Clone, Copy)]
pub enum Steer<'a> {
    /// The router's choice, exactly.
    Exact,
    /// A trace's experts and weights (`--route-from`); the router still runs.
    Replay(ReplayAt<'a>),
    /// `--cache-aware-routing`: a routed expert that is not resident gives way to the most
    /// probable resident one among the next k candidates whose probability is within `tol` of
    /// its own (absolute); weights then come from the chosen experts' probabilities.
    CacheAware { source: &'a dyn ExpertSource, moe_layer: usize, tol: f32 },
}

/// One MoE layer's router: its tensors and the model's rule.
#[derive(Debug, Clone, Copy)]
pub struct Router {
    /// `[E, H]` f32
    pub weight: TensorId,
    /// `[E]` f32 added to the logits (gpt-oss)
    pub bias: Option<TensorId>,
    /// `[E]` f32 added to the scores for the choice only (DeepSeek-V3's
    /// `e_score_correction_bias`)
    pub correction: Option<TensorId>,
    pub rule: RouterRule,
}

impl Router {
    /// The router of the MoE block whose tensors are named `{prefix}gate.weight` (and
    /// `{prefix}gate.bias` where the rule's family has one: gpt-oss; a sigmoid router's
    /// `{prefix}gate.e_score_correction_bias`).
    pub fn load(pkg: &Package, prefix: &str, rule: RouterRule, hidden: usize) -> Result<Router, ModelError> {
        let weight = pkg.require(&format!("{prefix}gate.weight"), &[rule.num_experts, hidden], true)?;
        let vector = |name: &str| pkg.require(&format!("{prefix}gate.{name}"), &[rule.num_experts], true);
        let (bias, correction) = match rule.scoring {
            Scoring::TopKSoftmax => (Some(vector("bias")?), None),
            Scoring::Sigmoid => (None, Some(vector("e_score_correction_bias")?)),
            Scoring::Softmax => (None, None),
        };
        Ok(Router { weight, bias, correction, rule })
    }

    /// Route the pass's batch (`st.hn`, normed) of model layer `l`, the `moe_layer`-th MoE
    /// layer, into `st.routing`; every token's choice goes to the observer, and `st.probs`
    /// (`[T, E]`) keeps its scores.
    /// Returns what steered the choice.
    pub fn route<'a>(&self, pass: &mut Pass<'a, '_>, l: usize, moe_layer: usize) -> Steer<'a> {
        let (exec, pkg, t_n) = (pass.exec, pass.pkg, pass.t_n);
        let rule = self.rule;
        let (e_n, k_n) = (rule.num_experts, rule.top_k);
        let steer = pass.steering.steer(pass.experts, moe_layer, t_n);
        let w = pkg.mat_by_index(self.weight);
        let RunState { hn, probs, routing, scratch, .. } = &mut *pass.st;
        let (hn, probs) = (&hn[..t_n * w.cols], &mut probs[..t_n * e_n]);
        let mut span = trace::span("router").arg("layer", l);
        exec.matmul("router", &w, hn, t_n, probs, scratch);
        if let Some(b) = self.bias {
            let b = pkg.f32_by_index(b);
            probs.chunks_exact_mut(e_n).for_each(|p| p.iter_mut().zip(b).for_each(|(p, &b)| *p += b));
        }
        let correction = self.correction.map(|c| pkg.f32_by_index(c));
        routing.picks.clear();
        routing.picks.resize(t_n * k_n, Pick::default());
        routing.substituted = 0;
        if let Steer::CacheAware { source, moe_layer, tol } = steer {
            // (only over plain softmax routers: `Decoder::set_cache_aware_routing` refuses others)
            // asks the expert source per token: one token after another
            let (mut top, mut wide) = (Vec::with_capacity(e_n), Vec::new());
            for (t, picks) in routing.picks.chunks_exact_mut(k_n).enumerate() {
                let p = &mut probs[t * e_n..(t + 1) * e_n];
                rule.score(p);
                top_k(p, k_n, &mut top);
                routing.substituted += prefer_resident(p, source, moe_layer, tol, &mut top, &mut wide);
                for (pk, &e) in picks.iter_mut().zip(&top) {
                    pk.expert = e;
                }
                rule.weigh(p, picks);
            }
        } else {
            let replay = if let Steer::Replay(r) = steer { Some(r) } else { None };
            // each token's scores, then its choice: the tokens in parallel (each its own: the
            // same bits)
            if rule.scoring != Scoring::TopKSoftmax {
                exec.rows_mut("softmax_rows", probs, e_n, &|_, p| p.chunks_exact_mut(e_n).for_each(|p| rule.score(p)));
            }
            {
                let scores = &*probs;
                let has_choice = rule.needs_choice_scores(correction.is_some());
                if has_choice && routing.choice.len() < t_n * e_n {
                    // a correction on a router `Routing::new` made none for
                    routing.choice.resize(t_n * e_n, 0.0);
                }
                let choice = Chunks::new(&mut routing.choice);
                // a token's top-k reads all its scores: 4 cycles or so each
                exec.rows_mut_costed("top_k_rows", &mut routing.picks, k_n, 16 * e_n, &|r, picks| {
                    for (t, picks) in r.zip(picks.chunks_exact_mut(k_n)) {
                        let p = &scores[t * e_n..(t + 1) * e_n];
                        let c = if has_choice {
                            // SAFETY: token t's row of the choice scores is this task's alone,
                            // inside a buffer that outlives the section
                            unsafe { choice.slice(t * e_n, e_n) }
                        } else {
                            &mut [][..]
                        };
                        rule.choose(p, correction, c, picks);
                        if let Some(r) = replay {
                            let (e, w) = r.route(t);
                            for ((pk, &e), &w) in picks.iter_mut().zip(e).zip(w) {
                                *pk = Pick { expert: e, weight: w };
                            }
                        }
                    }
                });
            }
            if rule.scoring == Scoring::TopKSoftmax {
                exec.rows_mut("softmax_rows", probs, e_n, &|_, p| p.chunks_exact_mut(e_n).for_each(|p| rule.report(p)));
            }
        }
        // every token's choice to the observer, in order
        let (top, weights) = &mut routing.seen;
        for (t, picks) in routing.picks.chunks_exact(k_n).enumerate() {
            top.clear();
            top.extend(picks.iter().map(|p| p.expert));
            weights.clear();
            weights.extend(picks.iter().map(|p| p.weight));
            if t_n == 1 {
                span.set("experts", top.as_slice());
                span.set("weights", weights.as_slice());
            }
            let pos = SeqRows::pos_of(pass.seqs, t);
            pass.obs.routing(l, pos, top, weights, &probs[t * e_n..(t + 1) * e_n]);
        }
        routing.group(t_n);
        if routing.substituted > 0 {
            span.set("substituted", routing.substituted);
            pass.steering.count_substitutions(routing.substituted);
        }
        steer
    }

    /// A softmax over every expert, its top-k chosen as they are: what cache-aware routing can
    /// steer.
    pub fn plain_softmax(&self) -> bool {
        self.rule.scoring == Scoring::Softmax && self.rule.groups.is_none() && self.correction.is_none()
    }

    /// A token's logits (`[E]`, from `weight`) in place become the scores its experts are
    /// ranked by for a guess ahead of the route: the bias, the rule's scores, the correction
    /// (expert groups left out).
    pub fn rank_scores(&self, pkg: &Package, p: &mut [f32]) {
        if let Some(b) = self.bias {
            p.iter_mut().zip(pkg.f32_by_index(b)).for_each(|(p, &b)| *p += b);
        }
        self.rule.score(p);
        if let Some(c) = self.correction {
            p.iter_mut().zip(pkg.f32_by_index(c)).for_each(|(p, &c)| *p += c);
        }
    }
}

/// Cache-aware routing for one token: in `top` (the top-k of probabilities `p`, rank order),
/// each expert that `source` does not hold gives way to the most probable held one among the
/// next k candidates that is not taken yet and whose probability is at least its own less
/// `tol`; then `top` is put back in rank order (probability, ties to the lower id). Returns
/// the substitutions made. `wide` is scratch.
fn prefer_resident(
    p: &[f32],
    source: &dyn ExpertSource,
    moe_layer: usize,
    tol: f32,
    top: &mut [usize],
    wide: &mut Vec<usize>,
) -> usize {
    let k = top.len();
    top_k(p, (2 * k).min(p.len()), wide);
    let held = source.resident(moe_layer, wide);
    let mut taken = vec![false; wide.len()];
    let mut n = 0;
    for j in 0..k {
        if held[j] {
            continue;
        }
        let floor = p[top[j]] - tol;
        if let Some(i) = (k..wide.len()).find(|&i| held[i] && !taken[i] && p[wide[i]] >= floor) {
            taken[i] = true;
            top[j] = wide[i];
            n += 1;
        }
    }
    if n > 0 {
        top.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    }
    n
}

#[cfg(test)]
mod tests;
