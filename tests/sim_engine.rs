//! The simulator reproduces the engine: an engine run with prefetch off records its routing,
//! `sim` replays that log with the run's policy and slot count, and both count the same hits
//! and misses, at every policy and at budgets from two layers' top-k to most of the experts.
//! (Exact where each layer's experts fit in the pool at once; see `sim::replay_pool`.)

mod common;

use common::*;
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::routing_log::{self, Header, RoutingLog};
use moescope::experts::sim::{self, SimPolicy};
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::Logits;
use moescope_kernels::Isa;

/// Fixture `name` in `quant`, `ids` decoded one at a time after a 3-token prompt, at each slot
/// count and policy: the simulator's hits and misses equal the engine's.
fn sim_matches_the_engine(name: &str, quant: &str, ids: &[u32], slot_counts: &[u64]) -> usize {
    let (dir, pkg) = convert(name, quant);
    let mut checked = 0;
    let blob = slot_bytes(&pkg);
    for &slots in slot_counts {
        for policy in [PolicyKind::Lru, PolicyKind::LeastStale, PolicyKind::Foresight] {
            let stream = StreamConfig {
                budget_bytes: Some(slots * blob),
                policy,
                prefetch: false,
                io_workers: 2,
                io: Some(IoMode::Direct),
                verify: true,
                auto: false,
                force: false,
            };
            let opts = EngineOptions {
                threads: 2,
                ctx_size: Some(128),
                isa: Isa::detect(),
                stream: Some(stream),
                panels: true,
                kv: moescope::model::KvTypes::F32,
            };
            let mut eng = Engine::load(&pkg, opts).expect("load");
            let cfg = eng.config().clone();
            let all = (cfg.num_experts * cfg.moe_layers().len()) as u64;
            let h = Header {
                moescope_routing: 1,
                model: name.into(),
                moe_layers: cfg.moe_layers(),
                num_experts: cfg.num_experts,
                top_k: cfg.num_experts_per_tok,
                bytes_per_expert: blob,
                candidates: None,
            };
            let path = dir.path().join(format!("r-{slots}-{}.jsonl", policy.name()));
            let mut log = RoutingLog::create(&path, &h).unwrap();
            eng.eval(&ids[..3], Logits::Last, &mut log).unwrap();
            for &id in &ids[3..] {
                eng.eval(&[id], Logits::Last, &mut log).unwrap();
            }
            log.finish().unwrap();
            let ex = eng.streamed().unwrap();
            let (cap, st) = (ex.cache.capacity_slots(), ex.cache.total_stats());
            assert_eq!(cap as u64, slots);
            let (h, recs) = routing_log::read(&path).unwrap();
            let got = sim::simulate(&h, &sim::steps(&recs), cap, SimPolicy::Policy(policy));
            let tag = format!("{name}: {slots} slots, {}", policy.name());
            assert!(st.evictions > 0 || slots >= all, "{tag}: the pool evicted");
            assert_eq!((got.hits, got.misses), (st.hits, st.misses), "{tag}: sim vs engine");
            checked += 1;
        }
    }
    checked
}

#[test]
fn sim_counts_the_engines_hits_and_misses_exactly_with_prefetch_off() {
    // "wide": 2 MoE layers of 64 experts, top-8; a 3-token prompt, then 80 tokens
    let ids: Vec<u32> = (0..80u32).map(|i| (i * 7919 + 13) % 500).collect();
    assert_eq!(sim_matches_the_engine("wide", "q4", &ids, &[16, 24, 40, 80]), 12);
}

/// The sigmoid routers (GLM-4.5's, and DeepSeek-V3's with expert groups): 2 MoE layers of 8
/// experts, top-3, from two layers' top-k to all of them.
#[test]
fn sim_counts_the_engines_hits_and_misses_for_glm_and_deepseek_routing() {
    let ids: Vec<u32> = (0..80u32).map(|i| (i * 7919 + 13) % 128).collect();
    for name in ["glm", "deepseek"] {
        assert_eq!(sim_matches_the_engine(name, "q8", &ids, &[6, 8, 12, 16]), 12, "{name}");
    }
}
