//! Latency histograms (hdrhistogram): per-token decode latency, time to first token, and later
//! read latency, summarized as p50/p90/p99/max.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies in microseconds, 1 µs to 1 hour, 3 significant digits.
pub struct Latency {
    h: Histogram<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    pub fn new() -> Latency {
        // the bounds are constants within hdrhistogram's limits, so this cannot fail
        let h = Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .unwrap_or_else(|_| unreachable!("constant bounds are valid"));
        Latency { h }
    }

    pub fn record_ns(&mut self, ns: u64) {
        self.h.saturating_record((ns / 1000).max(1));
    }

    pub fn record_ms(&mut self, ms: f64) {
        self.record_ns((ms * 1e6).max(0.0) as u64);
    }

    pub fn len(&self) -> u64 {
        self.h.len()
    }

    pub fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    pub fn reset(&mut self) {
        self.h.reset();
    }

    pub fn summary(&self) -> LatencySummary {
        if self.h.is_empty() {
            return LatencySummary::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        LatencySummary {
            count: self.h.len(),
            mean_ms: self.h.mean() / 1000.0,
            p50_ms: ms(self.h.value_at_quantile(0.50)),
            p90_ms: ms(self.h.value_at_quantile(0.90)),
            p99_ms: ms(self.h.value_at_quantile(0.99)),
            max_ms: ms(self.h.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_distribution() {
        // 1..=1000 ms: p50 = 500, p90 = 900, p99 = 990, max = 1000 (within 0.1%)
        let mut l = Latency::new();
        for ms in 1..=1000u64 {
            l.record_ns(ms * 1_000_000);
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        for (got, want) in
            [(s.p50_ms, 500.0), (s.p90_ms, 900.0), (s.p99_ms, 990.0), (s.max_ms, 1000.0), (s.mean_ms, 500.5)]
        {
            assert!((got - want).abs() <= want * 0.001 + 0.001, "{got} vs {want}");
        }
    }
}
