//! A prompt's logits, and the decode steps after it, are the same bits at any thread count and
//! however finely the parallel sections are cut: every per-token step of a prompt (norms,
//! residual adds, RoPE, routing, quantization, the products' transposes) runs split over the
//! threads, each row computed by itself. The tiny fixtures' sections would be one piece each at
//! the real piece size, so they run with pieces of one row as well.

use std::sync::Arc;

use moescope::exec::Exec;
use moescope::model::{Decoder, KvCache, Logits, NoObserver, Resident, RunState, Runtime};
use moescope::package::Package;
use moescope_kernels::Isa;

mod common;
use common::{Reference, convert};

/// The logits of the prompt (every position) and of two decode steps after it.
fn logits(model: &Decoder, exec: &Exec, prompt: &[u32]) -> Vec<u32> {
    let experts = Resident(model.package());
    let mut st = RunState::new(&model.cfg, prompt.len());
    let mut kv = KvCache::new(&model.cfg, prompt.len() + 2);
    let rt = Runtime { exec, experts: &experts };
    let mut out = model.forward(rt, &mut st, &mut kv, prompt, Logits::All, &mut NoObserver).unwrap().to_vec();
    for id in [3u32, 5] {
        out.extend_from_slice(model.forward(rt, &mut st, &mut kv, &[id], Logits::Last, &mut NoObserver).unwrap());
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn logits_are_the_same_bits_at_any_thread_count_and_piece_size() {
    // q4g32 through the AVX-512 group-32 tiles (rows of 128), q4 (group 128), a hybrid with
    // Gated DeltaNet layers and a shared expert, q8, gpt-oss (sliding windows, sinks, biases),
    // DeepSeek-V3 (latent attention: the prompt's heads expanded, one task each; the decode
    // steps absorbed) and GLM-4.5 (group routing with a correction bias)
    for (name, quant) in [
        ("deepseek", "q4"),
        ("deepseek-noqlora", "bf16"),
        ("glm", "q4g32"),
        ("single", "q4g32"),
        ("single", "q4"),
        ("qwen35", "q4"),
        ("next", "q8"),
        ("gpt-oss-mxfp4", "q4"),
        ("gpt-oss-mxfp4", "mxfp4"),
    ] {
        let r = Reference::load(name);
        let prompt = r.ids("input_ids");
        assert!(prompt.len() >= 8, "{name}: a prompt of several tokens");
        let (_d, path) = convert(name, quant);
        let model = Decoder::load(Arc::new(Package::open(&path).unwrap())).unwrap();
        for isa in Isa::available() {
            let want = logits(&model, &Exec::new(1, isa).unwrap(), &prompt);
            for threads in [2, 3, 5] {
                for least in [64 << 10, 0] {
                    let exec = Exec::new(threads, isa).unwrap().with_min_piece_bytes(least);
                    let got = logits(&model, &exec, &prompt);
                    let first = want.iter().zip(&got).position(|(a, b)| a != b);
                    assert!(
                        first.is_none() && want.len() == got.len(),
                        "{name} {quant} {isa}: {threads} threads, pieces of {least} B: logit {first:?} differs"
                    );
                }
            }
        }
    }
}
