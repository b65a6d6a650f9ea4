//! A hybrid model's MoE layer has a shared expert beside the routed ones. The predictor guesses
//! the next layer's experts by applying that layer's router to what this layer hands it (the
//! lookahead); with the shared expert's gated output added to the residual first, the guess is
//! closer to what the next router will see. The lookahead of one decode token is checked against
//! transformers (tests/reference/make_lookahead_reference.py), and is told apart from the MoE
//! block's own input, which it was before.

mod common;

use std::sync::{Arc, Mutex};

use common::{Reference, convert, fixture};
use moescope::exec::Exec;
use moescope::model::{
    Decoder, ExpertQuery, ExpertSource, KvCache, Logits, ModelError, NoObserver, ReadyFn, Resident, RunState, Runtime,
};
use moescope::package::Package;
use moescope_kernels::Isa;

/// The package's own experts, noting each one-token query's lookahead by model layer.
struct Recording<'a> {
    inner: Resident<'a>,
    seen: Mutex<Vec<(usize, Vec<f32>)>>,
}

impl ExpertSource for Recording<'_> {
    fn resident(&self, moe_layer: usize, candidates: &[usize]) -> Vec<bool> {
        self.inner.resident(moe_layer, candidates)
    }

    fn for_each_ready(&self, q: &ExpertQuery<'_>, each: &mut ReadyFn<'_>) -> Result<(), ModelError> {
        if q.tokens == 1 {
            let mut x = Vec::new();
            q.ahead.input.lookahead(0, &mut x);
            self.seen.lock().unwrap().push((q.layer, x));
        }
        self.inner.for_each_ready(q, each)
    }
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().expect("a list of numbers").iter().map(|x| x.as_f64().expect("a number") as f32).collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn the_next_router_sees_the_residual_with_the_shared_expert_added() {
    for name in ["qwen35", "next"] {
        let want: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture(name).join("lookahead.json")).unwrap()).unwrap();
        let r = Reference::load(name);
        let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
        assert_eq!(want["tokens"].as_u64(), Some(prompt.len() as u64 + 1), "{name}: the reference's tokens");

        let (_d, path) = convert(name, "bf16");
        let model = Decoder::load(Arc::new(Package::open(&path).unwrap())).unwrap();
        let exec = Exec::new(2, Isa::detect()).unwrap();
        let src = Recording { inner: Resident(model.package()), seen: Mutex::new(Vec::new()) };
        let mut st = RunState::new(&model.cfg, prompt.len());
        let mut kv = KvCache::new(&model.cfg, prompt.len() + 4);
        model
            .forward(Runtime { exec: &exec, experts: &src }, &mut st, &mut kv, &prompt, Logits::Last, &mut NoObserver)
            .unwrap();
        assert!(src.seen.lock().unwrap().is_empty(), "the prompt is one batch: no one-token query");
        model
            .forward(
                Runtime { exec: &exec, experts: &src },
                &mut st,
                &mut kv,
                &forced[..1],
                Logits::Last,
                &mut NoObserver,
            )
            .unwrap();

        let seen = src.seen.lock().unwrap();
        let layers = want["layers"].as_array().unwrap();
        let moe_layers = layers.iter().filter(|l| !l.is_null()).count();
        assert_eq!(seen.len(), moe_layers, "{name}: one query per MoE layer");
        for (l, got) in seen.iter() {
            let w = &layers[*l];
            let (lookahead, moe_input) = (floats(&w["lookahead"]), floats(&w["moe_input"]));
            let err = max_abs(got, &lookahead);
            // bf16 weights computed in f32 on both sides: the gap is summation order
            assert!(err < 2e-4, "{name} layer {l}: lookahead off by {err}");
            let apart = max_abs(&lookahead, &moe_input);
            assert!(apart > 50.0 * 2e-4, "{name} layer {l}: the reference cannot tell the two apart ({apart})");
        }
    }
}
