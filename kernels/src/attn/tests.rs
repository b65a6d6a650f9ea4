//! Attention against the textbook formula, across blocks, splits, tiles and tiers.

use super::*;

use crate::testutil::uniform;

/// softmax(q k^T * scale) v in f64, the whole score row at once: the textbook formula.
fn reference(q: &[f32], keys: &[f32], vals: &[f32], end: usize, scale: f32, hd: usize) -> Vec<f64> {
    let s: Vec<f64> =
        (0..end).map(|j| (0..hd).map(|d| q[d] as f64 * keys[j * hd + d] as f64).sum::<f64>() * scale as f64).collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let l: f64 = p.iter().sum();
    (0..hd).map(|d| (0..end).map(|j| p[j] * vals[j * hd + d] as f64).sum::<f64>() / l).collect()
}

#[test]
fn attention_matches_the_textbook_formula_across_blocks_and_splits() {
    // head sizes the models use and an awkward one; contexts short of a block (the last
    // block filled to each count of score vectors: 16 lanes of AVX-512, 8 of AVX2), across
    // blocks, and across several splits (queries at staggered causal ends)
    for isa in Isa::available() {
        for (hd, n) in [(128, 5), (128, 20), (64, 40), (128, 100), (64, 200), (72, 1100), (128, 2 * SPLIT + 77)] {
            let mut r = uniform(hd as u64 * 31 + n as u64);
            // large scores, so the running maximum moves and the rescaling matters
            let keys: Vec<f32> = (0..n * hd).map(|_| r() * 6.0).collect();
            let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
            let nq = 5;
            let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
            let ends: Vec<usize> = (0..nq).map(|i| n - i * (n / 7)).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
            let mut out = vec![0f32; nq * hd];
            let packed = pack_keys(&keys, hd);
            attend(isa, &q, &ends, &packed, &vals, scale, &mut acc, &mut part, &mut out);
            for i in 0..nq {
                let want = reference(&q[i * hd..(i + 1) * hd], &keys, &vals, ends[i], scale, hd);
                for (d, (&a, &b)) in out[i * hd..(i + 1) * hd].iter().zip(&want).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 2e-5 * (1.0 + b.abs()),
                        "{isa} hd {hd} n {n} query {i} (end {}) dim {d}: {a} vs {b}",
                        ends[i]
                    );
                }
            }
        }
    }
}

#[test]
fn a_query_gets_the_same_bits_alone_in_a_tile_and_from_parallel_splits() {
    let (hd, n) = (64, SPLIT + 300);
    let mut r = uniform(7);
    let keys: Vec<f32> = (0..n * hd).map(|_| r() * 4.0).collect();
    let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
    let nq = 6;
    let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
    let ends: Vec<usize> = (0..nq).map(|i| n - 37 * i).collect();
    let scale = 0.125;
    let keys = pack_keys(&keys, hd);
    for isa in Isa::available() {
        // the tile, as prefill runs it
        let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
        let mut tile = vec![0f32; nq * hd];
        attend(isa, &q, &ends, &keys, &vals, scale, &mut acc, &mut part, &mut tile);
        for i in 0..nq {
            // alone
            let (mut a1, mut p1) = (State::new(1, hd), State::new(1, hd));
            let mut alone = vec![0f32; hd];
            let qi = &q[i * hd..(i + 1) * hd];
            attend(isa, qi, &ends[i..=i], &keys, &vals, scale, &mut a1, &mut p1, &mut alone);
            assert_eq!(alone, tile[i * hd..(i + 1) * hd], "{isa} query {i}: alone vs in the tile");
            // as decode runs it: each split folded on its own (in reverse, as threads may
            // finish), the partial states merged in position order afterwards
            let parts: Vec<State> = splits(ends[i])
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .map(|rg| {
                    let mut p = State::new(1, hd);
                    fold(isa, qi, &ends[i..=i], &keys, &vals, rg, scale, &mut p);
                    p
                })
                .collect();
            let mut acc1 = State::new(1, hd);
            for p in parts.iter().rev() {
                acc1.merge(p);
            }
            let mut dec = vec![0f32; hd];
            acc1.finish(0, &mut dec);
            assert_eq!(dec, alone, "{isa} query {i}: merged splits vs one pass");
        }
    }
}

#[test]
fn exp_le0_is_within_three_ulp_of_exp() {
    let mut worst = 0f64;
    for k in 0..=2_000_000u32 {
        let x = -87.3 * k as f32 / 2_000_000.0;
        let want = (x as f64).exp();
        let got = exp_le0(x) as f64;
        // one ulp of the true value
        let ulp = f32::from_bits((want as f32).to_bits() + 1) as f64 - want as f32 as f64;
        worst = worst.max((got - want).abs() / ulp);
    }
    assert!(worst <= 3.0, "worst error {worst} ulp");
    assert_eq!(exp_le0(0.0), 1.0);
    assert_eq!(exp_le0(-100.0), 0.0);
    assert_eq!(exp_le0(f32::NEG_INFINITY), 0.0);
}

#[test]
fn merging_a_partial_that_saw_nothing_changes_nothing() {
    let mut a = State { hd: 2, m: vec![1.5], l: vec![2.0], o: vec![0.25, -1.0] };
    let before = a.clone();
    a.merge(&State::new(1, 2));
    assert_eq!(a, before);
}
