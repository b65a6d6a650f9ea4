//! One step of the gated delta rule (Gated DeltaNet's recurrence) for one value head.
//!
//! The state `S` is `[dk, dv]` f32, row-major (one row per key dimension). Given the token's
//! L2-normalised query `q` and key `k` (`[dk]`, q already scaled by dk^-0.5), its value `v`
//! (`[dv]`), `beta` = sigmoid(b) and `decay` = exp(g):
//! ```text
//! S <- decay * S
//! u  = beta * (v - S^T k)
//! S <- S + k u^T
//! o  = S^T q
//! ```
//! computed per output lane j as
//! ```text
//! a_j = sum_i k_i S_ij          (fused multiply-adds in i order, from 0)
//! u_j = beta * (v_j - decay * a_j)
//! S_ij <- k_i u_j + decay * S_ij   (one fused multiply-add)
//! o_j = sum_i q_i S_ij          (fused multiply-adds in i order, from 0)
//! ```
//! Lane j only ever meets column j of S, so the state is taken a block of columns at a time:
//! the block's sums stay in registers across all dk rows, and the block (128 rows x 64
//! columns = 32 KiB at most) stays in L1 between its two passes. One token ([`step`], decode)
//! then reads S from L2/L3 once and writes it once; a prompt's tokens ([`steps`]) take each
//! block through all of them before the next, so S leaves L1 once per block and prompt, not
//! once per token (a step's passes over a 64 KiB state in L2 ran at a third of the FMA rate).
//! Every tier performs the same operations on each lane in the same order (the scalar
//! reference uses `mul_add` for that), so every tier gives the same bits, and so does any split
//! of the value heads over threads or of a prompt into steps. Keep the state in f32: 8-bit or
//! half state is known to ruin long generations.

use crate::Isa;

/// One token's inputs to one value head.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// `[dk]`, L2-normalised and scaled by dk^-0.5.
    pub q: &'a [f32],
    /// `[dk]`, L2-normalised.
    pub k: &'a [f32],
    /// `[dv]`
    pub v: &'a [f32],
    /// sigmoid(b): how much of the correction is written.
    pub beta: f32,
    /// exp(g) in (0, 1]: how much of the state survives.
    pub decay: f32,
}

/// Advance `s` (`[dk, dv]`) by one token and write the head's output (`[dv]`) to `out`; `u`
/// (`[dv]`) is scratch.
pub fn step(isa: Isa, s: &mut [f32], x: Step, u: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (x.k.len(), x.v.len());
    assert!(x.q.len() == dk && s.len() == dk * dv && u.len() == dv && out.len() == dv, "delta step shapes");
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: the tier says the CPU has AVX-512 F; shapes checked above.
            return unsafe { avx512::step(s, x, out) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says the CPU has AVX2 and FMA; shapes checked above.
            return unsafe { avx2::step(s, x, out) };
        }
    }
    let _ = isa;
    scalar::step(s, x, u, out)
}

/// Lanes of the state's columns a block of [`steps`] takes through all the tokens.
pub const BLOCK_LANES: usize = 64;

/// Scratch [`steps`] needs for a state of `dk` rows and `dv` columns.
pub fn steps_scratch(dk: usize, dv: usize) -> usize {
    dk * BLOCK_LANES + dv
}

/// Advance `s` (`[dk, dv]`) through `n` tokens in order, token `t`'s inputs `x(t)` and output
/// (`[dv]`) at `outs[t dv..]`: the bits of [`step`] token by token; `scratch` holds
/// [`steps_scratch`] values.
pub fn steps<'a>(
    isa: Isa,
    s: &mut [f32],
    n: usize,
    x: impl Fn(usize) -> Step<'a>,
    scratch: &mut [f32],
    outs: &mut [f32],
) {
    if n == 0 {
        return;
    }
    let x0 = x(0);
    let (dk, dv) = (x0.k.len(), x0.v.len());
    assert!(
        (0..n).all(|t| {
            let xt = x(t);
            xt.q.len() == dk && xt.k.len() == dk && xt.v.len() == dv
        }) && s.len() == dk * dv
            && scratch.len() >= steps_scratch(dk, dv)
            && outs.len() == n * dv,
        "delta steps shapes"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            // SAFETY: the tier says the CPU has AVX-512 F; shapes checked above.
            return unsafe { avx512::steps(s, n, x, scratch, outs) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says the CPU has AVX2 and FMA; shapes checked above.
            return unsafe { avx2::steps(s, n, x, scratch, outs) };
        }
    }
    let _ = isa;
    let (u, _) = scratch.split_at_mut(dv);
    for (t, out) in outs.chunks_exact_mut(dv).enumerate() {
        scalar::step(s, x(t), u, out);
    }
}

pub mod scalar {
    use super::Step;

    pub fn step(s: &mut [f32], x: Step, u: &mut [f32], out: &mut [f32]) {
        let dv = x.v.len();
        u.fill(0.0);
        for (row, &ki) in s.chunks_exact(dv).zip(x.k) {
            for j in 0..dv {
                u[j] = ki.mul_add(row[j], u[j]);
            }
        }
        for j in 0..dv {
            u[j] = x.beta * (x.v[j] - x.decay * u[j]);
        }
        out.fill(0.0);
        for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(x.k).zip(x.q) {
            for j in 0..dv {
                row[j] = ki.mul_add(u[j], x.decay * row[j]);
                out[j] = qi.mul_add(row[j], out[j]);
            }
        }
    }
}

/// The vector tiers: blocks of `$nb` vectors of `$w` lanes (the second pass in halves of
/// `$nb2`, so its sums and the block's u fit in the registers), then single vectors, then the
/// remaining lanes through the scalar formulas.
macro_rules! vector_tier {
    ($name:ident, $feat:literal, $w:expr, $nb:expr, $nb2:expr, $ty:ty, $set1:ident, $load:ident, $store:ident, $mul:ident, $sub:ident, $fma:ident, $zero:ident) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use super::Step;
            use std::arch::x86_64::*;

            const W: usize = $w;

            #[target_feature(enable = $feat)]
            pub unsafe fn step(s: &mut [f32], x: Step, out: &mut [f32]) {
                // SAFETY: the caller's (one token takes no copy of a block)
                unsafe { steps(s, 1, |_| x, &mut [], out) }
            }

            /// `n` tokens in order, token `t`'s output at `outs[t dv..]`: each block of lanes
            /// through all of them, then the next. Several tokens take the block's columns into
            /// `blk` first: in place, its rows lie `dv` floats apart (512 bytes at dv = 128),
            /// so a 64-lane block's lines fall in half the L1 sets and 128 rows of them never
            /// stay there; contiguous, they do.
            #[target_feature(enable = $feat)]
            pub unsafe fn steps<'a>(
                s: &mut [f32],
                n: usize,
                x: impl Fn(usize) -> Step<'a>,
                blk: &mut [f32],
                outs: &mut [f32],
            ) {
                const { assert!($nb * W == super::BLOCK_LANES) };
                let x0 = x(0);
                let (dk, dv, wb) = (x0.k.len(), x0.v.len(), $nb * W);
                let mut j0 = 0;
                // SAFETY: every block below covers lanes j0..j0 + NB * W <= dv of the rows of
                // `s` ([dk, dv]) or of its copy in `blk` ([dk, NB W]), of `v` and of the
                // token's `outs` row ([dv]), shapes checked by the caller.
                unsafe {
                    if n > 1 && wb <= dv {
                        let blk = &mut blk[..dk * wb];
                        while j0 + wb <= dv {
                            for (i, r) in blk.chunks_exact_mut(wb).enumerate() {
                                r.copy_from_slice(&s[i * dv + j0..i * dv + j0 + wb]);
                            }
                            for (t, out) in outs.chunks_exact_mut(dv).enumerate() {
                                block::<{ $nb }, { $nb2 }>(blk.as_mut_ptr(), wb, x(t), out, j0);
                            }
                            for (i, r) in blk.chunks_exact(wb).enumerate() {
                                s[i * dv + j0..i * dv + j0 + wb].copy_from_slice(r);
                            }
                            j0 += wb;
                        }
                    }
                    while j0 + wb <= dv {
                        for (t, out) in outs.chunks_exact_mut(dv).enumerate() {
                            block::<{ $nb }, { $nb2 }>(s.as_mut_ptr().add(j0), dv, x(t), out, j0);
                        }
                        j0 += wb;
                    }
                    while j0 + W <= dv {
                        for (t, out) in outs.chunks_exact_mut(dv).enumerate() {
                            block::<1, 1>(s.as_mut_ptr().add(j0), dv, x(t), out, j0);
                        }
                        j0 += W;
                    }
                }
                for j in j0..dv {
                    for (t, out) in outs.chunks_exact_mut(dv).enumerate() {
                        lane(s, x(t), out, j);
                    }
                }
            }

            /// Lanes `j0..j0 + NB * W`, their columns of the state at `p` (row `i` at `p + i
            /// stride`).
            #[target_feature(enable = $feat)]
            unsafe fn block<const NB: usize, const NB2: usize>(
                p: *mut f32,
                stride: usize,
                x: Step,
                out: &mut [f32],
                j0: usize,
            ) {
                // SAFETY: NB * W lanes of dk rows from `p`, lanes j0..j0 + NB * W of `v` and
                // of `out`, inside them (the caller's bound)
                unsafe {
                    let mut a = [$zero(); NB];
                    for (i, &ki) in x.k.iter().enumerate() {
                        let kb = $set1(ki);
                        let row = p.add(i * stride);
                        for b in 0..NB {
                            a[b] = $fma(kb, $load(row.add(b * W)), a[b]);
                        }
                    }
                    let (beta, decay) = ($set1(x.beta), $set1(x.decay));
                    let vp = x.v.as_ptr().add(j0);
                    let mut u = [$zero(); NB];
                    for b in 0..NB {
                        u[b] = $mul(beta, $sub($load(vp.add(b * W)), $mul(decay, a[b])));
                    }
                    let op = out.as_mut_ptr().add(j0);
                    for h in (0..NB).step_by(NB2) {
                        let mut o = [$zero(); NB2];
                        for (i, (&ki, &qi)) in x.k.iter().zip(x.q).enumerate() {
                            let (kb, qb) = ($set1(ki), $set1(qi));
                            let row = p.add(i * stride + h * W);
                            for b in 0..NB2 {
                                let y: $ty = $fma(kb, u[h + b], $mul(decay, $load(row.add(b * W))));
                                $store(row.add(b * W), y);
                                o[b] = $fma(qb, y, o[b]);
                            }
                        }
                        for b in 0..NB2 {
                            $store(op.add((h + b) * W), o[b]);
                        }
                    }
                }
            }

            /// One lane, as the scalar reference computes it.
            fn lane(s: &mut [f32], x: Step, out: &mut [f32], j: usize) {
                let dv = x.v.len();
                let mut a = 0f32;
                for (i, &ki) in x.k.iter().enumerate() {
                    a = ki.mul_add(s[i * dv + j], a);
                }
                let u = x.beta * (x.v[j] - x.decay * a);
                let mut o = 0f32;
                for (i, (&ki, &qi)) in x.k.iter().zip(x.q).enumerate() {
                    let y = ki.mul_add(u, x.decay * s[i * dv + j]);
                    s[i * dv + j] = y;
                    o = qi.mul_add(y, o);
                }
                out[j] = o;
            }
        }
    };
}

vector_tier!(
    avx2,
    "avx2,fma",
    8,
    8,
    4,
    __m256,
    _mm256_set1_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_mul_ps,
    _mm256_sub_ps,
    _mm256_fmadd_ps,
    _mm256_setzero_ps
);
vector_tier!(
    avx512,
    "avx512f",
    16,
    4,
    4,
    __m512,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_mul_ps,
    _mm512_sub_ps,
    _mm512_fmadd_ps,
    _mm512_setzero_ps
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::uniform;

    /// One token's (q, k, v, beta, decay).
    type Token = (Vec<f32>, Vec<f32>, Vec<f32>, f32, f32);

    /// The recurrence as the formulas read, in f64, over `t` tokens of one head.
    fn textbook(s: &mut [f64], steps: &[Token], dk: usize, dv: usize) -> Vec<f64> {
        let mut outs = vec![];
        for (q, k, v, beta, decay) in steps {
            for x in s.iter_mut() {
                *x *= *decay as f64;
            }
            let mut u = vec![0f64; dv];
            for j in 0..dv {
                let sk: f64 = (0..dk).map(|i| s[i * dv + j] * k[i] as f64).sum();
                u[j] = *beta as f64 * (v[j] as f64 - sk);
            }
            for i in 0..dk {
                for j in 0..dv {
                    s[i * dv + j] += k[i] as f64 * u[j];
                }
            }
            outs.extend((0..dv).map(|j| (0..dk).map(|i| s[i * dv + j] * q[i] as f64).sum::<f64>()));
        }
        outs
    }

    fn unit(mut x: Vec<f32>) -> Vec<f32> {
        let n = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        x.iter_mut().for_each(|v| *v /= n);
        x
    }

    #[test]
    fn every_tier_follows_the_f64_recurrence_bit_for_bit_alike() {
        // dv not a multiple of either vector width; dk != dv
        for (dk, dv) in [(16, 24), (32, 37), (128, 128)] {
            let mut r = uniform(dk as u64 * 31 + dv as u64);
            let steps: Vec<_> = (0..40)
                .map(|_| {
                    let q: Vec<f32> =
                        unit((0..dk).map(|_| r()).collect()).iter().map(|x| x / (dk as f32).sqrt()).collect();
                    let k = unit((0..dk).map(|_| r()).collect());
                    let v: Vec<f32> = (0..dv).map(|_| 4.0 * r()).collect();
                    (q, k, v, 0.5 + r(), 0.9 + 0.2 * r())
                })
                .collect();
            let s0: Vec<f32> = (0..dk * dv).map(|_| 0.1 * r()).collect();
            let mut s64: Vec<f64> = s0.iter().map(|&x| x as f64).collect();
            let want = textbook(&mut s64, &steps, dk, dv);
            let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
            for isa in Isa::available() {
                let mut s = s0.clone();
                let (mut u, mut o) = (vec![0f32; dv], vec![0f32; dv]);
                let mut outs = vec![];
                for (q, k, v, beta, decay) in &steps {
                    step(isa, &mut s, Step { q, k, v, beta: *beta, decay: *decay }, &mut u, &mut o);
                    outs.extend_from_slice(&o);
                }
                for (i, (a, b)) in outs.iter().zip(&want).enumerate() {
                    assert!((*a as f64 - b).abs() < 1e-4, "{isa} {dk}x{dv} output {i}: {a} vs {b}");
                }
                for (a, b) in s.iter().zip(&s64) {
                    assert!((*a as f64 - b).abs() < 1e-4, "{isa} {dk}x{dv} state: {a} vs {b}");
                }
                // the prompt's form: each block of lanes through all the tokens
                let (mut s2, mut outs2) = (s0.clone(), vec![0f32; steps.len() * dv]);
                let mut scratch = vec![0f32; steps_scratch(dk, dv)];
                let x = |t: usize| {
                    let (q, k, v, beta, decay) = &steps[t];
                    Step { q, k, v, beta: *beta, decay: *decay }
                };
                super::steps(isa, &mut s2, steps.len(), x, &mut scratch, &mut outs2);
                assert!(outs2 == outs && s2 == s, "{isa} {dk}x{dv}: steps are not step's bits");
                match &first {
                    None => first = Some((outs, s)),
                    Some((o0, s0)) => assert!(o0 == &outs && s0 == &s, "{isa} {dk}x{dv}: not the scalar tier's bits"),
                }
            }
        }
    }
}
