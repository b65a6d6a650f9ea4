//! GLM-4.5 (`glm4_moe`) beyond tests/reference_logits.rs's checkpoint run: the Q8_0 GGUF
//! llama.cpp's converter wrote of the same checkpoint (tests/fixtures/gguf/glm, by
//! tests/reference/make_gguf_glm.py), run from the package `convert_gguf` makes of it, against
//! transformers' logits of the checkpoint, and its configuration against the checkpoint's. (Its
//! BF16 file gives transformers' logits within 1.3e-6; it is not committed, for the tree's size.)
//! The file also holds the MTP layer (tests/mtp.rs checks it), which is not run.

mod common;

use common::*;

/// tests/reference_logits.rs's q8 bounds: max |Δlogit| 0.6σ, mean KL 1.2e-3σ², top-1 0.85.
const Q8: (f64, f64, f64) = (0.6, 1.2e-3, 0.85);

fn check(file: &str, bounds: Option<(f64, f64, f64)>) {
    let r = Reference::load("glm");
    check_gguf_logits(&fixture("gguf/glm").join(file), &r.ids("input_ids"), &r.f32("logits"), bounds);
}

/// The checkpoint's package (bf16) and the Q8_0 file's.
fn configs() -> (moescope::model_config::ModelConfig, moescope::model_config::ModelConfig) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_d, hf) = convert("glm", "bf16");
    let gguf = dir.path().join("g.moe");
    use moescope::convert::{ConvertOptions, QuantMode, convert_gguf};
    convert_gguf(&fixture("gguf/glm/glm-q8_0.gguf"), &gguf, ConvertOptions::new(QuantMode::File)).expect("convert");
    let open = |p: &std::path::Path| moescope::package::Package::open(p).expect("package").meta.model.clone();
    (open(&hf), open(&gguf))
}

#[test]
fn q8_0_gguf_by_llama_cpps_converter_stays_in_the_q8_bounds() {
    check("glm-q8_0.gguf", Some(Q8));
}

/// The file states what the checkpoint's config.json does (the router's groups and scale, the
/// renormalisation, the shared expert, the dense layers, the rotary dims, the biases and norms it
/// holds, the MTP layer): the GGUF's package has the checkpoint's configuration, the eps aside
/// (the file keeps it as an f32).
#[test]
fn the_gguf_reads_as_the_checkpoints_config() {
    let (mut a, mut b) = configs();
    assert!((a.rms_norm_eps - b.rms_norm_eps).abs() < 1e-12, "{} vs {}", a.rms_norm_eps, b.rms_norm_eps);
    a.rms_norm_eps = 0.0;
    b.rms_norm_eps = 0.0;
    // the checkpoint has no tokenizer; the file's byte-level one ends nothing
    (a.eos_token_ids, b.eos_token_ids, a.bos_token_id, b.bos_token_id) = (vec![], vec![], None, None);
    assert_eq!(a, b);
}
