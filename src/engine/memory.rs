//! The memory a loaded engine expects to use, and the expert pool sized against what the
//! process may use (`sizing.rs` plans before loading; this re-plans with what was measured).

use super::{Engine, sizing};
use crate::model::KvCache;

/// The memory the engine expects to use, by part (bytes).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct MemoryPlan {
    /// Dense weights (mapped; resident once touched).
    pub dense: u64,
    /// The expert pool, or all experts when they are read through the mapping.
    pub experts: u64,
    /// The KV cache at full context (a server's: each slot's, and its prefix cache).
    pub kv: u64,
    /// The forward pass's buffers as allocated for a prompt chunk, and one position's logits
    /// (each thread's expert buffers and attention's states, which grow with the batches and
    /// the context served, come on top: `RunState::bytes`).
    pub buffers: u64,
    /// Code, tokenizer, metadata and thread stacks: measured at load (the resident size then,
    /// less the dense weights, which loading reads once to verify them).
    pub runtime: u64,
    pub total: u64,
}

impl Engine {
    /// The pool `auto` would size now, from the memory the process may use and the plan's
    /// measured parts at this context (None without streamed experts).
    pub fn auto_pool_bytes(&self) -> Option<u64> {
        let ex = self.experts.as_ref()?;
        let plan = self.memory_plan();
        let fixed = |_: usize| plan.total - plan.experts;
        let pool =
            sizing::largest_pool(&fixed, self.seq.kv.capacity(), &sizing::allowance(), self.package().sizes().blob);
        Some(pool.min(ex.total_bytes))
    }

    /// Check a pool of `bytes` against the memory the process may use, as at load: Err when its
    /// plan does not fit (unless `force`, which gives a warning instead).
    pub fn check_pool(&self, bytes: u64, force: bool) -> Result<Option<String>, String> {
        let plan = self.memory_plan();
        let fixed = |_: usize| plan.total - plan.experts;
        let blob = self.package().sizes().blob;
        sizing::check_explicit(&fixed, self.seq.kv.capacity(), bytes, &sizing::allowance(), blob, force)
    }

    /// Between replies: size an `auto` pool again from the memory the process may use now
    /// (MemAvailable moves with other programs; a cgroup's limit may be changed), growing or
    /// shrinking it when that moves it by more than 5%. Outputs never depend on the pool. Returns
    /// what changed, in words.
    pub fn resize_auto_pool(&self) -> Option<String> {
        let ex = self.experts.as_ref().filter(|_| self.auto_pool)?;
        let pool = self.auto_pool_bytes()?;
        let now = ex.cache.budget_bytes();
        let min = self.package().sizes().blob * self.model.cfg.num_experts_per_tok as u64;
        if pool < min || (pool as f64 - now as f64).abs() <= 0.05 * now as f64 {
            return None;
        }
        ex.cache.set_budget(pool);
        Some(format!("expert pool {} -> {} MiB (auto, re-checked after the reply)", now >> 20, pool >> 20))
    }

    /// Keys and values in `types` from now on: the sequence starts empty in a cache of the same
    /// length (a no-op when they are the types already). Refused, with the reason, where the
    /// model's heads cannot be kept in them.
    pub fn set_kv_types(&mut self, types: crate::model::KvTypes) -> Result<(), String> {
        KvCache::check_types(&self.model.cfg, types)?;
        if types != self.seq.kv.types() {
            self.seq = super::Slot::new(&self.model.cfg, self.seq.capacity(), types);
        }
        Ok(())
    }

    /// What the engine expects to use: dense weights, the expert pool, the KV cache at full
    /// context and the activations of a prompt chunk.
    pub fn memory_plan(&self) -> MemoryPlan {
        let c = &self.model.cfg;
        let sizes = self.package().sizes();
        let (dense, all_experts) = (sizes.dense, sizes.experts);
        let experts = self.experts.as_ref().map_or(all_experts, |e| e.cache.budget_bytes());
        // a server's slots at full context and its prefix cache
        let kv = self.seqs.slots.max(1) as u64
            * KvCache::bytes_at_capacity(c, self.seq.kv.capacity(), self.seq.kv.types())
            + self.seqs.cache_bytes;
        // the run state as allocated (the last position's logits among them)
        let buffers = self.state.bytes();
        let runtime = self.runtime_bytes;
        MemoryPlan { dense, experts, kv, buffers, runtime, total: dense + experts + kv + buffers + runtime }
    }
}
