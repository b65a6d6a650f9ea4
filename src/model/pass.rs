//! What every block of one forward pass shares, so that a block's `forward` takes the pass and
//! its layer number and nothing else: the compute threads, the weights, where the routed
//! experts come from, who watches, the sequences' caches, the buffers, and where each sequence's
//! rows sit in the batch.

use super::expert_source::ExpertSource;
use super::kv_cache::KvCache;
use super::observer::Observer;
use super::run_state::RunState;
use super::steering::Steering;
use crate::exec::Exec;
use crate::package::Package;

/// Where a forward pass runs: the compute threads and the routed experts' source (the
/// package's own mapping, or streamed experts).
#[derive(Clone, Copy)]
pub struct Runtime<'a> {
    pub exec: &'a Exec,
    pub experts: &'a dyn ExpertSource,
}

/// One sequence's rows of a pass: rows `row0..row0 + n` of the batch, at positions
/// `pos0..pos0 + n` of its own cache.
pub struct SeqRows<'a> {
    /// the sequence's keys and values, and the linear-attention layers' state
    pub kv: &'a mut KvCache,
    pub row0: usize,
    pub n: usize,
    pub pos0: usize,
}

impl SeqRows<'_> {
    /// Its rows of a buffer of rows of `width` values.
    pub fn of<'b>(&self, buf: &'b [f32], width: usize) -> &'b [f32] {
        &buf[self.row0 * width..(self.row0 + self.n) * width]
    }

    pub fn of_mut<'b>(&self, buf: &'b mut [f32], width: usize) -> &'b mut [f32] {
        &mut buf[self.row0 * width..(self.row0 + self.n) * width]
    }

    /// The position of the batch's row `row` in its own sequence.
    pub fn pos_of(seqs: &[SeqRows<'_>], row: usize) -> usize {
        seqs.iter().find(|s| row < s.row0 + s.n).map_or(row, |s| s.pos0 + row - s.row0)
    }
}

/// One forward pass of `t_n` tokens, as the blocks see it: one sequence's tokens at consecutive
/// positions, or a server's batch of several sequences' (a decode token each, or a prompt
/// chunk), their rows one sequence after another. What runs per row (norms, products, routing,
/// experts) runs over all of them at once; what mixes positions (attention, the linear
/// attention's conv and recurrence) runs per sequence over its own cache.
pub struct Pass<'a, 'k> {
    pub exec: &'a Exec,
    pub pkg: &'a Package,
    pub experts: &'a dyn ExpertSource,
    pub obs: &'a mut dyn Observer,
    /// the batch's sequences, in row order
    pub seqs: &'a mut [SeqRows<'k>],
    /// the buffers every block reads and writes (the residual stream, a block's normed input
    /// and its output); a pass uses their first `t_n` rows
    pub st: &'a mut RunState,
    /// what may replace the routers' choice (a replayed trace, cache-aware routing)
    pub steering: &'a Steering,
    pub t_n: usize,
}

impl Pass<'_, '_> {
    /// The first sequence's first position (for the trace).
    pub fn pos0(&self) -> usize {
        self.seqs.first().map_or(0, |s| s.pos0)
    }
}
