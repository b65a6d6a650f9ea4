//! `moescope bench` end to end: llama-bench's table, JSON with its field names (and only JSON
//! on stdout), CSV, and a valid trace.

mod common;

use common::trace_check::check;
use common::*;
use serde_json::Value;

#[test]
fn json_has_llama_bench_fields_and_nothing_else_on_stdout() {
    let (d, p) = convert("wide", "q4");
    let o = moescope(
        &["bench", "-m", p.to_str().unwrap(), "-p", "16,32", "-n", "8", "-r", "2", "-t", "1,2", "-o", "json"],
        d.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_str(&stdout(&o)).expect("stdout is exactly one JSON document");
    let rows = rows.as_array().unwrap();
    // (pp16, pp32, tg8) x (1, 2 threads)
    assert_eq!(rows.len(), 6);
    let tests: Vec<(String, u64)> =
        rows.iter().map(|r| (r["test"].as_str().unwrap().to_string(), r["n_threads"].as_u64().unwrap())).collect();
    assert_eq!(tests[..3], [("pp16".into(), 1), ("pp32".into(), 1), ("tg8".into(), 1)]);
    assert_eq!(tests[3].1, 2);
    for r in rows {
        for k in [
            "n_prompt",
            "n_gen",
            "n_threads",
            "avg_ts",
            "stddev_ts",
            "samples_ts",
            "samples_ns",
            "avg_ns",
            "model_size",
            "model_type",
            "model_n_params",
            "peak_rss_bytes",
            "weight_bytes_per_token",
        ] {
            assert!(!r[k].is_null(), "missing {k} in {r}");
        }
        let samples = r["samples_ts"].as_array().unwrap();
        assert_eq!(samples.len(), 2, "-r 2");
        let mean = samples.iter().map(|x| x.as_f64().unwrap()).sum::<f64>() / 2.0;
        assert!((mean - r["avg_ts"].as_f64().unwrap()).abs() <= 1e-6 * mean, "avg_ts is the mean of samples_ts");
        // each sample is tokens / time
        let n = r["n_prompt"].as_u64().unwrap() + r["n_gen"].as_u64().unwrap();
        for (ts, ns) in samples.iter().zip(r["samples_ns"].as_array().unwrap()) {
            let want = n as f64 * 1e9 / ns.as_f64().unwrap();
            assert!((ts.as_f64().unwrap() - want).abs() <= 1e-6 * want);
        }
        let is_gen = r["test"].as_str().unwrap().starts_with("tg");
        // a prefill test has n_gen 0, a decode test n_prompt 0 (as llama-bench)
        if is_gen {
            assert_eq!(r["n_prompt"], 0);
            let l = &r["decode_latency"];
            assert_eq!(l["count"], 16, "8 tokens x 2 repetitions");
            assert!(l["p50_ms"].as_f64().unwrap() <= l["p99_ms"].as_f64().unwrap());
            assert!(r["weight_gbps"].as_f64().unwrap() > 0.0);
        } else {
            assert_eq!(r["n_gen"], 0);
            assert!(r["decode_latency"].is_null());
            assert_eq!(r["ttft"]["count"], 2, "one time-to-first-token per repetition");
        }
        assert_eq!(r["model_type"], "qwen3_moe 2L 64x top-8");
        assert_eq!(r["model_size"].as_u64().unwrap(), std::fs::metadata(&p).unwrap().len());
    }
}

#[test]
fn markdown_and_csv_tables() {
    let (d, p) = convert("single", "q8");
    let o = moescope(
        &["bench", "-m", p.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "1", "--warmup", "0", "-t", "1"],
        d.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("| model | size | params | quant | threads |"), "{out}");
    assert!(lines[2].contains("| pp8 |") && lines[3].contains("| tg4 |"), "{out}");
    assert!(lines[2].contains(" ± "), "t/s as mean ± sd: {out}");
    assert!(out.contains("build: moescope"));
    let o = moescope(
        &["bench", "-m", p.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "csv"],
        d.path(),
    );
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "header and two rows: {out}");
    let cols = lines[0].split(',').count();
    assert!(lines[1..].iter().all(|l| l.split(',').count() == cols), "{out}");
}

/// `-ctk` and `-ctv` lists make a row for every key type x value type, each run on a cache of
/// those types (llama-bench's `type_k` and `type_v`), and a type that is none is refused.
#[test]
fn kv_cache_types_are_a_dimension_of_the_matrix() {
    let (d, p) = convert("single", "q8");
    let args = ["bench", "-m", p.to_str().unwrap(), "-p", "0", "-n", "2", "-r", "1", "--warmup", "0", "-t", "1"];
    let o = moescope(&[&args[..], &["-ctk", "f32,bf16", "-ctv", "f16", "-o", "json"]].concat(), d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<Value> = serde_json::from_str(&stdout(&o)).unwrap();
    let types: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["type_k"].as_str().unwrap(), r["type_v"].as_str().unwrap())).collect();
    assert_eq!(types, [("f32", "f16"), ("bf16", "f16")]);
    let o = moescope(&[&args[..], &["--cache-type-v", "q9"]].concat(), d.path());
    assert_clean_failure(&o, &["-ctv", "q9"]);
}

/// `bench -p 8 -n 4 -r 2 -t 2 EXTRA --trace T` on fixture `name` (q4); the trace, parsed.
fn bench_trace(name: &str, extra: &[&str]) -> Value {
    let (d, p) = convert(name, "q4");
    let t = d.path().join("bench.json");
    let mut args = vec!["bench", "-m", p.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "2", "-t", "2"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--trace", t.to_str().unwrap()]);
    let o = moescope(&args, d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&std::fs::read(&t).unwrap()).unwrap()
}

#[test]
fn bench_trace_is_valid() {
    let doc = bench_trace("single", &[]);
    let s = check(&doc);
    assert_eq!(s.slices["bench_test"], 2);
    // warmup + 2 repetitions of pp8 (one forward each) and of tg4 (4 each)
    assert_eq!(s.slices["forward"], 3 + 12);
    assert_eq!(doc["otherData"]["command"], "bench");
}

/// A bench trace has a run's counter tracks: tokens/s of every decode token and of every prompt
/// evaluation, and, streaming, the expert pool's after each of them.
#[test]
fn bench_trace_has_the_counters_of_a_run() {
    // a pool smaller than the experts, so there is streaming to count
    let doc = bench_trace("odd", &["--cache-mb", "0.1"]);
    let s = check(&doc);
    // bench_trace's -r 2 and -n 4, after bench's one warmup run
    let (runs, n_gen) = (1 + 2, 4);
    assert_eq!(s.counter_names.get("decode"), Some(&(runs * n_gen)), "a tok/s counter per decode token");
    assert_eq!(s.counter_names.get("prefill"), Some(&runs), "a tok/s counter per prompt evaluation");
    for c in ["expert hit %", "expert pool MB", "read queue", "read MB/s", "prefetch MB"] {
        assert_eq!(s.counter_names.get(c), Some(&(runs * (n_gen + 1))), "counter {c}: {:?}", s.counter_names);
    }
    let tok_s: Vec<f64> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && (e["name"] == "decode" || e["name"] == "prefill"))
        .map(|e| e["args"]["tok_s"].as_f64().unwrap())
        .collect();
    assert!(tok_s.iter().all(|&v| v.is_finite() && v > 0.0), "{tok_s:?}");
}

#[test]
fn bad_bench_arguments() {
    let d = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (vec!["bench", "-p", "0", "-n", "0"], "nothing to measure"),
        (vec!["bench", "-p", "1x"], "'1x'"),
        (vec!["bench", "-t", "0"], "-t"),
        (vec!["bench", "-o", "xml"], "xml"),
        (vec!["bench", "-r", "0"], "-r"),
    ] {
        let o = moescope(&args, d.path());
        assert_clean_failure(&o, &[needle]);
    }
}

/// `--roofline`: each decode row carries the read bandwidth probed just before its first timed
/// repetition and just after each, each repetition's share of the roofline (its weight GB/s over
/// the mean of the two probes around it) and their median; prompt rows carry none of it; the
/// table's footer gives the roofline.
#[test]
fn roofline_share_is_each_repetitions_weight_rate_over_the_probes_around_it() {
    let (d, p) = convert("wide", "q4");
    let pkg = p.to_string_lossy().into_owned();
    let args = ["bench", "-m", pkg.as_str(), "-p", "8", "-n", "4", "-r", "3", "-t", "1", "--roofline"];
    let o = moescope(&[&args[..], &["-o", "json"]].concat(), d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_str(&stdout(&o)).expect("json");
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    for key in ["read_gbps", "read_gbps_probes", "roofline_pct", "roofline_pct_reps"] {
        assert!(rows[0][key].is_null(), "pp row has {key}: {}", rows[0]);
    }
    let r = &rows[1];
    let floats = |k: &str| -> Vec<f64> {
        r[k].as_array().unwrap_or_else(|| panic!("{k}: {r}")).iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (probes, ts, shares) = (floats("read_gbps_probes"), floats("samples_ts"), floats("roofline_pct_reps"));
    // one probe before the first repetition and one after each
    assert_eq!((probes.len(), ts.len(), shares.len()), (4, 3, 3), "{r}");
    assert!(probes.iter().all(|&p| p > 0.1 && p.is_finite()), "{r}");
    let g = r["read_gbps"].as_f64().unwrap();
    assert!((g - probes.iter().sum::<f64>() / 4.0).abs() <= 1e-9 * g, "{r}");
    let bytes = r["weight_bytes_per_token"].as_f64().unwrap();
    for i in 0..3 {
        let want = 100.0 * ts[i] * bytes / 1e9 / ((probes[i] + probes[i + 1]) / 2.0);
        assert!((shares[i] - want).abs() <= 1e-9 * want, "repetition {i}: {} vs {want}: {r}", shares[i]);
    }
    let mut sorted = shares.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = r["roofline_pct"].as_f64().unwrap();
    assert!((pct - sorted[1]).abs() <= 1e-9 * pct, "the median of {shares:?}: {r}");
    // the probe's 2 GiB buffer lives in a child process, not in the bench's peak RSS
    assert!(r["peak_rss_bytes"].as_u64().unwrap() < 1 << 30, "{r}");
    let o = moescope(&args, d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("| roof % |") && out.contains("at 1T: roofline") && out.contains("4 probes beside"), "{out}");
}

/// `--roofline` with streamed experts: the disk's side too. Each streamed decode row carries the
/// probed expert-read bandwidth (the mean of a probe before and one after the thread count's
/// tests) and the share of it the run's reads used (t/s x MB per token / MB/s); the same against
/// the disk probed while threads stream memory.
#[test]
fn roofline_gives_the_disk_share_when_experts_stream() {
    let (d, p) = convert("wide", "q4");
    let pkg = p.to_string_lossy().into_owned();
    let args = ["bench", "-m", pkg.as_str(), "-p", "0", "-n", "6", "-r", "1", "-t", "1", "--cache-mb", "0.2", "--cold"];
    let o = moescope(&[&args[..], &["--roofline", "-o", "json"]].concat(), d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("expert reads"), "{}", stderr(&o));
    let rows: Value = serde_json::from_str(&stdout(&o)).expect("json");
    let e = &rows[0]["experts"];
    let (bw, pct, mbt) = (
        e["disk_read_mbps"].as_f64().expect("disk_read_mbps"),
        e["disk_roofline_pct"].as_f64().expect("disk_roofline_pct"),
        e["read_mb_per_token"].as_f64().expect("read_mb_per_token"),
    );
    assert!(bw > 0.0 && mbt > 0.0, "{e}");
    // the disk is probed before and after the thread count's tests, as the memory is
    let dp: Vec<f64> =
        e["disk_read_mbps_probes"].as_array().expect("probes").iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(dp.len(), 2, "{e}");
    assert!((bw - (dp[0] + dp[1]) / 2.0).abs() <= 1e-9 * bw, "{e}");
    let want = 100.0 * rows[0]["avg_ts"].as_f64().unwrap() * mbt / bw;
    assert!((pct - want).abs() <= 1e-9 * want.max(1.0), "{pct} vs {want}");
    // and against a third probe, beside threads streaming memory as decode's do
    let (bl, pl) = (
        e["disk_read_mbps_loaded"].as_f64().expect("disk_read_mbps_loaded"),
        e["disk_loaded_roofline_pct"].as_f64().expect("disk_loaded_roofline_pct"),
    );
    assert!(bl > 0.0, "{e}");
    let want = 100.0 * rows[0]["avg_ts"].as_f64().unwrap() * mbt / bl;
    assert!((pl - want).abs() <= 1e-9 * want.max(1.0), "{pl} vs {want}");
    assert!(stderr(&o).contains("while 1 thread(s) stream memory"), "{}", stderr(&o));
    // the share of decode time with a read in flight: a pool this small reads every token
    let busy = e["io_busy_pct"].as_f64().expect("io_busy_pct");
    assert!(busy > 0.0 && busy <= 100.0 + 1e-6, "{e}");
    // without --roofline there is no probe and no share, but the busy time is measured
    let o = moescope(&[&args[..], &["-o", "json"]].concat(), d.path());
    let rows: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert!(rows[0]["experts"]["disk_roofline_pct"].is_null(), "{}", rows[0]);
    assert!(rows[0]["experts"]["io_busy_pct"].as_f64().is_some(), "{}", rows[0]);
    // the table: the column in the header, every row as wide as the header
    let o = moescope(&args, d.path());
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with('|')).collect();
    assert!(lines[0].contains("| I/O busy % |"), "{out}");
    let cols = lines[0].matches('|').count();
    assert!(lines.len() >= 3 && lines.iter().all(|l| l.matches('|').count() == cols), "{out}");
}

#[test]
fn depth_runs_each_test_after_that_many_tokens_in_the_cache() {
    let (d, p) = convert("wide", "q4");
    let trace = d.path().join("depth.json");
    let o = moescope(
        &[
            "bench",
            "-m",
            p.to_str().unwrap(),
            "-p",
            "4",
            "-n",
            "3",
            "-d",
            "0,20",
            "-r",
            "1",
            "--warmup",
            "0",
            "-t",
            "1",
            "-o",
            "json",
            "--trace",
            trace.to_str().unwrap(),
        ],
        d.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_str(&stdout(&o)).expect("one JSON document");
    let got: Vec<(String, u64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["test"].as_str().unwrap().to_string(), r["n_depth"].as_u64().unwrap()))
        .collect();
    let want: Vec<(String, u64)> =
        [("pp4", 0), ("tg3", 0), ("pp4 @ d20", 20), ("tg3 @ d20", 20)].map(|(t, n)| (t.to_string(), n)).into();
    assert_eq!(got, want);
    // the engine's forward passes, in order, as (tokens, first position): at depth 20 the first
    // test starts after a 20-token pass from position 0, the next from a copy of that cache (no
    // pass), both continuing from position 20
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let fwd: Vec<(u64, u64)> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "forward")
        .map(|e| (e["args"]["tokens"].as_u64().unwrap(), e["args"]["pos"].as_u64().unwrap()))
        .collect();
    assert_eq!(fwd, [(4, 0), (1, 0), (1, 1), (1, 2), (20, 0), (4, 20), (1, 20), (1, 21), (1, 22)]);
    // a depth past the model's positions is refused up front
    let o = moescope(&["bench", "-m", p.to_str().unwrap(), "-p", "4", "-n", "0", "-d", "5000"], d.path());
    assert!(!o.status.success());
    assert!(stderr(&o).contains("5005 positions"), "{}", stderr(&o));
}

/// A decode row's bits a weight are the bytes a token reads over the weights those bytes hold,
/// counted from the package's index (every dense tensor but the embedding, one embedding row,
/// top-k experts' parts per MoE layer): on a Q4_K_M file the file's own sizes, under the 6 bits
/// a Q4_K weight took with f32 scales and mins.
#[test]
fn decode_rows_give_the_bits_a_weight_read() {
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("k.moe");
    let opts = moescope::convert::ConvertOptions::new(moescope::convert::QuantMode::File);
    moescope::convert::convert_gguf(&fixture("gguf/tiny/tiny-q4_k_m.gguf"), &pkg, opts).expect("convert");
    let o = moescope(&["bench", "-m", pkg.to_str().unwrap(), "-p", "0", "-n", "2", "-r", "1", "-o", "json"], d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_str(&stdout(&o)).expect("json");
    let row = &rows[0];
    let p = moescope::package::Package::open(&pkg).expect("open");
    let (c, count) = (&p.meta.model, |s: &[usize]| s.iter().product::<usize>() as u64);
    let mut weights = 0;
    for t in &p.meta.tensors {
        weights += if t.name == "model.embed_tokens.weight" { c.hidden_size as u64 } else { count(&t.shape) };
    }
    let ex = p.meta.experts.as_ref().expect("experts");
    let parts: u64 = ex.parts.iter().map(|t| count(&t.shape)).sum();
    weights += parts * c.num_experts_per_tok as u64;
    let bytes = row["weight_bytes_per_token"].as_u64().expect("bytes");
    let want = 8.0 * bytes as f64 / weights as f64;
    let got = row["weight_bits_per_weight"].as_f64().expect("bits a weight");
    assert!((got - want).abs() < 1e-9, "{got} bits a weight, the index gives {want}");
    assert!(got < 6.0, "{got}");
}
