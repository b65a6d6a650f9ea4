//! qwen35moe GGUFs llama.cpp's converter wrote of the tiny Qwen3.5-MoE fixture
//! (tests/fixtures/qwen35, by tests/reference/gguf_perplexity_device.sh: BF16, and Q8_0 by the
//! converter's `--outtype q8_0`), run from the packages `convert_gguf` makes of them, against
//! transformers' logits of the checkpoint itself (tests/fixtures/qwen35/reference.safetensors;
//! transformers 5.17 cannot load a qwen35moe GGUF, and the BF16 file holds the checkpoint's
//! weights exactly). The files keep llama.cpp's conventions and the engine runs them as they
//! are: norms as (1 + w), `ssm_a` = -exp(A_log), value heads in the tiled order.

mod common;

use common::*;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf};
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::Isa;

/// Max |Δlogit| and mean KL in units of σ, least top-1 agreement (tests/reference_logits.rs's
/// q8 bounds); None: exact weights, 1e-3.
fn check(file: &str, bounds: Option<(f64, f64, f64)>) {
    let r = Reference::load("qwen35");
    let ids = r.ids("input_ids");
    let want = r.f32("logits");
    let v = r.shape("logits")[1];
    let n = want.len() as f64;
    let mean = want.iter().map(|&x| x as f64).sum::<f64>() / n;
    let sigma = (want.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    let dir = tempfile::tempdir().expect("tempdir");
    let pkg = dir.path().join("q35.moe");
    convert_gguf(&fixture("gguf/qwen35").join(file), &pkg, ConvertOptions::new(QuantMode::File))
        .unwrap_or_else(|e| panic!("converting {file}: {e}"));
    for isa in Isa::available() {
        let tag = format!("{file} {isa}");
        let ctx = ids.len().next_multiple_of(64);
        let mut eng =
            Engine::load(&pkg, EngineOptions { threads: 2, ctx_size: Some(ctx), isa, stream: None }).expect("load");
        let got = eng.eval(&ids, Logits::All, &mut NoObserver).expect("prefill");
        assert_eq!(got.len(), want.len(), "{tag}: logits");
        // the last token again, one at a time after the rest
        eng.reset();
        eng.eval(&ids[..ids.len() - 1], Logits::Last, &mut NoObserver).expect("prefill");
        let inc = eng.eval(&ids[ids.len() - 1..], Logits::Last, &mut NoObserver).expect("decode");
        let d_inc = max_abs_diff(&inc, &got[(ids.len() - 1) * v..]);
        assert!(d_inc <= 1e-4, "{tag}: decode differs from the prompt's last row by {d_inc}");
        let (mut max_abs, mut kl_sum, mut agree) = (0f32, 0f64, 0usize);
        for (i, (a, b)) in got.chunks_exact(v).zip(want.chunks_exact(v)).enumerate() {
            max_abs = max_abs.max(max_abs_diff(a, b));
            kl_sum += kl(b, a);
            agree += usize::from(argmax(a) == argmax(b));
            let flip = bounds.map_or(1e-3, |(b, _, _)| (2.0 * b * sigma) as f32);
            if margin(b) >= flip {
                assert_eq!(argmax(a), argmax(b), "{tag}: row {i}: top-1 differs where the margin is {}", margin(b));
            }
        }
        let rows = ids.len() as f64;
        let mean_kl = kl_sum / rows;
        eprintln!(
            "{tag}: sigma {sigma:.3} max|dlogit| {max_abs:.3e} ({:.3} sigma) mean KL {mean_kl:.3e} top1 {:.3}",
            max_abs as f64 / sigma,
            agree as f64 / rows
        );
        match bounds {
            None => assert!(max_abs <= 1e-3, "{tag}: max |dlogit| {max_abs} > 1e-3"),
            Some((b, kl_max, agree_min)) => {
                assert!(max_abs as f64 <= b * sigma, "{tag}: max |dlogit| {max_abs} > {}", b * sigma);
                assert!(mean_kl <= kl_max * sigma * sigma, "{tag}: mean KL {mean_kl}");
                assert!(agree as f64 / rows >= agree_min, "{tag}: top-1 agreement {}", agree as f64 / rows);
            }
        }
    }
}

#[test]
fn qwen35moe_bf16_gguf_matches_transformers() {
    check("qwen35-bf16.gguf", None);
}

#[test]
fn qwen35moe_q8_0_gguf_within_the_q8_bounds() {
    check("qwen35-q8_0.gguf", Some((0.6, 1.2e-3, 0.85)));
}

/// The `qwen35moe` metadata gives the checkpoint's own config.json (its MTP block not a layer:
/// `block_count` 5, `nextn_predict_layers` 1), but for what the file changes: value heads come
/// tiled and `ssm_a` negated and exponentiated; the token ids are the tokenizer's.
#[test]
fn qwen35moe_metadata_gives_the_checkpoints_config() {
    let g = moescope::convert::gguf_model::GgufModel::open(&fixture("gguf/qwen35/qwen35-bf16.gguf")).expect("open");
    let mut from_gguf = g.config().expect("config");
    let hf = moescope::convert::hf_config::read_config(&fixture("qwen35")).expect("config.json");
    let hy = from_gguf.hybrid.as_mut().expect("hybrid");
    assert!(hy.value_heads_tiled && hy.a_stored_negated_exp);
    hy.value_heads_tiled = false;
    hy.a_stored_negated_exp = false;
    from_gguf.eos_token_ids = hf.eos_token_ids.clone();
    from_gguf.max_position_embeddings = hf.max_position_embeddings;
    from_gguf.bos_token_id = hf.bos_token_id;
    // GGUF keeps the eps as an f32, which is how the engine uses it
    assert_eq!(from_gguf.rms_norm_eps as f32, hf.rms_norm_eps as f32);
    from_gguf.rms_norm_eps = hf.rms_norm_eps;
    assert_eq!(from_gguf, hf);
}
