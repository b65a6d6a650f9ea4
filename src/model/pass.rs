//! What every block of one forward pass shares, so that a block's `forward` takes the pass and
//! its layer number and nothing else: the compute threads, the weights, where the routed
//! experts come from, who watches, the sequence's cache, the buffers, and where the batch sits.

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

/// One forward pass of `t_n` tokens at positions `pos0..pos0 + t_n`, as the blocks see it.
pub struct Pass<'a> {
    pub exec: &'a Exec,
    pub pkg: &'a Package,
    pub experts: &'a dyn ExpertSource,
    pub obs: &'a mut dyn Observer,
    /// the sequence's keys and values, and the linear-attention layers' state
    pub kv: &'a mut KvCache,
    /// the buffers every block reads and writes (the residual stream, a block's normed input
    /// and its output); a pass uses their first `t_n` rows
    pub st: &'a mut RunState,
    /// what may replace the routers' choice (a replayed trace, cache-aware routing)
    pub steering: &'a Steering,
    pub t_n: usize,
    pub pos0: usize,
}
