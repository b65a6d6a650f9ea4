//! The counter tracks a trace gets after each step: tokens/s, and the expert pool's hit rate,
//! bytes, queue and read rates.

use super::Engine;
use crate::experts::stats::LayerStats;
use crate::trace;

impl Engine {
    /// The pool's counters now, for [`trace_step_counters`](Self::trace_step_counters)'s
    /// per-step differences (None without a pool).
    pub fn expert_counters(&self) -> Option<LayerStats> {
        self.experts.as_ref().map(|e| e.cache.total_stats())
    }

    /// Counter tracks after a step of `tokens` tokens that took `step_ms` (when tracing): the
    /// step's tokens/s on track `track` ("decode" for one token), and the expert pool's hit
    /// rate, bytes, queue and read rates since `prev` (which it moves on).
    pub fn trace_step_counters(&self, track: &'static str, tokens: usize, step_ms: f64, prev: &mut Option<LayerStats>) {
        if !trace::enabled() {
            return;
        }
        trace::counter(track, &[("tok_s", tokens as f64 * 1000.0 / step_ms.max(1e-6))]);
        let (Some(ex), Some(p)) = (self.experts.as_ref(), prev.as_mut()) else { return };
        let snap = ex.cache.snapshot();
        let now = snap.totals.stats;
        let d = now.sub(p);
        *p = now;
        let (res, q) = (&snap.residency, snap.queue);
        trace::counter("expert hit %", &[("token", d.hit_pct()), ("run", now.hit_pct())]);
        trace::counter(
            "expert pool MB",
            &[("resident", res.resident_bytes as f64 / 1e6), ("budget", res.budget_bytes as f64 / 1e6)],
        );
        let queue = [("demand", q.demand as f64), ("prefetch", q.prefetch as f64), ("in_flight", q.in_flight as f64)];
        trace::counter("read queue", &queue);
        trace::counter(
            "read MB/s",
            &[
                ("demand", d.bytes_demand as f64 / 1e3 / step_ms.max(1e-6)),
                ("prefetch", d.bytes_prefetch as f64 / 1e3 / step_ms.max(1e-6)),
            ],
        );
        trace::counter(
            "prefetch MB",
            &[("useful", now.prefetch_useful_bytes as f64 / 1e6), ("wasted", now.prefetch_wasted_bytes as f64 / 1e6)],
        );
    }
}
