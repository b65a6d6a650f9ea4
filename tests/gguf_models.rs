//! GGUF files llama.cpp wrote (convert_hf_to_gguf.py, llama-quantize) of a tiny random
//! Qwen3-MoE, run from the package `convert_gguf` makes of each (every tensor as the file
//! holds it), against transformers loading the same GGUF (dequantized by gguf-py; fixture:
//! tests/reference/make_gguf_fixtures.sh, `reference.safetensors` holds `logits_<type>` of the
//! 40-token prompt `ids`).
//!
//! BF16 values are held exactly, so the logits must match to 1e-3 with greedy ids equal where
//! the top-2 margin is at least 1e-3. Q8_0 and Q4_0 are our q8 and q4 formats at group 32 with
//! the file's own codes and scales; the kernels then round the activations to int8, so the
//! logits are held to the q8 bounds of tests/reference_logits.rs (the weights are the file's,
//! so even Q4_0 needs no more). Q4_K_M mixes Q4_K (q4 group 32 with mins) and Q6_K (q6 group
//! 16): its mean KL stays within q8's bound, but the activations' rounding flips a near-tied
//! expert choice of this random model (max |Δ| 0.66σ in one row; 0.03σ while Q4_K ran as f32
//! on f32 activations), so it is held to the q4 bounds.

mod common;

use common::*;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf};
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::{IoMode, StreamConfig};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::Isa;

/// (max |Δlogit| in σ, mean KL in σ², least top-1 agreement): tests/reference_logits.rs's.
fn bounds(kind: &str) -> Option<(f64, f64, f64)> {
    match kind {
        "exact" => None,
        "q8" => Some((0.6, 1.2e-3, 0.85)),
        _ => Some((2.5, 7e-2, 0.35)),
    }
}

fn check(file: &str, key: &str, kind: &str) {
    let r = Reference::load("gguf/tiny");
    check_gguf_logits(&fixture("gguf/tiny").join(file), &r.ids("ids"), &r.f32(&format!("logits_{key}")), bounds(kind));
}

#[test]
fn bf16_split_in_three_parts_matches_transformers() {
    check("split/tiny-bf16-00001-of-00003.gguf", "bf16", "exact");
}

#[test]
fn q8_0_runs_as_q8_group_32() {
    check("tiny-q8_0.gguf", "q8_0", "q8");
}

#[test]
fn q4_0_runs_as_q4_group_32() {
    check("tiny-q4_0.gguf", "q4_0", "q8");
}

#[test]
fn q4_k_m_mixes_q4_k_and_q6_k() {
    check("tiny-q4_k_m.gguf", "q4_k_m", "q4");
}

/// Q4_K_M keeps layer 1's `ffn_down_exps` in Q6_K and layer 0's in Q4_K: the package gives each
/// layer's experts parts of their own (q6 group 16 with k6 records; the Q4_K blocks), and a small pool
/// streaming the blobs from disk gives the logits of the experts served from memory bit for bit.
#[test]
fn q4_k_m_experts_keep_each_layers_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pkg = dir.path().join("k.moe");
    convert_gguf(&fixture("gguf/tiny/tiny-q4_k_m.gguf"), &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
    let o = moescope(&["inspect", pkg.to_str().unwrap(), "--json"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let parts = j["regions"]["experts"]["parts"].as_array().expect("parts");
    let down = |layer: u64| {
        let p = parts.iter().find(|p| p["layer"] == layer && p["name"] == "down_proj").expect("down_proj");
        (p["layout"].as_str().unwrap_or("").to_string(), p["group"].as_u64())
    };
    assert_eq!(parts.len(), 6, "three parts per layer: {parts:?}");
    assert_eq!(down(0), ("row_major+ggml_q4_k".to_string(), Some(32)));
    assert_eq!(down(1).1, Some(16));
    assert!(down(1).0.starts_with("q6_lo4hi2"), "{:?}", down(1));

    let ids = Reference::load("gguf/tiny").ids("ids");
    let run = |stream: Option<StreamConfig>| {
        let opts = EngineOptions {
            threads: 2,
            ctx_size: Some(64),
            isa: Isa::detect(),
            stream,
            panels: true,
            kv: moescope::model::KvTypes::F32,
        };
        let mut eng = Engine::load(&pkg, opts).expect("load");
        eng.eval(&ids, Logits::All, &mut NoObserver).expect("prefill").to_vec()
    };
    let resident = run(None);
    let blob = moescope::package::Package::open(&pkg).expect("open").sizes().blob;
    let small = StreamConfig { budget_bytes: Some(3 * blob), io: Some(IoMode::Direct), ..StreamConfig::default() };
    let streamed = run(Some(small));
    assert!(resident.iter().zip(&streamed).all(|(a, b)| a.to_bits() == b.to_bits()), "streamed logits differ");
}

/// Q4_K and Q6_K keep their own size: ggml's blocks are 144 and 210 bytes a 256 values (4.5 and
/// 6.5625 bits a weight), and the package's Q4_K and Q6_K tensors (dense and expert parts) take
/// as many bytes as the file's, as `inspect` says of both.
#[test]
fn k_quants_keep_the_files_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = fixture("gguf/tiny/tiny-q4_k_m.gguf");
    let o = moescope(&["inspect", gguf.to_str().unwrap(), "--json"], dir.path());
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let q4k = &j["by_type"]["Q4_K"];
    assert_eq!(q4k["bits_per_weight"].as_f64(), Some(4.5), "{q4k}");
    assert_eq!(q4k["package_bytes"], q4k["bytes"], "{q4k}");
    let q6k = &j["by_type"]["Q6_K"];
    assert_eq!(q6k["bits_per_weight"].as_f64(), Some(6.5625), "{q6k}");
    assert_eq!(q6k["package_bytes"], q6k["bytes"], "{q6k}");
    let pkg = dir.path().join("k.moe");
    convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
    let o = moescope(&["inspect", pkg.to_str().unwrap(), "--json"], dir.path());
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let k4_parts: Vec<_> = j["regions"]["experts"]["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["layout"].as_str().is_some_and(|l| l.ends_with("+ggml_q4_k")))
        .collect();
    assert_eq!(k4_parts.len(), 5, "layer 0's three parts and layer 1's gate and up");
    for p in k4_parts {
        assert_eq!(p["bits_per_weight"].as_f64(), Some(4.5), "{p}");
    }
    let parts = j["regions"]["experts"]["parts"].as_array().expect("parts");
    let k6: Vec<_> = parts.iter().filter(|p| p["layout"].as_str().is_some_and(|l| l.ends_with("+k6"))).collect();
    assert_eq!(k6.len(), 1, "layer 1's down_proj");
    assert_eq!(k6[0]["bits_per_weight"].as_f64(), Some(6.5625), "{}", k6[0]);
    assert_eq!(j["dense_by_type"]["Q4_K"]["bits_per_weight"].as_f64(), Some(4.5), "{}", j["dense_by_type"]);
}

/// Q8_0 and Q4_0 keep their own size too: 34 and 18 bytes a 32 values (8.5 and 4.5 bits a
/// weight), the codes and the blocks' f16 scales, in the dense tensors and the experts.
#[test]
fn q8_0_and_q4_0_keep_the_files_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (file, t, bits) in [("tiny-q8_0.gguf", "Q8_0", 8.5), ("tiny-q4_0.gguf", "Q4_0", 4.5)] {
        let gguf = fixture(&format!("gguf/tiny/{file}"));
        let o = moescope(&["inspect", gguf.to_str().unwrap(), "--json"], dir.path());
        let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
        let by = &j["by_type"][t];
        assert_eq!(by["bits_per_weight"].as_f64(), Some(bits), "{by}");
        assert_eq!(by["package_bytes"], by["bytes"], "{by}");
        let pkg = dir.path().join("h.moe");
        convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
        let o = moescope(&["inspect", pkg.to_str().unwrap(), "--json"], dir.path());
        let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
        let parts = j["regions"]["experts"]["parts"].as_array().expect("parts");
        let f16: Vec<_> = parts.iter().filter(|p| p["layout"].as_str().is_some_and(|l| l.ends_with("+f16"))).collect();
        assert_eq!(f16.len(), parts.len(), "{file}: every expert part keeps f16 scales: {parts:?}");
        for p in f16 {
            assert_eq!(p["bits_per_weight"].as_f64(), Some(bits), "{file}: {p}");
        }
        let dense = &j["dense_by_type"][if t == "Q8_0" { "q8" } else { "q4" }];
        assert_eq!(dense["bits_per_weight"].as_f64(), Some(bits), "{file}: {dense}");
    }
}

/// The overall error a requantizing conversion reports, in percent.
fn requant_error(quant: QuantMode) -> Option<f64> {
    let dir = tempfile::tempdir().expect("tempdir");
    let rep = convert_gguf(&fixture("gguf/tiny/tiny-q8_0.gguf"), &dir.path().join("x.moe"), ConvertOptions::new(quant))
        .expect("convert");
    let line = rep.warnings.iter().find(|w| w.contains("relative RMS weight error"))?;
    let pct = line.split("error ").nth(1)?.split('%').next()?;
    Some(pct.parse().expect("a percentage"))
}

#[test]
fn requantizing_reports_its_cost() {
    assert_eq!(requant_error(QuantMode::File), None, "the file's own values cost nothing and say nothing");
    let q8 = requant_error(QuantMode::Q8).expect("q8 reports");
    let q4 = requant_error(QuantMode::Q4 { max_group: 128 }).expect("q4 reports");
    let bf16 = requant_error(QuantMode::Bf16).expect("bf16 reports");
    // bf16 rounds 8 bits below the values' own, q8 regroups int8 codes, q4 halves the bits
    assert!(0.0 < bf16 && bf16 < q8 && q8 < q4, "bf16 {bf16}% q8 {q8}% q4 {q4}%");
    // the bf16 rounding of a value is at most 2^-9 of it
    assert!(bf16 <= 100.0 / 512.0, "bf16 {bf16}%");
}

/// `inspect` says how each type of a GGUF runs, the mapping README documents.
#[test]
fn inspect_says_how_each_type_runs() {
    let d = tempfile::tempdir().unwrap();
    let f = fixture("gguf/tiny/tiny-q4_k_m.gguf");
    let o = moescope(&["inspect", f.to_str().unwrap(), "--json"], d.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let runs = |t: &str| j["by_type"][t]["runs_as"].as_str().map(String::from);
    assert_eq!(runs("Q6_K").as_deref(), Some("q6, group 16 with k6 records"));
    assert_eq!(runs("Q4_K").as_deref(), Some("its own blocks (integer sums a block, activations quantized per 256)"));
    assert_eq!(runs("F32").as_deref(), Some("f32"));
    let f = fixture("gguf/tiny.gguf");
    let o = moescope(&["inspect", f.to_str().unwrap(), "--json"], d.path());
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(j["by_type"]["Q4_0"]["runs_as"], "q4, group 32 with f16 scales");
    assert_eq!(j["by_type"]["Q8_0"]["runs_as"], "q8, group 32 with f16 scales");
    assert_eq!(j["by_type"]["F16"]["runs_as"], "f32 (dequantized)");
}

/// With the file's types kept, every weight the package holds equals the file's value bit for
/// bit (gguf-py's, by kernels/tests/ggml_blocks.rs): dense tensors and every expert.
#[test]
fn packages_hold_the_files_values_exactly() {
    for file in ["split/tiny-bf16-00001-of-00003.gguf", "tiny-q8_0.gguf", "tiny-q4_0.gguf", "tiny-q4_k_m.gguf"] {
        let gguf = fixture("gguf/tiny").join(file);
        let dir = tempfile::tempdir().expect("tempdir");
        let pkg = dir.path().join("x.moe");
        convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
        assert_package_holds_gguf_values(&gguf, &pkg);
    }
    // Q4_1 (its f16 scales and mins kept): the Q8_0 file re-typed, as tests/gguf_llama_logits.rs does
    let dir = tempfile::tempdir().expect("tempdir");
    let (gguf, pkg) = (dir.path().join("tiny-q4_1.gguf"), dir.path().join("x.moe"));
    let q8 = fixture("gguf/tiny/tiny-q8_0.gguf");
    moescope::derived_gguf::low_bit_mix(&q8, &gguf, &[moescope_kernels::ggml::BlockType::Q4_1]).expect("derive");
    convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
    assert_package_holds_gguf_values(&gguf, &pkg);
}
