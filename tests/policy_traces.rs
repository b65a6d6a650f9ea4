//! The default cache policy against lru, least-stale and Belady's optimum on the routing traces
//! committed under traces/: a trained 12-layer x 128-expert top-8 model's held-out trace (the
//! policy was tuned on routing-tune, never on this one) and the demo model's (6 x 16, top-4).
//! Hit rates are the simulator's, which counts what the engine counts (tests/sim_engine.rs).

use std::path::Path;

use moescope::experts::PolicyKind;
use moescope::experts::routing_log;
use moescope::experts::sim::{self, SimPolicy, SimResult};

/// Hit % of every policy and Belady at `pct`% of the trace's experts.
fn hit_rates(trace: &str, pct: usize) -> [SimResult; 4] {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces").join(trace);
    let (h, recs) = routing_log::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let steps = sim::steps(&recs);
    let slots = h.moe_layers.len() * h.num_experts * pct / 100;
    [
        SimPolicy::Policy(PolicyKind::Lru),
        SimPolicy::Policy(PolicyKind::LeastStale),
        SimPolicy::Policy(PolicyKind::Foresight),
        SimPolicy::Belady,
    ]
    .map(|p| sim::simulate(&h, &steps, slots, p))
}

#[test]
fn the_default_beats_lru_and_least_stale_and_reaches_90_percent_of_belady_on_trained_routing() {
    for pct in [25, 50, 75] {
        let [lru, ls, ours, best] = hit_rates("routing-heldout.jsonl.xz", pct);
        let (o, b) = (ours.hit_pct, best.hit_pct);
        assert!(
            o >= lru.hit_pct && o >= ls.hit_pct,
            "{pct}%: ours {o:.2}, lru {:.2}, ls {:.2}",
            lru.hit_pct,
            ls.hit_pct
        );
        assert!(o >= 0.9 * b, "{pct}%: ours {o:.2} < 90% of Belady's {b:.2}");
    }
}

#[test]
fn the_default_holds_its_own_on_the_demo_models_routing() {
    for pct in [25, 30, 50, 75] {
        let [lru, ls, ours, _] = hit_rates("demo-routing-500.jsonl.xz", pct);
        let o = ours.hit_pct;
        assert!(o >= ls.hit_pct, "{pct}%: ours {o:.2} < least-stale {:.2}", ls.hit_pct);
        // at 25% the pool holds exactly one token's experts (6 layers x top-4 = 24 slots), where
        // lru keeps precisely each layer's last route: ours must count what keeping an older
        // expert costs there (policy.rs, route_bound_hole)
        assert!(o >= lru.hit_pct, "{pct}%: ours {o:.2} < lru {:.2}", lru.hit_pct);
    }
}

#[test]
fn below_one_tokens_routes_the_default_still_beats_lru_and_least_stale() {
    // 5% of 1,536 experts: 76 slots, fewer than one token's 96 routed experts; and the demo's
    // 20% (19 slots of its 24)
    for (trace, pct) in [("routing-heldout.jsonl.xz", 5), ("demo-routing-500.jsonl.xz", 20)] {
        let [lru, ls, ours, _] = hit_rates(trace, pct);
        let o = ours.hit_pct;
        assert!(
            o >= lru.hit_pct && o >= ls.hit_pct,
            "{trace} {pct}%: ours {o:.2}, lru {:.2}, ls {:.2}",
            lru.hit_pct,
            ls.hit_pct
        );
    }
}
