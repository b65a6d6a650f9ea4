//! Each quant type a GGUF can hold, against llama.cpp's own logits on the same file. The tiny
//! Qwen3-MoE's Q8_0 file is written back (test time, `moescope::derived_gguf`) with every
//! quantized tensor as seeded random blocks of one type (Q4_0 ... Q6_K, Q2_K, Q3_K, the IQ
//! types, MXFP4), as `moescope-replay --write-typed-ggufs` writes them; llama.cpp
//! (llama-cpp-python 0.3.36's tree, f32 KV cache, the prompt as one batch) ran each, and its logits at
//! three rows of the 40-token prompt are kept in tests/fixtures/gguf/tiny/llama-logits.safetensors
//! (f16; tests/reference/llama_logits.py).
//!
//! The weights are the same bits on both sides, so what differs is how activations are
//! rounded and the float order. Q2_K, Q3_K and IQ4_XS round activations as llama.cpp does (8
//! bits per 256) and are held to 0.05 sigma max |dlogit| (measured: 0.034, 0.001, 0.002 sigma).
//! The others round them per 16 or 32 (llama.cpp: per 256 for the K and IQ types, per 32 with f16
//! scales for Q4_0 ... Q5_0), and are held to the bound tests/reference_logits.rs allows for q8
//! weights against f32, 0.6 sigma (measured: 0.02-0.14 sigma, IQ3_S 0.28, IQ1_M 0.50; weights
//! rounded to bf16 instead put llama.cpp's IQ1_M logits 0.49 sigma away and moescope's 0.20: the
//! per-256 rounding is the larger error there). The fixture's own f16 rounding is below 2e-3
//! sigma.

mod common;

use common::*;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf};
use moescope::derived_gguf::ONE_TYPE_FILES;
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::ggml::BlockType;

/// (max |dlogit| in sigma, mean KL in sigma^2, least top-1 agreement over the three rows): see
/// the module's note. Top-1 must also agree on every row whose margin exceeds twice the bound.
fn bounds(t: BlockType) -> (f64, f64, f64) {
    match t {
        BlockType::Q2K | BlockType::Q3K | BlockType::Iq4Xs => (0.05, 1e-4, 0.6),
        // measured mean KL up to 5.7e-3 sigma^2 (IQ1_M)
        _ => (0.6, 1e-2, 0.6),
    }
}

#[test]
fn every_quant_type_gives_llama_cpp_logits_on_the_same_file() {
    let llama = Reference::load_file("gguf/tiny", "llama-logits.safetensors");
    let rows: Vec<usize> = llama.i64("rows").into_iter().map(|r| r as usize).collect();
    let ids = Reference::load("gguf/tiny").ids("ids");
    let dir = tempfile::tempdir().expect("tempdir");
    for t in ONE_TYPE_FILES {
        let name = t.name().to_lowercase();
        let gguf = dir.path().join(format!("tiny-{name}.gguf"));
        let k = moescope::derived_gguf::low_bit_mix(&fixture("gguf/tiny/tiny-q8_0.gguf"), &gguf, &[t]).expect("derive");
        assert!(k >= 10, "{name}: {k} tensors re-typed");
        let want = llama.f16(&format!("llama_{name}"));
        let v = want.len() / rows.len();
        let pkg = dir.path().join(format!("tiny-{name}.moe"));
        convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for isa in moescope_kernels::Isa::available() {
            let opts = EngineOptions {
                threads: 2,
                ctx_size: Some(64),
                isa,
                stream: None,
                panels: true,
                kv: moescope::model::KvTypes::F32,
            };
            let mut eng = Engine::load(&pkg, opts).expect("load");
            let all = eng.eval(&ids, Logits::All, &mut NoObserver).expect("prefill");
            let got: Vec<f32> = rows.iter().flat_map(|&r| all[r * v..(r + 1) * v].to_vec()).collect();
            check_logits(&format!("{name} {isa}"), &got, &want, v, Some(bounds(t)));
        }
        std::fs::remove_file(&pkg).ok();
    }
}

/// The tiny Q8_0 file with YaRN's keys as llama.cpp's converter writes them for a Qwen
/// checkpoint (`moescope::derived_gguf::with_yarn`: factor 4 over 16 original positions, rows
/// 20 and 39 of the prompt past them): llama.cpp's logits on that file (`llama_yarn`, made by
/// tests/reference/llama_logits.py from `moescope-replay --write-typed-ggufs`'s tiny-yarn.gguf).
#[test]
fn yarn_keys_give_llama_cpp_logits_past_the_original_context() {
    let llama = Reference::load_file("gguf/tiny", "llama-logits.safetensors");
    let rows: Vec<usize> = llama.i64("rows").into_iter().map(|r| r as usize).collect();
    let ids = Reference::load("gguf/tiny").ids("ids");
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = dir.path().join("tiny-yarn.gguf");
    moescope::derived_gguf::with_yarn(&fixture("gguf/tiny/tiny-q8_0.gguf"), &gguf).expect("derive");
    let pkg = dir.path().join("tiny-yarn.moe");
    convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
    let want = llama.f16("llama_yarn");
    let v = want.len() / rows.len();
    assert!(rows.iter().any(|&r| r >= moescope::derived_gguf::YARN_ORIGINAL_CONTEXT as usize));
    let opts = EngineOptions { ctx_size: Some(64), kv: moescope::model::KvTypes::F32, ..common::options(None) };
    let mut eng = Engine::load(&pkg, opts).expect("load");
    let all = eng.eval(&ids, Logits::All, &mut NoObserver).expect("prefill");
    let got: Vec<f32> = rows.iter().flat_map(|&r| all[r * v..(r + 1) * v].to_vec()).collect();
    // measured 0.055 sigma (Q8_0's activations rounded per 32 against llama.cpp's per 32 in f16)
    check_logits("yarn", &got, &want, v, Some((0.15, 1e-3, 0.6)));
}
