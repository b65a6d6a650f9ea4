//! What `run` and `bench` say about expert streaming: the pool, the memory plan, the counters,
//! and the routing trace (`--routing-out`).

use std::path::Path;

use anyhow::{Context, Result};
use moescope::engine::Engine;
use moescope::experts::routing_log::{self, Header, RoutingLog};
use moescope::experts::stats::LayerStats;
use moescope::sysinfo;
use serde_json::{Value, json};

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// One line about the expert pool (or that experts are read through the mapping).
pub fn describe(engine: &Engine) -> String {
    match engine.streamed() {
        None if engine.package().experts_resident() => "experts: copied into memory at start with the dense weights, in huge pages (no pool: the package fits in half the memory; --cache-mb streams)".into(),
        None => "experts: read through the package mapping, resident once touched (--no-stream; --cache-mb streams)".into(),
        Some(ex) => {
            let c = &ex.cache;
            format!(
                "experts: pool {:.0} MiB of {:.0} MiB ({} slots of {:.2} MiB), {} I/O, {} policy, prefetch {}",
                mib(c.budget_bytes()),
                mib(ex.total_bytes),
                c.capacity_slots(),
                mib(c.blob_len() as u64),
                ex.io.name(),
                c.policy().name(),
                if c.prefetch_on() { "on" } else { "off" }
            )
        }
    }
}

/// The memory plan in one line.
pub fn memory_line(engine: &Engine) -> String {
    let m = engine.memory_plan();
    format!(
        "memory: dense {:.0} + experts {:.0} + KV {:.0} + buffers {:.0} + runtime {:.0} = {:.0} MiB expected",
        mib(m.dense),
        mib(m.experts),
        mib(m.kv),
        mib(m.buffers),
        mib(m.runtime),
        mib(m.total)
    )
}

/// Counters since `before`, with the predictor's accuracy, as JSON.
pub fn experts_json(engine: &Engine, before: &LayerStats, tokens: usize) -> Value {
    let Some(ex) = engine.streamed() else {
        return json!(null);
    };
    let d = ex.cache.total_stats().sub(before);
    let p = ex.predictor.stats();
    let per = |x: u64| if tokens == 0 { 0.0 } else { x as f64 / tokens as f64 };
    json!({
        "budget_mib": mib(ex.cache.budget_bytes()),
        // the most buffer bytes the process held at once (the pool's, and one per I/O worker
        // in flight: at most budget + io_workers x blob)
        "buffers_peak_mib": mib(moescope::aligned_buf::peak_bytes() as u64),
        "blob_mib": mib(ex.cache.blob_len() as u64),
        "io_workers": ex.cache.io_workers(),
        "experts_mib": mib(ex.total_bytes),
        "io": ex.io.name(),
        "policy": ex.cache.policy().name(),
        "prefetch": ex.cache.prefetch_on(),
        "hits": d.hits,
        "misses": d.misses,
        "hit_pct": d.hit_pct(),
        "prefetch_hits": d.prefetch_hits,
        "stalls": d.stalls,
        "stall_ms": d.stall_ns as f64 / 1e6,
        "read_mb": d.bytes_read() as f64 / 1e6,
        "demand_mb": d.bytes_demand as f64 / 1e6,
        "prefetch_mb": d.bytes_prefetch as f64 / 1e6,
        "prefetch_useful_mb": d.prefetch_useful_bytes as f64 / 1e6,
        "prefetch_wasted_mb": d.prefetch_wasted_bytes as f64 / 1e6,
        "reloads_soon": d.reloads_soon,
        "evictions": d.evictions,
        "read_mb_per_token": per(d.bytes_read()) / 1e6,
        "stall_ms_per_token": per(d.stall_ns) / 1e6,
        "predictor": {
            "recall": p.recall(),
            "precision": p.precision(),
            "rank_accuracy": p.rank_accuracy(),
            "slot_recall": p.slot_recall(),
            "gate_mass_recall": p.gate_mass_recall(),
            "lead_ms": p.lead_ms(),
            "issued_ranks": ex.predictor.issued_ranks(),
            "late": p.late,
            "read_usefulness": p.read_usefulness(),
            "withheld_share": p.withheld_share(),
            "capped_reads": p.capped,
            "two_ahead": {
                "recall": p.two_ahead.recall(),
                "slot_recall": p.two_ahead.slot_recall(),
                "gate_mass_recall": p.two_ahead.gate_mass_recall(),
                "reads": p.two_ahead_reads,
                "precision": p.two_ahead_precision(),
            },
        },
        "route_from": engine.model().route_replay().map(|r| r.name()),
        "route_tokens_replayed": engine.model().route_replay().map(|r| r.tokens_replayed()),
    })
}

/// With `path`, make `engine` follow that routing trace (`--route-from`); the line to print.
pub fn start_route_replay(engine: &mut Engine, path: Option<&Path>) -> Result<Option<String>> {
    let Some(path) = path else { return Ok(None) };
    let (h, recs) = routing_log::read(path).map_err(anyhow::Error::msg)?;
    let replay = routing_log::replay(&path.display().to_string(), &h, recs).map_err(anyhow::Error::msg)?;
    let line = replay.describe();
    engine.set_route_replay(Some(std::sync::Arc::new(replay)))?;
    Ok(Some(line))
}

/// With `tol`, turn on cache-aware routing; the line to print.
pub fn start_cache_aware(engine: &mut Engine, tol: Option<f32>) -> Result<Option<String>> {
    let Some(tol) = tol else { return Ok(None) };
    if !tol.is_finite() {
        anyhow::bail!("--cache-aware-routing: {tol} is not a probability gap");
    }
    engine.set_cache_aware_routing(Some(tol)).map_err(|e| anyhow::anyhow!("--cache-aware-routing: {e}"))?;
    let note =
        if engine.streamed().is_none() { " (every expert is in memory here: nothing to substitute)" } else { "" };
    Ok(Some(format!(
        "cache-aware routing: a missing expert gives way to a pooled one within {tol} of its router probability (not the exact model){note}"
    )))
}

/// Cache-aware routing's setting and substitutions so far (null when off).
pub fn cache_aware_json(engine: &Engine, tokens: usize) -> Value {
    match engine.model().cache_aware_routing() {
        None => json!(null),
        Some(tol) => {
            let n = engine.model().substitutions();
            json!({"tol": tol, "substitutions": n, "per_token": if tokens == 0 { 0.0 } else { n as f64 / tokens as f64 }})
        }
    }
}

/// Expected memory beside the peak RSS, as JSON.
pub fn memory_json(engine: &Engine) -> Value {
    let m = engine.memory_plan();
    json!({
        "dense_mib": mib(m.dense), "experts_mib": mib(m.experts), "kv_mib": mib(m.kv),
        "buffers_mib": mib(m.buffers), "runtime_mib": mib(m.runtime), "expected_mib": mib(m.total),
        "peak_rss_mib": mib(sysinfo::peak_rss_bytes()),
    })
}

/// Start recording `engine`'s routing into `path` (an observer to pass to its passes).
pub fn start_routing_log(engine: &Engine, path: &Path) -> Result<RoutingLog> {
    let pkg = engine.package();
    let m = &pkg.meta;
    let header = Header {
        moescope_routing: 1,
        model: m.name.clone(),
        moe_layers: m.model.moe_layers(),
        num_experts: m.model.num_experts,
        top_k: m.model.num_experts_per_tok,
        bytes_per_expert: pkg.sizes().blob,
        candidates: None,
    };
    RoutingLog::create(path, &header).with_context(|| format!("creating {}", path.display()))
}

/// Finish the routing trace, if one is being recorded.
pub fn finish_routing_log(log: Option<RoutingLog>) -> Result<()> {
    if let Some(log) = log {
        let p = log.finish().context("writing the routing trace")?;
        eprintln!("moescope: routing trace {}", p.display());
    }
    Ok(())
}

/// One line on how full the pool's buffers ever were against what they may hold: at most the
/// budget plus one blob per I/O worker (a read in flight).
pub fn pool_peak_line(engine: &Engine) -> Option<String> {
    let ex = engine.streamed()?;
    let (budget, blob, workers) = (ex.cache.budget_bytes(), ex.cache.blob_len() as u64, ex.cache.io_workers() as u64);
    Some(format!(
        "expert pool: at most {:.2} MiB of buffers at once (budget {:.2} MiB + {workers} I/O workers x {:.2} MiB = {:.2} MiB allowed)",
        mib(moescope::aligned_buf::peak_bytes() as u64),
        mib(budget),
        mib(blob),
        mib(budget + workers * blob),
    ))
}
