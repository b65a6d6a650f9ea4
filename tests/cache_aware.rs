//! Cache-aware routing (`--cache-aware-routing TOL`): a routed expert missing from the pool gives
//! way to a pooled one among the next top-k candidates within TOL of its router probability.
//! The rule is checked on every routing call against the router's own probabilities; with
//! prefetch off it is deterministic for a pool size; TOL 0 is the exact model.

mod common;

use std::path::Path;

use common::*;
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::{Logits, Observer};
use moescope_kernels::Isa;

/// Every routing call: the experts taken, their weights, and the router's probabilities.
#[derive(Default)]
struct Seen(Vec<(Vec<usize>, Vec<f32>, Vec<f32>)>);
impl Observer for Seen {
    fn routing(&mut self, _layer: usize, _pos: usize, experts: &[usize], weights: &[f32], probs: &[f32]) {
        self.0.push((experts.to_vec(), weights.to_vec(), probs.to_vec()));
    }
}

fn engine(pkg: &Path, slots: u64, tol: Option<f32>) -> Engine {
    let o = |stream| EngineOptions {
        threads: 2,
        ctx_size: Some(320),
        isa: Isa::detect(),
        stream,
        panels: true,
        kv: moescope::model::KvTypes::F32,
    };
    let blob = slot_bytes(pkg);
    let stream = StreamConfig {
        budget_bytes: Some(slots * blob),
        policy: PolicyKind::Foresight,
        prefetch: false,
        io_workers: 2,
        io: Some(IoMode::Direct),
        verify: true,
        auto: false,
        force: false,
    };
    let mut eng = Engine::load(pkg, o(Some(stream))).unwrap();
    eng.set_cache_aware_routing(tol).unwrap();
    eng
}

fn run(eng: &mut Engine, prompt: &[u32], forced: &[u32]) -> (Vec<f32>, Seen) {
    let mut seen = Seen::default();
    eng.reset();
    let mut out = eng.eval(prompt, Logits::Last, &mut seen).unwrap().to_vec();
    for &id in &forced[..16] {
        out.extend_from_slice(eng.eval(&[id], Logits::Last, &mut seen).unwrap());
    }
    (out, seen)
}

/// The top-k of `p` by probability, ties to the lower id (the oracle's own sort).
fn top(p: &[f32], k: usize) -> Vec<usize> {
    let mut i: Vec<usize> = (0..p.len()).collect();
    i.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    i.truncate(k);
    i
}

#[test]
fn substitutes_come_from_the_next_candidates_within_the_tolerance() {
    for name in ["wide", "qwen35"] {
        let (_d, pkg) = convert(name, "q4");
        let r = Reference::load(name);
        let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
        let cfg = Engine::load(
            &pkg,
            EngineOptions {
                threads: 1,
                ctx_size: Some(320),
                isa: Isa::detect(),
                stream: None,
                panels: true,
                kv: moescope::model::KvTypes::F32,
            },
        )
        .unwrap()
        .config()
        .clone();
        let (e_n, k) = (cfg.num_experts, cfg.num_experts_per_tok);
        let slots = (e_n * cfg.moe_layers().len() / 3) as u64;
        let tol = 0.05f32;
        let mut eng = engine(&pkg, slots, Some(tol));
        let (logits, seen) = run(&mut eng, &prompt, &forced);
        let mut subs = 0;
        for (chosen, w, p) in &seen.0 {
            let exact = top(p, k);
            let wide = top(p, 2 * k);
            let added: Vec<usize> = chosen.iter().copied().filter(|e| !exact.contains(e)).collect();
            let dropped: Vec<usize> = exact.iter().copied().filter(|e| !chosen.contains(e)).collect();
            assert_eq!(added.len(), dropped.len(), "{name}: one substitute per dropped expert");
            let lowest_dropped = dropped.iter().map(|&e| p[e]).fold(f32::INFINITY, f32::min);
            for &s in &added {
                assert!(wide.contains(&s), "{name}: substitute {s} is not among the top-2k");
                assert!(
                    p[s] >= lowest_dropped - tol,
                    "{name}: substitute {s} is more than {tol} below what it replaced"
                );
            }
            // rank order by probability, weights from the chosen experts' probabilities
            let order = top(&chosen.iter().map(|&e| p[e]).collect::<Vec<_>>(), chosen.len());
            assert_eq!(order, (0..chosen.len()).collect::<Vec<_>>(), "{name}: rank order");
            let sum: f32 = chosen.iter().map(|&e| p[e]).sum();
            let norm = if cfg.norm_topk_prob { sum } else { 1.0 };
            for (&e, &we) in chosen.iter().zip(w) {
                assert!((we - p[e] / norm).abs() < 1e-6, "{name}: weight of {e}");
            }
            subs += added.len();
        }
        assert!(subs > 0, "{name}: a third of the experts in the pool must leave something to substitute");
        assert_eq!(subs as u64, eng.model().substitutions(), "{name}: substitutions counted");
        // prefetch off: the same pool gives the same substitutions and the same bits
        let mut again = engine(&pkg, slots, Some(tol));
        let (logits2, _) = run(&mut again, &prompt, &forced);
        assert!(logits.iter().zip(&logits2).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: deterministic");
        assert_eq!(again.model().substitutions(), subs as u64);
        // tolerance 0 is the exact model
        let (exact, _) = run(&mut engine(&pkg, slots, None), &prompt, &forced);
        let (zero, _) = run(&mut engine(&pkg, slots, Some(0.0)), &prompt, &forced);
        assert!(exact.iter().zip(&zero).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: tolerance 0");
    }
}

#[test]
fn perplexity_reports_what_cache_aware_routing_costs_against_exact_routing() {
    let (dir, pkg) = convert("tied-demo-tok", "q4");
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "Rust is a systems programming language. Ownership rules decide when values are dropped. ".repeat(12),
    )
    .unwrap();
    let p = pkg.to_str().unwrap();
    let args =
        ["perplexity", "-m", p, text.to_str().unwrap(), "--window", "64", "--cache-mb", "0.2", "--prefetch", "off"];
    let o = moescope(&[&args[..], &["--cache-aware-routing", "0.2", "--against", p, "--json"]].concat(), dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let n = v["cache_aware_routing"]["substitutions"].as_u64().unwrap();
    assert!(n > 0, "{v}");
    let (agree, kl) = (v["against"]["top1_agreement"].as_f64().unwrap(), v["against"]["kl_mean"].as_f64().unwrap());
    assert!(kl > 0.0 && agree <= 1.0, "{v}");
    // exact routing against itself (the KV cache exact too, as the base keeps it): no
    // substitution, no divergence
    let o = moescope(&[&args[..], &["--against", p, "-ctk", "f32", "-ctv", "f32", "--json"]].concat(), dir.path());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["cache_aware_routing"].is_null());
    assert_eq!(v["against"]["top1_agreement"].as_f64(), Some(1.0), "{v}");
    assert!(v["against"]["kl_mean"].as_f64().unwrap() < 1e-9, "{v}");
    // a tolerance that is not a probability gap
    let o = moescope(&[&args[..], &["--cache-aware-routing", "2"]].concat(), dir.path());
    assert_clean_failure(&o, &["--cache-aware-routing", "not in [0, 1]"]);
}
