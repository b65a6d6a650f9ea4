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
//! Two passes over S: the first decays each row and accumulates S^T k, the second adds k_i u
//! to each row and accumulates S^T q. Every output lane j only ever meets lane j of the rows, in
//! row order, through one fused multiply-add per row, so every tier gives the same bits as the
//! scalar reference (which uses `mul_add` for the same reason), and so does any split of the
//! value heads over threads. Keep the state in f32: 8-bit or half state is known to ruin long
//! generations.

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
            return unsafe { avx512::step(s, x, u, out) };
        }
        if isa.has_avx2() {
            // SAFETY: the tier says the CPU has AVX2 and FMA; shapes checked above.
            return unsafe { avx2::step(s, x, u, out) };
        }
    }
    let _ = isa;
    scalar::step(s, x, u, out)
}

pub mod scalar {
    use super::Step;

    pub fn step(s: &mut [f32], x: Step, u: &mut [f32], out: &mut [f32]) {
        let dv = x.v.len();
        u.fill(0.0);
        for (row, &ki) in s.chunks_exact_mut(dv).zip(x.k) {
            for j in 0..dv {
                row[j] *= x.decay;
                u[j] = ki.mul_add(row[j], u[j]);
            }
        }
        for j in 0..dv {
            u[j] = x.beta * (x.v[j] - u[j]);
        }
        out.fill(0.0);
        for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(x.k).zip(x.q) {
            for j in 0..dv {
                row[j] = ki.mul_add(u[j], row[j]);
                out[j] = qi.mul_add(row[j], out[j]);
            }
        }
    }
}

/// The vector tiers: `$w` lanes at a time, the tail through the scalar formulas.
macro_rules! vector_tier {
    ($name:ident, $feat:literal, $w:expr, $ty:ty, $set1:ident, $load:ident, $store:ident, $mul:ident, $sub:ident, $fma:ident, $zero:ident) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use super::Step;
            use std::arch::x86_64::*;

            const W: usize = $w;

            #[target_feature(enable = $feat)]
            pub unsafe fn step(s: &mut [f32], x: Step, u: &mut [f32], out: &mut [f32]) {
                let dv = x.v.len();
                let body = dv / W * W;
                // SAFETY (all pointer reads and writes below): lanes j..j + W < body <= dv of
                // rows of `s` ([dk, dv]), `u`, `v` and `out` ([dv]), shapes checked by the caller.
                unsafe {
                    let decay = $set1(x.decay);
                    u.fill(0.0);
                    for (row, &ki) in s.chunks_exact_mut(dv).zip(x.k) {
                        let kv = $set1(ki);
                        let (r, up) = (row.as_mut_ptr(), u.as_mut_ptr());
                        for j in (0..body).step_by(W) {
                            let y: $ty = $mul($load(r.add(j)), decay);
                            $store(r.add(j), y);
                            $store(up.add(j), $fma(kv, y, $load(up.add(j))));
                        }
                        for j in body..dv {
                            row[j] *= x.decay;
                            u[j] = ki.mul_add(row[j], u[j]);
                        }
                    }
                    let beta = $set1(x.beta);
                    let (up, vp) = (u.as_mut_ptr(), x.v.as_ptr());
                    for j in (0..body).step_by(W) {
                        $store(up.add(j), $mul(beta, $sub($load(vp.add(j)), $load(up.add(j)))));
                    }
                    for j in body..dv {
                        u[j] = x.beta * (x.v[j] - u[j]);
                    }
                    let op = out.as_mut_ptr();
                    for j in (0..body).step_by(W) {
                        $store(op.add(j), $zero());
                    }
                    out[body..].fill(0.0);
                    for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(x.k).zip(x.q) {
                        let (kv, qv) = ($set1(ki), $set1(qi));
                        let (r, up, op) = (row.as_mut_ptr(), u.as_ptr(), out.as_mut_ptr());
                        for j in (0..body).step_by(W) {
                            let y = $fma(kv, $load(up.add(j)), $load(r.add(j)));
                            $store(r.add(j), y);
                            $store(op.add(j), $fma(qv, y, $load(op.add(j))));
                        }
                        for j in body..dv {
                            row[j] = ki.mul_add(u[j], row[j]);
                            out[j] = qi.mul_add(row[j], out[j]);
                        }
                    }
                }
            }
        }
    };
}

vector_tier!(
    avx2,
    "avx2,fma",
    8,
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
                match &first {
                    None => first = Some((outs, s)),
                    Some((o0, s0)) => assert!(o0 == &outs && s0 == &s, "{isa} {dk}x{dv}: not the scalar tier's bits"),
                }
            }
        }
    }
}
