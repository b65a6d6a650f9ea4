//! `moescope perplexity` on the trained demo model, against transformers.
//!
//! transformers' number is what `tests/reference/train_demo.py` printed for the saved (bf16)
//! checkpoint computed in fp32 over `tests/fixtures/demo/heldout.txt` (held-out Rust docs text; packed)
//! with the same protocol (windows of 512 tokens from an empty context), recorded in
//! `src/demo/train_log.json`.
//!
//! Bounds:
//! - bf16 holds the checkpoint's exact weights, and the engine's bf16 logits are within 1e-3 of
//!   transformers' (tests/reference_logits.rs). A token's NLL is logsumexp(logits) - logit of the
//!   token, so it moves by at most twice the largest logit error: |ΔNLL| <= 2e-3, and the same
//!   number of tokens must be predicted.
//! - q8 and q4 change the weights. When the text is what the bf16 model expects, the mean rise
//!   in NLL is the mean KL(p_bf16 || p_quant); the reference test measures that KL on this model
//!   at 3.0e-3 (q8) and 5e-2 to 8e-2 (q4, q4g32) on its prompt, and the rise on real text came
//!   out below it (q8 +0.12%, q4 +2.7%, q4g32 +1.7% in perplexity). The bounds allow about twice
//!   that: perplexity within 1% of bf16 for q8 and 5% for q4 and q4g32, which is also what
//!   llama.cpp reports for its Q8_0 and Q4_0 on small models (a few tenths of a percent and a few
//!   percent).

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

fn reference() -> (f64, u64) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/demo/train_log.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&p).expect("train_log.json")).expect("json");
    let e = &v["perplexity_fp32"]["excerpt"];
    (e["nll"].as_f64().expect("nll"), e["tokens"].as_u64().expect("tokens"))
}

fn heldout() -> String {
    fixture("demo").join("heldout.txt").to_string_lossy().into_owned()
}

fn perplexity(pkg: &Path, cache: &Path) -> Value {
    perplexity_with(pkg, cache, &[])
}

fn perplexity_with(pkg: &Path, cache: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["perplexity", "-m"];
    let (p, h) = (pkg.to_string_lossy().into_owned(), heldout());
    // an exact KV cache: the figures are transformers' (and the base's, which keeps f32)
    args.extend([p.as_str(), h.as_str(), "--json", "-t", "2", "-ctk", "f32", "-ctv", "f32"]);
    args.extend_from_slice(extra);
    let o = moescope(&args, cache);
    assert!(o.status.success(), "perplexity failed: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)))
}

#[test]
fn demo_perplexity_matches_transformers_and_quantization_costs_little() {
    let cache = tempfile::tempdir().expect("tempdir");
    let (ref_nll, ref_tokens) = reference();
    let (_d, bf16) = convert("demo", "bf16");
    let b = perplexity(&bf16, cache.path());
    assert_eq!(b["predicted"].as_u64(), Some(ref_tokens), "predicted tokens: {b}");
    let nll = b["nll"].as_f64().expect("nll");
    assert!((nll - ref_nll).abs() <= 2e-3, "bf16 mean NLL {nll} vs transformers {ref_nll}");
    let ppl = b["perplexity"].as_f64().expect("ppl");
    assert!((ppl - ref_nll.exp()).abs() / ref_nll.exp() < 2.1e-3, "{ppl}");
    for (quant, max_rise) in [("q8", 0.01), ("q4", 0.05), ("q4g32", 0.05)] {
        let (_d, pkg) = convert("demo", quant);
        let q = perplexity(&pkg, cache.path());
        let qp = q["perplexity"].as_f64().expect("ppl");
        let rise = qp / ppl - 1.0;
        assert!(rise.abs() <= max_rise, "{quant}: perplexity {qp} vs bf16 {ppl} ({:+.2}%)", rise * 100.0);
    }
}

#[test]
fn perplexity_rejects_bad_input_clearly() {
    let cache = tempfile::tempdir().expect("tempdir");
    let bin = cache.path().join("not-text.bin");
    std::fs::write(&bin, [b'a', 0xff, 0xfe, b'b']).expect("write");
    let (_d, pkg) = convert("demo", "q8");
    let pkg = pkg.to_string_lossy().into_owned();
    let o = moescope(&["perplexity", "-m", &pkg, &bin.to_string_lossy()], cache.path());
    assert_clean_failure(&o, &["not-text.bin", "not UTF-8", "byte 1"]);
    let o = moescope(&["perplexity", "-m", &pkg, &heldout(), "--window", "1"], cache.path());
    assert_clean_failure(&o, &["--window"]);
    let missing = cache.path().join("missing.txt");
    let o = moescope(&["perplexity", "-m", &pkg, &missing.to_string_lossy()], cache.path());
    assert_clean_failure(&o, &["missing.txt"]);
    let one = cache.path().join("one.txt");
    std::fs::write(&one, "a").expect("write");
    let o = moescope(&["perplexity", "-m", &pkg, &one.to_string_lossy()], cache.path());
    assert_clean_failure(&o, &["one.txt", "fewer than 2 tokens"]);
}

/// `--against`: a model against itself diverges by nothing; quantized against bf16, the base's
/// perplexity is bf16's own and the divergence orders as the reference test measures it (KL on
/// the demo's prompt: q8 3.0e-3, q4 5e-2 to 8e-2; bounds at about twice those).
#[test]
fn against_reports_kl_and_top1_agreement_with_the_base() {
    let cache = tempfile::tempdir().expect("tempdir");
    let (_d, bf16) = convert("demo", "bf16");
    let b16 = bf16.to_string_lossy().into_owned();
    let lim = ["--tokens", "600", "--window", "256"];
    let own = perplexity_with(&bf16, cache.path(), &lim);
    // 600 tokens in windows of 256: 255 + 255 + 87 predicted
    assert_eq!(own["predicted"].as_u64(), Some(597), "{own}");
    let mut args = lim.to_vec();
    args.extend(["--against", b16.as_str()]);
    let me = perplexity_with(&bf16, cache.path(), &args);
    assert_eq!(me["against"]["kl_max"].as_f64(), Some(0.0), "{me}");
    assert_eq!(me["against"]["top1_agreement"].as_f64(), Some(1.0), "{me}");
    let mut kls = vec![];
    for quant in ["q8", "q4"] {
        let (_d, pkg) = convert("demo", quant);
        let q = perplexity_with(&pkg, cache.path(), &args);
        let ag = &q["against"];
        assert_eq!(ag["nll"].as_f64(), own["nll"].as_f64(), "{quant}: the base's NLL is bf16's: {q}");
        let kl = ag["kl_mean"].as_f64().expect("kl");
        let top1 = ag["top1_agreement"].as_f64().expect("top1");
        assert!(kl > 0.0 && ag["kl_median"].as_f64() <= Some(ag["kl_max"].as_f64().expect("max")), "{q}");
        let (max_kl, min_top1) = if quant == "q8" { (6e-3, 0.9) } else { (0.16, 0.6) };
        assert!(kl <= max_kl && top1 >= min_top1, "{quant}: KL {kl}, top-1 {top1}");
        kls.push(kl);
    }
    assert!(kls[0] < kls[1], "q8 diverges less than q4: {kls:?}");
    let o = moescope(&["perplexity", "-m", &b16, &heldout(), "--against", "/nonexistent/base.moe"], cache.path());
    assert_clean_failure(&o, &["/nonexistent/base.moe"]);
}

/// The demo checkpoint with its output layer untied: `lm_head.weight` a copy of the embedding (in
/// the embedding's shard, the index naming it) and `tie_word_embeddings` false, the same function
/// of the same weights. A q4 package of it stores the output layer at q6 (the tied demo keeps q8:
/// it is the embedding).
fn untied_demo(dir: &Path) {
    let src = fixture("demo");
    let index_name = "model.safetensors.index.json";
    let mut index: Value =
        serde_json::from_slice(&std::fs::read(src.join(index_name)).expect("demo index")).expect("index json");
    let shard = index["weight_map"]["model.embed_tokens.weight"].as_str().expect("embedding's shard").to_string();
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copy checkpoint file");
    }
    let b = std::fs::read(src.join(&shard)).expect("demo weights");
    let n = u64::from_le_bytes(b[..8].try_into().expect("header length")) as usize;
    let mut h: Value = serde_json::from_slice(&b[8..8 + n]).expect("header");
    let data = &b[8 + n..];
    let e = h["model.embed_tokens.weight"].clone();
    let (s, t) =
        (e["data_offsets"][0].as_u64().expect("start") as usize, e["data_offsets"][1].as_u64().expect("end") as usize);
    let mut lm = e.clone();
    lm["data_offsets"] = serde_json::json!([data.len(), data.len() + (t - s)]);
    h["lm_head.weight"] = lm;
    let mut hj = serde_json::to_vec(&h).expect("json");
    hj.resize(hj.len().next_multiple_of(8), b' ');
    let mut out = (hj.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&hj);
    out.extend_from_slice(data);
    out.extend_from_slice(&data[s..t]);
    std::fs::write(dir.join(&shard), out).expect("write weights");
    index["weight_map"]["lm_head.weight"] = Value::String(shard);
    std::fs::write(dir.join(index_name), serde_json::to_vec(&index).expect("json")).expect("write index");
    let mut c: Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config")).expect("json");
    c["tie_word_embeddings"] = Value::Bool(false);
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&c).expect("json")).expect("write config");
}

/// The q6 output layer on a trained model: against the bf16 package it diverges as little as the
/// tied demo's q8 output layer does (measured: KL 0.05488 vs 0.05435 nats, top-1 84.70% vs 84.64%,
/// the rest of the model at q4 alike). A q6 kernel or layout error would move the logits of every
/// token; the bound allows the q6 layer 10% more divergence than the q8 one.
#[test]
fn q6_output_layer_costs_about_what_q8_does() {
    let cache = tempfile::tempdir().expect("tempdir");
    let src = cache.path().join("untied");
    std::fs::create_dir_all(&src).expect("mkdir");
    untied_demo(&src);
    let conv = |q: &str| {
        let out = cache.path().join(format!("untied-{q}.moe"));
        let o =
            moescope(&["convert", &src.to_string_lossy(), "-o", &out.to_string_lossy(), "--quant", q], cache.path());
        assert!(o.status.success(), "convert {q}: {}", stderr(&o));
        out
    };
    let (ub16, uq4) = (conv("bf16"), conv("q4"));
    let o = moescope(&["inspect", &uq4.to_string_lossy(), "--json"], cache.path());
    let j: Value = serde_json::from_str(&stdout(&o)).expect("inspect json");
    // one q6 tensor (the output layer: 4096 x 256 at 0.78 bytes a weight)
    let q6 = &j["dense_by_type"]["q6"];
    assert_eq!(q6["tensors"], 1, "{}", j["dense_by_type"]);
    let (_d, tb16) = convert("demo", "bf16");
    let (_e, tq4) = convert("demo", "q4");
    let ub = ub16.to_string_lossy().into_owned();
    let tb = tb16.to_string_lossy().into_owned();
    let untied = perplexity_with(&uq4, cache.path(), &["--against", &ub]);
    let tied = perplexity_with(&tq4, cache.path(), &["--against", &tb]);
    // the bf16 packages of both are the same function
    assert_eq!(untied["against"]["nll"], tied["against"]["nll"], "{untied} {tied}");
    let (ku, kt) =
        (untied["against"]["kl_mean"].as_f64().expect("kl"), tied["against"]["kl_mean"].as_f64().expect("kl"));
    assert!(ku <= 1.1 * kt, "q6 output layer KL {ku} vs q8 {kt}");
    let (tu, tt) = (
        untied["against"]["top1_agreement"].as_f64().expect("top1"),
        tied["against"]["top1_agreement"].as_f64().expect("top1"),
    );
    assert!(tu >= tt - 0.01, "top-1 {tu} vs {tt}");
}

/// `--second-half` scores as llama-perplexity does: whole windows only, each window's second
/// half. The mean NLL is recomputed here from the engine's logits with the windows cut by hand.
#[test]
fn second_half_scores_whole_windows_from_their_middle() {
    use moescope::engine::tokenizer::Tok;
    use moescope::engine::{Engine, EngineOptions};
    use moescope::model::{Logits, NoObserver};
    let cache = tempfile::tempdir().expect("tempdir");
    let (_d, pkg) = convert("demo", "bf16");
    let w = 128;
    let got = perplexity_with(&pkg, cache.path(), &["--window", "128", "--second-half", "--tokens", "1000"]);
    let json = std::fs::read_to_string(fixture("demo").join("tokenizer.json")).unwrap();
    let ids = Tok::from_json(&json).unwrap().encode(&std::fs::read_to_string(heldout()).unwrap()).unwrap();
    let ids = &ids[..1000];
    // the tier the command runs at (CI runs the tests again with MOESCOPE_ISA capped)
    let cap = std::env::var("MOESCOPE_ISA").ok().filter(|v| !v.is_empty()).map(|v| v.parse().expect("MOESCOPE_ISA"));
    let isa = moescope_kernels::Isa::detect_capped(cap);
    let mut eng = Engine::load(
        &pkg,
        EngineOptions {
            threads: 2,
            ctx_size: Some(w),
            isa,
            stream: None,
            panels: true,
            kv: moescope::model::KvTypes::F32,
        },
    )
    .expect("load");
    let v = eng.config().vocab_size;
    let (mut sum, mut n) = (0f64, 0usize);
    for win in ids.chunks_exact(w) {
        eng.reset();
        let logits = eng.eval(win, Logits::All, &mut NoObserver).expect("eval").to_vec();
        for p in w / 2..w - 1 {
            let row = &logits[p * v..(p + 1) * v];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            sum += lse - row[win[p + 1] as usize] as f64;
            n += 1;
        }
    }
    assert_eq!(got["predicted"].as_u64(), Some(n as u64), "{got}");
    assert_eq!(n, 1000 / w * (w / 2 - 1), "7 whole windows of 63 scored tokens; the last 104 tokens left out");
    let nll = got["nll"].as_f64().unwrap();
    assert!((nll - sum / n as f64).abs() < 1e-9, "{nll} vs {}", sum / n as f64);
}
