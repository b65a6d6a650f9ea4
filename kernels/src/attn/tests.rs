//! Attention against the textbook formula, across blocks, splits, tiles and tiers.

use super::*;

use crate::testutil::uniform;

/// softmax(q k^T * scale) v in f64 over positions `keys_seen`, the whole score row at once,
/// a sink logit (if any) one more column of the softmax dropped after it: the textbook
/// formula, written as transformers' eager gpt-oss attention writes it.
fn reference_over(
    q: &[f32],
    keys: &[f32],
    vals: &[f32],
    keys_seen: std::ops::Range<usize>,
    scale: f32,
    sink: Option<f32>,
    hd: usize,
) -> Vec<f64> {
    let mut s: Vec<f64> = keys_seen
        .clone()
        .map(|j| (0..hd).map(|d| q[d] as f64 * keys[j * hd + d] as f64).sum::<f64>() * scale as f64)
        .collect();
    s.extend(sink.map(f64::from));
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let l: f64 = p.iter().sum();
    (0..hd)
        .map(|d| keys_seen.clone().enumerate().map(|(i, j)| p[i] * vals[j * hd + d] as f64).sum::<f64>() / l)
        .collect()
}

fn reference(q: &[f32], keys: &[f32], vals: &[f32], end: usize, scale: f32, hd: usize) -> Vec<f64> {
    reference_over(q, keys, vals, 0..end, scale, None, hd)
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
            attend(isa, &q, &ends, &packed, &vals, Scoring::full(scale), &[], &mut acc, &mut part, &mut out);
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
    // queries in fours that see the same keys (as a token's heads: they weigh the values
    // together), then ones that see fewer
    let nq = 11;
    let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
    let ends: Vec<usize> = (0..nq).map(|i| if i < 8 { n - 37 * (i / 4) } else { n - 37 * (i - 6) }).collect();
    let keys = pack_keys(&keys, hd);
    // every key, and windows shorter than a block, ending mid-block, longer than a split
    let windows = [None, Some(1), Some(37), Some(64), Some(200), Some(SPLIT + 5)];
    for (isa, window) in Isa::available().into_iter().flat_map(|i| windows.map(|w| (i, w))) {
        let scale = Scoring { scale: 0.125, window };
        // a sink per query, large enough to take a share of the weight
        let sinks: Vec<f32> = (0..nq).map(|i| i as f32 - 2.0).collect();
        // the tile, as prefill runs it
        let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
        let mut tile = vec![0f32; nq * hd];
        attend(isa, &q, &ends, &keys, &vals, scale, &sinks, &mut acc, &mut part, &mut tile);
        for i in 0..nq {
            // alone
            let (mut a1, mut p1) = (State::new(1, hd), State::new(1, hd));
            let mut alone = vec![0f32; hd];
            let qi = &q[i * hd..(i + 1) * hd];
            attend(isa, qi, &ends[i..=i], &keys, &vals, scale, &sinks[i..=i], &mut a1, &mut p1, &mut alone);
            assert_eq!(alone, tile[i * hd..(i + 1) * hd], "{isa} {window:?} query {i}: alone vs in the tile");
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
            acc1.finish(0, Some(sinks[i]), &mut dec);
            assert_eq!(dec, alone, "{isa} {window:?} query {i}: merged splits vs one pass");
        }
    }
}

#[test]
fn a_window_and_a_sink_match_the_textbook_formula() {
    // queries at staggered ends, windows inside a block, across blocks and across splits, sinks
    // below, near and above the scores
    let (hd, n) = (64, SPLIT + 150);
    let mut r = uniform(99);
    let keys: Vec<f32> = (0..n * hd).map(|_| r() * 5.0).collect();
    let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
    let nq = 7;
    let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
    let ends: Vec<usize> = (0..nq).map(|i| n - 151 * i).collect();
    let sinks: Vec<f32> = (0..nq).map(|i| i as f32 * 1.5 - 4.0).collect();
    let packed = pack_keys(&keys, hd);
    for isa in Isa::available() {
        for window in [Some(1), Some(20), Some(64), Some(129), Some(SPLIT + 100), None] {
            let sc = Scoring { scale: 0.125, window };
            let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
            let mut out = vec![0f32; nq * hd];
            attend(isa, &q, &ends, &packed, &vals, sc, &sinks, &mut acc, &mut part, &mut out);
            for i in 0..nq {
                let seen = window.map_or(0, |w| ends[i].saturating_sub(w))..ends[i];
                let want = reference_over(&q[i * hd..(i + 1) * hd], &keys, &vals, seen, 0.125, Some(sinks[i]), hd);
                for (d, (&a, &b)) in out[i * hd..(i + 1) * hd].iter().zip(&want).enumerate() {
                    assert!(
                        (a as f64 - b).abs() <= 2e-5 * (1.0 + b.abs()),
                        "{isa} window {window:?} query {i} (end {}) dim {d}: {a} vs {b}",
                        ends[i]
                    );
                }
            }
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

/// Values read from the keys' first dims (DeepSeek's latent attention) give the bits that the
/// same values as rows of their own give, at every tier, across blocks, splits and a window;
/// and the textbook formula over those values.
#[test]
fn values_from_the_keys_prefix_are_the_rows_bits() {
    for isa in Isa::available() {
        for (hk, hv, n) in [(40, 32, 5), (40, 32, 70), (72, 64, 200), (576 / 8, 512 / 8, SPLIT + 90)] {
            let mut r = uniform(hk as u64 * 131 + n as u64);
            let keys: Vec<f32> = (0..n * hk).map(|_| r() * 4.0).collect();
            let vals: Vec<f32> = keys.chunks_exact(hk).flat_map(|k| k[..hv].to_vec()).collect();
            let nq = 6;
            let q: Vec<f32> = (0..nq * hk).map(|_| r()).collect();
            let ends: Vec<usize> = (0..nq).map(|i| n - i * (n / 9)).collect();
            let packed = pack_keys(&keys, hk);
            for window in [None, Some(33)] {
                let sc = Scoring { scale: 0.3, window };
                let run = |v: Values<'_, f32>| {
                    let (mut acc, mut part) = (State::new(nq, hv), State::new(nq, hv));
                    let mut out = vec![0f32; nq * hv];
                    attend_keyed(isa, (&q, hk), &ends, &packed, v, sc, &[], (&mut acc, &mut part), &mut out);
                    out
                };
                let (a, b) = (run(Values::KeyPrefix), run(Values::Rows(&vals)));
                let tag = format!("{isa} hk {hk} hv {hv} n {n} window {window:?}");
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{tag}: bits differ");
                for i in 0..nq {
                    let seen = sc.first(ends[i])..ends[i];
                    let s: Vec<f64> = seen
                        .clone()
                        .map(|j| (0..hk).map(|d| q[i * hk + d] as f64 * keys[j * hk + d] as f64).sum::<f64>() * 0.3)
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let l: f64 = p.iter().sum();
                    for d in 0..hv {
                        let want = seen.clone().zip(&p).map(|(j, p)| p * keys[j * hk + d] as f64).sum::<f64>() / l;
                        let got = a[i * hv + d] as f64;
                        assert!(
                            (got - want).abs() <= 2e-5 * (1.0 + want.abs()),
                            "{tag} query {i} dim {d}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Unit roundoff of a KV element (`|x - stored(x)| <= u |x| + tiny`): bf16 keeps 8 significant
/// bits, f16 11 (and below 2^-14 steps of 2^-24: the `tiny`), f32 is the reference's own.
fn roundoff<E: KvElem>() -> (f64, f64) {
    match E::BYTES {
        4 => (0.0, 0.0),
        _ if stored::<E>(1.0 + 1.0 / 512.0) == 1.0 => (2f64.powi(-8), 2f64.powi(-133)),
        _ => (2f64.powi(-11), 2f64.powi(-25)),
    }
}

/// Attention over a cache of `K` keys and `V` values, past 4 key blocks and past a split, as a
/// prompt's tile and as decode's merged splits: (1) the textbook formula in f64 over the values
/// the cache holds, within f32 rounding, (2) the same formula over the unrounded values, within
/// the bound the rounding gives: a score moves by at most `D = scale sum_d |q_d| max_j |k_jd| u_K`,
/// so each weight by a factor within `e^(+-2D)`, and the output by at most
/// `max|v| (e^(2D) - 1 + u_V)`.
fn typed_attention<K: KvElem, V: KvElem>() {
    let (uk, tk) = roundoff::<K>();
    let (uv, tv) = roundoff::<V>();
    for isa in Isa::available() {
        for (hd, n) in [(64, 1), (64, 5), (128, 4 * KEY_BLOCK + 37), (64, SPLIT + 300)] {
            let mut r = uniform(hd as u64 * 7 + n as u64 + K::BYTES as u64 * 3 + V::BYTES as u64);
            let keys: Vec<f32> = (0..n * hd).map(|_| r() * 4.0).collect();
            let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
            let nq = 6;
            let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
            // four heads of the last token (weighed together), then earlier tokens
            let ends: Vec<usize> =
                (0..nq).map(|i| if i < 4 { n } else { n.saturating_sub(70 * (i - 3)).max(1) }).collect();
            let kc: Vec<K> = pack_keys(&keys, hd).iter().map(|&x| K::from_f32(x)).collect();
            let vc: Vec<V> = vals.iter().map(|&x| V::from_f32(x)).collect();
            let (ks, vs): (Vec<f32>, Vec<f32>) =
                (keys.iter().map(|&x| stored::<K>(x)).collect(), vals.iter().map(|&x| stored::<V>(x)).collect());
            let scale = 1.0 / (hd as f32).sqrt();
            let sc = Scoring::full(scale);
            let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
            let mut out = vec![0f32; nq * hd];
            attend(isa, &q, &ends, &kc, &vc, sc, &[], &mut acc, &mut part, &mut out);
            let vmax = vals.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
            let tag = format!("{isa} {}/{} hd {hd} n {n}", K::BYTES, V::BYTES);
            for i in 0..nq {
                let qi = &q[i * hd..(i + 1) * hd];
                let held = reference(qi, &ks, &vs, ends[i], scale, hd);
                let exact = reference(qi, &keys, &vals, ends[i], scale, hd);
                let kmax: Vec<f64> =
                    (0..hd).map(|d| (0..ends[i]).fold(0f64, |m, j| m.max(keys[j * hd + d].abs() as f64))).collect();
                let dscore: f64 =
                    qi.iter().zip(&kmax).map(|(&x, &k)| (x.abs() as f64) * (k * uk + tk)).sum::<f64>() * scale as f64;
                let bound = vmax * ((2.0 * dscore).exp() - 1.0 + uv) + tv;
                for d in 0..hd {
                    let a = out[i * hd + d] as f64;
                    assert!(
                        (a - held[d]).abs() <= 2e-5 * (1.0 + held[d].abs()),
                        "{tag} query {i} dim {d}: {a} vs {}",
                        held[d]
                    );
                    let e = exact[d];
                    assert!(
                        (a - e).abs() <= bound + 2e-5 * (1.0 + e.abs()),
                        "{tag} query {i} dim {d}: {a} vs {e} (bound {bound})"
                    );
                }
                // decode: the splits folded apart and merged, the tile's bits
                let mut merged = State::new(1, hd);
                for rg in splits(ends[i]) {
                    let mut p = State::new(1, hd);
                    fold(isa, qi, &ends[i..=i], &kc, &vc, rg, sc, &mut p);
                    merged.merge(&p);
                }
                let mut dec = vec![0f32; hd];
                merged.finish(0, None, &mut dec);
                assert!(
                    dec.iter().zip(&out[i * hd..]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{tag} query {i}: decode"
                );
            }
        }
    }
}

#[test]
fn each_kv_type_attends_within_its_rounding_bound() {
    typed_attention::<f32, f32>();
    typed_attention::<Bf16, Bf16>();
    typed_attention::<F16, F16>();
    typed_attention::<Bf16, F16>();
    typed_attention::<F16, f32>();
}

/// Each type's rounding is torch's: to nearest, ties to even (bf16: the bits above 16 with the
/// carry of round-half-even; f16: IEEE, subnormals included).
#[test]
fn kv_elements_round_to_nearest_even() {
    // bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and goes to the even one, 1
    assert_eq!(Bf16::from_f32(1.0 + 2f32.powi(-8)).0, 0x3f80);
    assert_eq!(Bf16::from_f32(1.0 + 3.0 * 2f32.powi(-8)).0, 0x3f82);
    assert_eq!(Bf16::from_f32(-2.5).to_f32(), -2.5);
    // f16: 1 + 2^-11 halfway to 1 + 2^-10: even, 1; 65520 overflows to infinity; 2^-24 the
    // smallest subnormal
    assert_eq!(F16::from_f32(1.0 + 2f32.powi(-11)).0, 0x3c00);
    assert_eq!(F16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).0, 0x3c02);
    assert_eq!(F16::from_f32(65520.0).0, 0x7c00);
    assert_eq!(F16::from_f32(2f32.powi(-24)).0, 1);
}
