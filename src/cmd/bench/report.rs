//! `moescope bench` results: one row per test, printed as llama-bench does (markdown table,
//! CSV, or JSON with llama-bench's field names where they exist, plus ours).

use std::io::Write;

use anyhow::Result;
use serde::Serialize;
use serde_json::Value;

use moescope::sysinfo;
use moescope::trace::hist::LatencySummary;

use super::matrix::Done;

/// One test's result. Field names follow llama-bench's JSON where one exists.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub build_commit: String,
    pub cpu_info: String,
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub quant: String,
    pub n_threads: usize,
    pub isa: String,
    /// The KV cache's key and value types (llama-bench's `type_k`, `type_v`).
    pub type_k: String,
    pub type_v: String,
    /// How far ahead the decode kernels prefetched weights in software (0: not at all).
    pub weight_prefetch_bytes: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens already in the KV cache when the test starts (`-d`).
    pub n_depth: usize,
    pub test: String,
    pub test_time: String,
    pub n_reps: usize,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    /// Per-token decode latency over every repetition (decode tests only).
    pub decode_latency: Option<LatencySummary>,
    /// Time to the first token's logits of each repetition, i.e. the prompt's evaluation
    /// (prompt tests only).
    pub ttft: Option<LatencySummary>,
    /// Weight bytes a decode token reads (the roofline's numerator), and what the measured rate
    /// makes of it (decode tests only).
    pub weight_bytes_per_token: u64,
    /// Those bytes' bits a weight read (decode tests only): the file's own where the package
    /// keeps its types' sizes (GGUF's K-quants).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_bits_per_weight: Option<f64>,
    pub weight_gbps: Option<f64>,
    /// With `--roofline` (decode tests): the memory read bandwidth at this thread count, probed
    /// just before the first timed repetition and just after each (`read_gbps_probes`, R + 1 of
    /// them; `read_gbps` their mean), and the decode rate as a share of its roofline (read
    /// bandwidth / weight bytes per token), in percent: each repetition's weight GB/s over the
    /// mean of the two probes around it (`roofline_pct_reps`), and `roofline_pct` the median of
    /// those. A shared host's bandwidth drifts by tens of percent within minutes; the probes
    /// beside each repetition measure it when the repetition ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_gbps_probes: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline_pct: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline_pct_reps: Option<Vec<f64>>,
    pub peak_rss_bytes: u64,
    /// What the engine expects to use (dense + expert pool + KV + buffers + runtime).
    pub expected_memory_bytes: u64,
    /// Expert streaming (cache budget, hit %, SSD MB per token, prefetch) once it lands;
    /// absent until then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Md,
    Json,
    Csv,
}

impl Format {
    pub fn parse(s: &str) -> Result<Format, String> {
        match s {
            "md" => Ok(Format::Md),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            o => Err(format!("-o: unknown output '{o}' (md, json or csv)")),
        }
    }
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn params(n: u64) -> String {
    if n >= 1_000_000_000 { format!("{:.2} B", n as f64 / 1e9) } else { format!("{:.2} M", n as f64 / 1e6) }
}

pub const MD_HEADER: &str = "| model | size | params | quant | threads | isa | type_k | type_v | pool MiB | prefetch | cache | test | t/s | p50 ms | p99 ms | GB/s | roof % | hit % | SSD MB/t | disk % | I/O busy % | stall ms/t | peak RSS |\n\
| ----- | ---: | -----: | ----- | ------: | --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";

/// The expert columns: pool, prefetch, cold/warm, hit %, SSD MB per token, share of the disk
/// roofline (with --roofline), share of decode time with a read in flight, stall ms per token.
fn expert_cols(r: &Row) -> [String; 8] {
    match &r.experts {
        None => Default::default(),
        Some(e) => [
            format!("{:.1}", e["budget_mib"].as_f64().unwrap_or(0.0)),
            if e["prefetch"].as_bool().unwrap_or(false) { "on".into() } else { "off".into() },
            e["mode"].as_str().unwrap_or("").to_string(),
            format!("{:.1}", e["hit_pct"].as_f64().unwrap_or(0.0)),
            format!("{:.1}", e["read_mb_per_token"].as_f64().unwrap_or(0.0)),
            e["disk_roofline_pct"].as_f64().map_or(String::new(), |p| format!("{p:.0}")),
            e["io_busy_pct"].as_f64().map_or(String::new(), |p| format!("{p:.0}")),
            format!("{:.2}", e["stall_ms_per_token"].as_f64().unwrap_or(0.0)),
        ],
    }
}

pub fn md_row(r: &Row) -> String {
    let lat =
        |f: fn(&LatencySummary) -> f64| r.decode_latency.as_ref().map_or(String::new(), |l| format!("{:.2}", f(l)));
    let [pool, pf, mode, hit, ssd, disk, busy, stall] = expert_cols(r);
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {pool} | {pf} | {mode} | {} | {:.2} ± {:.2} | {} | {} | {} | {} | {hit} | {ssd} | {disk} | {busy} | {stall} | {} |",
        r.model_type,
        gib(r.model_size),
        params(r.model_n_params),
        r.quant,
        r.n_threads,
        r.isa,
        r.type_k,
        r.type_v,
        r.test,
        r.avg_ts,
        r.stddev_ts,
        lat(|l| l.p50_ms),
        lat(|l| l.p99_ms),
        r.weight_gbps.map_or(String::new(), |g| format!("{g:.1}")),
        r.roofline_pct.map_or(String::new(), |p| format!("{p:.0}")),
        gib(r.peak_rss_bytes),
    )
}

pub const CSV_HEADER: &str = "build_commit,cpu_info,model_filename,model_type,model_size,model_n_params,quant,n_threads,isa,type_k,type_v,n_prompt,n_gen,n_depth,test,test_time,n_reps,avg_ns,stddev_ns,avg_ts,stddev_ts,decode_p50_ms,decode_p90_ms,decode_p99_ms,decode_max_ms,weight_bytes_per_token,weight_gbps,read_gbps,roofline_pct,peak_rss_bytes,pool_mib,prefetch,cache_mode,hit_pct,ssd_mb_per_token,disk_roofline_pct,io_busy_pct,stall_ms_per_token";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

pub fn csv_row(r: &Row) -> String {
    let lat =
        |f: fn(&LatencySummary) -> f64| r.decode_latency.as_ref().map_or(String::new(), |l| format!("{:.4}", f(l)));
    [
        csv_field(&r.build_commit),
        csv_field(&r.cpu_info),
        csv_field(&r.model_filename),
        csv_field(&r.model_type),
        r.model_size.to_string(),
        r.model_n_params.to_string(),
        r.quant.clone(),
        r.n_threads.to_string(),
        r.isa.clone(),
        r.type_k.clone(),
        r.type_v.clone(),
        r.n_prompt.to_string(),
        r.n_gen.to_string(),
        r.n_depth.to_string(),
        r.test.clone(),
        r.test_time.clone(),
        r.n_reps.to_string(),
        r.avg_ns.to_string(),
        r.stddev_ns.to_string(),
        format!("{:.4}", r.avg_ts),
        format!("{:.4}", r.stddev_ts),
        lat(|l| l.p50_ms),
        lat(|l| l.p90_ms),
        lat(|l| l.p99_ms),
        lat(|l| l.max_ms),
        r.weight_bytes_per_token.to_string(),
        r.weight_gbps.map_or(String::new(), |g| format!("{g:.4}")),
        r.read_gbps.map_or(String::new(), |g| format!("{g:.4}")),
        r.roofline_pct.map_or(String::new(), |p| format!("{p:.2}")),
        r.peak_rss_bytes.to_string(),
    ]
    .into_iter()
    .chain(expert_cols(r))
    .collect::<Vec<_>>()
    .join(",")
}

/// The table's header (markdown, CSV; JSON has none).
pub(super) fn print_header(out: &mut impl Write, format: Format) -> Result<()> {
    match format {
        Format::Md => writeln!(out, "{MD_HEADER}")?,
        Format::Csv => writeln!(out, "{CSV_HEADER}")?,
        Format::Json => {}
    }
    Ok(())
}

/// One row as soon as it is measured (JSON's rows come all at once at the end).
pub(super) fn print_row(out: &mut impl Write, format: Format, row: &Row) -> Result<()> {
    match format {
        Format::Md => writeln!(out, "{}", md_row(row))?,
        Format::Csv => writeln!(out, "{}", csv_row(row))?,
        Format::Json => {}
    }
    out.flush()?;
    Ok(())
}

/// After the last test: JSON's rows, or markdown's footer (the build, the CPU, the weights a
/// decode token reads, and the probes' summaries).
pub(super) fn finish(
    out: &mut impl Write,
    format: Format,
    done: &Done,
    (weight_bytes, bits): (u64, f64),
) -> Result<()> {
    match format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&done.rows)?)?,
        Format::Md => writeln!(
            out,
            "\nbuild: moescope {} ({}) | CPU: {} ({} cores) | {:.1} MB of weights per decode token, {:.2} bits a weight{}",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) { "debug" } else { "release" },
            sysinfo::cpu_model(),
            sysinfo::logical_cores(),
            weight_bytes as f64 / 1e6,
            bits,
            probe_notes(done, weight_bytes)
        )?,
        Format::Csv => {}
    }
    Ok(())
}

/// The footer's words on the memory and disk probes, one ` | ...` part per thread count.
fn probe_notes(done: &Done, weight_bytes: u64) -> String {
    let memory = done.probes.iter().map(|(t, p)| {
        let g = mean_sd(p).0;
        let (lo, hi) = p.iter().fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!(
            " | read {g:.1} GB/s at {t}T: roofline {:.1} t/s ({} probes beside the decode repetitions, {lo:.1}-{hi:.1}; roof % is each repetition's share of the probes around it, median)",
            g * 1e9 / weight_bytes.max(1) as f64,
            p.len()
        )
    });
    let disk = done.disks.iter().map(|d| {
        format!(
            " | expert reads {:.0} MB/s at {t}T (probed {:.0} before, {:.0} after): disk roofline = that / SSD MB per token; {:.0} MB/s while {t} thread(s) stream memory as decode's do (JSON: disk_loaded_roofline_pct)",
            d.bps() / 1e6,
            d.before / 1e6,
            d.after / 1e6,
            d.loaded / 1e6,
            t = d.threads
        )
    });
    memory.chain(disk).collect()
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (m, 0.0);
    }
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
    (m, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, sd) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
