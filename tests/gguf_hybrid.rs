//! qwen35moe and qwen3next GGUFs llama.cpp's converter wrote of tiny hybrid checkpoints (BF16,
//! and Q8_0 by the converter's `--outtype q8_0`), run from the packages `convert_gguf` makes of
//! them, against transformers' logits of each checkpoint itself (a BF16 file holds its
//! checkpoint's weights exactly) and, for qwen35moe, of transformers 5.24 loading the GGUF:
//! - qwen35moe: the Qwen3.5-MoE of tests/fixtures/qwen35 (tests/reference/gguf_perplexity_device.sh);
//! - qwen3next: a Qwen3-Next of the tests/fixtures/next shape with every layer MoE
//!   (tests/fixtures/gguf/next, by tests/reference/gguf_next_device.sh); transformers 5.24 has no
//!   qwen3next GGUF loader.
//!
//! The files keep llama.cpp's conventions and the engine runs them as they are: norms as (1 + w),
//! `ssm_a` = -exp(A_log), qwen35moe's value heads in the tiled order; qwen3next's beta and alpha
//! rows are read out of its fused `ssm_ba`.

mod common;

use common::*;
use moescope::model_config::ModelConfig;

/// Max |Δlogit| and mean KL in units of σ, least top-1 agreement (tests/reference_logits.rs's
/// q8 bounds); None: exact weights, 1e-3.
fn check(reference: &str, file: &str, bounds: Option<(f64, f64, f64)>) {
    let r = Reference::load(reference);
    let dir = file.split('-').next().unwrap_or(file);
    check_gguf_logits(&fixture("gguf").join(dir).join(file), &r.ids("input_ids"), &r.f32("logits"), bounds);
}

/// transformers 5.24 loading the qwen35moe GGUF itself (dequantized to f32), given the
/// checkpoint's config (tests/reference/gguf_hybrid_oracle_device.sh: its GGUF loader takes the
/// layer kinds from `full_attention_interval` and ignores `recurrent_layers`, which this
/// fixture's non-periodic layers need); `logits_<type>` of tests/fixtures/gguf/qwen35.
fn check_against_transformers_on_the_gguf(file: &str, bounds: Option<(f64, f64, f64)>) {
    let r = Reference::load("gguf/qwen35");
    let want = r.f32(&format!("logits_{}", file.trim_start_matches("qwen35-").trim_end_matches(".gguf")));
    check_gguf_logits(&fixture("gguf/qwen35").join(file), &r.ids("input_ids"), &want, bounds);
}

#[test]
fn qwen35moe_bf16_gguf_matches_transformers() {
    check("qwen35", "qwen35-bf16.gguf", None);
    check_against_transformers_on_the_gguf("qwen35-bf16.gguf", None);
}

#[test]
fn qwen35moe_q8_0_gguf_within_the_q8_bounds() {
    check("qwen35", "qwen35-q8_0.gguf", Some((0.6, 1.2e-3, 0.85)));
    check_against_transformers_on_the_gguf("qwen35-q8_0.gguf", Some((0.6, 1.2e-3, 0.85)));
}

/// The config the GGUF's metadata gives and the checkpoint's config.json, with what GGUF states
/// otherwise or not at all (token ids, context length, the eps as f32) taken from the checkpoint.
fn configs(gguf: &str, checkpoint: &str) -> (ModelConfig, ModelConfig) {
    let g = moescope::convert::gguf::model::GgufModel::open(&fixture(gguf)).expect("open");
    let mut from_gguf = g.config().expect("config");
    let hf = moescope::convert::hf_config::read_config(&fixture(checkpoint)).expect("config.json");
    from_gguf.eos_token_ids = hf.eos_token_ids.clone();
    from_gguf.max_position_embeddings = hf.max_position_embeddings;
    from_gguf.bos_token_id = hf.bos_token_id;
    // GGUF keeps the eps as an f32, which is how the engine uses it
    assert_eq!(from_gguf.rms_norm_eps as f32, hf.rms_norm_eps as f32);
    from_gguf.rms_norm_eps = hf.rms_norm_eps;
    (from_gguf, hf)
}

/// The `qwen35moe` metadata gives the checkpoint's own config.json (its MTP block not a layer:
/// `block_count` 5, `nextn_predict_layers` 1), but for what the file changes: value heads come
/// tiled and `ssm_a` negated and exponentiated.
#[test]
fn qwen35moe_metadata_gives_the_checkpoints_config() {
    let (mut from_gguf, hf) = configs("gguf/qwen35/qwen35-bf16.gguf", "qwen35");
    let hy = from_gguf.hybrid.as_mut().expect("hybrid");
    assert!(hy.value_heads_tiled && hy.a_stored_negated_exp);
    hy.value_heads_tiled = false;
    hy.a_stored_negated_exp = false;
    assert_eq!(from_gguf, hf);
}

/// The `qwen3next` metadata gives the checkpoint's config.json (its layer kinds from
/// `attention.recurrent_layers`), value heads in the checkpoint's own grouped order.
#[test]
fn qwen3next_metadata_gives_the_checkpoints_config() {
    let (mut from_gguf, hf) = configs("gguf/next/next-moe-bf16.gguf", "gguf/next");
    let hy = from_gguf.hybrid.as_mut().expect("hybrid");
    assert!(!hy.value_heads_tiled && hy.a_stored_negated_exp);
    hy.a_stored_negated_exp = false;
    assert_eq!(from_gguf, hf);
}

#[test]
fn qwen3next_bf16_gguf_matches_transformers() {
    check("gguf/next", "next-moe-bf16.gguf", None);
}

/// Some of the file's tensors are F16 (the converter's fallback for rows too short for Q8_0).
#[test]
fn qwen3next_q8_0_gguf_within_the_q8_bounds() {
    check("gguf/next", "next-moe-q8_0.gguf", Some((0.6, 1.2e-3, 0.85)));
}
