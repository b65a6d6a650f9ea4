//! `/metrics`: Prometheus text with llama-server's names (`llamacpp:`), so dashboards made for
//! it work, plus the expert pool's counters under `moescope_`. The engine thread adds to the
//! counters as it goes (prompt tokens after each prompt chunk, predicted tokens after each
//! token), so a scrape during a reply sees it progress.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::experts::Experts;

#[derive(Debug, Default)]
pub struct Metrics {
    pub prompt_tokens: AtomicU64,
    pub prompt_us: AtomicU64,
    pub predicted_tokens: AtomicU64,
    pub predicted_us: AtomicU64,
    /// Forward passes (steps: each holds every running request's prompt chunk or token).
    pub decodes: AtomicU64,
    /// Requests over all forward passes (each pass counts those it held).
    pub busy_slots: AtomicU64,
    pub processing: AtomicU64,
    pub queued: AtomicU64,
    pub requests: AtomicU64,
    pub rejected_full: AtomicU64,
    pub cancelled: AtomicU64,
    pub errors: AtomicU64,
    /// Prompt tokens taken from the KV cache instead of evaluated.
    pub cached_tokens: AtomicU64,
    /// Most tokens one request has held (prompt and reply).
    pub tokens_max: AtomicU64,
    /// Tokens the slots' caches hold now, and what they could hold (slots x context).
    pub kv_tokens: AtomicU64,
    pub kv_capacity: AtomicU64,
    /// Routed experts the steps read (distinct per layer and step), and the tokens' choices of
    /// them (tokens x top-k): choices / reads is how many sequences share a read.
    pub expert_reads: AtomicU64,
    pub expert_choices: AtomicU64,
    /// Requests the prefix cache started, the tokens it gave them, and its bytes now.
    pub prefix_hits: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    pub prefix_bytes: AtomicU64,
}

fn line(out: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

impl Metrics {
    pub fn render(&self, experts: Option<&Experts>) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed) as f64;
        let mut o = String::new();
        let (pt, ps) = (g(&self.prompt_tokens), g(&self.prompt_us) / 1e6);
        let (dt, ds) = (g(&self.predicted_tokens), g(&self.predicted_us) / 1e6);
        let rate = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
        line(&mut o, "llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", pt);
        line(&mut o, "llamacpp:prompt_seconds_total", "counter", "Prompt process time.", ps);
        line(&mut o, "llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.", dt);
        line(&mut o, "llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time.", ds);
        line(&mut o, "llamacpp:n_decode_total", "counter", "Total number of forward passes.", g(&self.decodes));
        line(
            &mut o,
            "llamacpp:n_busy_slots_per_decode",
            "counter",
            "Average number of busy slots per forward pass.",
            rate(g(&self.busy_slots), g(&self.decodes)),
        );
        line(&mut o, "llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", rate(pt, ps));
        line(
            &mut o,
            "llamacpp:predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            rate(dt, ds),
        );
        line(&mut o, "llamacpp:requests_processing", "gauge", "Number of requests processing.", g(&self.processing));
        line(&mut o, "llamacpp:requests_deferred", "gauge", "Number of requests deferred.", g(&self.queued));
        line(&mut o, "llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.", g(&self.tokens_max));
        let (kv, cap) = (g(&self.kv_tokens), g(&self.kv_capacity));
        line(
            &mut o,
            "llamacpp:kv_cache_usage_ratio",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            rate(kv, cap),
        );
        line(&mut o, "llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", kv);
        let m = |o: &mut String, name: &str, kind: &str, help: &str, v: f64| {
            line(o, &format!("moescope_{name}"), kind, help, v)
        };
        m(&mut o, "requests_total", "counter", "Requests accepted into the queue.", g(&self.requests));
        m(
            &mut o,
            "requests_rejected_total",
            "counter",
            "Requests refused because the queue was full.",
            g(&self.rejected_full),
        );
        m(
            &mut o,
            "requests_cancelled_total",
            "counter",
            "Requests whose client went away before the end.",
            g(&self.cancelled),
        );
        m(&mut o, "requests_failed_total", "counter", "Requests that ended in an engine error.", g(&self.errors));
        m(&mut o, "queue_depth", "gauge", "Requests waiting for the engine.", g(&self.queued));
        let (reads, choices) = (g(&self.expert_reads), g(&self.expert_choices));
        m(
            &mut o,
            "expert_reads_total",
            "counter",
            "Routed experts read by the forward passes (once per layer and pass).",
            reads,
        );
        m(&mut o, "expert_choices_total", "counter", "Tokens' choices of routed experts (tokens x top-k).", choices);
        m(
            &mut o,
            "experts_read_per_step",
            "gauge",
            "Routed experts read per forward pass, on average.",
            rate(reads, g(&self.decodes)),
        );
        m(
            &mut o,
            "sequences_per_expert_read",
            "gauge",
            "Tokens served per routed expert read, on average.",
            rate(choices, reads),
        );
        m(
            &mut o,
            "prefix_cache_hits_total",
            "counter",
            "Requests started from the prefix cache.",
            g(&self.prefix_hits),
        );
        m(
            &mut o,
            "prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens the prefix cache gave.",
            g(&self.prefix_hit_tokens),
        );
        m(&mut o, "prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.", g(&self.prefix_bytes));
        m(
            &mut o,
            "prompt_cached_tokens_total",
            "counter",
            "Prompt tokens reused from the KV cache.",
            g(&self.cached_tokens),
        );
        if let Some(ex) = experts {
            let s = ex.cache.total_stats();
            let c = |o: &mut String, name: &str, help: &str, v: u64| m(o, name, "counter", help, v as f64);
            c(&mut o, "expert_hits_total", "Expert requests served from the pool.", s.hits);
            c(&mut o, "expert_prefetch_hits_total", "Hits on experts a prefetch brought in.", s.prefetch_hits);
            c(&mut o, "expert_misses_total", "Expert requests that waited for a read.", s.misses);
            c(&mut o, "expert_evictions_total", "Experts evicted from the pool.", s.evictions);
            c(&mut o, "ssd_read_bytes_total", "Bytes of experts read from the package.", s.bytes_read());
            c(&mut o, "ssd_demand_bytes_total", "Bytes read because a layer needed them.", s.bytes_demand);
            c(&mut o, "ssd_prefetch_bytes_total", "Bytes read ahead of need (predicted).", s.bytes_prefetch);
            c(&mut o, "prefetch_useful_bytes_total", "Prefetched bytes a layer then used.", s.prefetch_useful_bytes);
            c(&mut o, "prefetch_wasted_bytes_total", "Prefetched bytes evicted unused.", s.prefetch_wasted_bytes);
            let snap = ex.cache.snapshot();
            m(
                &mut o,
                "pool_resident_bytes",
                "gauge",
                "Bytes of experts in the pool.",
                snap.residency.resident_bytes as f64,
            );
            m(&mut o, "pool_budget_bytes", "gauge", "The pool's byte budget.", snap.residency.budget_bytes as f64);
        }
        o
    }

    pub fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_parses() {
        let m = Metrics::default();
        Metrics::add(&m.prompt_tokens, 300);
        Metrics::add(&m.prompt_us, 1_500_000);
        let text = m.render(None);
        // every sample line: a name Prometheus accepts and a number; each with HELP and TYPE
        let mut names = Vec::new();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, v) = l.split_once(' ').unwrap();
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "{name}");
            v.parse::<f64>().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
            names.push(name);
        }
        assert!(text.contains("llamacpp:prompt_tokens_total 300\n"));
        assert!(text.contains("llamacpp:prompt_tokens_seconds 200\n"));
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
