//! Routed experts streamed from the package: the store (reads), the pool (cache + I/O
//! workers), the next-layer predictor, their counters, and the simulator that replays routing
//! traces against every policy.

pub mod coactivation;
pub mod faults;
pub mod policy;
pub mod pool;
pub mod predict;
pub mod route_model;
pub mod routing_log;
pub mod sim;
mod source;
pub mod stats;
pub mod store;

use std::sync::Arc;

use moescope_kernels::Isa;

pub use policy::PolicyKind;
pub use pool::{CacheConfig, ExpertCache};
pub use predict::Predictor;
pub use store::IoMode;

use crate::package::{Package, PackageError};

/// How experts are streamed.
#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
    /// Pool size; None = no pool when the package fits in half of the memory the process may
    /// use (experts copied with the dense weights), else the pool `auto` sizes
    /// (`engine::sizing`).
    pub budget_bytes: Option<u64>,
    /// `--cache-mb auto`: a pool sized from the memory allowance even when the package fits.
    pub auto: bool,
    /// Run an explicit budget whose memory plan exceeds the allowance (with a warning) instead
    /// of refusing it.
    pub force: bool,
    pub policy: PolicyKind,
    pub prefetch: bool,
    pub io_workers: usize,
    /// None = O_DIRECT when the pool is smaller than the experts, else buffered.
    pub io: Option<IoMode>,
    pub verify: bool,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            budget_bytes: None,
            policy: PolicyKind::Foresight,
            prefetch: true,
            io_workers: DEFAULT_IO_WORKERS,
            io: None,
            verify: true,
            auto: false,
            force: false,
        }
    }
}

/// A layer's misses are read at once, one per worker (with more than one, the first takes
/// demand reads only): 4-5 blob-sized reads a layer on the Qwen3-30B-A3B shape, and a disk
/// delivers its bandwidth only with several reads in flight. Idle workers cost a blocked
/// thread each.
pub const DEFAULT_IO_WORKERS: usize = 8;

/// The streaming machinery of one engine.
pub struct Experts {
    /// The package the experts are read from (their blobs are viewed through its layout).
    pkg: Arc<Package>,
    pub cache: Arc<ExpertCache>,
    pub predictor: Predictor,
    /// Bytes of all expert blobs in the package.
    pub total_bytes: u64,
    pub io: IoMode,
}

impl Experts {
    /// Start streaming `pkg`'s experts. `routers[li]` is MoE layer li's router tensor index.
    /// Returns warnings (an O_DIRECT fallback) beside the machinery.
    pub fn start(
        pkg: Arc<Package>,
        routers: Vec<crate::model::Router>,
        cfg: StreamConfig,
        isa: Isa,
    ) -> Result<(Experts, Vec<String>), PackageError> {
        let c = pkg.meta.model.clone();
        let total_bytes = pkg.sizes().experts;
        let budget = cfg.budget_bytes.unwrap_or_else(|| {
            let half = crate::sysinfo::available_memory_bytes() / 2;
            let all = if total_bytes <= half { total_bytes } else { half };
            match pkg.meta.default_pool_fraction {
                Some(f) if f > 0.0 => ((total_bytes as f64 * f) as u64).min(all),
                _ => all,
            }
        });
        let io = cfg.io.unwrap_or(if budget < total_bytes { IoMode::Direct } else { IoMode::Buffered });
        let (store, warning) = store::ExpertStore::open(&pkg, io, cfg.verify)?;
        let io = store.mode();
        let cache = Arc::new(ExpertCache::new(
            store,
            routers.len(),
            c.num_experts,
            c.num_experts_per_tok,
            CacheConfig {
                budget_bytes: budget,
                policy: cfg.policy,
                prefetch: cfg.prefetch,
                io_workers: cfg.io_workers,
            },
        ));
        let predictor = Predictor::start(pkg.clone(), routers, cache.clone(), isa);
        Ok((Experts { pkg, cache, predictor, total_bytes, io }, warning.into_iter().collect()))
    }
}
