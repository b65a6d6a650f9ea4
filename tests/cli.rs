//! The `moescope` binary end to end: run (one-shot, --json, --logits-out, --chat, the REPL),
//! inspect, convert on the fly into the cache, and the built-in demo.

mod common;

use common::*;
use serde_json::Value;

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

fn json_out(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "stderr: {}", stderr(o));
    let out = stdout(o);
    assert_eq!(out.lines().count(), 1, "--json prints exactly one line: {out}");
    serde_json::from_str(&out).expect("stdout is JSON")
}

fn as_ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// A float32 .npy file: (shape, data). Parsed here from the format's definition.
fn read_npy(p: &std::path::Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(p).unwrap();
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
    let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hl]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    assert_eq!((10 + hl) % 64, 0, "header padded to 64 bytes");
    let shape_txt = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> = shape_txt.split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let data: Vec<f32> = b[10 + hl..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (shape, data)
}

#[test]
fn run_json_and_logits_match_transformers() {
    let (d, p) = convert("single", "bf16");
    let r = Reference::load("single");
    let prompt = r.ids("input_ids");
    let npy = d.path().join("logits.npy");
    let o = moescope(
        &[
            "run",
            "-m",
            p.to_str().unwrap(),
            "--prompt-ids",
            &ids_arg(&prompt),
            "-n",
            "16",
            "--temperature",
            "0",
            "--json",
            "--logits-out",
            npy.to_str().unwrap(),
            // transformers' cache is f32
            "-ctk",
            "f32",
            "-ctv",
            "f32",
        ],
        d.path(),
    );
    let v = json_out(&o);
    assert_eq!(as_ids(&v["prompt_ids"]), prompt);
    assert_eq!((&v["kv_cache"]["type_k"], &v["kv_cache"]["type_v"]), (&"f32".into(), &"f32".into()));
    // every greedy step of this fixture has a margin >= 2.8e-3: all ids must match
    assert_eq!(as_ids(&v["generated_ids"]), r.ids("generated_ids"));
    assert!(v["text"].is_null(), "no tokenizer, no text");
    for k in ["prefill_ms", "decode_ms", "ttft_ms", "prefill_tps", "decode_tps"] {
        assert!(v["timings"][k].as_f64().is_some_and(|x| x >= 0.0), "timings.{k}: {}", v["timings"]);
    }
    assert_eq!(v["stop"], "length");
    let lat = &v["timings"]["decode_latency_ms"];
    assert_eq!(lat["count"], 15, "16 tokens: the first comes from prefill, 15 decode steps");
    assert!(lat["p50_ms"].as_f64().unwrap() <= lat["max_ms"].as_f64().unwrap());
    let (shape, data) = read_npy(&npy);
    let vocab = r.shape("gen_logits")[1];
    assert_eq!(shape, vec![16, vocab]);
    let d_max = max_abs_diff(&data, &r.f32("gen_logits"));
    assert!(d_max <= 1e-3, "logits-out differs from transformers by {d_max}");
}

#[test]
fn text_prompt_through_the_tokenizer() {
    let (d, p) = convert("tied-demo-tok", "bf16");
    let r = Reference::load("tied-demo-tok");
    let prompt = "The quick brown fox jumps over the lazy dog. Hello, 世界! 1+1=2";
    let o = moescope(
        &["run", "-m", p.to_str().unwrap(), "--prompt", prompt, "-n", "16", "--temperature", "0", "--json"],
        d.path(),
    );
    let v = json_out(&o);
    assert_eq!(as_ids(&v["prompt_ids"]), r.ids("input_ids"));
    assert_eq!(as_ids(&v["generated_ids"]), r.ids("generated_ids"));
    assert!(v["text"].as_str().is_some_and(|t| !t.is_empty()));
    // streamed (no --json): the text goes to stdout, the stats line to stderr
    let o =
        moescope(&["run", "-m", p.to_str().unwrap(), "--prompt", prompt, "-n", "16", "--temperature", "0"], d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim_end_matches('\n'), v["text"].as_str().unwrap());
    assert!(stderr(&o).contains("tok/s"), "{}", stderr(&o));
}

#[test]
fn chat_flag_applies_the_template() {
    let (d, p) = convert("tied-demo-tok", "q8");
    let chats: Value = serde_json::from_str(&std::fs::read_to_string(fixture("chat_reference.json")).unwrap()).unwrap();
    let want = chats
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["tokenizer"] == "demo"
                && c["messages"].as_array().unwrap().len() == 1
                && c["messages"][0]["content"] == "What is Rust?"
                && c["add_generation_prompt"] == true
                && c["enable_thinking"] == false
        })
        .expect("reference render")["text"]
        .as_str()
        .unwrap()
        .to_string();
    let o = moescope(
        &["run", "-m", p.to_str().unwrap(), "--prompt", "What is Rust?", "--chat", "--no-think", "-n", "4", "--json"],
        d.path(),
    );
    let v = json_out(&o);
    // the prompt ids are exactly the rendered template, tokenized
    let raw = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt", &want, "-n", "1", "--json"], d.path());
    assert_eq!(v["prompt_ids"], json_out(&raw)["prompt_ids"]);
}

#[test]
fn same_seed_same_text() {
    let (d, p) = convert("tied-demo-tok", "q4");
    let run = |seed: &str| {
        json_out(&moescope(
            &[
                "run",
                "-m",
                p.to_str().unwrap(),
                "--prompt",
                "fn main",
                "-n",
                "24",
                "--temperature",
                "1.0",
                "--seed",
                seed,
                "--json",
            ],
            d.path(),
        ))["generated_ids"]
            .clone()
    };
    assert_eq!(run("42"), run("42"));
    assert_ne!(run("42"), run("43"), "different seeds should differ over 24 sampled tokens");
}

#[test]
fn repl_chats_and_reuses_the_cache() {
    let (d, p) = convert("tied-demo-tok", "q4");
    let o = moescope_stdin(
        &["run", "-m", p.to_str().unwrap(), "-n", "6", "--temperature", "0", "--ignore-eos"],
        d.path(),
        b"Hello there\nWhat is a crate?\n/reset\nHello there\n/quit\nnever read\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // the first turn is what a one-shot --chat run of the same message prints, and after
    // /reset the same message gets the same (greedy) reply again
    let one = moescope(
        &[
            "run",
            "-m",
            p.to_str().unwrap(),
            "--prompt",
            "Hello there",
            "--chat",
            "-n",
            "6",
            "--temperature",
            "0",
            "--ignore-eos",
        ],
        d.path(),
    );
    let first = stdout(&one);
    assert!(!first.is_empty());
    assert!(out.starts_with(&first) && out.ends_with(&first) && out.len() > 2 * first.len(), "{out:?} vs {first:?}");
    let err = stderr(&o);
    let stats: Vec<&str> = err.lines().filter(|l| l.starts_with("[prefill")).collect();
    assert_eq!(stats.len(), 3, "{err}");
    // the second turn reuses the first turn's tokens from the KV cache; after /reset nothing is
    assert!(stats[1].contains("cached"), "{}", stats[1]);
    assert!(!stats[2].contains("cached"), "{}", stats[2]);
    assert!(err.contains("(conversation cleared)"));
}

#[test]
fn inspect_reports_layout() {
    let (d, p) = convert("odd", "q4");
    let o = moescope(&["inspect", "--json", p.to_str().unwrap()], d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ex = &v["regions"]["experts"];
    assert_eq!(ex["layers"], 2, "decoder_sparse_step 2 over 4 layers: 2 MoE layers");
    assert_eq!(ex["experts_per_layer"], 24);
    let blob = ex["bytes_per_expert"].as_u64().unwrap();
    assert!(blob > 0 && blob.is_multiple_of(4096));
    assert_eq!(ex["bytes"].as_u64().unwrap(), blob * 48);
    assert_eq!(ex["offset"].as_u64().unwrap() % 4096, 0);
    assert_eq!(v["file_bytes"].as_u64().unwrap(), std::fs::metadata(&p).unwrap().len());
    // hidden 80 takes q4 group 16; the dense layers' down_proj (K = 112) fits no group: q8
    assert_eq!(ex["parts"][0]["dtype"], "q4");
    assert_eq!(ex["parts"][0]["group"], 16);
    // rows of 80 values are not whole 128-value chunks: row-major, not interleaved
    assert_eq!(ex["parts"][0]["layout"], "q4_lohi32");
    // hidden 128, expert width 64: gate and up [64, 128] (whole blocks of 4 rows of whole
    // chunks) are interleaved; down [128, 64] (half a chunk a row) is not
    let (d2, p2) = convert("single", "q4");
    let v2: Value =
        serde_json::from_str(&stdout(&moescope(&["inspect", "--json", p2.to_str().unwrap()], d2.path()))).unwrap();
    let layouts: Vec<&str> =
        v2["regions"]["experts"]["parts"].as_array().unwrap().iter().map(|p| p["layout"].as_str().unwrap()).collect();
    assert_eq!(layouts, ["q4_lohi32_x4", "q4_lohi32_x4", "q4_lohi32"]);
    let text = stdout(&moescope(&["inspect", p.to_str().unwrap()], d.path()));
    assert!(text.contains("per expert") && text.contains("q4"), "{text}");
}

#[test]
fn hf_directory_is_converted_once_into_the_cache() {
    let d = tempfile::tempdir().unwrap();
    let r = Reference::load("single");
    let (src, ids) = (fixture("single"), ids_arg(&r.ids("input_ids")));
    let args = [
        "run",
        "-m",
        src.to_str().unwrap(),
        "--quant",
        "bf16",
        "--prompt-ids",
        &ids,
        "-n",
        "4",
        "--temperature",
        "0",
        "--json",
    ];
    let first = moescope(&args, d.path());
    assert!(stderr(&first).contains("converting"), "{}", stderr(&first));
    assert!(stderr(&first).contains("no tokenizer.json"), "warning expected: {}", stderr(&first));
    let second = moescope(&args, d.path());
    assert!(stderr(&second).contains("converted earlier"), "{}", stderr(&second));
    assert_eq!(json_out(&first)["generated_ids"], json_out(&second)["generated_ids"]);
    assert_eq!(as_ids(&json_out(&first)["generated_ids"]), r.ids("generated_ids")[..4].to_vec());
    let n = std::fs::read_dir(d.path().join("converted")).unwrap().count();
    assert_eq!(n, 1, "one package in the cache");
}

#[test]
fn builtin_demo_without_arguments() {
    let d = tempfile::tempdir().unwrap();
    let o = moescope(&["run", "--prompt", "Rust is", "-n", "8", "--seed", "1", "--json"], d.path());
    let v = json_out(&o);
    assert!(stderr(&o).contains("trained on the Rust docs"), "the demo says what it is: {}", stderr(&o));
    // it streams its experts through a pool smaller than they are
    let ex = &v["experts"];
    assert!(ex["budget_mib"].as_f64().unwrap() < ex["experts_mib"].as_f64().unwrap(), "{ex}");
    assert!(ex["read_mb"].as_f64().unwrap() > 0.0 && ex["misses"].as_u64().unwrap() > 0, "{ex}");
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 8);
    assert!(v["text"].is_string());
    let pkgs: Vec<_> = std::fs::read_dir(d.path()).unwrap().filter_map(|e| e.ok()).collect();
    assert_eq!(pkgs.len(), 1, "the demo package is written to the cache once");
    // no arguments at all: the REPL, here reading one line from a pipe
    let o = moescope_stdin(&[], d.path(), b"hi\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().filter(|l| l.starts_with("[prefill")).count(), 1, "{}", stderr(&o));
}

/// `MOESCOPE_WEIGHT_PREFETCH`: the decode kernels' software prefetch changes how fast, never
/// what: the logits of a q4 package (rows interleaved, the kernels that prefetch) are the same
/// bits with it off and at two distances, at 1 and 2 threads; `--json` reports the distance;
/// a bad setting is a one-line error naming the variable.
#[test]
fn logits_are_the_same_bits_at_every_thread_count() {
    // a product's rows are split over the threads, and one token's experts over their rows
    // (every gate and up row in one section, every down row in another), whatever expert a
    // chunk falls in: no split may change a bit. 3 threads do not divide the 2 experts a token
    // uses, nor their rows evenly.
    for quant in ["q4", "q8"] {
        let (d, p) = convert("single", quant);
        let r = Reference::load("single");
        let prompt = ids_arg(&r.ids("input_ids"));
        let run = |threads: &str| {
            let npy = d.path().join(format!("logits-{threads}.npy"));
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_moescope"))
                .args(["run", "-m", p.to_str().unwrap(), "--prompt-ids", &prompt, "-n", "8", "--temperature", "0"])
                .args(["--ignore-eos", "-t", threads, "--json", "--logits-out", npy.to_str().unwrap()])
                .env("MOESCOPE_CACHE_DIR", d.path())
                .output()
                .expect("running moescope");
            (json_out(&o), read_npy(&npy))
        };
        let (v1, (shape, want)) = run("1");
        assert_eq!(shape[0], 8, "one row of logits per generated token");
        for threads in ["2", "3"] {
            let (v, (_, got)) = run(threads);
            assert_eq!(v["generated_ids"], v1["generated_ids"], "{quant} at {threads} threads");
            let same = want.len() == got.len() && want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{quant}: logits at {threads} threads differ from 1 thread's");
        }
    }
}

#[test]
fn pinned_threads_change_no_logit_and_a_bad_setting_is_refused() {
    let (d, p) = convert("single", "q4g32");
    let r = Reference::load("single");
    let prompt = ids_arg(&r.ids("input_ids"));
    let run = |pin: &str, threads: &str| {
        let npy = d.path().join(format!("logits-pin{pin}-{threads}.npy"));
        std::process::Command::new(env!("CARGO_BIN_EXE_moescope"))
            .args(["run", "-m", p.to_str().unwrap(), "--prompt-ids", &prompt, "-n", "4", "--temperature", "0"])
            .args(["--ignore-eos", "-t", threads, "--json", "--logits-out", npy.to_str().unwrap()])
            .env("MOESCOPE_CACHE_DIR", d.path())
            .env("MOESCOPE_PIN", pin)
            .output()
            .map(|o| (o, npy))
            .expect("running moescope")
    };
    let bits = |npy: &std::path::Path| read_npy(npy).1.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    for threads in ["2", "3"] {
        let (o, want) = run("0", threads);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (o, got) = run("1", threads);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(bits(&want) == bits(&got), "logits differ with MOESCOPE_PIN=1 at {threads} threads");
    }
    let (o, _) = run("cores", "2");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("MOESCOPE_PIN") && err.contains("cores"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn weight_prefetch_changes_no_logit_and_bad_settings_are_refused() {
    let (d, p) = convert("single", "q4");
    let r = Reference::load("single");
    let prompt = ids_arg(&r.ids("input_ids"));
    let run = |setting: &str, threads: &str| {
        let npy = d.path().join(format!("logits-{setting}-{threads}.npy"));
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_moescope"))
            .args(["run", "-m", p.to_str().unwrap(), "--prompt-ids", &prompt, "-n", "6", "--temperature", "0"])
            .args(["-t", threads, "--json", "--logits-out", npy.to_str().unwrap()])
            .env("MOESCOPE_CACHE_DIR", d.path())
            .env("MOESCOPE_WEIGHT_PREFETCH", setting)
            .output()
            .expect("running moescope");
        (json_out(&o), read_npy(&npy).1)
    };
    for threads in ["1", "2"] {
        let (v0, want) = run("off", threads);
        assert_eq!(v0["weight_prefetch_bytes"], 0, "{v0}");
        for (setting, bytes) in [("4096", 4096), ("64", 64)] {
            let (v, got) = run(setting, threads);
            assert_eq!(v["weight_prefetch_bytes"], bytes, "{v}");
            assert_eq!(v["generated_ids"], v0["generated_ids"]);
            let (wb, gb): (Vec<u32>, Vec<u32>) =
                (want.iter().map(|x| x.to_bits()).collect(), got.iter().map(|x| x.to_bits()).collect());
            assert!(wb == gb, "logits differ with MOESCOPE_WEIGHT_PREFETCH={setting} at {threads} threads");
        }
    }
    for bad in ["100", "lots"] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_moescope"))
            .args(["run", "-m", p.to_str().unwrap(), "--prompt-ids", &prompt, "-n", "1"])
            .env("MOESCOPE_CACHE_DIR", d.path())
            .env("MOESCOPE_WEIGHT_PREFETCH", bad)
            .output()
            .expect("running moescope");
        assert_clean_failure(&o, &["MOESCOPE_WEIGHT_PREFETCH", bad]);
    }
}

/// `compute-peak` (hidden; device_scaling.sh logs it): a line per thread count with each probed
/// tier's rate, or on a CPU without AVX-512 a one-line error; junk counts are refused.
#[test]
fn compute_peak_prints_a_rate_per_thread_count() {
    let d = tempfile::tempdir().unwrap();
    let o = moescope(&["compute-peak", "-t", "1,2", "--ms", "20"], d.path());
    if moescope_kernels::Isa::detect() >= moescope_kernels::Isa::Avx512 {
        assert!(o.status.success(), "{}", stderr(&o));
        let out = stdout(&o);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        for (l, t) in lines.iter().zip([1, 2]) {
            assert!(l.starts_with(&format!("threads {t}: int8 VNNI ")), "{l}");
            let rate: f64 = l.split_whitespace().nth(4).and_then(|v| v.parse().ok()).expect("a rate");
            assert!(rate > 0.0 && rate.is_finite(), "{l}");
        }
    } else {
        assert!(!o.status.success() && stderr(&o).contains("compute-peak"), "{}", stderr(&o));
    }
    let bad = moescope(&["compute-peak", "-t", "1,x"], d.path());
    assert!(!bad.status.success() && stderr(&bad).contains("-t: 'x' is not a whole number"), "{}", stderr(&bad));
}
