//! A hybrid model's recurrent state across turns. Its conv and delta-rule states cannot be cut
//! back like a KV cache, so a new prompt reuses them only when it extends the cached tokens
//! exactly, or from the checkpoint taken at a prompt's end (a later turn that rewrites the
//! last reply, as Qwen templates do when they drop an old <think> block); otherwise it
//! recomputes. Either way the logits are those of the prompt run from scratch.

mod common;

use std::sync::atomic::AtomicBool;

use common::*;
use moescope::engine::sampler::{Sampler, SamplerParams};
use moescope::engine::{Engine, EngineOptions, GenRequest, GenStats, Reuse};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::Isa;

/// A greedy turn of `n` tokens after `prompt`: its stats and the logits of every step.
fn turn(eng: &mut Engine, prompt: &[u32], n: usize) -> (GenStats, Vec<Vec<f32>>) {
    let mut sampler = Sampler::new(SamplerParams { temperature: 0.0, ..Default::default() });
    let cancel = AtomicBool::new(false);
    let req = GenRequest { max_tokens: n, stop_at_eos: false, cancel: &cancel, progress: None };
    let mut steps = vec![];
    let stats = eng
        .generate(prompt, &mut sampler, req, &mut NoObserver, &mut |_, l| {
            steps.push(l.to_vec());
            true
        })
        .expect("turn");
    (stats, steps)
}

/// The last logits of `prompt` on a fresh cache.
fn from_scratch(eng: &mut Engine, prompt: &[u32]) -> Vec<f32> {
    eng.reset();
    eng.eval(prompt, Logits::Last, &mut NoObserver).expect("from scratch").to_vec()
}

#[test]
fn turns_reuse_state_only_where_it_is_exact_and_match_a_fresh_run() {
    for name in ["next", "qwen35"] {
        let (_d, pkg) = convert(name, "bf16");
        let r = Reference::load(name);
        let (p1, forced) = (r.ids("input_ids")[..40].to_vec(), r.ids("forced_ids"));
        let opts = EngineOptions { ctx_size: Some(256), ..common::options(None) };
        let mut eng = Engine::load(&pkg, opts).expect("load");
        let mut fresh = Engine::load(&pkg, opts).expect("load");

        // turn 1, then turn 2 = turn 1's prompt + reply + more: extends the cache exactly
        let (s1, _) = turn(&mut eng, &p1, 6);
        assert_eq!((s1.prompt_cached, s1.reuse), (0, Reuse::None));
        let mut p2 = p1.clone();
        p2.extend(&s1.generated);
        p2.extend(&forced[..5]);
        let (s2, steps2) = turn(&mut eng, &p2, 4);
        let cached = p1.len() + s1.generated.len() - 1; // the last sampled id is never fed
        assert_eq!(s2.prompt_cached, cached, "{name}: an exact extension reuses the whole state");
        assert_eq!(s2.reuse, Reuse::Prefix);
        let d = max_abs_diff(&steps2[0], &from_scratch(&mut fresh, &p2));
        assert!(d <= 1e-4, "{name}: reused state differs from a fresh run by {d}");

        // turn 3 rewrites turn 2's reply (a dropped <think>): back to the snapshot at p2's end
        let mut p3 = p2.clone();
        p3.extend(&forced[5..12]);
        assert_ne!(p3[p2.len()], s2.generated[0], "the test needs a diverging reply");
        let (s3, steps3) = turn(&mut eng, &p3, 3);
        assert_eq!(s3.prompt_cached, p2.len(), "{name}: a rewritten reply goes back to the snapshot");
        assert_eq!(s3.reuse, Reuse::Snapshot);
        let d = max_abs_diff(&steps3[0], &from_scratch(&mut fresh, &p3));
        assert!(d <= 1e-4, "{name}: the snapshot's state differs from a fresh run by {d}");

        // turn 4 diverges inside turn 3's prompt, after turn 1's: back to the checkpoint at p1's end
        let mut p4 = p3[..p1.len() + 3].to_vec();
        p4.extend(&forced[12..]);
        let (s4, steps4) = turn(&mut eng, &p4, 2);
        assert_eq!(s4.prompt_cached, p1.len(), "{name}: back to the checkpoint at turn 1's end");
        assert_eq!((s4.prompt_evaluated, s4.reuse), (p4.len() - p1.len(), Reuse::Snapshot));
        let d = max_abs_diff(&steps4[0], &from_scratch(&mut fresh, &p4));
        assert!(d <= 1e-4, "{name}: the checkpoint's state differs from a fresh run by {d}");

        // turn 5 diverges inside turn 1's prompt: no state can go back there: recomputed
        let mut p5 = p1[..p1.len() - 3].to_vec();
        p5.extend(&forced[12..]);
        let (s5, steps5) = turn(&mut eng, &p5, 2);
        assert_eq!(s5.prompt_cached, 0, "{name}: no state can go back there: recomputed");
        assert_eq!((s5.prompt_evaluated, s5.reuse), (p5.len(), Reuse::Recomputed));
        let d = max_abs_diff(&steps5[0], &from_scratch(&mut fresh, &p5));
        assert!(d <= 1e-4, "{name}: the recomputed prompt differs from a fresh run by {d}");
    }
}

/// Without linear-attention layers the KV cache goes back to any common prefix, as before.
#[test]
fn a_qwen3_moe_cache_goes_back_to_any_common_prefix() {
    let (_d, pkg) = convert("single", "bf16");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let opts = EngineOptions {
        threads: 2,
        ctx_size: Some(128),
        isa: Isa::detect(),
        stream: None,
        panels: true,
        kv: moescope::model::KvTypes::F32,
    };
    let mut eng = Engine::load(&pkg, opts).expect("load");
    turn(&mut eng, &prompt, 3);
    let mut p2 = prompt[..prompt.len() - 4].to_vec();
    p2.extend(&forced[..6]);
    let (s2, steps) = turn(&mut eng, &p2, 1);
    assert_eq!((s2.prompt_cached, s2.reuse), (prompt.len() - 4, Reuse::Prefix));
    let mut fresh = Engine::load(&pkg, opts).expect("load");
    let d = max_abs_diff(&steps[0], &from_scratch(&mut fresh, &p2));
    assert!(d <= 1e-4, "reused prefix differs from a fresh run by {d}");
}
