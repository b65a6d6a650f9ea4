//! The predictor's scores on the trained demo model's decode, one and two MoE layers ahead,
//! against transformers: the same guesses (each layer's router applied to the MoE input of the
//! layer one or two before it) scored against the same routes, slot by slot and by gate weight
//! (tests/reference/make_predictor_reference.py -> tests/fixtures/demo/predictor.json).

mod common;

use common::{Reference, convert, fixture};
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::stats::Recall;
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::Isa;

fn count(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("predictor.json: {key} is not a count"))
}

/// `got` matches the reference scoring `want`, but for the scorings a near tie decides (each
/// moves at most one routed expert in or out of the guess, or one expert between slots).
fn assert_scored_as(name: &str, got: &Recall, want: &serde_json::Value) {
    assert_eq!(got.routed, count(want, "routed"), "{name}: every guess is scored");
    let ties = count(want, "near_ties");
    let slack = |a: u64, b: u64| a.abs_diff(b) <= ties;
    assert!(
        slack(got.routed_predicted, count(want, "routed_predicted")),
        "{name}: {} routed experts predicted, transformers {} ({ties} near ties)",
        got.routed_predicted,
        want["routed_predicted"]
    );
    let slots: Vec<u64> =
        want["slot_predicted"].as_array().expect("slots").iter().map(|x| x.as_u64().expect("a count")).collect();
    assert_eq!(got.slot_predicted.len(), slots.len(), "{name}: slots");
    for (j, (&g, &w)) in got.slot_predicted.iter().zip(&slots).enumerate() {
        assert!(slack(g, w), "{name}: slot {j}: {g} predicted, transformers {w}");
    }
    let gm = want["gate_mass_predicted"].as_f64().expect("gate mass") / want["gate_mass"].as_f64().expect("gate mass");
    let tol = 0.01 + ties as f64 / got.routed as f64;
    assert!((got.gate_mass_recall() - gm).abs() <= tol, "{name}: gate-mass recall {} vs {gm}", got.gate_mass_recall());
}

#[test]
fn the_predictor_scores_as_transformers_one_and_two_layers_ahead() {
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("demo").join("predictor.json")).unwrap()).unwrap();
    let r = Reference::load("demo");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    assert_eq!(count(&want, "decode_tokens"), forced.len() as u64);
    let (_d, pkg) = convert("demo", "bf16");
    let stream = StreamConfig {
        budget_bytes: Some(1 << 30),
        policy: PolicyKind::Foresight,
        prefetch: true,
        io_workers: 2,
        io: Some(IoMode::Buffered),
        verify: true,
        auto: false,
        force: false,
    };
    let mut eng = Engine::load(
        &pkg,
        EngineOptions {
            threads: 2,
            ctx_size: Some(320),
            isa: Isa::detect(),
            stream: Some(stream),
            panels: true,
            kv: moescope::model::KvTypes::F32,
        },
    )
    .expect("load");
    eng.streamed().unwrap().predictor.set_lossless(true);
    eng.reset();
    eng.eval(&prompt, Logits::Last, &mut NoObserver).unwrap();
    for &id in &forced {
        eng.eval(&[id], Logits::Last, &mut NoObserver).unwrap();
    }
    let p = eng.streamed().unwrap().predictor.stats();
    assert_scored_as("one ahead", &p.next, &want["one_ahead"]);
    assert_scored_as("two ahead", &p.two_ahead, &want["two_ahead"]);
}
