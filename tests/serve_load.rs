//! A bounded load test of `moescope serve` on 127.0.0.1: 32 concurrent clients x 8 requests
//! (streamed and not, some hanging up mid-stream) against the demo with a 1 MiB expert pool.
//! Nothing is lost or mixed up (each reply equals the same request run alone with its seed),
//! and the server's resident memory is flat between two identical rounds.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::server::Server;
use serde_json::{Value, json};

const CLIENTS: usize = 32;
const PER_CLIENT: usize = 8;
const PROMPTS: [&str; 4] =
    ["What is a trait?", "Explain ownership.", "How do closures capture?", "What does cargo do?"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Whole,
    Stream,
    /// Streamed, hanging up after two chunks.
    HangUp,
}

fn request(c: usize, r: usize) -> (Value, Mode) {
    let i = c * PER_CLIENT + r;
    let mode = match i % 5 {
        0 | 2 => Mode::Stream,
        4 if c % 4 == 1 => Mode::HangUp,
        _ => Mode::Whole,
    };
    let body = json!({
        "messages": [{"role": "user", "content": PROMPTS[i % PROMPTS.len()]}],
        "max_tokens": 10 + i % 7, "seed": 1000 + i, "temperature": 0.9,
    });
    (body, mode)
}

/// The reply's text and completion tokens; None for a hang-up.
fn run(s: &Server, body: &Value, mode: Mode) -> Option<(String, u64)> {
    match mode {
        Mode::Whole => {
            let r = s.post("/v1/chat/completions", body);
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            let text = v["choices"][0]["message"]["content"].as_str().expect("content").to_string();
            Some((text, v["usage"]["completion_tokens"].as_u64().unwrap()))
        }
        Mode::Stream | Mode::HangUp => {
            let mut b = body.clone();
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
            let mut sse = s.stream("/v1/chat/completions", &b);
            assert_eq!(sse.status, 200);
            if mode == Mode::HangUp {
                sse.next_data();
                sse.next_data();
                sse.hang_up();
                return None;
            }
            let events = sse.all();
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
            let chunks: Vec<Value> =
                events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
            let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
            let usage = chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().expect("usage chunk");
            Some((text, usage))
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn thirty_two_clients_lose_and_mix_up_nothing() {
    let d = tempfile::tempdir().unwrap();
    // 4 slots: the concurrent rounds run in batches of up to 4 requests a step
    let args = ["-t", "2", "--cache-mb", "1", "--queue", "64", "--parallel", "4", "--metrics"];
    let s = Arc::new(Server::start(&args, d.path()));
    // every request alone first: the replies the concurrent rounds must reproduce
    let alone: Vec<Vec<Option<(String, u64)>>> = (0..CLIENTS)
        .map(|c| {
            (0..PER_CLIENT)
                .map(|r| {
                    let (body, mode) = request(c, r);
                    (mode != Mode::HangUp).then(|| run(&s, &body, Mode::Whole).unwrap())
                })
                .collect()
        })
        .collect();
    let alone = Arc::new(alone);
    let mut rss = Vec::new();
    for round in 0..2 {
        let t0 = Instant::now();
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (s, alone) = (s.clone(), alone.clone());
                thread::spawn(move || {
                    let mut lat = Vec::new();
                    let mut tokens = 0;
                    for r in 0..PER_CLIENT {
                        let (body, mode) = request(c, r);
                        let t = Instant::now();
                        let got = run(&s, &body, mode);
                        if let (Some(got), Some(want)) = (got, &alone[c][r]) {
                            assert_eq!(&got, want, "client {c} request {r} ({mode:?})");
                            lat.push(t.elapsed().as_secs_f64() * 1000.0);
                            tokens += got.1;
                        }
                    }
                    (lat, tokens)
                })
            })
            .collect();
        let (mut lat, mut tokens) = (Vec::new(), 0);
        for h in handles {
            let (l, t) = h.join().expect("a client failed");
            lat.extend(l);
            tokens += t;
        }
        let wall = t0.elapsed().as_secs_f64();
        // the hang-ups end too: the engine goes idle with an empty queue
        let m = s.wait_metrics(30, "idle", |m| {
            m["llamacpp:requests_processing"] == 0.0 && m["llamacpp:requests_deferred"] == 0.0
        });
        assert_eq!(m["moescope_requests_rejected_total"], 0.0);
        assert_eq!(m["moescope_requests_failed_total"], 0.0);
        let n = lat.len();
        eprintln!(
            "round {round}: {n} replies compared, latency p50 {:.0} ms p99 {:.0} ms, {:.0} completion tokens/s, {:.1} requests/s, RSS {} KiB",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            tokens as f64 / wall,
            (CLIENTS * PER_CLIENT) as f64 / wall,
            rss_kib(s.pid())
        );
        rss.push(rss_kib(s.pid()));
    }
    let (a, b) = (rss[0] as f64, rss[1] as f64);
    assert!((b - a).abs() <= 0.10 * a, "RSS moved from {a} to {b} KiB between identical rounds");
    thread::sleep(Duration::from_millis(10));
}
