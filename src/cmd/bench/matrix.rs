//! The tests of `moescope bench`, for every thread count x pool budget x prefetch x KV cache types x depth:
//! each test's warmup and timed repetitions, and the probes around them (the memory's read
//! bandwidth beside each decode repetition, the disk's before and after a thread count's tests).

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use moescope::engine::sampler::Rng;
use moescope::engine::{Engine, Slot};
use moescope::experts::routing_log::RoutingLog;
use moescope::experts::stats::LayerStats;
use moescope::model::{KvTypes, Logits};
use moescope::sysinfo;
use moescope::trace::{self, hist::Latency};
use serde_json::json;

use super::probes::{DiskProbe, Prober, memory_probe_bytes, print_probe};
use super::report::{self as report, Row};
use super::{ModelInfo, Plan, Test};
use crate::cli::BenchArgs;
use crate::cmd::experts_report;
use crate::cmd::run_config::CacheMb;

/// What the matrix measured: the rows, and the probes the report's footer summarises.
pub(super) struct Done {
    pub rows: Vec<Row>,
    /// per thread count: every memory probe of its decode tests
    pub probes: Vec<(usize, Vec<f64>)>,
    /// per thread count: the disk's
    pub disks: Vec<DiskProbe>,
}

/// Where the tests run and what they share.
struct Bench<'a> {
    engine: &'a mut Engine,
    log: &'a mut Option<RoutingLog>,
    a: &'a BenchArgs,
    rng: Rng,
    vocab: u64,
    prober: Option<Prober>,
    /// The KV cache after a depth's tokens (the depth and the cache's types), restored before
    /// each later repetition at that depth instead of evaluating the tokens again, as
    /// llama-bench keeps its depth's state (32,768 tokens took minutes per repetition)
    depth_state: Option<(usize, KvTypes, Slot)>,
}

pub(super) fn run(
    engine: &mut Engine,
    log: &mut Option<RoutingLog>,
    plan: &Plan,
    model: &ModelInfo,
    a: &BenchArgs,
    stdout: &mut impl Write,
) -> Result<Done> {
    let default_budget = engine.pool().map_or(0, |p| p.budget_bytes());
    let budget_of = |engine: &Engine, b: &Option<CacheMb>| match b {
        None => default_budget,
        Some(CacheMb::Auto) => engine.auto_pool_bytes().unwrap_or(default_budget),
        Some(CacheMb::Mib(m)) => (m * (1u64 << 20) as f64) as u64,
    };
    let largest_pool = plan.budgets.iter().map(|b| budget_of(engine, b)).max().unwrap_or(0);
    let decoding = plan.decoding();
    let probe_bytes = memory_probe_bytes(engine, largest_pool, a.roofline && decoding);
    let probing = a.roofline && decoding && probe_bytes.is_some();
    // the disk's side of the roofline when experts stream, probed around each thread count's tests
    let disk_probing = a.roofline && decoding && engine.pool().is_some();
    if disk_probing && let Some(pool) = engine.pool() {
        // the pool's buffers are allocated on idle cores after loading: not beside the disk probe
        let w = pool.wait_filled(std::time::Duration::from_secs(60));
        if w.as_millis() >= 100 {
            eprintln!("moescope bench: waited {:.2} s for the pool's buffers before probing the disk", w.as_secs_f64());
        }
    }
    let prober = match probe_bytes.filter(|_| probing) {
        Some(b) => Some(Prober::start(b >> 20)?),
        None => None,
    };
    let vocab = engine.config().vocab_size as u64;
    let mut bench = Bench { engine, log, a, rng: Rng::new(0x6d6f_6573_636f_7065), vocab, prober, depth_state: None };
    let mut done = Done { rows: Vec::new(), probes: Vec::new(), disks: Vec::new() };
    for &t in &plan.threads {
        bench.engine.set_threads(t)?;
        if let (Some(p), Some(bytes)) = (bench.prober.as_mut(), probe_bytes) {
            // once before the tests, for the log: where the machine stands
            let r = p.probe(t)?;
            print_probe(&r, t, &format!("({} MiB probe, before the tests)", bytes >> 20));
        }
        // the disk probed before and after this thread count's tests; its rows wait for the second
        let disk_before =
            if disk_probing { Some(DiskProbe::read(bench.engine, a.experts.io_workers, "")?) } else { None };
        let mut held = Vec::new();
        for budget in &plan.budgets {
            let budget_bytes = budget_of(bench.engine, budget);
            if let Some(CacheMb::Mib(_)) = budget
                && let Some(w) = bench.engine.check_pool(budget_bytes, a.experts.force).map_err(anyhow::Error::msg)?
            {
                eprintln!("warning: {w}");
            }
            for (&prefetch, &kv) in plan.prefetches.iter().flat_map(|p| plan.kv.iter().map(move |k| (p, k))) {
                if let Some(pool) = bench.engine.pool() {
                    pool.set_budget(budget_bytes);
                    pool.set_prefetch(prefetch);
                }
                bench.engine.set_kv_types(kv).map_err(anyhow::Error::msg)?;
                for (&depth, test) in plan.depths.iter().flat_map(|d| plan.tests.iter().map(move |t| (d, t))) {
                    let row = bench.test(test, depth, t)?;
                    let row = with_model(row, model);
                    if let Some(p) = &row.read_gbps_probes {
                        match done.probes.iter_mut().find(|(pt, _)| *pt == t) {
                            Some((_, all)) => all.extend(p),
                            None => done.probes.push((t, p.clone())),
                        }
                    }
                    if disk_before.is_some() {
                        held.push(row);
                    } else {
                        report::print_row(stdout, plan.format, &row)?;
                        done.rows.push(row);
                    }
                }
            }
        }
        if let Some(before) = disk_before {
            let disk = DiskProbe::around(bench.engine, a.experts.io_workers, t, before)?;
            for mut row in held {
                disk.fill(&mut row);
                report::print_row(stdout, plan.format, &row)?;
                done.rows.push(row);
            }
            done.disks.push(disk);
        }
    }
    Ok(done)
}

/// A test's row with what it says of the model, and its roofline shares where probed.
fn with_model(row: Row, model: &ModelInfo) -> Row {
    let weight_gbps = row.decode_latency.map(|_| row.avg_ts * model.weight_bytes as f64 / 1e9);
    let mut row = Row {
        model_filename: model.filename.clone(),
        model_type: model.model_type.clone(),
        model_size: model.size,
        model_n_params: model.n_params,
        quant: model.quant.clone(),
        weight_bytes_per_token: model.weight_bytes,
        weight_bits_per_weight: row.decode_latency.map(|_| model.bits_per_weight()),
        weight_gbps,
        ..row
    };
    if let Some(p) = &row.read_gbps_probes {
        let shares = roofline_shares(&row.samples_ts, model.weight_bytes, p);
        row.read_gbps = Some(report::mean_sd(p).0);
        row.roofline_pct = Some(median(&shares));
        row.roofline_pct_reps = Some(shares);
    }
    row
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

/// What one test measured over its timed repetitions.
#[derive(Default)]
struct Timed {
    samples_ns: Vec<u64>,
    lat: Latency,
    ttft: Latency,
    /// the pool's counters over the timed tests alone (not the depth's tokens)
    stats: LayerStats,
    /// the disk's busy time over the timed repetitions (decode): how little it idled
    busy_ns: u64,
    /// --roofline: the read bandwidth just before the first timed repetition and after each
    probes: Vec<f64>,
}

impl Bench<'_> {
    /// One test at the engine's current settings: warmup, then timed repetitions (each starting
    /// from an empty pool and page cache when `--cold`, and from `depth` random tokens in the KV
    /// cache: evaluated untimed the first time, restored from a copy after).
    fn test(&mut self, test: &Test, depth: usize, threads: usize) -> Result<Row> {
        let _span = trace::span("bench_test").arg("test", test.name(depth)).arg("threads", threads);
        let a = self.a;
        let mut m = Timed::default();
        for rep in 0..a.warmup + a.repetitions {
            let timed = rep >= a.warmup;
            self.engine.reset();
            if depth > 0 {
                let kv = self.engine.kv_types();
                match &self.depth_state {
                    Some((d, t, s)) if (*d, *t) == (depth, kv) && self.engine.restore_sequence(s) => {}
                    _ => {
                        let ids = self.ids(depth);
                        self.engine.eval(&ids, Logits::Last, self.log)?;
                        self.depth_state = self.engine.save_sequence().map(|s| (depth, kv, s));
                    }
                }
            }
            if let (Some(pool), true) = (self.engine.pool(), a.cold) {
                // after the depth's tokens: a cold test starts from an empty pool whatever filled it
                pool.clear();
            }
            let stats0 = self.engine.pool().map(|p| p.total_stats());
            match test {
                Test::Prompt(n) => self.prompt(*n, timed, &mut m)?,
                Test::Gen(n) => self.generate(*n, threads, timed, &mut m)?,
            }
            if let (true, Some(s0), Some(pool)) = (timed, stats0, self.engine.pool()) {
                m.stats.add(&pool.total_stats().sub(&s0));
            }
        }
        Ok(self.row(test, depth, threads, m))
    }

    fn ids(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| (self.rng.next_u64() % self.vocab) as u32).collect()
    }

    /// One repetition of ppN.
    fn prompt(&mut self, n: usize, timed: bool, m: &mut Timed) -> Result<()> {
        let ids = self.ids(n);
        let mut counters = self.engine.expert_counters();
        let t0 = Instant::now();
        self.engine.eval(&ids, Logits::Last, self.log)?;
        let ns = t0.elapsed().as_nanos() as u64;
        // the same counter tracks as a run's, the prompt's on a track of its own
        self.engine.trace_step_counters("prefill", n, ns as f64 / 1e6, &mut counters);
        if timed {
            m.samples_ns.push(ns);
            m.ttft.record_ns(ns);
        }
        Ok(())
    }

    /// One repetition of tgN, with the memory probes around it when asked.
    fn generate(&mut self, n: usize, threads: usize, timed: bool, m: &mut Timed) -> Result<()> {
        // the disk's busy time is read inside the timed window (after its start, before its
        // end), so the share can never pass 100% by the few ns between the two reads
        if let (true, true, Some(p)) = (timed, m.probes.is_empty(), self.prober.as_mut()) {
            m.probes.push(p.probe(threads)?.best());
        }
        let t0 = Instant::now();
        let busy0 = self.engine.pool().map_or(0, |p| p.disk_busy_ns());
        let mut counters = self.engine.expert_counters();
        for _ in 0..n {
            let id = (self.rng.next_u64() % self.vocab) as u32;
            let s = Instant::now();
            self.engine.eval(&[id], Logits::Last, self.log)?;
            let ns = s.elapsed().as_nanos() as u64;
            self.engine.trace_step_counters("decode", 1, ns as f64 / 1e6, &mut counters);
            if timed {
                m.lat.record_ns(ns);
            }
        }
        if timed {
            m.busy_ns += self.engine.pool().map_or(0, |p| p.disk_busy_ns()) - busy0;
            m.samples_ns.push(t0.elapsed().as_nanos() as u64);
            if let Some(p) = self.prober.as_mut() {
                m.probes.push(p.probe(threads)?.best());
            }
        }
        Ok(())
    }

    /// The row of a test's timed repetitions (the model's columns filled in by the caller).
    fn row(&self, test: &Test, depth: usize, threads: usize, m: Timed) -> Row {
        let (a, engine) = (self.a, &*self.engine);
        let n_tokens = test.tokens();
        let samples_ts: Vec<f64> = m.samples_ns.iter().map(|&ns| n_tokens as f64 * 1e9 / ns as f64).collect();
        let (avg_ts, stddev_ts) = report::mean_sd(&samples_ts);
        let (avg_ns, stddev_ns) = report::mean_sd(&m.samples_ns.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let is_gen = matches!(test, Test::Gen(_));
        let experts = engine.pool().map(|pool| {
            let tokens = (n_tokens * a.repetitions).max(1);
            // experts_json reports the counters since a snapshot: the one that leaves the timed sum
            let since = pool.total_stats().sub(&m.stats);
            let mut e = experts_report::experts_json(engine, &since, tokens);
            e["mode"] = json!(if a.cold { "cold" } else { "warm" });
            if is_gen {
                let wall: u64 = m.samples_ns.iter().sum();
                e["io_busy_pct"] = json!(if wall == 0 { 0.0 } else { 100.0 * m.busy_ns as f64 / wall as f64 });
            }
            e
        });
        Row {
            build_commit: format!("moescope {}", env!("CARGO_PKG_VERSION")),
            cpu_info: sysinfo::cpu_model(),
            model_filename: String::new(),
            model_type: String::new(),
            model_size: 0,
            model_n_params: 0,
            quant: String::new(),
            n_threads: threads,
            isa: engine.isa().name().into(),
            type_k: engine.kv_types().k.name().into(),
            type_v: engine.kv_types().v.name().into(),
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
            samples_ns: m.samples_ns,
            samples_ts,
            decode_latency: is_gen.then(|| m.lat.summary()),
            ttft: (!is_gen).then(|| m.ttft.summary()),
            weight_bytes_per_token: 0,
            weight_bits_per_weight: None,
            weight_gbps: None,
            read_gbps: None,
            read_gbps_probes: (!m.probes.is_empty()).then_some(m.probes),
            roofline_pct: None,
            roofline_pct_reps: None,
            peak_rss_bytes: sysinfo::peak_rss_bytes(),
            expected_memory_bytes: engine.memory_plan().total,
            experts,
        }
    }
}
