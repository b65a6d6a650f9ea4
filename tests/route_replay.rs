//! `--route-from`: the engine follows a recorded routing trace instead of its routers. The
//! trace here is made by the test itself (a seeded generator, written gzipped as
//! train_routing.py writes them), so what the engine must route is known without the engine:
//! token i of the run (prompt tokens, then decode tokens) in MoE layer l takes the trace's token
//! i mod N in layer l mod L. Streaming, pool size and prefetch change nothing in the logits.

mod common;

use std::io::Write;
use std::path::Path;

use common::*;
use moescope::engine::Engine;
use moescope::experts::routing_log;
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::{Logits, Observer};

/// Routes `[token][layer]` of `tokens` tokens over `layers` layers: `k` distinct experts of `e`
/// with weights summing to 1, and 2k candidates.
type Route = (Vec<usize>, Vec<f32>, Vec<usize>);

fn make_routes(e: usize, k: usize, layers: usize, tokens: usize, seed: u64) -> Vec<Vec<Route>> {
    let mut s = seed;
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    (0..tokens)
        .map(|_| {
            (0..layers)
                .map(|_| {
                    let mut pick: Vec<usize> = Vec::new();
                    while pick.len() < k {
                        let x = next() % e;
                        if !pick.contains(&x) {
                            pick.push(x);
                        }
                    }
                    let raw: Vec<f32> = (0..k).map(|j| (k - j) as f32 + (next() % 100) as f32 / 100.0).collect();
                    let sum: f32 = raw.iter().sum();
                    let cand: Vec<usize> = (0..2 * k).map(|_| next() % e).collect();
                    (pick, raw.iter().map(|w| w / sum).collect(), cand)
                })
                .collect()
        })
        .collect()
}

/// Written as the recorder writes them: a prompt pass of `prompt` tokens (records layer by
/// layer), then one pass per token; gzipped.
fn write_trace(path: &Path, e: usize, k: usize, routes: &[Vec<Route>], prompt: usize) {
    let layers = routes[0].len();
    let f = std::fs::File::create(path).unwrap();
    let mut z = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    writeln!(
        z,
        r#"{{"moescope_routing":1,"model":"test","moe_layers":{:?},"num_experts":{e},"top_k":{k},"bytes_per_expert":1,"candidates":{}}}"#,
        (0..layers).collect::<Vec<_>>(),
        2 * k
    )
    .unwrap();
    let rec = |z: &mut dyn Write, p: usize, t: usize, l: usize, ph: &str| {
        let (ex, w, c) = &routes[t][l];
        let cs: Vec<f32> = (0..c.len()).map(|i| 1.0 / (i + 2) as f32).collect();
        writeln!(z, r#"{{"p":{p},"t":{t},"l":{l},"e":{ex:?},"w":{w:?},"ph":"{ph}","c":{c:?},"cs":{cs:?}}}"#).unwrap();
    };
    for l in 0..layers {
        for t in 0..prompt {
            rec(&mut z, 0, t, l, "prefill");
        }
    }
    for t in prompt..routes.len() {
        for l in 0..layers {
            rec(&mut z, 1 + t - prompt, t, l, "decode");
        }
    }
    z.finish().unwrap();
}

/// Every routing call, in order: (MoE layer's model layer, experts, weights).
#[derive(Default)]
struct Seen(Vec<(usize, Vec<usize>, Vec<f32>)>);
impl Observer for Seen {
    fn routing(&mut self, layer: usize, _pos: usize, experts: &[usize], weights: &[f32], _probs: &[f32]) {
        self.0.push((layer, experts.to_vec(), weights.to_vec()));
    }
}

fn engine(pkg: &Path, stream: Option<StreamConfig>, trace: Option<&Path>) -> Engine {
    let mut eng = Engine::load(pkg, common::options(stream)).expect("load");
    if let Some(t) = trace {
        let (h, recs) = routing_log::read(t).expect("trace");
        let r = routing_log::replay(&t.display().to_string(), &h, recs).expect("replay");
        eng.set_route_replay(Some(std::sync::Arc::new(r))).expect("replay fits");
    }
    eng
}

/// The prompt in one pass, then `n` decode steps on the forced ids; all logits, and what the
/// routers were told to pick.
fn run(eng: &mut Engine, prompt: &[u32], forced: &[u32], n: usize) -> (Vec<f32>, Seen) {
    let mut seen = Seen::default();
    eng.reset();
    let mut out = eng.eval(prompt, Logits::All, &mut seen).unwrap().to_vec();
    for &id in &forced[..n] {
        out.extend_from_slice(eng.eval(&[id], Logits::Last, &mut seen).unwrap());
    }
    (out, seen)
}

#[test]
fn the_engine_routes_as_the_trace_says_layers_and_tokens_wrapping() {
    // "single": 3 MoE layers of 8 experts, top-2; the trace has 2 layers and fewer tokens than
    // the run routes, so both wrap
    let (dir, pkg) = convert("single", "q4");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let n_dec = 6;
    let tokens = prompt.len() + n_dec - 3;
    let routes = make_routes(8, 2, 2, tokens, 7);
    let trace = dir.path().join("t.jsonl.gz");
    write_trace(&trace, 8, 2, &routes, 4);
    let mut eng = engine(&pkg, None, Some(&trace));
    let moe_layers = eng.config().moe_layers();
    let (_, seen) = run(&mut eng, &prompt, &forced, n_dec);
    // the prompt's pass routes layer by layer (all its tokens in a layer), decode one token
    let mut want = Vec::new();
    for (li, &layer) in moe_layers.iter().enumerate() {
        for t in 0..prompt.len() {
            want.push((layer, t, li));
        }
    }
    for t in prompt.len()..prompt.len() + n_dec {
        for (li, &layer) in moe_layers.iter().enumerate() {
            want.push((layer, t, li));
        }
    }
    assert_eq!(seen.0.len(), want.len());
    for ((layer, e, w), &(wl, t, li)) in seen.0.iter().zip(&want) {
        let (te, tw, _) = &routes[t % tokens][li % 2];
        assert_eq!((*layer, e, w), (wl, te, tw), "token {t} MoE layer {li}");
    }
    assert_eq!(eng.model().route_replay().unwrap().tokens_replayed(), prompt.len() + n_dec);
    // and the routes are not the model's own: its logits differ from the unreplayed run's
    let (own, _) = run(&mut engine(&pkg, None, None), &prompt, &forced, n_dec);
    let (replayed, _) = run(&mut engine(&pkg, None, Some(&trace)), &prompt, &forced, n_dec);
    assert!(max_abs_diff(&own, &replayed) > 1e-3, "replayed routes must change the logits");
}

#[test]
fn replayed_logits_are_bit_identical_streamed_with_prefetch_on_and_off() {
    for name in ["single", "qwen35"] {
        let (dir, pkg) = convert(name, "q4");
        let r = Reference::load(name);
        let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
        let probe = engine(&pkg, None, None);
        let cfg = probe.config().clone();
        drop(probe);
        let (e, k, n_moe) = (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_layers().len());
        let routes = make_routes(e, k, n_moe.max(2) - 1, prompt.len() + 12, 11);
        let trace = dir.path().join("t.jsonl.gz");
        write_trace(&trace, e, k, &routes, prompt.len());
        let (want, _) = run(&mut engine(&pkg, None, Some(&trace)), &prompt, &forced, 12);
        let blob = slot_bytes(&pkg);
        let third = (e * n_moe / 3).max(k) as u64;
        for prefetch in [false, true] {
            for policy in [PolicyKind::Lru, PolicyKind::Foresight] {
                let s = StreamConfig {
                    budget_bytes: Some(third * blob),
                    policy,
                    prefetch,
                    io_workers: 2,
                    io: Some(IoMode::Direct),
                    verify: true,
                    auto: false,
                    force: false,
                };
                let mut eng = engine(&pkg, Some(s), Some(&trace));
                let (got, _) = run(&mut eng, &prompt, &forced, 12);
                let tag = format!("{name}: prefetch {prefetch}, {}", policy.name());
                let same = got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{tag}: logits differ from the resident replay (max {})", max_abs_diff(&got, &want));
                let st = eng.streamed().unwrap().cache.total_stats();
                assert!(st.evictions > 0, "{tag}: a third of the experts must evict");
            }
        }
    }
}

#[test]
fn run_reports_the_trace_and_a_trace_of_another_shape_is_refused() {
    let (dir, pkg) = convert("single", "q4");
    let good = dir.path().join("good.jsonl.gz");
    write_trace(&good, 8, 2, &make_routes(8, 2, 3, 40, 3), 4);
    let (p, g) = (pkg.to_str().unwrap(), good.to_str().unwrap());
    let o = moescope(&["run", "-m", p, "--prompt-ids", "1,2,3", "-n", "4", "--route-from", g, "--json"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("routes replayed from"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["route_from"], g, "{v}");
    // 16 experts top-4: not this model's shape
    let bad = dir.path().join("bad.jsonl.gz");
    write_trace(&bad, 16, 4, &make_routes(16, 4, 1, 5, 3), 2);
    let o = moescope(
        &["run", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "--route-from", bad.to_str().unwrap()],
        dir.path(),
    );
    assert_clean_failure(&o, &["bad.jsonl.gz", "top-4 of 16 experts; this model routes top-2 of 8"]);
    // a damaged record is named by its line
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(
        &broken,
        "{\"moescope_routing\":1,\"model\":\"t\",\"moe_layers\":[0],\"num_experts\":8,\"top_k\":2,\"bytes_per_expert\":1}\n\
         {\"p\":0,\"t\":0,\"l\":0,\"e\":[1,9],\"w\":[0.5,0.5]}\n",
    )
    .unwrap();
    let o = moescope(
        &["run", "-m", p, "--prompt-ids", "1,2", "-n", "1", "--route-from", broken.to_str().unwrap()],
        dir.path(),
    );
    assert_clean_failure(&o, &["broken.jsonl", "line 2", "expert 9 out of range"]);
}

/// Decode the "single" fixture (3 MoE layers of 8, top-2) through a trace whose routes
/// `shape` sets from the seeded ones (`next` = the experts the following MoE layer routes to,
/// the next token's first layer after the last), streamed with prefetch; the predictor's
/// statistics.
fn predictor_stats(seed: u64, shape: impl Fn(&mut Route, &[usize])) -> moescope::experts::stats::PredictStats {
    predictor_stats_of(seed, |routes| {
        for t in 0..routes.len() - 1 {
            for l in 0..3 {
                let next = if l + 1 < 3 { routes[t][l + 1].0.clone() } else { routes[t + 1][0].0.clone() };
                shape(&mut routes[t][l], &next);
            }
        }
    })
}

/// The same with the seeded routes (`[token][MoE layer]`) changed by `reshape`.
fn predictor_stats_of(seed: u64, reshape: impl FnOnce(&mut [Vec<Route>])) -> moescope::experts::stats::PredictStats {
    let (dir, pkg) = convert("single", "q4");
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    let n_dec = 12;
    let mut routes = make_routes(8, 2, 3, prompt.len() + n_dec + 1, seed);
    reshape(&mut routes);
    let trace = dir.path().join("t.jsonl.gz");
    write_trace(&trace, 8, 2, &routes, prompt.len());
    let s = StreamConfig {
        budget_bytes: Some(8 * slot_bytes(&pkg)),
        policy: PolicyKind::Foresight,
        prefetch: true,
        io_workers: 2,
        io: Some(IoMode::Direct),
        verify: true,
        auto: false,
        force: false,
    };
    let mut eng = engine(&pkg, Some(s), Some(&trace));
    // every prediction made and scored, however loaded the cores are
    eng.streamed().unwrap().predictor.set_lossless(true);
    run(&mut eng, &prompt, &forced, n_dec);
    eng.streamed().unwrap().predictor.stats()
}

#[test]
fn the_predictor_takes_the_traces_candidates() {
    // candidates that name exactly the next MoE layer's experts: a predictor that uses them
    // recalls every routed expert; one that applies the routers to this model's hidden states
    // cannot know the replayed routes
    let p = predictor_stats(5, |route, next| route.2 = next.iter().chain(&[7usize, 6]).copied().collect());
    assert!(p.next.routed > 0, "decode made predictions");
    assert_eq!(p.next.routed_predicted, p.next.routed, "recall {} with the trace's perfect candidates", p.recall());
}

#[test]
fn predictor_reports_recall_by_slot_and_by_gate_mass() {
    // candidates naming only the next layer's first-ranked expert among the top-2 predicted
    // (the second predicted one is never routed), every route weighted 0.7 / 0.3: slot recall
    // is exactly [1, 0], recall 1/2, gate-mass recall 0.7
    let p = predictor_stats(9, |route, next| {
        route.1 = vec![0.7, 0.3];
        let other = (0..8).find(|e| !next.contains(e)).unwrap();
        route.2 = vec![next[0], other, next[1], other];
    });
    assert!(p.next.routed > 0 && p.lead_n > 0, "decode made predictions");
    assert_eq!(p.slot_recall(), vec![1.0, 0.0]);
    assert!((p.recall() - 0.5).abs() < 1e-12, "recall {}", p.recall());
    assert!((p.gate_mass_recall() - 0.7).abs() < 1e-6, "gate-mass recall {}", p.gate_mass_recall());
    assert!(p.lead_ms() >= 0.0);
}

#[test]
fn two_layers_ahead_the_predictor_learns_which_experts_follow_from_the_replayed_routes() {
    // the routes of all (token, MoE layer) steps in forward order, n = 3 t + l, are
    // {x_n, x_n + 4} with x_n = (x_(n-2) + 1) mod 4: a route fixes the one two layers later
    // (across tokens too) and nothing else does, so the co-activation guess is right whenever
    // it has seen that route's followers: every guess scored names the whole route (an oracle
    // by construction; guesses it cannot make yet are not scored)
    let p = predictor_stats_of(3, |routes| {
        let mut x = vec![0usize, 2];
        let steps: Vec<&mut Route> = routes.iter_mut().flatten().collect();
        for n in 2..steps.len() + 1 {
            x.push((x[n - 2] + 1) % 4);
        }
        for (n, route) in steps.into_iter().enumerate() {
            route.0 = vec![x[n], x[n] + 4];
            // the trace's next-layer candidates are right, so prefetch pays and guesses are made
            route.2 = vec![x[n + 1], x[n + 1] + 4, (x[n + 1] + 1) % 4, (x[n + 1] + 1) % 4 + 4];
        }
    });
    let two = &p.two_ahead;
    assert!(two.routed >= 12, "guesses scored: {}", two.routed);
    assert_eq!(two.routed_predicted, two.routed, "two-ahead recall {}", two.recall());
    assert_eq!(two.slot_recall(), vec![1.0, 1.0]);
}
