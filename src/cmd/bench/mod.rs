//! `moescope bench`: prompt processing (`ppN`) and text generation (`tgN`) throughput, measured
//! separately as llama-bench does, on synthetic token ids (no tokenizer cost, no sampling).
//!
//! - ppN: the KV cache is emptied, N random ids are evaluated as one prompt; t/s = N / time.
//! - tgN: the KV cache is emptied, then N single-token forward passes, each on a random id;
//!   t/s = N / time, and each pass's latency goes into a histogram (p50/p90/p99/max).
//!
//! Each test runs `--warmup` times untimed, then `-r` timed repetitions: mean ± sample standard
//! deviation of the repetitions' t/s.
//!
//! The command in four parts: the settings and the engine (here), the matrix of tests
//! (`matrix.rs`: thread counts x pool budgets x prefetch x depths x tests), the roofline's
//! probes around them (`probes.rs`) and the rows and their formats (`report.rs`).

use std::path::Path;

use anyhow::{Result, bail};
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::routing_log::RoutingLog;
use moescope::model::{KvType, KvTypes};
use serde_json::json;

use super::run_config::{self as run, isa_from_env, panels_from_env};
use super::{experts_report, model_arg, trace_out};
use crate::cli::BenchArgs;
use report::Format;

mod matrix;
pub mod peak;
mod probes;
mod report;

fn parse_list(flag: &str, s: &str) -> Result<Vec<usize>> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>().map_err(|_| anyhow::anyhow!("{flag}: '{x}' is not a whole number")))
        .collect::<Result<_>>()?;
    if v.is_empty() {
        bail!("{flag}: empty list");
    }
    Ok(v)
}

enum Test {
    Prompt(usize),
    Gen(usize),
}

impl Test {
    /// llama-bench's name for the test at `depth` tokens of context: `pp512`, `tg128 @ d4096`.
    fn name(&self, depth: usize) -> String {
        let t = match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n) => format!("tg{n}"),
        };
        if depth > 0 { format!("{t} @ d{depth}") } else { t }
    }

    fn tokens(&self) -> usize {
        match self {
            Test::Prompt(n) | Test::Gen(n) => *n,
        }
    }
}

/// The command line's lists and settings, checked before anything loads.
struct Plan {
    prompts: Vec<usize>,
    gens: Vec<usize>,
    depths: Vec<usize>,
    threads: Vec<usize>,
    tests: Vec<Test>,
    /// the KV cache's length: the longest test after the deepest depth
    ctx: usize,
    budgets: Vec<Option<run::CacheMb>>,
    prefetches: Vec<bool>,
    /// every key type x every value type
    kv: Vec<KvTypes>,
    format: Format,
}

impl Plan {
    fn parse(a: &BenchArgs) -> Result<Plan> {
        let prompts = parse_list("-p", &a.n_prompt)?;
        let gens = parse_list("-n", &a.n_gen)?;
        let depths = parse_list("-d", &a.n_depth)?;
        let threads = parse_list("-t", &a.threads)?;
        for &t in &threads {
            super::thread_count("-t", Some(t), t)?;
        }
        if a.repetitions == 0 {
            bail!("-r: at least one repetition");
        }
        let format = Format::parse(&a.output).map_err(anyhow::Error::msg)?;
        super::output_path("--routing-out", a.experts.routing_out.as_deref())?;
        super::output_path("--trace", a.trace.trace.as_deref())?;
        let mut tests: Vec<Test> = prompts.iter().filter(|&&n| n > 0).map(|&n| Test::Prompt(n)).collect();
        tests.extend(gens.iter().filter(|&&n| n > 0).map(|&n| Test::Gen(n)));
        if tests.is_empty() {
            bail!("nothing to measure: -p and -n are all 0");
        }
        let ctx = prompts
            .iter()
            .chain(&gens)
            .copied()
            .max()
            .unwrap_or(1)
            .saturating_add(depths.iter().copied().max().unwrap_or(0))
            .saturating_add(1);
        let budgets: Vec<Option<run::CacheMb>> = match &a.cache_mb {
            Some(l) => l.split(',').map(|x| run::parse_cache_mb(x).map(Some)).collect::<Result<_>>()?,
            None => vec![None],
        };
        let prefetches: Vec<bool> =
            a.prefetch.split(',').map(|x| run::parse_on_off("--prefetch", x.trim())).collect::<Result<_>>()?;
        let types = |flag: &str, l: &str| -> Result<Vec<KvType>> {
            l.split(',').map(|x| x.parse().map_err(|e| anyhow::anyhow!("{flag}: {e}"))).collect()
        };
        let (ks, vs) = (types("-ctk", &a.cache_type_k)?, types("-ctv", &a.cache_type_v)?);
        let kv = ks.iter().flat_map(|&k| vs.iter().map(move |&v| KvTypes { k, v })).collect();
        Ok(Plan { prompts, gens, depths, threads, tests, ctx, budgets, prefetches, kv, format })
    }

    /// The pool's first budget: the smallest number in the list (which also decides O_DIRECT
    /// by default), else `auto` when the list names it.
    fn first_budget(&self) -> Option<String> {
        let smallest = self
            .budgets
            .iter()
            .filter_map(|b| match b {
                Some(run::CacheMb::Mib(m)) => Some(*m),
                _ => None,
            })
            .fold(None, |m: Option<f64>, b| Some(m.map_or(b, |m| m.min(b))));
        match (smallest, self.budgets.contains(&Some(run::CacheMb::Auto))) {
            (Some(m), _) => Some(m.to_string()),
            (None, true) => Some("auto".to_string()),
            (None, false) => None,
        }
    }

    fn decoding(&self) -> bool {
        self.tests.iter().any(|t| matches!(t, Test::Gen(_)))
    }
}

/// What every row says of the model.
struct ModelInfo {
    filename: String,
    model_type: String,
    size: u64,
    n_params: u64,
    quant: String,
    /// weight bytes one decode token reads
    weight_bytes: u64,
    /// and the weights they hold
    weights: u64,
}

impl ModelInfo {
    fn of(engine: &Engine, path: &Path) -> ModelInfo {
        let (cfg, meta, model) = (engine.config(), &engine.package().meta, engine.model());
        let mut model_type = format!(
            "{} {}L {}x top-{}",
            cfg.arch.name(),
            cfg.num_hidden_layers,
            cfg.num_experts,
            cfg.num_experts_per_tok
        );
        if meta.synthetic.is_some() {
            model_type.push_str(" synthetic");
        }
        if let Some(r) = model.route_replay() {
            let file = Path::new(r.name()).file_name().map_or_else(|| r.name().into(), |f| f.to_string_lossy());
            model_type.push_str(&format!(", routes from {file}"));
        }
        if let Some(tol) = model.cache_aware_routing() {
            model_type.push_str(&format!(", cache-aware routing {tol}"));
        }
        ModelInfo {
            filename: path.display().to_string(),
            model_type,
            size: engine.package().file_size(),
            n_params: model.n_params(),
            quant: meta.quant.mode.clone(),
            weight_bytes: model.decode_weight_bytes(),
            weights: model.decode_weights(),
        }
    }

    /// Bits a weight that a decode token reads (values, scales and the rest, as stored).
    fn bits_per_weight(&self) -> f64 {
        8.0 * self.weight_bytes as f64 / self.weights.max(1) as f64
    }
}

pub fn run(a: &BenchArgs) -> Result<()> {
    let plan = Plan::parse(a)?;
    let path = model_arg::resolve(a.model.as_deref(), a.quant.as_deref())?;
    let trace = trace_out::begin(&a.trace);
    let (mut engine, mut log) = load(&plan, a, &path)?;
    let model = ModelInfo::of(&engine, &path);
    let meta = engine.package().meta.clone();
    eprintln!(
        "moescope bench: {} ({}, {:.2} GiB, {:.2} B params), {:.1} MB of weights per decode token ({:.2} bits a weight), {} kernels, {}, {} long-row matrices panel-major",
        meta.name,
        meta.quant.mode,
        model.size as f64 / (1u64 << 30) as f64,
        model.n_params as f64 / 1e9,
        model.weight_bytes as f64 / 1e6,
        model.bits_per_weight(),
        engine.isa(),
        moescope_kernels::prefetch::describe(),
        engine.package().panelled_tensors()
    );
    let mut stdout = std::io::stdout().lock();
    report::print_header(&mut stdout, plan.format)?;
    let done = matrix::run(&mut engine, &mut log, &plan, &model, a, &mut stdout)?;
    report::finish(&mut stdout, plan.format, &done, (model.weight_bytes, model.bits_per_weight()))?;
    experts_report::finish_routing_log(log)?;
    if let Some(t) = trace {
        t.finish(json!({
            "command": "bench",
            "model": meta.name,
            "package": path.display().to_string(),
            "quant": meta.quant.mode,
            "config": meta.model,
            "threads": plan.threads,
            "isa": engine.isa().name(),
            "settings": {"n_prompt": plan.prompts, "n_gen": plan.gens, "n_depth": plan.depths, "repetitions": a.repetitions, "warmup": a.warmup,
                         "type_k": a.cache_type_k, "type_v": a.cache_type_v,
                         "cache_mib": a.cache_mb, "prefetch": plan.prefetches, "cold": a.cold},
        }))?;
    }
    Ok(())
}

/// The engine at the plan's first settings, its background checks done, its routing switches
/// and log started, and what it said on the way.
fn load(plan: &Plan, a: &BenchArgs, path: &Path) -> Result<(Engine, Option<RoutingLog>)> {
    let first = plan.first_budget();
    let stream = run::stream_config(&a.experts, first.as_deref(), plan.prefetches[0])?;
    let stream = (!a.experts.no_stream).then_some(stream);
    let opts = EngineOptions {
        threads: plan.threads[0],
        ctx_size: Some(plan.ctx),
        isa: isa_from_env()?,
        stream,
        panels: panels_from_env()?,
        kv: plan.kv[0],
    };
    let mut engine = Engine::load(path, opts)?;
    for w in engine.warnings() {
        eprintln!("warning: {w}");
    }
    if let Some(s) = engine.sizing() {
        eprintln!("moescope bench: memory: {s}");
    }
    // the experts' checksums are checked in the background after loading: not in any test
    let waited = engine.wait_experts_verified();
    if waited.as_millis() > 0 {
        eprintln!("moescope bench: waited {:.2} s for the experts' checksums before the tests", waited.as_secs_f64());
    }
    let replay_line = experts_report::start_route_replay(&mut engine, a.experts.route_from.as_deref())?;
    let aware_line = experts_report::start_cache_aware(&mut engine, a.experts.aware.cache_aware_routing)?;
    let log = a.experts.routing_out.as_deref().map(|p| experts_report::start_routing_log(&engine, p)).transpose()?;
    eprintln!("moescope bench: {}", experts_report::describe(&engine));
    for line in replay_line.iter().chain(&aware_line) {
        eprintln!("moescope bench: {line}");
    }
    Ok((engine, log))
}

#[cfg(test)]
mod tests {
    #[test]
    fn lists_parse_and_reject_junk() {
        assert_eq!(super::parse_list("-p", "128, 512").unwrap(), vec![128, 512]);
        assert!(super::parse_list("-p", "12x").unwrap_err().to_string().contains("'12x'"));
    }

    #[test]
    fn iso_time_has_the_shape() {
        let t = moescope::sysinfo::utc_now().iso();
        assert_eq!(t.len(), 20);
        assert!(t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T");
    }
}
