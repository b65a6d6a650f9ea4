//! The model's routing switches: routes replayed from a trace (`--route-from`) or cache-aware
//! routing (`--cache-aware-routing`), never both, and the count of what the latter changed.
//! A MoE block asks for its [`Steer`] once per batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::ModelError;
use super::expert_source::ExpertSource;
use super::route_replay::{ReplayAt, RouteReplay};
use super::router::Steer;

#[derive(Default)]
pub struct Steering {
    /// routes taken from a trace instead of the routers
    replay: Option<Arc<RouteReplay>>,
    /// cache-aware routing's tolerance, and the substitutions it has made
    cache_aware: Option<f32>,
    substitutions: AtomicU64,
}

impl Steering {
    /// Take every MoE block's route from `replay` from now on (None: the routers' own again);
    /// the trace must have the model's `num_experts` and `top_k`.
    pub fn set_route_replay(
        &mut self,
        replay: Option<Arc<RouteReplay>>,
        num_experts: usize,
        top_k: usize,
    ) -> Result<(), ModelError> {
        if replay.is_some() && self.cache_aware.is_some() {
            return Err(ModelError::Unsupported("cache-aware routing cannot steer replayed routes".into()));
        }
        if let Some(r) = &replay {
            r.check_model(num_experts, top_k).map_err(ModelError::Unsupported)?;
        }
        self.replay = replay;
        Ok(())
    }

    pub fn route_replay(&self) -> Option<&RouteReplay> {
        self.replay.as_deref()
    }

    /// Cache-aware routing with tolerance `tol` (an absolute gap in router probability), or
    /// exact routing (None). Not with replayed routes.
    pub fn set_cache_aware_routing(&mut self, tol: Option<f32>) -> Result<(), ModelError> {
        if tol.is_some() && self.replay.is_some() {
            return Err(ModelError::Unsupported("cache-aware routing cannot steer replayed routes".into()));
        }
        if let Some(t) = tol
            && !(0.0..=1.0).contains(&t)
        {
            return Err(ModelError::Unsupported(format!("cache-aware routing tolerance {t} is not in [0, 1]")));
        }
        self.cache_aware = tol;
        Ok(())
    }

    pub fn cache_aware_routing(&self) -> Option<f32> {
        self.cache_aware
    }

    /// Routed experts cache-aware routing replaced so far.
    pub fn substitutions(&self) -> u64 {
        self.substitutions.load(Ordering::Relaxed)
    }

    pub(super) fn count_substitutions(&self, n: usize) {
        self.substitutions.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// What steers MoE layer `moe_layer`'s batch of `t_n` tokens (a replayed trace moves on by
    /// `t_n` tokens of that layer).
    pub(super) fn steer<'a>(&'a self, experts: &'a dyn ExpertSource, moe_layer: usize, t_n: usize) -> Steer<'a> {
        match (&self.replay, self.cache_aware) {
            (Some(r), _) => Steer::Replay(ReplayAt { replay: r, moe_layer, base: r.begin(moe_layer, t_n) }),
            (None, Some(tol)) => Steer::CacheAware { source: experts, moe_layer, tol },
            (None, None) => Steer::Exact,
        }
    }
}
