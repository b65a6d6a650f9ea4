//! DeepSeek-V3 (`deepseek_v3`) beyond tests/reference_logits.rs's checkpoint runs: the GGUF
//! llama.cpp's converter wrote of tests/fixtures/deepseek (`deepseek2`, kv_b_proj split into
//! `attn_k_b` / `attn_v_b`; tests/fixtures/gguf/deepseek, by
//! tests/reference/make_gguf_deepseek.py), run from the package `convert_gguf` makes of it,
//! against transformers' logits of the checkpoint it holds (YaRN's mscale equal to
//! mscale_all_dim, the one value a GGUF states for both), and its configuration against the
//! checkpoint's, and the older converter's whole `attn_kv_b` form of the same checkpoint.
//! (Their BF16 files are not committed, for the tree's size.)

mod common;

use common::*;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf};
use moescope::model_config::ModelConfig;

/// tests/reference_logits.rs's q8 bounds: max |Δlogit| 0.6σ, mean KL 1.2e-3σ², top-1 0.85.
const Q8: (f64, f64, f64) = (0.6, 1.2e-3, 0.85);

fn gguf() -> std::path::PathBuf {
    fixture("gguf/deepseek/deepseek-q8_0.gguf")
}

#[test]
fn q8_0_gguf_by_llama_cpps_converter_stays_in_the_q8_bounds() {
    let r = Reference::load("gguf/deepseek");
    check_gguf_logits(&gguf(), &r.ids("input_ids"), &r.f32("logits"), Some(Q8));
}

/// The same checkpoint through llama.cpp's converter of early 2025 (llama-cpp-python 0.3.8's
/// tree, by tests/reference/make_gguf_deepseek.py), which writes kv_b_proj whole (`attn_kv_b`)
/// and states a head's own key and value lengths: split into the absorbed halves on reading,
/// within the same q8 bounds of transformers' logits.
#[test]
fn legacy_attn_kv_b_gguf_by_an_older_converter_stays_in_the_q8_bounds() {
    let path = fixture("gguf/deepseek/deepseek-legacy-q8_0.gguf");
    let bytes = std::fs::read(&path).expect("fixture");
    let has = |name: &[u8]| bytes.windows(name.len()).any(|w| w == name);
    assert!(has(b"blk.1.attn_kv_b.weight") && !has(b"attn_k_b"), "the fixture holds the legacy layout");
    let r = Reference::load("gguf/deepseek");
    check_gguf_logits(&path, &r.ids("input_ids"), &r.f32("logits"), Some(Q8));
}

/// The file states what the checkpoint's config.json does (latent attention's ranks and head
/// dims, YaRN, the router's groups, scale and renormalisation, the shared expert, the dense
/// layer): the GGUF's package has the checkpoint's configuration with mscale = mscale_all_dim,
/// the eps and the softmax scale aside (the file keeps 0.1 x mscale_all_dim and the eps as
/// f32s), and the MTP layer the converter leaves out.
#[test]
fn the_gguf_reads_as_the_checkpoints_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_d, hf) = convert("deepseek", "bf16");
    let g = dir.path().join("g.moe");
    convert_gguf(&gguf(), &g, ConvertOptions::new(QuantMode::File)).expect("convert");
    let open = |p: &std::path::Path| moescope::package::Package::open(p).expect("package").meta.model.clone();
    let (mut a, mut b): (ModelConfig, ModelConfig) = (open(&hf), open(&g));
    assert!((a.rms_norm_eps - b.rms_norm_eps).abs() < 1e-12, "{} vs {}", a.rms_norm_eps, b.rms_norm_eps);
    let (ma, mb) = (a.features.mla.as_mut().expect("mla"), b.features.mla.as_mut().expect("mla"));
    let rel = (ma.softmax_scale / mb.softmax_scale - 1.0).abs();
    assert!(rel < 1e-6, "softmax scale {} vs {}", ma.softmax_scale, mb.softmax_scale);
    (ma.softmax_scale, mb.softmax_scale) = (0.0, 0.0);
    (a.rms_norm_eps, b.rms_norm_eps) = (0.0, 0.0);
    // mscale = mscale_all_dim: cos and sin unscaled
    a.features.rope_yarn.as_mut().expect("yarn").attention_factor = 1.0;
    assert_eq!(a.features.nextn_layers, 1);
    a.features.nextn_layers = 0;
    // the checkpoint has no tokenizer; the file's byte-level one ends nothing
    (a.eos_token_ids, b.eos_token_ids, a.bos_token_id, b.bos_token_id) = (vec![], vec![], None, None);
    assert_eq!(a, b);
}

/// A batch runs latent attention expanded (each head's keys and values made from the cache a
/// split of 1,024 positions at a time), a decoded token absorbed. 1,100 tokens in one pass
/// (two splits, the second cut short), and as batches of 1,000 and 100 (the second's queries
/// see all of one split and part of the next), against the same tokens decoded one at a
/// time: the same weights' sums in another order, within the f32 bound (bf16 weights: no
/// activation rounding in either form).
#[test]
fn expanded_batches_over_two_splits_equal_absorbed_decode() {
    use moescope::exec::Exec;
    use moescope::model::{Decoder, KvCache, Logits, NoObserver, Resident, RunState, Runtime};
    use moescope_kernels::Isa;
    use std::sync::Arc;

    let (_d, path) = convert("deepseek-noqlora", "bf16");
    let model = Decoder::load(Arc::new(moescope::package::Package::open(&path).expect("package"))).expect("load");
    let (n, v) = (1100, model.cfg.vocab_size);
    let ids: Vec<u32> = (0..n).map(|i| ((i * 7919 + 13) % v) as u32).collect();
    let exec = Exec::new(2, Isa::detect()).expect("exec");
    let experts = Resident(model.package());
    let rt = Runtime { exec: &exec, experts: &experts };
    let run = |batches: &[usize]| {
        let mut st = RunState::new(&model.cfg, n);
        let mut kv = KvCache::new(&model.cfg, n);
        let (mut out, mut at) = (Vec::new(), 0);
        for &b in batches {
            let want = if b == 1 { Logits::Last } else { Logits::All };
            let rows = model.forward(rt, &mut st, &mut kv, &ids[at..at + b], want, &mut NoObserver).expect("forward");
            out.extend_from_slice(rows);
            at += b;
        }
        out
    };
    let decoded = run(&[1; 1100]);
    for batches in [&[1100][..], &[1000, 100]] {
        let batch = run(batches);
        let d = max_abs_diff(&batch, &decoded);
        assert!(d <= 1e-4, "batches {batches:?}: max |dlogit| {d} from the tokens decoded one at a time");
    }
}
