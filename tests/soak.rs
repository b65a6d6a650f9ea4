//! Soak: a long chat in `moescope run`'s REPL on the demo model, streaming its experts through a
//! pool of a third of their size with prefetch on, turns of 40 tokens with a `/reset` every 8,
//! and a trace whose ring (`--trace-max-events`) is full before a tenth of the run. Sampled from
//! /proc every 20 ms, the process must stay within its memory plan + 10% throughout, grow by at
//! most 1% (plus 512 KiB of page-level noise) over the second half, keep its thread and file
//! descriptor counts once the first turn is done, and its pool must never hold more buffers than
//! the budget plus one blob per I/O worker (the process's own count, printed at the end).
//!
//! CI runs 2,000 tokens; `MOESCOPE_SOAK_TOKENS=10000 cargo test --release --test soak` is the
//! full run the issue asks for.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One /proc sample of the child: tokens decoded by then, RSS and peak RSS (KiB), threads, fds.
#[derive(Debug, Clone, Copy)]
struct Sample {
    decoded: usize,
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
    fds: usize,
}

fn sample(pid: u32, decoded: usize) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| -> Option<u64> {
        let l = status.lines().find(|l| l.starts_with(k))?;
        l.split_whitespace().nth(1)?.parse().ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Sample { decoded, rss_kib: field("VmRSS:")?, hwm_kib: field("VmHWM:")?, threads: field("Threads:")?, fds })
}

/// The number after `key` in `line` (`"= 46"` of `"... = 46 MiB expected"`, `"decode 40"`).
fn number_after(line: &str, key: &str) -> Option<f64> {
    let at = line.find(key)? + key.len();
    line[at..].trim_start().split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?.parse().ok()
}

#[test]
fn a_long_chat_stays_inside_its_memory_plan() {
    let tokens: usize = std::env::var("MOESCOPE_SOAK_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("demo.moe");
    moescope::demo::write_demo_package(&pkg, moescope::convert::QuantMode::Q4 { max_group: 128 }).expect("demo");
    let trace = d.path().join("soak.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_moescope"))
        .args(["run", "-m", pkg.to_str().unwrap(), "-n", "40", "--ignore-eos", "--cache-mb", "1", "--io-workers", "2"])
        .args(["-t", "2", "--seed", "7", "--trace", trace.to_str().unwrap(), "--trace-max-events", "4000"])
        .env("MOESCOPE_CACHE_DIR", d.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    // every turn decodes 40 tokens; the lines go in at once and are answered one by one
    let turns = tokens.div_ceil(40);
    let prompts = ["Tell me about ownership.", "What does a trait do?", "Explain lifetimes briefly.", "Why Cargo?"];
    let mut input = String::new();
    for t in 0..turns {
        if t > 0 && t % 8 == 0 {
            input.push_str("/reset\n");
        }
        input.push_str(prompts[t % prompts.len()]);
        input.push('\n');
    }
    input.push_str("/quit\n");
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    // stderr: the plan, each turn's stats, the pool's peak, the trace's count
    let decoded = Arc::new(AtomicUsize::new(0));
    let lines = {
        let (decoded, err) = (decoded.clone(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut lines = vec![];
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(n) = number_after(&l, "decode ") {
                    decoded.fetch_add(n as usize, Ordering::SeqCst);
                }
                lines.push(l);
            }
            lines
        })
    };
    let mut samples = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the soak ran past 10 minutes");
        samples.extend(sample(pid, decoded.load(Ordering::SeqCst)));
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines = lines.join().unwrap();
    let all = lines.join("\n");
    assert!(status.success(), "{status:?}: {all}");
    let done = decoded.load(Ordering::SeqCst);
    assert_eq!(done, turns * 40, "every turn decoded its 40 tokens: {all}");

    // within the memory plan + 10% throughout (VmHWM: the peak between samples too)
    let plan_mib = lines.iter().find(|l| l.contains("memory:")).and_then(|l| number_after(l, "= "));
    let plan_mib = plan_mib.unwrap_or_else(|| panic!("no memory plan printed: {all}"));
    let peak_mib = samples.iter().map(|s| s.hwm_kib).max().unwrap_or(0) as f64 / 1024.0;
    assert!(peak_mib <= plan_mib * 1.10, "peak RSS {peak_mib:.1} MiB over the plan {plan_mib} MiB + 10%");

    // the second half: RSS grows by at most 1% (and a MiB of page-level noise)
    // (samples while turns ran: after the last one the process writes its trace and exits)
    let second: Vec<&Sample> = samples.iter().filter(|s| s.decoded >= done / 2 && s.decoded < done).collect();
    assert!(second.len() >= 10, "too few samples in the second half: {}", second.len());
    // medians of its first and last tenth, against single samples' page-level noise
    let median = |xs: &[&Sample]| {
        let mut v: Vec<u64> = xs.iter().map(|s| s.rss_kib).collect();
        v.sort_unstable();
        v[v.len() / 2] as f64
    };
    let tenth = second.len() / 10;
    let (mid, end) = (median(&second[..tenth]), median(&second[second.len() - tenth..]));
    assert!(end <= mid * 1.01 + 512.0, "RSS grew from {mid} KiB to {end} KiB over the second half");

    // threads and descriptors: fixed once the first turn is done
    let settled: Vec<&Sample> = samples.iter().filter(|s| s.decoded >= 40 && s.decoded < done).collect();
    let first = settled.first().expect("samples after the first turn");
    for s in &settled {
        assert_eq!((s.threads, s.fds), (first.threads, first.fds), "threads / fds changed: {s:?} vs {first:?}");
    }

    // the pool's own count of its buffers, against budget + one blob per I/O worker
    let pool =
        lines.iter().find(|l| l.contains("expert pool: at most")).unwrap_or_else(|| panic!("no pool line: {all}"));
    let held = number_after(pool, "at most").expect("held");
    let allowed = number_after(pool, "= ").expect("allowed");
    assert!(held <= allowed, "{pool}");

    // the trace's ring filled early: it kept its cap and dropped the rest
    let tr = lines.iter().find(|l| l.contains("events; the cap")).unwrap_or_else(|| panic!("no trace line: {all}"));
    assert!(tr.contains(": 4000 events") && tr.contains("dropped"), "{tr}");
    eprintln!(
        "soak: {done} tokens, {} samples, peak RSS {peak_mib:.1} MiB (plan {plan_mib} MiB), second half {:.1} -> {:.1} MiB, {} threads, {} fds; {pool}",
        samples.len(),
        mid / 1024.0,
        end / 1024.0,
        first.threads,
        first.fds
    );
}
