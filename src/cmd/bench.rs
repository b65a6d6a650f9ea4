//! `moescope bench`: prompt processing (`ppN`) and text generation (`tgN`) throughput, measured
//! separately as llama-bench does, on synthetic token ids (no tokenizer cost, no sampling).
//!
//! - ppN: the KV cache is emptied, N random ids are evaluated as one prompt; t/s = N / time.
//! - tgN: the KV cache is emptied, then N single-token forward passes, each on a random id;
//!   t/s = N / time, and each pass's latency goes into a histogram (p50/p90/p99/max).
//!
//! Each test runs `--warmup` times untimed, then `-r` timed repetitions: mean ± sample standard
//! deviation of the repetitions' t/s.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use moescope::engine::sampler::Rng;
use moescope::engine::{Engine, EngineOptions};
use moescope::model::Logits;
use moescope::sysinfo;
use moescope::trace::{self, hist::Latency};
use serde_json::json;

use super::bench_probes::{Prober, print_probe, probe_disk};
use super::bench_report::{self as report, Format, Row};
use super::{experts_report, model_arg, run, run::isa_from_env, trace_out};
use crate::cli::BenchArgs;
use moescope::experts::routing_log::RoutingLog;
use moescope::experts::stats::LayerStats;

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
}

pub fn run(a: &BenchArgs) -> Result<()> {
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
    let out = Format::parse(&a.output).map_err(anyhow::Error::msg)?;
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

    let budgets_mib: Vec<Option<run::CacheMb>> = match &a.cache_mb {
        Some(l) => l.split(',').map(|x| run::parse_cache_mb(x).map(Some)).collect::<Result<_>>()?,
        None => vec![None],
    };
    let prefetches: Vec<bool> =
        a.prefetch.split(',').map(|x| run::parse_on_off("--prefetch", x.trim())).collect::<Result<_>>()?;
    let path = model_arg::resolve(a.model.as_deref(), a.quant.as_deref())?;
    let trace = trace_out::begin(&a.trace);
    // the pool starts at the smallest budget, which also decides O_DIRECT by default (auto
    // when the list has no number)
    let smallest = budgets_mib
        .iter()
        .filter_map(|b| match b {
            Some(run::CacheMb::Mib(m)) => Some(*m),
            _ => None,
        })
        .fold(None, |m: Option<f64>, b| Some(m.map_or(b, |m| m.min(b))));
    let first = match (smallest, budgets_mib.contains(&Some(run::CacheMb::Auto))) {
        (Some(m), _) => Some(m.to_string()),
        (None, true) => Some("auto".to_string()),
        (None, false) => None,
    };
    let stream = run::stream_config(&a.experts, first.as_deref(), prefetches[0])?;
    let stream = (!a.experts.no_stream).then_some(stream);
    let opts = EngineOptions { threads: threads[0], ctx_size: Some(ctx), isa: isa_from_env()?, stream };
    let mut engine = Engine::load(&path, opts)?;
    for w in &engine.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(s) = &engine.sizing {
        eprintln!("moescope bench: memory: {s}");
    }
    // the experts' checksums are checked in the background after loading: not in any test
    let waited = engine.wait_experts_verified();
    if waited.as_millis() > 0 {
        eprintln!("moescope bench: waited {:.2} s for the experts' checksums before the tests", waited.as_secs_f64());
    }
    let replay_line = experts_report::start_route_replay(&mut engine, a.experts.route_from.as_deref())?;
    let aware_line = experts_report::start_cache_aware(&mut engine, a.experts.aware.cache_aware_routing)?;
    let mut log =
        a.experts.routing_out.as_deref().map(|p| experts_report::start_routing_log(&engine, p)).transpose()?;
    let default_budget = engine.experts.as_ref().map_or(0, |e| e.cache.budget_bytes());
    let cfg = engine.model.cfg.clone();
    let meta = engine.package().meta.clone();
    let mut model_type =
        format!("{} {}L {}x top-{}", cfg.arch.name(), cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok);
    if meta.synthetic.is_some() {
        model_type.push_str(" synthetic");
    }
    if let Some(r) = engine.model.route_replay() {
        let file = Path::new(r.name()).file_name().map_or_else(|| r.name().into(), |f| f.to_string_lossy());
        model_type.push_str(&format!(", routes from {file}"));
    }
    if let Some(tol) = engine.model.cache_aware_routing() {
        model_type.push_str(&format!(", cache-aware routing {tol}"));
    }
    let weight_bytes = engine.model.decode_weight_bytes();
    let n_params = engine.model.n_params();
    let model_size = engine.package().file_size();
    eprintln!("moescope bench: {}", experts_report::describe(&engine));
    for line in replay_line.iter().chain(&aware_line) {
        eprintln!("moescope bench: {line}");
    }
    eprintln!(
        "moescope bench: {} ({}, {:.2} GiB, {:.2} B params), {:.1} MB of weights per decode token, {} kernels, {}",
        meta.name,
        meta.quant.mode,
        model_size as f64 / (1u64 << 30) as f64,
        n_params as f64 / 1e9,
        weight_bytes as f64 / 1e6,
        engine.exec.isa,
        moescope_kernels::prefetch::describe()
    );

    let mut stdout = std::io::stdout().lock();
    match out {
        Format::Md => writeln!(stdout, "{}", report::MD_HEADER)?,
        Format::Csv => writeln!(stdout, "{}", report::CSV_HEADER)?,
        Format::Json => {}
    }
    let mut rng = Rng::new(0x6d6f_6573_636f_7065);
    let vocab = cfg.vocab_size as u64;
    let mut rows = Vec::new();
    let cold = a.cold;
    // the probe's buffer: 2 GiB (past any cache), less where memory is short; beside the memory
    // plan's largest pool (the pool's buffers are still being allocated now, so what is free now
    // overstates it: a probe sized from that was OOM-killed with the pool under a cgroup limit)
    let allowance = moescope::engine::sizing::allowance();
    let largest_pool = budgets_mib
        .iter()
        .map(|b| match b {
            Some(run::CacheMb::Mib(m)) => (m * (1u64 << 20) as f64) as u64,
            Some(run::CacheMb::Auto) => engine.auto_pool_bytes().unwrap_or(default_budget),
            None => default_budget,
        })
        .max()
        .unwrap_or(0);
    let plan = engine.memory_plan();
    let room = allowance
        .bytes
        .saturating_sub(plan.total - plan.experts + largest_pool + moescope::engine::sizing::headroom(&allowance));
    let probe_bytes = (2usize << 30).min(sysinfo::available_memory_bytes() as usize / 4).min(room as usize);
    let decoding = tests.iter().any(|t| matches!(t, Test::Gen(_)));
    let mem_room = probe_bytes >= (256 << 20);
    if a.roofline && decoding && !mem_room {
        // a tight cap leaves no room beside the pool: the disk's side is still worth having
        eprintln!(
            "moescope bench: --roofline: no memory probe: it needs 256 MiB beside the largest pool ({} MiB) under {}, which leaves {} MiB (a pool {} MiB smaller would leave room); the disk is still probed",
            largest_pool >> 20,
            allowance.source,
            room >> 20,
            ((256u64 << 20).saturating_sub(room) >> 20) + 1
        );
    }
    // per thread count: (threads, every probe of its decode tests)
    let mut probes: Vec<(usize, Vec<f64>)> = Vec::new();
    let probing = a.roofline && decoding && mem_room;
    // the disk's side of the roofline when experts stream, probed around each thread count's tests
    let disk_probing = a.roofline && decoding && engine.experts.is_some();
    let mut disk_probes: Vec<(usize, f64, [f64; 2], f64)> = Vec::new();
    if disk_probing {
        // the pool's buffers are allocated on idle cores after loading: not beside the disk probe
        if let Some(ex) = &engine.experts {
            let w = ex.cache.wait_filled(std::time::Duration::from_secs(60));
            if w.as_millis() >= 100 {
                eprintln!(
                    "moescope bench: waited {:.2} s for the pool's buffers before probing the disk",
                    w.as_secs_f64()
                );
            }
        }
    }
    let mut prober = if probing { Some(Prober::start(probe_bytes >> 20)?) } else { None };
    for &t in &threads {
        engine.set_threads(t)?;
        if let Some(p) = prober.as_mut() {
            // once before the tests, for the log: where the machine stands
            let r = p.probe(t)?;
            print_probe(&r, t, &format!("({} MiB probe, before the tests)", probe_bytes >> 20));
        }
        // the disk probed before and after this thread count's tests; its rows wait for the second
        let disk_before = if disk_probing { Some(probe_disk(&engine, a.experts.io_workers, "")?) } else { None };
        let mut held = Vec::new();
        for budget in &budgets_mib {
            let budget_bytes = match budget {
                None => default_budget,
                Some(run::CacheMb::Auto) => engine.auto_pool_bytes().unwrap_or(default_budget),
                Some(run::CacheMb::Mib(m)) => {
                    let b = (m * (1u64 << 20) as f64) as u64;
                    if let Some(w) = engine.check_pool(b, a.experts.force).map_err(anyhow::Error::msg)? {
                        eprintln!("warning: {w}");
                    }
                    b
                }
            };
            for &prefetch in &prefetches {
                if let Some(ex) = &engine.experts {
                    ex.cache.set_budget(budget_bytes);
                    ex.cache.set_prefetch(prefetch);
                }
                for (&depth, test) in depths.iter().flat_map(|d| tests.iter().map(move |t| (d, t))) {
                    let row =
                        run_test(&mut engine, &mut log, test, depth, t, a, cold, &mut rng, vocab, prober.as_mut())?;
                    let weight_gbps = row.decode_latency.map(|_| row.avg_ts * weight_bytes as f64 / 1e9);
                    let mut row = Row {
                        model_filename: path.display().to_string(),
                        model_type: model_type.clone(),
                        model_size,
                        model_n_params: n_params,
                        quant: meta.quant.mode.clone(),
                        weight_bytes_per_token: weight_bytes,
                        weight_gbps,
                        ..row
                    };
                    if let Some(p) = &row.read_gbps_probes {
                        let shares = roofline_shares(&row.samples_ts, weight_bytes, p);
                        row.read_gbps = Some(report::mean_sd(p).0);
                        row.roofline_pct = Some(median(&shares));
                        row.roofline_pct_reps = Some(shares);
                        match probes.iter_mut().find(|(pt, _)| *pt == t) {
                            Some((_, all)) => all.extend(p),
                            None => probes.push((t, p.clone())),
                        }
                    }
                    if disk_before.is_some() {
                        held.push(row);
                    } else {
                        print_row(&mut stdout, out, &row)?;
                        rows.push(row);
                    }
                }
            }
        }
        if let Some(db) = disk_before {
            let da = probe_disk(&engine, a.experts.io_workers, " after the tests")?;
            // and as decode's reads meet it: beside t threads streaming memory
            let when = format!(" while {t} thread(s) stream memory");
            let dl = sysinfo::under_memory_load(t, || probe_disk(&engine, a.experts.io_workers, &when))?;
            let bps = (db + da) / 2.0;
            disk_probes.push((t, bps, [db, da], dl));
            for mut row in held {
                if let (Some(e), true) = (row.experts.as_mut(), row.decode_latency.is_some()) {
                    // the share of the disk's bandwidth this run's reads kept busy: t/s over
                    // (read bandwidth / bytes read per token)
                    let mbt = e["read_mb_per_token"].as_f64().unwrap_or(0.0);
                    e["disk_read_mbps"] = json!(bps / 1e6);
                    e["disk_read_mbps_probes"] = json!([db / 1e6, da / 1e6]);
                    e["disk_roofline_pct"] = json!(100.0 * row.avg_ts * mbt * 1e6 / bps);
                    e["disk_read_mbps_loaded"] = json!(dl / 1e6);
                    e["disk_loaded_roofline_pct"] = json!(100.0 * row.avg_ts * mbt * 1e6 / dl);
                }
                print_row(&mut stdout, out, &row)?;
                rows.push(row);
            }
        }
    }
    match out {
        Format::Json => writeln!(stdout, "{}", serde_json::to_string_pretty(&rows)?)?,
        Format::Md => writeln!(
            stdout,
            "\nbuild: moescope {} ({}) | CPU: {} ({} cores) | {:.1} MB of weights per decode token{}",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) { "debug" } else { "release" },
            sysinfo::cpu_model(),
            sysinfo::logical_cores(),
            weight_bytes as f64 / 1e6,
            probes
                .iter()
                .map(|(t, p)| {
                    let g = report::mean_sd(p).0;
                    let (lo, hi) = p.iter().fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                    format!(
                        " | read {g:.1} GB/s at {t}T: roofline {:.1} t/s ({} probes beside the decode repetitions, {lo:.1}-{hi:.1}; roof % is each repetition's share of the probes around it, median)",
                        g * 1e9 / weight_bytes.max(1) as f64,
                        p.len()
                    )
                })
                .chain(disk_probes.iter().map(|(t, d, [db, da], dl)| format!(
                    " | expert reads {:.0} MB/s at {t}T (probed {:.0} before, {:.0} after): disk roofline = that / SSD MB per token; {:.0} MB/s while {t} thread(s) stream memory as decode's do (JSON: disk_loaded_roofline_pct)",
                    d / 1e6,
                    db / 1e6,
                    da / 1e6,
                    dl / 1e6
                )))
                .collect::<String>()
        )?,
        Format::Csv => {}
    }
    experts_report::finish_routing_log(log)?;
    if let Some(t) = trace {
        t.finish(json!({
            "command": "bench",
            "model": meta.name,
            "package": path.display().to_string(),
            "quant": meta.quant.mode,
            "config": meta.model,
            "threads": threads,
            "isa": engine.exec.isa.name(),
            "settings": {"n_prompt": prompts, "n_gen": gens, "n_depth": depths, "repetitions": a.repetitions, "warmup": a.warmup,
                         "cache_mib": a.cache_mb, "prefetch": prefetches, "cold": cold},
        }))?;
    }
    Ok(())
}

fn print_row(stdout: &mut impl Write, out: Format, row: &Row) -> Result<()> {
    match out {
        Format::Md => writeln!(stdout, "{}", report::md_row(row))?,
        Format::Csv => writeln!(stdout, "{}", report::csv_row(row))?,
        Format::Json => {}
    }
    stdout.flush()?;
    Ok(())
}

/// Each repetition's share of its roofline, in percent: its weight GB/s (`ts` tokens a second,
/// `weight_bytes` a token) over the mean of the probes just before and just after it (`probes[i]`
/// and `probes[i + 1]` around repetition `i`).
fn roofline_shares(ts: &[f64], weight_bytes: u64, probes: &[f64]) -> Vec<f64> {
    ts.iter()
        .zip(probes.windows(2))
        .map(|(&ts, p)| 100.0 * ts * weight_bytes as f64 / 1e9 / ((p[0] + p[1]) / 2.0))
        .collect()
}

/// The median (the mean of the middle two for an even count); 0 for none.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One test at the engine's current settings: warmup, then timed repetitions (each starting
/// from an empty pool and page cache when `cold`, and from `depth` random tokens evaluated
/// untimed into the emptied KV cache).
#[allow(clippy::too_many_arguments)]
fn run_test(
    engine: &mut Engine,
    log: &mut Option<RoutingLog>,
    test: &Test,
    depth: usize,
    threads: usize,
    a: &BenchArgs,
    cold: bool,
    rng: &mut Rng,
    vocab: u64,
    mut prober: Option<&mut Prober>,
) -> Result<Row> {
    let _span = trace::span("bench_test").arg("test", test.name(depth)).arg("threads", threads);
    let mut samples_ns = Vec::new();
    let (mut lat, mut ttft) = (Latency::new(), Latency::new());
    // the pool's counters over the timed tests alone (not the depth's tokens)
    let mut timed_stats = LayerStats::default();
    // the disk's busy time over the timed repetitions (decode): how little it idled
    let mut busy_ns = 0u64;
    // --roofline: the read bandwidth just before the first timed repetition and after each
    let mut probes = Vec::new();
    for rep in 0..a.warmup + a.repetitions {
        let timed = rep >= a.warmup;
        engine.reset();
        if depth > 0 {
            let ids: Vec<u32> = (0..depth).map(|_| (rng.next_u64() % vocab) as u32).collect();
            engine.eval(&ids, Logits::Last, log)?;
        }
        if let Some(ex) = &engine.experts {
            // after the depth's tokens: a cold test starts from an empty pool whatever filled it
            if cold {
                ex.cache.clear();
            }
        }
        let stats0 = engine.experts.as_ref().map(|ex| ex.cache.total_stats());
        match test {
            Test::Prompt(n) => {
                let ids: Vec<u32> = (0..*n).map(|_| (rng.next_u64() % vocab) as u32).collect();
                let mut counters = engine.expert_counters();
                let t0 = Instant::now();
                engine.eval(&ids, Logits::Last, log)?;
                let ns = t0.elapsed().as_nanos() as u64;
                // the same counter tracks as a run's, the prompt's on a track of its own
                engine.trace_step_counters("prefill", *n, ns as f64 / 1e6, &mut counters);
                if timed {
                    samples_ns.push(ns);
                    ttft.record_ns(ns);
                }
            }
            Test::Gen(n) => {
                // the disk's busy time is read inside the timed window (after its start, before
                // its end), so the share can never pass 100% by the few ns between the two reads
                if let (true, true, Some(p)) = (timed, probes.is_empty(), prober.as_deref_mut()) {
                    probes.push(p.probe(threads)?.best());
                }
                let t0 = Instant::now();
                let busy0 = engine.experts.as_ref().map_or(0, |ex| ex.cache.disk_busy_ns());
                let mut counters = engine.expert_counters();
                for _ in 0..*n {
                    let id = (rng.next_u64() % vocab) as u32;
                    let s = Instant::now();
                    engine.eval(&[id], Logits::Last, log)?;
                    let ns = s.elapsed().as_nanos() as u64;
                    engine.trace_step_counters("decode", 1, ns as f64 / 1e6, &mut counters);
                    if timed {
                        lat.record_ns(ns);
                    }
                }
                if timed {
                    busy_ns += engine.experts.as_ref().map_or(0, |ex| ex.cache.disk_busy_ns()) - busy0;
                    samples_ns.push(t0.elapsed().as_nanos() as u64);
                    if let Some(p) = prober.as_deref_mut() {
                        probes.push(p.probe(threads)?.best());
                    }
                }
            }
        }
        if let (true, Some(s0), Some(ex)) = (timed, stats0, &engine.experts) {
            timed_stats.add(&ex.cache.total_stats().sub(&s0));
        }
    }
    let n_tokens = match test {
        Test::Prompt(n) | Test::Gen(n) => *n,
    };
    let samples_ts: Vec<f64> = samples_ns.iter().map(|&ns| n_tokens as f64 * 1e9 / ns as f64).collect();
    let (avg_ts, stddev_ts) = report::mean_sd(&samples_ts);
    let (avg_ns, stddev_ns) = report::mean_sd(&samples_ns.iter().map(|&x| x as f64).collect::<Vec<_>>());
    let is_gen = matches!(test, Test::Gen(_));
    let experts = engine.experts.as_ref().map(|ex| {
        let tokens = (n_tokens * a.repetitions).max(1);
        // experts_json reports the counters since a snapshot: the one that leaves the timed sum
        let since = ex.cache.total_stats().sub(&timed_stats);
        let mut e = experts_report::experts_json(engine, &since, tokens);
        e["mode"] = json!(if cold { "cold" } else { "warm" });
        if is_gen {
            let wall: u64 = samples_ns.iter().sum();
            e["io_busy_pct"] = json!(if wall == 0 { 0.0 } else { 100.0 * busy_ns as f64 / wall as f64 });
        }
        e
    });
    Ok(Row {
        build_commit: format!("moescope {}", env!("CARGO_PKG_VERSION")),
        cpu_info: sysinfo::cpu_model(),
        model_filename: String::new(),
        model_type: String::new(),
        model_size: 0,
        model_n_params: 0,
        quant: String::new(),
        n_threads: threads,
        isa: engine.exec.isa.name().into(),
        weight_prefetch_bytes: moescope_kernels::prefetch::distance(),
        n_prompt: if is_gen { 0 } else { n_tokens },
        n_gen: if is_gen { n_tokens } else { 0 },
        n_depth: depth,
        test: test.name(depth),
        test_time: sysinfo::utc_now().iso(),
        n_reps: a.repetitions,
        avg_ns: avg_ns as u64,
        stddev_ns: stddev_ns as u64,
        avg_ts,
        stddev_ts,
        samples_ns,
        samples_ts,
        decode_latency: is_gen.then(|| lat.summary()),
        ttft: (!is_gen).then(|| ttft.summary()),
        weight_bytes_per_token: 0,
        weight_gbps: None,
        read_gbps: None,
        read_gbps_probes: (!probes.is_empty()).then_some(probes),
        roofline_pct: None,
        roofline_pct_reps: None,
        peak_rss_bytes: sysinfo::peak_rss_bytes(),
        expected_memory_bytes: engine.memory_plan().total,
        experts,
    })
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
        let t = super::sysinfo::utc_now().iso();
        assert_eq!(t.len(), 20);
        assert!(t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T");
    }
}
