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
            attend(isa, &q, &ends, &packed[..], &vals[..], Scoring::full(scale), &[], &mut acc, &mut part, &mut out);
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
        attend(isa, &q, &ends, &keys[..], &vals[..], scale, &sinks, &mut acc, &mut part, &mut tile);
        for i in 0..nq {
            // alone
            let (mut a1, mut p1) = (State::new(1, hd), State::new(1, hd));
            let mut alone = vec![0f32; hd];
            let qi = &q[i * hd..(i + 1) * hd];
            attend(isa, qi, &ends[i..=i], &keys[..], &vals[..], scale, &sinks[i..=i], &mut a1, &mut p1, &mut alone);
            assert_eq!(alone, tile[i * hd..(i + 1) * hd], "{isa} {window:?} query {i}: alone vs in the tile");
            // as decode runs it: each split folded on its own (in reverse, as threads may
            // finish), the partial states merged in position order afterwards
            let parts: Vec<State> = splits(ends[i])
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .map(|rg| {
                    let mut p = State::new(1, hd);
                    fold(isa, qi, &ends[i..=i], &keys[..], &vals[..], rg, scale, &mut p);
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
            attend(isa, &q, &ends, &packed[..], &vals[..], sc, &sinks, &mut acc, &mut part, &mut out);
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
                let run = |v: Values<&[f32]>| {
                    let (mut acc, mut part) = (State::new(nq, hv), State::new(nq, hv));
                    let mut out = vec![0f32; nq * hv];
                    attend_keyed(isa, (&q, hk), &ends, &packed[..], v, sc, &[], (&mut acc, &mut part), &mut out);
                    out
                };
                let (a, b) = (run(Values::KeyPrefix), run(Values::Rows(&vals[..])));
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

/// A KV cache type as the tests store rows in it.
#[derive(Debug, Clone, Copy)]
enum Ty {
    F32,
    Bf16,
    F16,
    Q8,
}

/// Rows stored in one of the types, keys (transposed blocks) or values (rows).
enum Stored {
    F32(Vec<f32>),
    Bf16(Vec<Bf16>),
    F16(Vec<F16>),
    Q8(Vec<i8>, Vec<F16>, bool),
}

impl Stored {
    fn view(&self) -> Cached<'_> {
        match self {
            Stored::F32(x) => Cached::F32(x),
            Stored::Bf16(x) => Cached::Bf16(x),
            Stored::F16(x) => Cached::F16(x),
            Stored::Q8(c, s, true) => Cached::Q8Keys(Q8Keys::new(c, s)),
            Stored::Q8(c, s, false) => Cached::Q8Rows(Q8Rows::new(c, s)),
        }
    }
}

impl Ty {
    /// Rows `[n, hd]` stored as keys (transposed blocks, [`pack_keys`]'s layout) or as values.
    fn store(self, rows: &[f32], hd: usize, keys: bool) -> Stored {
        let laid = if keys { pack_keys(rows, hd) } else { rows.to_vec() };
        match self {
            Ty::F32 => Stored::F32(laid),
            Ty::Bf16 => Stored::Bf16(laid.iter().map(|&x| Bf16::from_f32(x)).collect()),
            Ty::F16 => Stored::F16(laid.iter().map(|&x| F16::from_f32(x)).collect()),
            Ty::Q8 => {
                let mut codes = vec![0i8; laid.len()];
                let mut scales = vec![F16(0); laid.len() / q8::Q8_GROUP];
                for (j, row) in rows.chunks_exact(hd).enumerate() {
                    if keys {
                        q8::store_key(&mut codes, &mut scales, j, row);
                    } else {
                        q8::store_row(&mut codes, &mut scales, j * hd, row);
                    }
                }
                Stored::Q8(codes, scales, keys)
            }
        }
    }

    /// What the type holds of rows (each a whole number of 32-value groups), and a bound on each value's error: bf16 keeps 8
    /// significant bits, f16 11 (below 2^-14 steps of 2^-24); q8_0 `d / 2` of the code's
    /// rounding plus `|code| d 2^-11` of the scale's (`d = max / 127` of the value's 32), so
    /// `max (1/254 + 2^-11)`, 1% over for the rounding of `x / d`.
    fn held(self, rows: &[f32]) -> (Vec<f32>, Vec<f64>) {
        let (u, tiny) = match self {
            Ty::F32 => return (rows.to_vec(), vec![0.0; rows.len()]),
            Ty::Bf16 => (2f64.powi(-8), 2f64.powi(-133)),
            Ty::F16 => (2f64.powi(-11), 2f64.powi(-25)),
            Ty::Q8 => {
                let mut held = Vec::with_capacity(rows.len());
                let mut err = Vec::with_capacity(rows.len());
                for g in rows.chunks_exact(q8::Q8_GROUP) {
                    let mut c = [0i8; q8::Q8_GROUP];
                    let d = q8::q8_0(g, &mut c).to_f32();
                    held.extend(c.iter().map(|&c| c as f32 * d));
                    let max = g.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
                    err.extend(std::iter::repeat_n(max * (1.0 / 254.0 + 2f64.powi(-11)) * 1.01, g.len()));
                }
                return (held, err);
            }
        };
        let held = rows
            .iter()
            .map(|&x| match self {
                Ty::Bf16 => stored::<Bf16>(x),
                _ => stored::<F16>(x),
            })
            .collect();
        (held, rows.iter().map(|&x| u * x.abs() as f64 + tiny).collect())
    }
}

/// Attention over a cache of `kt` keys and `vt` values, past 4 key blocks and past a split, as
/// a prompt's tile and as decode's merged splits: (1) the textbook formula in f64 over the
/// values the cache holds, within f32 rounding, (2) the same formula over the unrounded values,
/// within the bound the rounding gives: a score moves by at most
/// `D = scale sum_d |q_d| max_j e(k_jd)` (`e` a value's error bound, [`Ty::held`]), so each
/// weight by a factor within `e^(+-2D)`, and the output by at most
/// `max|v| (e^(2D) - 1) + max e(v)`.
fn typed_attention(kt: Ty, vt: Ty) {
    for isa in Isa::available() {
        for (hd, n) in [(64, 1), (64, 5), (128, 4 * KEY_BLOCK + 37), (64, SPLIT + 300)] {
            let mut r = uniform(hd as u64 * 7 + n as u64 + kt as u64 * 3 + vt as u64);
            let keys: Vec<f32> = (0..n * hd).map(|_| r() * 4.0).collect();
            let vals: Vec<f32> = (0..n * hd).map(|_| r()).collect();
            let nq = 6;
            let q: Vec<f32> = (0..nq * hd).map(|_| r()).collect();
            // four heads of the last token (weighed together), then earlier tokens
            let ends: Vec<usize> =
                (0..nq).map(|i| if i < 4 { n } else { n.saturating_sub(70 * (i - 3)).max(1) }).collect();
            let (kc, vc) = (kt.store(&keys, hd, true), vt.store(&vals, hd, false));
            let ((ks, ke), (vs, ve)) = (kt.held(&keys), vt.held(&vals));
            let scale = 1.0 / (hd as f32).sqrt();
            let sc = Scoring::full(scale);
            let (mut acc, mut part) = (State::new(nq, hd), State::new(nq, hd));
            let mut out = vec![0f32; nq * hd];
            let views = (kc.view(), Some(vc.view()));
            attend_cached(isa, (&q, hd), &ends, views.0, views.1, sc, &[], (&mut acc, &mut part), &mut out);
            let vmax = vals.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
            let verr = ve.iter().fold(0f64, |m, &e| m.max(e));
            let tag = format!("{isa} {kt:?}/{vt:?} hd {hd} n {n}");
            for i in 0..nq {
                let qi = &q[i * hd..(i + 1) * hd];
                let held = reference(qi, &ks, &vs, ends[i], scale, hd);
                let exact = reference(qi, &keys, &vals, ends[i], scale, hd);
                let kerr: Vec<f64> = (0..hd).map(|d| (0..ends[i]).fold(0f64, |m, j| m.max(ke[j * hd + d]))).collect();
                let dscore: f64 = qi.iter().zip(&kerr).map(|(&x, &e)| x.abs() as f64 * e).sum::<f64>() * scale as f64;
                let bound = vmax * ((2.0 * dscore).exp() - 1.0) + verr;
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
                    fold_cached(isa, (qi, hd), &ends[i..=i], views.0, views.1, rg, sc, &mut p);
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
    for (k, v) in [
        (Ty::F32, Ty::F32),
        (Ty::Bf16, Ty::Bf16),
        (Ty::F16, Ty::F16),
        (Ty::Q8, Ty::Q8),
        (Ty::Bf16, Ty::F16),
        (Ty::F16, Ty::F32),
        (Ty::Q8, Ty::Bf16),
        (Ty::F32, Ty::Q8),
    ] {
        typed_attention(k, v);
    }
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

/// q8_0 blocks are ggml's: on values of every scale, ties, zeros and an outlier, each group's
/// scale and codes are the bytes gguf-py's reference quantizer writes (fixture:
/// tests/reference/make_q8_0_fixture.py); stored as keys and as values, the views read back
/// `d * code` of the very block at every position.
#[test]
fn q8_0_blocks_are_ggmls_bits_and_read_back_where_stored() {
    let b: &[u8] = include_bytes!("../../tests/fixtures/q8_0_blocks.bin");
    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let x: Vec<f32> = b[4..4 + 4 * n].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let blocks = &b[4 + 4 * n..];
    assert_eq!(blocks.len(), n / 32 * 34);
    let mut want = Vec::new();
    for (g, (xs, blk)) in x.chunks_exact(32).zip(blocks.chunks_exact(34)).enumerate() {
        let mut codes = [0i8; 32];
        let d = q8::q8_0(xs, &mut codes);
        assert_eq!(d.0.to_le_bytes(), [blk[0], blk[1]], "group {g}: scale");
        assert!(codes.iter().zip(&blk[2..]).all(|(&c, &w)| c as u8 == w), "group {g}: codes {codes:?}");
        want.extend(codes.iter().map(|&c| c as f32 * d.to_f32()));
    }
    // the values 4 times over as rows of 32 dims (136 positions, past two key blocks), keys
    // and values
    let (hd, x, want) = (32, x.repeat(4), want.repeat(4));
    let (keys, vals) = (Ty::Q8.store(&x, hd, true), Ty::Q8.store(&x, hd, false));
    let (Cached::Q8Keys(k), Cached::Q8Rows(v)) = (keys.view(), vals.view()) else { unreachable!() };
    for (j, row) in want.chunks_exact(hd).enumerate() {
        for (d, &w) in row.iter().enumerate() {
            let at = j / KEY_BLOCK * hd * KEY_BLOCK + d * KEY_BLOCK + j % KEY_BLOCK;
            assert_eq!(k.get(at).to_bits(), w.to_bits(), "key {j} dim {d}");
            assert_eq!(v.get(j * hd + d).to_bits(), w.to_bits(), "value {j} dim {d}");
        }
    }
}
