//! `serve --parallel N` over HTTP: requests that run together (continuous batching, one forward
//! pass a step over all of them) get the replies they get alone, bit for bit (greedy tokens
//! and every log-probability, printed as the shortest text that reads back to the same f32);
//! a request that joins while another replies changes none of its bits; and a prompt that
//! starts from the prefix cache (another slot's sequence, saved when its slot was taken) gets
//! the numbers of a fresh prefill. On the demo (plain attention) and on a tiny Qwen3.5-MoE
//! hybrid (Gated DeltaNet layers: its state resumes from a checkpoint).

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::server::{Client, Server};
use common::*;
use moescope::convert::{ConvertOptions, QuantMode};
use serde_json::{Value, json};

/// The models: the built-in demo, and the package of llama.cpp's GGUF of the tiny Qwen3.5-MoE
/// (its own 512-token tokenizer).
fn models(dir: &std::path::Path) -> Vec<(&'static str, Vec<String>, u32)> {
    let q35 = dir.join("qwen35.moe");
    moescope::convert::convert_gguf(
        &fixture("gguf/qwen35").join("qwen35-bf16.gguf"),
        &q35,
        ConvertOptions::new(QuantMode::File),
    )
    .expect("converting the Qwen3.5 GGUF");
    vec![("demo", vec![], 4000), ("qwen35", vec!["-m".into(), q35.to_string_lossy().into_owned()], 500)]
}

/// `n` token ids from seed `k`, below `vocab` (no two prompts share a first token).
fn ids(k: u32, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (k * 97 + i * 31 + i * i * 7) % (vocab - 20) + 10 + if i == 0 { k } else { 0 }).collect()
}

fn req(prompt: &[u32]) -> Value {
    json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true, "logprobs": 3})
}

/// What must match: the text and every token's log-probabilities.
fn reply(r: &Value) -> (Value, Value) {
    (r["choices"][0]["text"].clone(), r["choices"][0]["logprobs"].clone())
}

fn start(args: &[String], extra: &[&str], cache: &std::path::Path) -> Server {
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    a.extend(["-t", "2"]);
    a.extend(extra);
    Server::start(&a, cache)
}

/// Every prompt alone, one request at a time, in a server of one slot and no prefix cache.
fn alone(args: &[String], prompts: &[Vec<u32>], cache: &std::path::Path) -> Vec<(Value, Value)> {
    let s = start(args, &["--parallel", "1", "--cache-ram", "0"], cache);
    prompts.iter().map(|p| reply(&s.post("/v1/completions", &req(p)).json())).collect()
}

#[test]
fn concurrent_requests_get_their_alone_replies_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    for (name, args, vocab) in models(d.path()) {
        // one token, a few, several key blocks, more than a prompt chunk (512)
        let prompts: Vec<Vec<u32>> =
            [1, 7, 200, 700].iter().enumerate().map(|(k, &n)| ids(k as u32 + 1, n, vocab)).collect();
        let want = alone(&args, &prompts, d.path());

        // all four at once
        let s = start(&args, &["--parallel", "4", "--metrics"], d.path());
        let go = Arc::new(Barrier::new(prompts.len()));
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (c, p, go): (Client, Vec<u32>, _) = (*s, p.clone(), go.clone());
                thread::spawn(move || {
                    go.wait();
                    reply(&c.post("/v1/completions", &req(&p)).json())
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), want[i], "{name}: request {i} ({} tokens) batched", prompts[i].len());
        }
        let m = s.metrics();
        assert!(m["llamacpp:n_busy_slots_per_decode"] > 1.5, "{name}: the requests shared passes: {m:?}");
        // the slots' caches hold every prompt and reply; each expert read served several tokens
        let held: usize = prompts.iter().map(|p| p.len() + 23).sum();
        assert_eq!(m["llamacpp:kv_cache_tokens"], held as f64, "{name}: tokens the slots hold");
        assert!(m["llamacpp:kv_cache_usage_ratio"] > 0.0 && m["llamacpp:kv_cache_usage_ratio"] < 1.0);
        assert!(m["moescope_sequences_per_expert_read"] > 1.0, "{name}: {m:?}");
        assert!(m["moescope_expert_reads_total"] < m["moescope_expert_choices_total"]);
        drop(s);

        // one replying, the others joining while it streams: its reply keeps every bit
        let s = start(&args, &["--parallel", "4"], d.path());
        let mut body = req(&prompts[1]);
        body["stream"] = true.into();
        let mut first = s.stream("/v1/completions", &body);
        // its first token is out: it is replying
        let mut chunks = vec![first.next_data().expect("a first chunk")];
        let others: Vec<_> = [3, 0, 2]
            .iter()
            .map(|&i| {
                let (c, p) = (*s, prompts[i].clone());
                thread::spawn(move || (i, reply(&c.post("/v1/completions", &req(&p)).json())))
            })
            .collect();
        chunks.extend(first.all());
        for h in others {
            let (i, r) = h.join().unwrap();
            assert_eq!(r, want[i], "{name}: request {i} joining a running one");
        }
        let (text, logprobs) = streamed(&chunks);
        assert_eq!(text, want[1].0, "{name}: the running reply's text with others joining");
        assert_eq!(logprobs, want[1].1["token_logprobs"], "{name}: the running reply's logprobs with others joining");
    }
}

/// A streamed completion's text and token log-probabilities, joined from its chunks.
fn streamed(chunks: &[String]) -> (Value, Value) {
    let (mut text, mut lps) = (String::new(), Vec::new());
    for c in chunks.iter().filter(|c| c.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(c).unwrap();
        let ch = &v["choices"][0];
        text.push_str(ch["text"].as_str().unwrap_or(""));
        if let Some(l) = ch["logprobs"]["token_logprobs"].as_array() {
            lps.extend(l.iter().cloned());
        }
    }
    (Value::String(text), Value::Array(lps))
}

#[test]
fn a_prompt_from_the_prefix_cache_gets_a_fresh_prefills_numbers() {
    let d = tempfile::tempdir().unwrap();
    for (name, args, vocab) in models(d.path()) {
        let p1 = ids(1, 600, vocab);
        // as long: it overwrites every position p1 left in the slot's memory
        let other = ids(2, 640, vocab);
        // p1's first 580 tokens, then its own
        let mut p3 = p1[..580].to_vec();
        p3.extend(ids(3, 30, vocab));
        // one slot: `other` takes p1's slot, which goes to the prefix cache first
        let s = start(&args, &["--parallel", "1", "--cache-ram", "64", "--metrics"], d.path());
        for p in [&p1, &other] {
            assert_eq!(s.post("/v1/completions", &req(p)).status, 200);
        }
        let hit = s.post("/v1/completions", &req(&p3)).json();
        let cached = hit["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        // attention's keys go back anywhere; a hybrid's state to its checkpoint at the end of the
        // first prompt chunk
        let expect = if name == "qwen35" { 512 } else { 580 };
        assert_eq!(cached, expect, "{name}: tokens from the prefix cache");
        let m = s.metrics();
        assert_eq!(m["moescope_prefix_cache_hits_total"], 1.0, "{name}");
        assert_eq!(m["moescope_prefix_cache_hit_tokens_total"], expect as f64, "{name}");
        assert!(m["moescope_prefix_cache_bytes"] > 0.0, "{name}");
        drop(s);
        let fresh = start(&args, &["--parallel", "1", "--cache-ram", "0"], d.path());
        let want = fresh.post("/v1/completions", &req(&p3)).json();
        assert_eq!(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(reply(&hit), reply(&want), "{name}: from the prefix cache against a fresh prefill");
    }
}
