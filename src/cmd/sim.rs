//! `moescope sim`: replay a routing trace against the pool's policies and Belady's optimum at
//! several budgets (no model needed), or write a synthetic trace with locality.

use std::io::Write;

use anyhow::{Context, Result, bail};
use moescope::experts::routing_log::{self, RoutingLog};
use moescope::experts::sim::{self, SimPolicy};
use moescope::model::Observer;
use moescope::model_config::{MAX_EXPERTS, MAX_LAYERS};
use serde_json::json;

use crate::cli::SimArgs;

/// The most token-layer records a synthetic trace holds (a 10,000-token run of a 94-layer model
/// has ~1 M): they are built in memory first.
const MAX_RECORDS: usize = 1 << 24;

fn list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>> {
    s.split(',').map(|x| x.trim().parse::<T>().map_err(|_| anyhow::anyhow!("{flag}: '{x}' is not a number"))).collect()
}

pub fn run(a: &SimArgs) -> Result<()> {
    if let Some(out) = &a.synthetic {
        if a.top_k == 0 || a.top_k > a.experts || a.layers == 0 || a.tokens == 0 {
            bail!("--synthetic needs 0 < --top-k <= --experts, and positive --layers and --tokens");
        }
        if !(0.0..=1.0).contains(&a.repeat) || a.zipf.is_nan() || a.zipf < 0.0 {
            bail!("--repeat must be in [0, 1] and --zipf >= 0");
        }
        // the records are built in memory before they are written
        if a.layers > MAX_LAYERS || a.experts > MAX_EXPERTS || a.layers.saturating_mul(a.tokens) > MAX_RECORDS {
            bail!(
                "--synthetic takes at most {MAX_LAYERS} --layers, {MAX_EXPERTS} --experts and {MAX_RECORDS} \
                 --layers x --tokens records"
            );
        }
        let (h, recs) =
            sim::synthetic(a.layers, a.experts, a.top_k, a.tokens, a.zipf, a.repeat, a.seed, a.bytes_per_expert);
        let mut log = RoutingLog::create(out, &h).with_context(|| format!("creating {}", out.display()))?;
        let mut pass = None;
        for r in &recs {
            if pass != Some(r.p) {
                pass = Some(r.p);
                log.begin_pass();
            }
            log.routing(r.l, r.t, &r.e, &r.w, &[]);
        }
        log.finish().with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {} ({} tokens x {} layers, {})", out.display(), a.tokens, a.layers, h.model);
        return Ok(());
    }
    let Some(file) = &a.file else { bail!("give a routing trace file (or --synthetic OUT)") };
    let (h, mut recs) = routing_log::read(file).map_err(anyhow::Error::msg)?;
    if a.decode_only {
        recs = sim::decode_only(recs);
        if recs.is_empty() {
            bail!("{}: no pass of one token to replay (--decode-only)", file.display());
        }
    }
    let steps = sim::steps(&recs);
    let tokens = recs.iter().map(|r| (r.p, r.t)).collect::<std::collections::HashSet<_>>().len();
    let all = h.moe_layers.len() * h.num_experts;
    let budgets: Vec<(String, usize)> = match (&a.cache_mb, &a.cache_pct) {
        (Some(mb), _) => list::<f64>("--cache-mb", mb)?
            .into_iter()
            .map(|m| (format!("{m} MiB"), ((m * (1u64 << 20) as f64) as u64 / h.bytes_per_expert.max(1)) as usize))
            .collect(),
        (None, pct) => list::<f64>("--cache-pct", pct.as_deref().unwrap_or("25,50,75"))?
            .into_iter()
            .map(|p| (format!("{p}%"), ((p / 100.0) * all as f64).round() as usize))
            .collect(),
    };
    let policies: Vec<SimPolicy> =
        a.policy.split(',').map(|p| SimPolicy::parse(p.trim()).map_err(anyhow::Error::msg)).collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for (label, slots) in &budgets {
        let slots = (*slots).clamp(h.top_k.max(1), all.max(1));
        let best = sim::simulate(&h, &steps, slots, SimPolicy::Belady);
        for &p in &policies {
            let r = if p == SimPolicy::Belady { best } else { sim::simulate(&h, &steps, slots, p) };
            rows.push(json!({
                "budget": label, "slots": slots, "budget_pct": 100.0 * slots as f64 / all as f64,
                "policy": p.name(), "hits": r.hits, "misses": r.misses, "hit_pct": r.hit_pct,
                "read_gb": r.bytes_read as f64 / 1e9,
                "read_mb_per_token": if tokens == 0 { 0.0 } else { r.bytes_read as f64 / 1e6 / tokens as f64 },
                "belady_hit_pct": best.hit_pct, "gap_to_belady_pts": best.hit_pct - r.hit_pct,
            }));
        }
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        let doc = json!({"trace": file.display().to_string(), "model": h.model, "layers": h.moe_layers.len(),
                         "experts": h.num_experts, "top_k": h.top_k, "bytes_per_expert": h.bytes_per_expert,
                         "tokens": tokens, "results": rows});
        writeln!(out, "{doc}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{}: {} ({} MoE layers x {} experts, top-{}, {} tokens, {:.2} MB per expert)",
        file.display(),
        h.model,
        h.moe_layers.len(),
        h.num_experts,
        h.top_k,
        tokens,
        h.bytes_per_expert as f64 / 1e6
    )?;
    writeln!(out, "| budget | slots | policy | hit % | misses | MB read / token | gap to Belady |")?;
    writeln!(out, "| ---: | ---: | --- | ---: | ---: | ---: | ---: |")?;
    for r in &rows {
        writeln!(
            out,
            "| {} | {} | {} | {:.1} | {} | {:.1} | {:.1} pts |",
            r["budget"].as_str().unwrap_or(""),
            r["slots"],
            r["policy"].as_str().unwrap_or(""),
            r["hit_pct"].as_f64().unwrap_or(0.0),
            r["misses"],
            r["read_mb_per_token"].as_f64().unwrap_or(0.0),
            r["gap_to_belady_pts"].as_f64().unwrap_or(0.0)
        )?;
    }
    Ok(())
}
