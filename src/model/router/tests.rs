//! Each rule against a brute-force oracle that follows transformers' routers line by line in
//! f64 (sort everything, take the first k): Qwen3's softmax router, gpt-oss's top-k-then-softmax,
//! DeepSeek-V3's sigmoid with a correction bias, expert groups and a scale.

use super::*;
use crate::rng::Rng;

/// Logits in [-4, 4) on `levels` steps: a few levels tie often (the tie rule is exercised),
/// many are distinct enough for f32 scores to keep the f64 oracle's order.
fn logits(rng: &mut Rng, n: usize, levels: u32) -> Vec<f32> {
    let step = 8.0 / levels as f32;
    (0..n).map(|_| (rng.next_f64() * levels as f64).floor() as f32 * step - 4.0).collect()
}

/// Indices of `s` by descending value, ties to the lower index.
fn ranked(s: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..s.len()).collect();
    idx.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
    idx
}

/// The oracle: chosen experts in rank order and their weights.
fn oracle(rule: &RouterRule, logits: &[f32], correction: Option<&[f32]>) -> (Vec<usize>, Vec<f64>) {
    let x: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let k = rule.top_k;
    let softmax = |v: &[f64]| {
        let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = v.iter().map(|&a| (a - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|a| a / s).collect::<Vec<f64>>()
    };
    let (chosen, mut w): (Vec<usize>, Vec<f64>) = match rule.scoring {
        Scoring::Softmax => {
            let p = softmax(&x);
            let c: Vec<usize> = ranked(&p)[..k].to_vec();
            let w = c.iter().map(|&e| p[e]).collect();
            (c, w)
        }
        Scoring::TopKSoftmax => {
            let c: Vec<usize> = ranked(&x)[..k].to_vec();
            let w = softmax(&c.iter().map(|&e| x[e]).collect::<Vec<_>>());
            (c, w)
        }
        Scoring::Sigmoid => {
            let p: Vec<f64> = x.iter().map(|&a| 1.0 / (1.0 + (-a).exp())).collect();
            let mut choice: Vec<f64> =
                p.iter().enumerate().map(|(e, &v)| v + correction.map_or(0.0, |c| c[e] as f64)).collect();
            if let Some(g) = rule.groups {
                let size = choice.len() / g.groups;
                let gs: Vec<f64> = (0..g.groups)
                    .map(|i| {
                        let r = ranked(&choice[i * size..(i + 1) * size]);
                        r.iter().take(2).map(|&j| choice[i * size + j]).sum()
                    })
                    .collect();
                let keep = &ranked(&gs)[..g.keep];
                for (e, c) in choice.iter_mut().enumerate() {
                    if !keep.contains(&(e / size)) {
                        *c = f64::NEG_INFINITY;
                    }
                }
            }
            let c: Vec<usize> = ranked(&choice)[..k].to_vec();
            let w = c.iter().map(|&e| p[e]).collect();
            (c, w)
        }
    };
    if rule.renormalize {
        let s: f64 = w.iter().sum();
        w.iter_mut().for_each(|v| *v /= s);
    }
    w.iter_mut().for_each(|v| *v *= rule.scale as f64);
    (chosen, w)
}

/// The rule's choice of one token, as `route` makes it.
fn choose(rule: &RouterRule, logits: &[f32], correction: Option<&[f32]>) -> (Vec<usize>, Vec<f32>, Vec<f32>) {
    let mut p = logits.to_vec();
    rule.score(&mut p);
    let mut c = vec![0f32; p.len()];
    let mut picks = vec![Pick::default(); rule.top_k];
    rule.choose(&p, correction, &mut c, &mut picks);
    rule.report(&mut p);
    (picks.iter().map(|pk| pk.expert).collect(), picks.iter().map(|pk| pk.weight).collect(), p)
}

fn rule(scoring: Scoring, groups: Option<Groups>, renormalize: bool, scale: f32) -> RouterRule {
    RouterRule { num_experts: 32, top_k: 6, scoring, groups, renormalize, scale }
}

fn check(tag: &str, rule: &RouterRule, correction: Option<&[f32]>, seed: u64) {
    let mut rng = Rng::new(seed);
    for case in 0..300 {
        // few levels: ties everywhere; many: distinct values
        let levels = if case % 2 == 0 { 5 } else { 1000 };
        let x = logits(&mut rng, rule.num_experts, levels);
        let (want_e, want_w) = oracle(rule, &x, correction);
        let (got_e, got_w, _) = choose(rule, &x, correction);
        assert_eq!(got_e, want_e, "{tag} case {case}: experts for {x:?}");
        for (j, (g, w)) in got_w.iter().zip(&want_w).enumerate() {
            assert!((*g as f64 - w).abs() < 1e-6 * w.abs().max(1.0), "{tag} case {case}: weight {j} {g} vs {w}");
        }
    }
}

#[test]
fn top_k_into_is_ops_top_k_without_allocating() {
    let mut rng = Rng::new(3);
    for case in 0..500 {
        let n = 1 + case % 40;
        let x = logits(&mut rng, n, if case % 3 == 0 { 3 } else { 50 });
        for k in [0, 1, 2.min(n), n.min(7), n] {
            let mut want = Vec::new();
            top_k(&x, k, &mut want);
            let mut picks = vec![Pick::default(); k];
            top_k_into(&x, &mut picks);
            let got: Vec<usize> = picks.iter().map(|p| p.expert).collect();
            assert_eq!(got, want, "n {n} k {k}: {x:?}");
        }
    }
}

#[test]
fn softmax_routers_match_the_oracle() {
    check("softmax, renormalized", &rule(Scoring::Softmax, None, true, 1.0), None, 11);
    check("softmax", &rule(Scoring::Softmax, None, false, 1.0), None, 12);
}

#[test]
fn top_k_then_softmax_matches_the_oracle_and_reports_the_full_softmax() {
    let r = rule(Scoring::TopKSoftmax, None, false, 1.0);
    check("top-k softmax", &r, None, 13);
    let x = logits(&mut Rng::new(5), 32, 1000);
    let (_, w, reported) = choose(&r, &x, None);
    let sum: f32 = w.iter().sum();
    assert!((sum - 1.0).abs() < 1e-6, "the k weights sum to one: {sum}");
    let mut full = x.clone();
    softmax_inplace(&mut full);
    assert_eq!(reported, full, "an observer sees the softmax over every expert");
}

#[test]
fn sigmoid_routers_with_correction_groups_and_scale_match_the_oracle() {
    let mut rng = Rng::new(9);
    let bias: Vec<f32> = (0..32).map(|_| (rng.next_f64() as f32 - 0.5) * 0.6).collect();
    let g = Some(Groups { groups: 8, keep: 3 });
    check("sigmoid", &rule(Scoring::Sigmoid, None, false, 1.0), None, 14);
    check("sigmoid + correction, renormalized, scaled", &rule(Scoring::Sigmoid, None, true, 2.5), Some(&bias), 15);
    check("sigmoid + correction + groups", &rule(Scoring::Sigmoid, g, true, 2.5), Some(&bias), 16);
    check(
        "sigmoid + groups of one",
        &rule(Scoring::Sigmoid, Some(Groups { groups: 32, keep: 9 }), false, 1.0),
        None,
        17,
    );
}

#[test]
fn the_correction_chooses_but_does_not_weigh() {
    // expert 3 has the lowest score and a bias that lifts it to the top of the choice
    let r = RouterRule {
        num_experts: 4,
        top_k: 2,
        scoring: Scoring::Sigmoid,
        groups: None,
        renormalize: false,
        scale: 1.0,
    };
    let x = [1.0f32, 2.0, 0.5, -3.0];
    let bias = [0.0f32, 0.0, 0.0, 10.0];
    let (e, w, _) = choose(&r, &x, Some(&bias));
    assert_eq!(e, vec![3, 1]);
    assert!((w[0] - 1.0 / (1.0 + 3f32.exp())).abs() < 1e-7, "the weight is the uncorrected sigmoid: {}", w[0]);
}

#[test]
fn only_the_best_groups_are_chosen_from() {
    // two groups of four; the second holds the single best expert but the first the better
    // pair, so with one group kept the best expert is passed over
    let r = RouterRule {
        num_experts: 8,
        top_k: 2,
        scoring: Scoring::Sigmoid,
        groups: Some(Groups { groups: 2, keep: 1 }),
        renormalize: true,
        scale: 1.0,
    };
    let x = [2.0f32, 2.0, -5.0, -5.0, 3.0, -4.0, -5.0, -5.0];
    let (e, _, _) = choose(&r, &x, None);
    assert_eq!(e, vec![0, 1]);
}
