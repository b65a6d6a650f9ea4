//! qwen35moe GGUFs llama.cpp's converter wrote of the tiny Qwen3.5-MoE fixture
//! (tests/fixtures/qwen35, by tests/reference/gguf_perplexity_device.sh: BF16, and Q8_0 by the
//! converter's `--outtype q8_0`), run from the packages `convert_gguf` makes of them, against
//! transformers' logits of the checkpoint itself (tests/fixtures/qwen35/reference.safetensors;
//! transformers 5.17 cannot load a qwen35moe GGUF, and the BF16 file holds the checkpoint's
//! weights exactly). The files keep llama.cpp's conventions and the engine runs them as they
//! are: norms as (1 + w), `ssm_a` = -exp(A_log), value heads in the tiled order.

mod common;

use common::*;

/// Max |Δlogit| and mean KL in units of σ, least top-1 agreement (tests/reference_logits.rs's
/// q8 bounds); None: exact weights, 1e-3.
fn check(file: &str, bounds: Option<(f64, f64, f64)>) {
    let r = Reference::load("qwen35");
    check_gguf_logits(&fixture("gguf/qwen35").join(file), &r.ids("input_ids"), &r.f32("logits"), bounds);
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
