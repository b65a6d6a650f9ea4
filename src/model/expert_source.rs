//! The seam between the MoE block's math and where the experts' weights come from. The block
//! asks one question per layer and batch ([`ExpertQuery`]); a source answers with the experts'
//! matrices as they become ready: a resident package at once ([`Resident`]), streamed experts
//! as their reads land (src/experts/source.rs). The query also reports what the block saw
//! ([`Ahead`]), for a source that guesses the next layer's experts; what it guesses from that
//! is its own business, and a source that does not guess costs the block nothing.

use moescope_kernels::ops::{add_inplace, rms_norm_inplace};
use smallvec::SmallVec;

use super::error::ModelError;
use super::router::Pick;
use crate::package::{ExpertMats, Package};

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
    /// What the block reports for a source that looks ahead.
    pub ahead: Ahead<'a>,
}

/// What the MoE block knows that helps guess the next MoE layer's experts.
#[derive(Clone, Copy)]
pub struct Ahead<'a> {
    /// The block's router input and what joins the residual stream before the routed experts.
    pub input: RouterInput<'a>,
    /// With replayed routing, the trace's predictor candidates for the next MoE layer (one
    /// token's pass), which a predictor takes instead of applying a router.
    pub predicted: Option<&'a [usize]>,
    /// One token's route in rank order, with its gate weights (empty for a batch): what a guess
    /// made for this layer is scored against.
    pub ranked: &'a [Pick],
}

/// The MoE block's input as its router saw it, `normed = rms_norm(residual) · norm` (`[T, H]`
/// each), and the shared expert's gated output, which joins the residual before any routed
/// expert's (hybrid models).
#[derive(Clone, Copy)]
pub struct RouterInput<'a> {
    pub normed: &'a [f32],
    pub residual: &'a [f32],
    pub shared: Option<&'a [f32]>,
    /// `[H]`, and the norm's eps
    pub norm: &'a [f32],
    pub eps: f32,
}

impl RouterInput<'_> {
    /// Token `t`'s best guess at the next MoE layer's router input, into `out` (`[H]`): the
    /// residual with the shared expert's output added, normed by this block's norm, or the
    /// block's own normed input when it has no shared expert. (The routed experts' sum is not
    /// known yet, nor the next layer's norm; with the shared expert's output on the residual a
    /// predictor's recall rises, see tests/hybrid_lookahead.rs.)
    pub fn lookahead(&self, t: usize, out: &mut Vec<f32>) {
        let h = self.norm.len();
        out.clear();
        match self.shared {
            Some(y) => {
                out.extend_from_slice(&self.residual[t * h..(t + 1) * h]);
                add_inplace(out, &y[t * h..(t + 1) * h]);
                rms_norm_inplace(out, self.norm, self.eps);
            }
            None => out.extend_from_slice(&self.normed[t * h..(t + 1) * h]),
        }
    }
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
        // on the stack for one token's experts; a prompt's many spill to the heap
        let mats: SmallVec<[ExpertMats<'_>; 16]> =
            q.used.iter().map(|&e| self.0.expert(q.layer, e)).collect::<Result<_, _>>()?;
        each(q.used, &mats)
    }
}
