//! The routed-experts block of a MoE layer, and the seam between its math and where the
//! experts' weights come from.
//!
//! For a batch of T tokens `hn` (`[T, H]`, normed):
//! ```text
//! route:   p = softmax(hn Wr^T) in f32 over E experts; top-k by probability (ties: lower id);
//!          w = p_topk (/ sum if the top-k is renormalised)
//! group:   the (token, rank) uses of each expert the batch chose
//! compute: y = down(silu(gate x) * up x) of each expert for its tokens, weighted into
//!          yk[t, j] ([T, k, H]) for the rank j that chose it
//! sum:     out[t] = sum of yk[t, j] over j in rank order
//! ```
//! An [`ExpertSource`] hands the experts out in any batches and any order (a resident package
//! hands them all at once; streamed experts come as their reads land). Each (token, rank) slot
//! is written by the one expert that rank chose, and the sum runs in rank order, so the result
//! never depends on how the experts arrived. How a batch is computed depends only on its shape.

use std::sync::Mutex;

use moescope_kernels::Mat;
use moescope_kernels::ops::{add_inplace, softmax_inplace, swiglu, top_k};

use super::error::ModelError;
use super::observer::Observer;
use super::route_replay::ReplayAt;
use crate::exec::{Chunks, Exec, Scratch};
use crate::package::{ExpertMats, Package};
use crate::trace;

/// What the MoE block asks of its experts for one layer and batch.
pub struct ExpertQuery<'a> {
    /// The model's layer number (for traces).
    pub layer: usize,
    /// The layer's place among the MoE layers (its row of the expert table).
    pub moe_layer: usize,
    /// Tokens in the batch.
    pub tokens: usize,
    /// The experts the batch chose, ascending, each once.
    pub used: &'a [usize],
    /// What the next MoE layer's router should see for a prediction of its experts, `[T, H]`:
    /// this layer's normed input (a block with a shared expert may add that expert's output).
    pub lookahead: &'a [f32],
    /// With replayed routing, the trace's predictor candidates for the next MoE layer (one
    /// token's pass), which the predictor takes instead of applying a router to `lookahead`.
    pub predicted: Option<&'a [usize]>,
    /// One token's route in rank order, with its gate weights (empty for a batch): what the
    /// predictor's guess for this layer is scored against.
    pub ranked: &'a [Pick],
}

/// Called with ready experts: their ids and matrices, in the same order.
pub type ReadyFn<'a> = dyn FnMut(&[usize], &[ExpertMats<'_>]) -> Result<(), ModelError> + 'a;

/// Where a MoE layer's experts come from. The block asks one question per layer and batch;
/// everything a source does to answer it (reads, pins, predictions) stays behind this trait.
pub trait ExpertSource {
    /// A forward pass begins (a chunk of prompt tokens, or one decode token).
    fn begin_pass(&self) {}

    /// Which of `candidates` (experts of MoE layer `moe_layer`) are in memory now, in their
    /// order: for routing that prefers what it already holds (opt-in; the exact route never
    /// asks).
    fn resident(&self, moe_layer: usize, candidates: &[usize]) -> Vec<bool>;

    /// Call `each` with the experts of `q.used`, ready to compute, any number at a time and in
    /// any order, until every one was handed out once. An error of `each` ends the hand-out
    /// and is returned.
    fn for_each_ready(&self, q: &ExpertQuery<'_>, each: &mut ReadyFn<'_>) -> Result<(), ModelError>;
}

/// Every expert already in memory: the package's mapping, or its resident copy.
pub struct Resident<'p>(pub &'p Package);

impl ExpertSource for Resident<'_> {
    fn resident(&self, _moe_layer: usize, candidates: &[usize]) -> Vec<bool> {
        vec![true; candidates.len()]
    }

    fn for_each_ready(&self, q: &ExpertQuery<'_>, each: &mut ReadyFn<'_>) -> Result<(), ModelError> {
        let mats: Vec<ExpertMats<'_>> = q.used.iter().map(|&e| self.0.expert(q.layer, e)).collect::<Result<_, _>>()?;
        each(q.used, &mats)
    }
}

/// The router's shape and rule.
#[derive(Debug, Clone, Copy)]
pub struct RouterSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Divide the top-k probabilities by their sum.
    pub renormalize: bool,
}

/// The expert a token's rank chose, and its weight.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pick {
    pub expert: usize,
    pub weight: f32,
}

/// One of an expert's uses in a batch: token `token` chose it at rank `rank`.
#[derive(Debug, Clone, Copy)]
struct Use {
    token: usize,
    rank: usize,
}

/// A batch's routing.
pub struct Routing {
    top_k: usize,
    /// `[T, k]`: token t's rank j at `t * k + j`.
    picks: Vec<Pick>,
    /// Each expert's uses, indexed by expert id (empty for experts no token chose).
    uses: Vec<Vec<Use>>,
    /// The experts chosen, ascending.
    pub used: Vec<usize>,
    /// Experts cache-aware routing put in place of routed ones.
    pub substituted: usize,
}

impl Routing {
    /// Token `t`'s picks in rank order.
    pub fn picks_of(&self, t: usize) -> &[Pick] {
        &self.picks[t * self.top_k..(t + 1) * self.top_k]
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

/// Route the batch `hn` (`[T, H]`) of MoE layer `layer` through `router` (f32 `[E, H]`): softmax,
/// top-k, weights; every token's choice goes to `obs` (tokens at positions `pos0..`). `probs`
/// (`[T, E]`) receives the router's probabilities. `steer` may replace the top-k (see
/// [`Steer`]).
#[allow(clippy::too_many_arguments)]
pub fn route(
    exec: &Exec,
    router: &Mat<'_>,
    spec: RouterSpec,
    layer: usize,
    hn: &[f32],
    pos0: usize,
    probs: &mut [f32],
    s: &mut Scratch,
    obs: &mut dyn Observer,
    steer: Steer<'_>,
) -> Routing {
    let (e_n, k_n) = (spec.num_experts, spec.top_k);
    let t_n = hn.len() / router.cols;
    let mut span = trace::span("router").arg("layer", layer);
    // router logits, then probabilities
    exec.matmul("router", router, hn, t_n, probs, s);
    let mut picks = vec![Pick::default(); t_n * k_n];
    let mut substituted = 0;
    if let Steer::CacheAware { source, moe_layer, tol } = steer {
        // asks the expert source per token: one token after another
        let (mut top, mut wide) = (Vec::with_capacity(e_n), Vec::new());
        for (t, picks) in picks.chunks_exact_mut(k_n).enumerate() {
            let p = &mut probs[t * e_n..(t + 1) * e_n];
            softmax_inplace(p);
            top_k(p, k_n, &mut top);
            substituted += prefer_resident(p, source, moe_layer, tol, &mut top, &mut wide);
            pick(p, &top, spec.renormalize, picks);
        }
    } else {
        let replay = if let Steer::Replay(r) = steer { Some(r) } else { None };
        // each token's softmax, then its top-k: the tokens in parallel (each its own: the same
        // bits)
        exec.rows_mut("softmax_rows", &mut probs[..t_n * e_n], e_n, &|_, p| {
            p.chunks_exact_mut(e_n).for_each(softmax_inplace)
        });
        let probs = &probs[..t_n * e_n];
        // a token's top-k reads all its probabilities: 4 cycles or so each
        exec.rows_mut_costed("top_k_rows", &mut picks, k_n, 16 * e_n, &|r, picks| {
            let mut top = Vec::with_capacity(e_n);
            for (t, picks) in r.zip(picks.chunks_exact_mut(k_n)) {
                let p = &probs[t * e_n..(t + 1) * e_n];
                top_k(p, k_n, &mut top);
                pick(p, &top, spec.renormalize, picks);
                if let Some(r) = replay {
                    let (e, w) = r.route(t);
                    for ((pk, &e), &w) in picks.iter_mut().zip(e).zip(w) {
                        *pk = Pick { expert: e, weight: w };
                    }
                }
            }
        });
    }
    // every token's choice to the observer, in order
    let (mut top, mut weights) = (Vec::with_capacity(k_n), Vec::with_capacity(k_n));
    for (t, picks) in picks.chunks_exact(k_n).enumerate() {
        top.clear();
        top.extend(picks.iter().map(|p| p.expert));
        weights.clear();
        weights.extend(picks.iter().map(|p| p.weight));
        if t_n == 1 {
            span.set("experts", top.as_slice());
            span.set("weights", weights.as_slice());
        }
        obs.routing(layer, pos0 + t, &top, &weights, &probs[t * e_n..(t + 1) * e_n]);
    }
    let mut uses: Vec<Vec<Use>> = vec![Vec::new(); e_n];
    for t in 0..t_n {
        for rank in 0..k_n {
            uses[picks[t * k_n + rank].expert].push(Use { token: t, rank });
        }
    }
    let used = (0..e_n).filter(|&e| !uses[e].is_empty()).collect();
    if substituted > 0 {
        span.set("substituted", substituted);
    }
    Routing { top_k: k_n, picks, uses, used, substituted }
}

/// Token `p`'s picks from its chosen experts `top` (rank order): each expert with its probability,
/// divided by their sum when the model renormalizes.
fn pick(p: &[f32], top: &[usize], renormalize: bool, picks: &mut [Pick]) {
    let sum: f32 = top.iter().map(|&e| p[e]).sum();
    let norm = if renormalize { sum } else { 1.0 };
    for (pk, &e) in picks.iter_mut().zip(top) {
        *pk = Pick { expert: e, weight: p[e] / norm };
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

/// Where [`routed_sum`] works and leaves its result.
pub struct SumBuffers<'a> {
    /// The experts' weighted outputs per (token, rank), `[T, k, H]`.
    pub yk: &'a mut [f32],
    /// The sum, `[T, H]`.
    pub out: &'a mut [f32],
}

/// The weighted sum of the routed experts' outputs for the batch `hn` (`[T, H]`), computed as
/// `source` hands the experts out, into `bufs.out`. `blob_bytes` (one expert's bytes) is for the
/// trace.
#[allow(clippy::too_many_arguments)]
pub fn routed_sum(
    exec: &Exec,
    source: &dyn ExpertSource,
    q: &ExpertQuery<'_>,
    routing: &Routing,
    hn: &[f32],
    blob_bytes: u64,
    bufs: SumBuffers<'_>,
    s: &mut Scratch,
) -> Result<(), ModelError> {
    let (t_n, k_n) = (q.tokens, routing.top_k);
    let h = hn.len() / t_n.max(1);
    let SumBuffers { yk, out } = bufs;
    debug_assert!(yk.len() == t_n * k_n * h && out.len() == t_n * h);
    {
        let slots = WeightedOutputs { routing, slots: Chunks::new(yk), h };
        let batch = Batch { exec, layer: q.layer, hn, h, blob_bytes, out: &slots };
        source.for_each_ready(q, &mut |ids, mats| {
            batch.compute(ids, mats, s);
            Ok(())
        })?;
    }
    // each token's ranks summed in rank order, the tokens in parallel
    let yk = &yk[..];
    exec.rows_mut("sum_rows", out, h, &|r, out| {
        for (t, o) in r.zip(out.chunks_exact_mut(h)) {
            o.fill(0.0);
            for j in 0..k_n {
                add_inplace(o, &yk[(t * k_n + j) * h..(t * k_n + j + 1) * h]);
            }
        }
    });
    Ok(())
}

/// `yk` of [`routed_sum`], written by the experts' tasks: each (token, rank) slot by the one
/// expert that rank chose.
struct WeightedOutputs<'r> {
    routing: &'r Routing,
    slots: Chunks,
    h: usize,
}

impl WeightedOutputs<'_> {
    /// Expert `e`'s outputs for its tokens (`[n, H]`, in its uses' order), weighted into their
    /// slots.
    ///
    /// # Safety
    /// No other task writes expert `e`'s slots meanwhile (each expert is computed once per
    /// batch, so only its own task does).
    unsafe fn put(&self, e: usize, ys: &[f32]) {
        let (h, k_n) = (self.h, self.routing.top_k);
        for (i, u) in self.routing.uses[e].iter().enumerate() {
            let w = self.routing.picks[u.token * k_n + u.rank].weight;
            // SAFETY: slot (token, rank) is inside yk and belongs to expert e alone (that
            // token's rank chose e); the caller guarantees no one else writes e's slots now
            let dst = unsafe { self.slots.slice((u.token * k_n + u.rank) * h, h) };
            for (d, y) in dst.iter_mut().zip(&ys[i * h..(i + 1) * h]) {
                *d = y * w;
            }
        }
    }
}

/// How one hand-out of ready experts is computed.
struct Batch<'a> {
    exec: &'a Exec,
    layer: usize,
    hn: &'a [f32],
    h: usize,
    blob_bytes: u64,
    out: &'a WeightedOutputs<'a>,
}

impl Batch<'_> {
    /// Compute experts `ids` (`mats`), by the batch's shape alone: one token: all of them in two
    /// row-split sections (the threads finish together); several tokens and several experts on
    /// several threads: whole experts per thread, the busiest first (one parallel section for
    /// the hand-out, each expert's gathering, quantization and SwiGLU in parallel too); else one
    /// expert after another, each product split over the threads. Every product runs as it would
    /// alone, so each strategy gives the same bits.
    fn compute(&self, ids: &[usize], mats: &[ExpertMats<'_>], s: &mut Scratch) {
        let (exec, uses) = (self.exec, &self.out.routing.uses);
        if self.hn.len() == self.h {
            let mut span =
                trace::span("experts").arg("layer", self.layer).arg("bytes", self.blob_bytes * ids.len() as u64);
            span.set("experts", ids);
            // SAFETY: each expert of the hand-out is put once, here on the calling thread
            decode_experts(exec, mats, self.hn, s, |i, y| unsafe { self.out.put(ids[i], y) });
        } else if ids.len() > 1 && exec.threads() > 1 {
            let mut order: Vec<usize> = (0..ids.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(uses[ids[i]].len()));
            let scratch: Vec<Mutex<Scratch>> = (0..exec.threads()).map(|_| Mutex::new(Scratch::default())).collect();
            exec.run(order.len(), &|task, p| {
                let i = order[task];
                let mut s = scratch[p].lock().unwrap_or_else(|e| e.into_inner());
                self.expert(ids[i], &mats[i], exec.serial(), &mut s);
            });
        } else {
            for (&e, m) in ids.iter().zip(mats) {
                self.expert(e, m, exec, s);
            }
        }
    }

    /// Expert `e` over its tokens of the batch, weighted into their slots.
    fn expert(&self, e: usize, m: &ExpertMats<'_>, exec: &Exec, s: &mut Scratch) {
        let (h, users) = (self.h, &self.out.routing.uses[e]);
        let _es = trace::span("expert")
            .arg("layer", self.layer)
            .arg("expert", e)
            .arg("tokens", users.len())
            .arg("bytes", self.blob_bytes);
        let mut xe = Vec::with_capacity(users.len() * h);
        for u in users {
            xe.extend_from_slice(&self.hn[u.token * h..(u.token + 1) * h]);
        }
        let labels = ["expert_gate_up", "expert_gate", "expert_up", "expert_down"];
        let ye = swiglu_mlp(exec, labels, &m.gate, &m.up, &m.down, &xe, users.len(), s);
        // SAFETY: expert e is computed once per batch, by this task alone
        unsafe { self.out.put(e, &ye) };
    }
}

/// One token's experts `mats` over the input `x` (`[H]`) as two parallel sections for all of
/// them: every gate and up row with its SwiGLU in one, every down row in the other, each section
/// cut into pieces across the experts' boundaries, so the threads finish
/// together whatever expert they are in. `each(i, y)` gets expert `i`'s output (`[H]`).
fn decode_experts(
    exec: &Exec,
    mats: &[ExpertMats<'_>],
    x: &[f32],
    s: &mut Scratch,
    mut each: impl FnMut(usize, &[f32]),
) {
    // each expert's SwiGLU activation, [I_e] end to end
    let pairs: Vec<(&Mat<'_>, &Mat<'_>)> = mats.iter().map(|m| (&m.gate, &m.up)).collect();
    let mut act = vec![0f32; mats.iter().map(|m| m.gate.rows).sum()];
    exec.swiglu_pairs("expert_gate_up", &pairs, x, &mut act, s);
    let mut downs: Vec<(&Mat<'_>, &[f32])> = Vec::with_capacity(mats.len());
    let mut a0 = 0;
    for m in mats {
        downs.push((&m.down, &act[a0..a0 + m.gate.rows]));
        a0 += m.gate.rows;
    }
    let mut y = vec![0f32; mats.iter().map(|m| m.down.rows).sum()];
    exec.matvec_each("expert_down", &downs, &mut y);
    let mut y0 = 0;
    for (i, m) in mats.iter().enumerate() {
        each(i, &y[y0..y0 + m.down.rows]);
        y0 += m.down.rows;
    }
}

/// `down(silu(gate x) * up x)` for `x` of `[n, H]`; returns `[n, H]`. `labels` name the
/// products in the trace: gate and up as one (one token), gate, up (several), down.
#[allow(clippy::too_many_arguments)]
pub(super) fn swiglu_mlp(
    exec: &Exec,
    labels: [&'static str; 4],
    gate: &Mat<'_>,
    up: &Mat<'_>,
    down: &Mat<'_>,
    x: &[f32],
    n: usize,
    s: &mut Scratch,
) -> Vec<f32> {
    let i = gate.rows;
    let mut a = vec![0f32; n * i];
    if n == 1 {
        // one token (decode): gate and up with their SwiGLU in one parallel section, the input
        // quantized once
        exec.swiglu_pairs(labels[0], &[(gate, up)], x, &mut a, s);
    } else {
        let (mut g, mut u) = (vec![0f32; n * i], vec![0f32; n * i]);
        exec.matmul_shared(x, n, &mut [(labels[1], gate, &mut g), (labels[2], up, &mut u)], s);
        swiglu(&g, &u, &mut a);
    }
    let mut y = vec![0f32; n * down.rows];
    exec.matmul(labels[3], down, &a, n, &mut y, s);
    y
}
