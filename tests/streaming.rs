//! Expert streaming gives exactly the logits of the fully resident run: at every budget down to
//! one layer's top-k, with prefetch on or off, with every policy, in prefill and in cached
//! decode, for Qwen3-MoE and the hybrid models alike. Then faults: a damaged blob, a shrunken file, and the engine serving the next
//! request afterwards.

mod common;

use std::path::Path;

use common::*;
use moescope::engine::{Engine, EngineError};
use moescope::experts::pool::{Cell, QueueDepth, Resident};
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::{Logits, NoObserver};

fn engine(pkg: &Path, stream: Option<StreamConfig>) -> Engine {
    Engine::load(pkg, common::options(stream)).expect("load")
}

/// Prompt logits (all positions) then 12 cached decode steps on the reference's forced ids.
fn run(eng: &mut Engine, prompt: &[u32], forced: &[u32]) -> Result<Vec<f32>, EngineError> {
    eng.reset();
    let mut out = eng.eval(prompt, Logits::All, &mut NoObserver)?.to_vec();
    for &id in &forced[..12] {
        out.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver)?);
    }
    Ok(out)
}

fn stream(budget: u64, prefetch: bool, policy: PolicyKind, io: IoMode) -> StreamConfig {
    StreamConfig {
        budget_bytes: Some(budget),
        policy,
        prefetch,
        io_workers: 2,
        io: Some(io),
        verify: true,
        auto: false,
        force: false,
    }
}

#[test]
fn logits_are_bit_identical_at_every_budget() {
    let q4 = ["single", "odd", "wide", "next", "qwen35", "gpt-oss-mxfp4", "glm", "deepseek"].map(|n| (n, "q4"));
    // MXFP4 blobs streamed as they are
    for (name, quant) in q4.into_iter().chain([("gpt-oss-mxfp4", "mxfp4")]) {
        let (_d, pkg) = convert(name, quant);
        let r = Reference::load(name);
        let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
        let want = run(&mut engine(&pkg, None), &prompt, &forced).unwrap();
        let probe = engine(&pkg, Some(stream(1, true, PolicyKind::Foresight, IoMode::Buffered)));
        let blob = probe.pool().unwrap().blob_len() as u64;
        let cfg = probe.config().clone();
        drop(probe);
        let all = (cfg.num_experts * cfg.moe_layers().len()) as u64;
        let k = cfg.num_experts_per_tok as u64;
        // top-k of one layer, one layer's experts, a third, half, everything
        for slots in [k, cfg.num_experts as u64, all / 3, all / 2, all] {
            for prefetch in [false, true] {
                for policy in [PolicyKind::Lru, PolicyKind::LeastStale, PolicyKind::Foresight] {
                    let mut eng = engine(&pkg, Some(stream(slots * blob, prefetch, policy, IoMode::Direct)));
                    let got = run(&mut eng, &prompt, &forced).unwrap();
                    let tag = format!("{name} {quant}: {slots} slots, prefetch {prefetch}, {}", policy.name());
                    assert_eq!(got.len(), want.len(), "{tag}");
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{tag}: logits differ from the resident run (max {})", max_abs_diff(&got, &want));
                    let st = eng.streamed().unwrap().cache.total_stats();
                    assert!(st.hits + st.misses > 0, "{tag}: the pool was used");
                    if slots < all {
                        assert!(st.evictions > 0, "{tag}: a pool smaller than the experts must evict");
                    }
                }
            }
        }
    }
}

/// A package that fits in half the memory, without --cache-mb: no pool, and the experts copied
/// into memory with the dense weights; the logits are those read through the file's mapping
/// (--no-stream), bit for bit.
#[test]
fn experts_copied_into_memory_give_the_mappings_logits() {
    let (_d, pkg) = convert("wide", "q4");
    let r = Reference::load("wide");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let mut mapped = engine(&pkg, None);
    assert!(!mapped.package().experts_resident(), "--no-stream reads the experts through the mapping");
    let want = run(&mut mapped, &prompt, &forced).unwrap();
    let default = StreamConfig { budget_bytes: None, ..stream(0, true, PolicyKind::Foresight, IoMode::Direct) };
    let mut copied = engine(&pkg, Some(default));
    assert!(copied.streamed().is_none(), "no pool when the package fits");
    assert!(copied.package().experts_resident(), "the experts are copied with the dense weights");
    let got = run(&mut copied, &prompt, &forced).unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "logits differ from the mapping's");
}

#[test]
fn prefetch_reads_predicted_experts_during_decode() {
    // Qwen3-MoE's softmax router, GLM-4.5's sigmoid one, DeepSeek-V3's with expert groups: the
    // predictor scores each with the model's own rule
    for name in ["wide", "glm", "deepseek"] {
        prefetch_reads_predicted_experts(name);
    }
}

fn prefetch_reads_predicted_experts(name: &str) {
    let (_d, pkg) = convert(name, "q8");
    let r = Reference::load(name);
    let mut eng = engine(&pkg, Some(stream(1 << 30, true, PolicyKind::Foresight, IoMode::Buffered)));
    let (mut prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    // a long prompt reads every one of a small model's experts (8 a layer): two tokens leave
    // some for the predictor to fetch
    if name != "wide" {
        prompt.truncate(2);
    }
    let want = run(&mut engine(&pkg, None), &prompt, &forced).unwrap();
    // as `run`, but letting the predictor finish between tokens: the prediction of a token's
    // first MoE layer (made from the previous token's last) is then always in time, whatever
    // the load on the cores (the tests run in parallel; how timely prefetch is in real decode
    // is `bench`'s to measure). The logits stay the resident run's.
    eng.reset();
    let mut got = eng.eval(&prompt, Logits::All, &mut NoObserver).unwrap().to_vec();
    for &id in &forced[..12] {
        assert!(eng.streamed().unwrap().predictor.wait_idle(std::time::Duration::from_secs(10)), "predictor stuck");
        got.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver).unwrap());
    }
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "logits differ from the resident run");
    let ex = eng.streamed().unwrap();
    let p = ex.predictor.stats();
    // 12 decode steps x 2 MoE layers, each predicted from the layer before; the 11 first-layer
    // predictions after the first step were waited for (the first step's came from the prompt,
    // which predicts nothing)
    assert!(p.samples[0] >= 11, "{name}: predictions were scored: {p:?}");
    assert!(p.next.routed > 0 && p.recall() > 0.0, "{name}: {p:?}");
    let st = ex.cache.total_stats();
    assert!(st.bytes_prefetch > 0, "{name}: prefetch read something: {st:?}");
    // with the whole model fitting, nothing is evicted and nothing read twice
    assert_eq!(st.evictions, 0);
    let all = (ex.total_bytes / ex.cache.blob_len() as u64) * ex.cache.blob_len() as u64;
    assert!(st.bytes_read() <= all, "read {} of {all} bytes", st.bytes_read());
    assert_eq!(st.bytes_demand, st.misses * ex.cache.blob_len() as u64, "one demand read per miss");
}

#[test]
fn budget_policy_and_prefetch_change_between_tokens() {
    let (_d, pkg) = convert("odd", "q4");
    let r = Reference::load("odd");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let want = run(&mut engine(&pkg, None), &prompt, &forced).unwrap();
    let mut eng = engine(&pkg, Some(stream(1 << 30, true, PolicyKind::Lru, IoMode::Buffered)));
    let cache = eng.streamed().unwrap().cache.clone();
    eng.reset();
    let mut got = eng.eval(&prompt, Logits::All, &mut NoObserver).unwrap().to_vec();
    let blob = cache.blob_len() as u64;
    for (i, &id) in forced[..12].iter().enumerate() {
        // shrink, switch policy and prefetch as the workbench's knobs would
        match i % 3 {
            0 => cache.set_budget(6 * blob),
            1 => cache.set_policy(PolicyKind::LeastStale),
            _ => {
                cache.set_prefetch(i % 2 == 0);
                cache.set_budget((10 + i as u64) * blob);
            }
        }
        got.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver).unwrap());
        assert!(cache.resident().experts <= cache.capacity_slots());
    }
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "knobs changed the logits");
}

/// Flip one byte of every expert blob of layer 0 on disk, after the engine opened the package.
fn damage_layer0(pkg: &Path) -> Vec<u8> {
    let orig = std::fs::read(pkg).unwrap();
    let o = moescope(&["inspect", "--json", pkg.to_str().unwrap()], pkg.parent().unwrap());
    let m: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let start = m["regions"]["experts"]["offset"].as_u64().unwrap() as usize;
    let blob = m["regions"]["experts"]["bytes_per_expert"].as_u64().unwrap() as usize;
    let n = m["regions"]["experts"]["experts_per_layer"].as_u64().unwrap() as usize;
    let mut b = orig.clone();
    for e in 0..n {
        b[start + e * blob + 77] ^= 0x40;
    }
    std::fs::write(pkg, b).unwrap();
    orig
}

#[test]
fn a_damaged_blob_fails_the_request_and_the_next_one_works() {
    let (_d, pkg) = convert("single", "q4");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let want = run(&mut engine(&pkg, None), &prompt, &forced).unwrap();
    let mut eng = engine(&pkg, Some(stream(1, false, PolicyKind::Foresight, IoMode::Direct)));
    let orig = damage_layer0(&pkg);
    let err = run(&mut eng, &prompt, &forced).expect_err("a damaged expert must fail the request").to_string();
    assert!(err.contains("checksum mismatch") && err.contains("layer 0, expert"), "{err}");
    // repaired on disk: the same engine serves the next request, exactly
    std::fs::write(&pkg, orig).unwrap();
    let got = run(&mut eng, &prompt, &forced).expect("the next request works");
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn a_package_that_shrank_gives_a_clear_error() {
    let (_d, pkg) = convert("single", "q4");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let mut eng = engine(&pkg, Some(stream(1, false, PolicyKind::Lru, IoMode::Buffered)));
    // keep the first two experts of layer 0 (the dense weights stay mapped and intact)
    let o = moescope(&["inspect", "--json", pkg.to_str().unwrap()], pkg.parent().unwrap());
    let m: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let start = m["regions"]["experts"]["offset"].as_u64().unwrap();
    let blob = m["regions"]["experts"]["bytes_per_expert"].as_u64().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&pkg).unwrap();
    f.set_len(start + 2 * blob + 100).unwrap();
    let err = run(&mut eng, &prompt, &forced).expect_err("reads past the end must fail").to_string();
    assert!(err.contains("shrank"), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn verification_can_be_switched_off() {
    let (_d, pkg) = convert("single", "q4");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let mut cfg = stream(1 << 30, false, PolicyKind::Foresight, IoMode::Buffered);
    cfg.verify = false;
    let mut eng = engine(&pkg, Some(cfg));
    damage_layer0(&pkg);
    // no checksum: the damaged bytes are used (this is what verification is for)
    assert!(run(&mut eng, &prompt, &forced).is_ok());
}

/// Poll `f` for up to 10 s.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    f()
}

/// An engine streaming into a pool of every expert, prefetch on, that has evaluated `prompt`
/// (all positions' logits) and finished the predictions and reads it caused; with the layer-0
/// experts the prompt left unread.
fn after_prompt(pkg: &Path, prompt: &[u32]) -> (Engine, Vec<f32>, Vec<usize>) {
    let mut eng = engine(pkg, Some(stream(1 << 30, true, PolicyKind::Foresight, IoMode::Direct)));
    eng.reset();
    let logits = eng.eval(prompt, Logits::All, &mut NoObserver).unwrap().to_vec();
    let ex = eng.streamed().unwrap();
    assert!(ex.predictor.wait_idle(std::time::Duration::from_secs(10)), "predictor stuck");
    assert!(eventually(|| ex.cache.queue_depth() == QueueDepth::default()), "reads drained");
    let res = ex.cache.residency();
    let free = (0..res.num_experts).filter(|&e| res.cells[e] == Cell::Free).collect();
    (eng, logits, free)
}

/// Speculative reads (the predictor's lower ranks) fill free slots while the disk idles, never
/// push out an entry the policy values more, and leave the logits the resident run's.
#[test]
fn speculative_reads_fill_free_slots_and_evict_nothing_worth_more() {
    let (_d, pkg) = convert("wide", "q8");
    let r = Reference::load("wide");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let want = run(&mut engine(&pkg, None), &prompt, &forced).unwrap();
    let (mut eng, mut got, free) = after_prompt(&pkg, &prompt);
    let cache = eng.streamed().unwrap().cache.clone();
    let idle = || cache.queue_depth() == QueueDepth::default();
    assert!(free.len() >= 4, "the prompt left layer 0 experts unread: {free:?}");
    let res = cache.residency();
    let blob = cache.blob_len() as u64;
    let before = cache.total_stats();
    let next = cache.pass() + 1;
    cache.speculate(next, 0, &[(free[0], 0.3), (free[1], 0.2), (free[2], 0.1)]);
    assert!(
        eventually(|| { free[..3].iter().all(|&e| cache.residency().cells[e] == Cell::Predicted) }),
        "speculative candidates read into free slots: {:?}",
        &cache.residency().cells[..res.num_experts]
    );
    let after = cache.total_stats();
    assert_eq!(after.bytes_prefetch - before.bytes_prefetch, 3 * blob);
    assert_eq!((after.bytes_demand, after.evictions), (before.bytes_demand, before.evictions));
    // a full pool: a candidate with no chance of use is read into nothing and evicts nothing
    let Resident { experts: n_resident, bytes } = cache.resident();
    cache.set_budget(bytes);
    cache.speculate(next, 0, &[(free[3], 0.0)]);
    assert!(eventually(idle));
    assert_eq!(cache.residency().cells[free[3]], Cell::Free);
    assert_eq!(cache.resident().experts, n_resident);
    assert_eq!(cache.total_stats().evictions, before.evictions);
    cache.set_budget(1 << 30);
    for &id in &forced[..12] {
        got.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver).unwrap());
    }
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "logits differ from the resident run");
}

/// The pool allocates its buffers ahead of use, up to the budget and no further, before any
/// read (so first reads do not pay for their pages).
#[test]
fn the_pool_allocates_its_buffers_ahead_up_to_the_budget() {
    let (_d, pkg) = convert("wide", "q8");
    let probe = engine(&pkg, Some(stream(1, false, PolicyKind::Lru, IoMode::Direct)));
    let blob = probe.pool().unwrap().blob_len() as u64;
    drop(probe);
    let eng = engine(&pkg, Some(stream(5 * blob, false, PolicyKind::Lru, IoMode::Direct)));
    let cache = eng.streamed().unwrap().cache.clone();
    let slots = cache.capacity_slots() as u64;
    assert!(
        eventually(|| cache.allocated_bytes() == slots * blob),
        "allocated {} of {}",
        cache.allocated_bytes(),
        slots * blob
    );
    assert_eq!(cache.total_stats().bytes_read(), 0, "nothing was read");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(cache.allocated_bytes(), slots * blob, "no more than the budget");
    cache.set_budget(2 * blob);
    assert!(cache.allocated_bytes() <= cache.capacity_slots() as u64 * blob, "shrinking gives buffers back");
}

/// A speculative read (in pieces) of a damaged blob is dropped: nothing resident, nothing
/// counted as read, no error for a request that did not ask for it; the demand for that expert
/// then reports the damage.
#[test]
fn a_damaged_blob_read_speculatively_is_dropped() {
    let (_d, pkg) = convert("wide", "q8");
    let prompt = Reference::load("wide").ids("input_ids");
    let (eng, _, free) = after_prompt(&pkg, &prompt);
    let cache = eng.streamed().unwrap().cache.clone();
    let idle = || cache.queue_depth() == QueueDepth::default();
    assert!(!free.is_empty());
    let orig = damage_layer0(&pkg);
    let before = cache.total_stats();
    cache.speculate(cache.pass() + 1, 0, &[(free[0], 0.5)]);
    assert!(eventually(idle));
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(cache.residency().cells[free[0]], Cell::Free, "a failed speculative read leaves nothing");
    assert_eq!(cache.total_stats().bytes_prefetch, before.bytes_prefetch);
    let mut req = cache.request(0, &[free[0]]);
    let err = match req.next_ready() {
        Err(e) => e.to_string(),
        Ok(_) => panic!("the damaged expert must fail its demand read"),
    };
    assert!(err.contains("checksum mismatch") && err.contains("layer 0, expert"), "{err}");
    drop(req);
    std::fs::write(&pkg, orig).unwrap();
}
