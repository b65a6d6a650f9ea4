//! An `auto` pool follows the memory the process may use between replies: with a fake memory
//! cgroup (`MOESCOPE_CGROUP_DIR`, a folder holding `memory.limit_in_bytes`) whose limit is
//! lowered and raised again, `Engine::resize_auto_pool` shrinks the pool to what the new limit
//! leaves and grows it back, ignores a change too small to matter, and the logits stay those
//! of the fully resident run, bit for bit, before, between and after.
//!
//! Its own test binary: the environment variable is the process's.

mod common;

use std::path::Path;

use common::*;
use moescope::engine::Engine;
use moescope::experts::StreamConfig;
use moescope::model::{Logits, NoObserver};

const MIB: u64 = 1 << 20;

fn engine(pkg: &Path, stream: Option<StreamConfig>) -> Engine {
    Engine::load(pkg, common::options(stream)).expect("load")
}

/// Prompt logits (all positions) then 12 cached decode steps on the reference's forced ids.
fn run(eng: &mut Engine, prompt: &[u32], forced: &[u32]) -> Vec<f32> {
    eng.reset();
    let mut out = eng.eval(prompt, Logits::All, &mut NoObserver).expect("prompt").to_vec();
    for &id in &forced[..12] {
        out.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver).expect("decode"));
    }
    out
}

fn set_limit(dir: &Path, bytes: u64) {
    std::fs::write(dir.join("memory.limit_in_bytes"), format!("{bytes}\n")).expect("limit file");
}

fn budget(eng: &Engine) -> u64 {
    eng.streamed().expect("a pool").cache.budget_bytes()
}

#[test]
fn auto_pool_shrinks_and_grows_with_the_limit_and_logits_stay_the_same() {
    let (_d, pkg) = convert("single", "q4");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let want = run(&mut engine(&pkg, None), &prompt, &forced);

    let cg = tempfile::tempdir().expect("tempdir");
    // far more than the package: auto holds every expert
    set_limit(cg.path(), 64 << 30);
    // SAFETY: set before any other thread of this test binary reads the environment (this file
    // has one test, and the engine's threads start in `engine` below)
    unsafe { std::env::set_var("MOESCOPE_CGROUP_DIR", cg.path()) };
    let mut eng = engine(&pkg, Some(StreamConfig { auto: true, ..StreamConfig::default() }));
    let (all, blob) = {
        let ex = eng.streamed().expect("a pool");
        (ex.total_bytes, ex.cache.blob_len() as u64)
    };
    assert_eq!(budget(&eng), all, "a limit far past the package: every expert");
    assert_eq!(eng.resize_auto_pool(), None, "nothing moved: no change");
    let same = |got: &[f32], tag: &str| {
        assert_eq!(got.len(), want.len(), "{tag}");
        let eq = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(eq, "{tag}: logits differ from the resident run (max {})", max_abs_diff(got, &want));
    };
    same(&run(&mut eng, &prompt, &forced), "every expert");

    // a limit that leaves room for a third of the experts beside the fixed part and the
    // headroom (256 MiB below 6.4 GiB)
    let plan = eng.memory_plan();
    let fixed = plan.total - plan.experts;
    let k = eng.config().num_experts_per_tok as u64;
    let third = (all / 3).max((k + 1) * blob);
    set_limit(cg.path(), fixed + 256 * MIB + third);
    let line = eng.resize_auto_pool().expect("a third of the experts: the pool shrinks");
    assert!(line.contains("auto, re-checked after the reply"), "{line}");
    let small = budget(&eng);
    assert!(small <= third && small + blob > third, "pool {small} for a room of {third} (blob {blob})");
    same(&run(&mut eng, &prompt, &forced), "a third of the experts");
    let st = eng.streamed().expect("a pool").cache.total_stats();
    assert!(st.evictions > 0, "a pool smaller than the experts must evict");

    // a few bytes more: within 5%, left alone
    set_limit(cg.path(), fixed + 256 * MIB + third + blob / 8);
    assert_eq!(eng.resize_auto_pool(), None, "a change under 5% is ignored");
    assert_eq!(budget(&eng), small);

    // the limit raised again: every expert
    set_limit(cg.path(), 64 << 30);
    eng.resize_auto_pool().expect("the pool grows back");
    assert_eq!(budget(&eng), all);
    same(&run(&mut eng, &prompt, &forced), "grown back");
}
