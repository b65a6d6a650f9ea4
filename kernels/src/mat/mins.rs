//! Asymmetric groups (`MatData::Q4` / `Q8` with `mins`): GGUF's Q4_K, Q5_K and Q4_1 store a
//! value as `scale * n - min` of an unsigned code `n`. The products run on the symmetric
//! kernels and the mins' term is added after; rows dequantize with the same two operations as
//! ggml (`scale * n`, then `- min`), so the values equal the file's bit for bit.

use std::ops::Range;

use super::{Mat, MatData};
use crate::act::QuantAct;
use crate::isa::Isa;
use crate::quant::q4_value;

/// One q4 row (`q4_lohi32`, row-major) with mins: `scale * (q + 8) - min`.
pub(super) fn dequant_q4_row(q: &[u8], scales: &[f32], mins: &[f32], group: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        let (g, qg) = (j / group, &q[j / group * group / 2..][..group / 2]);
        *o = scales[g] * (q4_value(qg, group, j % group) + 8) as f32 - mins[g];
    }
}

/// One q8 row with mins: `scale * q - min`.
pub(super) fn dequant_q8_row(q: &[i8], scales: &[f32], mins: &[f32], group: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = scales[j / group] * q[j] as f32 - mins[j / group];
    }
}

impl Mat<'_> {
    /// What the mins of asymmetric groups add to the symmetric kernels' products: per group,
    /// the kernels took a q4 value as `scale * (n - 8)` and a q8 value as `scale * q`, where it
    /// is `scale * n - min` (`scale * q - min`), so `(8 scale - min) * sum a` (`-min * sum a`)
    /// is missing, `sum a` being the group's sum of the quantized activations
    /// (`QuantAct::scaled_sums`): [`mins_term`] per (row, token).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_mins(
        &self,
        isa: Isa,
        scales: &[f32],
        mins: &[f32],
        ng: usize,
        a: &QuantAct,
        n: usize,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        let bias = if matches!(self.data, MatData::Q4 { .. }) { 8.0 } else { 0.0 };
        for (i, r) in rows.enumerate() {
            let (s, m) = (&scales[r * ng..(r + 1) * ng], &mins[r * ng..(r + 1) * ng]);
            for t in 0..n {
                out[i * n + t] += mins_term(isa, bias, s, m, &a.scaled_sums[t * ng..(t + 1) * ng]);
            }
        }
    }
}

/// `sum_g (bias * s_g - m_g) * ss_g` over the row's groups: group g into lane `g % 16` of 16
/// accumulators (a multiply, a subtract, a multiply and an add each, no fused operation), then
/// the lanes summed in one fixed tree ([`lanes_sum`]). The same bits at every tier: AVX-512
/// does 16 groups per step, the others the same lanes one by one.
fn mins_term(isa: Isa, bias: f32, s: &[f32], m: &[f32], ss: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU
        return unsafe { mins_term_avx512(bias, s, m, ss) };
    }
    let _ = isa;
    let mut acc = [0f32; 16];
    for (g, ((s, m), ss)) in s.iter().zip(m).zip(ss).enumerate() {
        acc[g % 16] += (bias * s - m) * ss;
    }
    lanes_sum(&acc)
}

/// The 16 lanes summed pairwise: lane l with l + 8, then + 4, + 2, + 1.
pub(super) fn lanes_sum(acc: &[f32; 16]) -> f32 {
    let mut v = *acc;
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            v[l] += v[l + w];
        }
    }
    v[0]
}

/// [`mins_term`] 16 groups at a time.
///
/// # Safety
/// The CPU must support AVX-512 F; the three slices have the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn mins_term_avx512(bias: f32, s: &[f32], m: &[f32], ss: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    debug_assert!(s.len() == m.len() && m.len() == ss.len());
    let b = _mm512_set1_ps(bias);
    let mut acc = _mm512_setzero_ps();
    for g in (0..s.len()).step_by(16) {
        let k = super::avx512::first_lanes(s.len() - g);
        // SAFETY: the masked lanes are groups g.. of the three slices
        let (sv, mv, sv2) = unsafe {
            (
                _mm512_maskz_loadu_ps(k, s.as_ptr().add(g)),
                _mm512_maskz_loadu_ps(k, m.as_ptr().add(g)),
                _mm512_maskz_loadu_ps(k, ss.as_ptr().add(g)),
            )
        };
        // only the loaded lanes change: a lane past the row's end keeps its sum
        let term = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(b, sv), mv), sv2);
        acc = _mm512_mask_add_ps(acc, k, acc, term);
    }
    let mut lanes = [0f32; 16];
    // SAFETY: 16 floats
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes_sum(&lanes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::uniform;

    #[test]
    fn mins_term_is_the_same_at_every_tier_and_near_the_f64_sum() {
        let mut r = uniform(41);
        for ng in [1, 5, 16, 17, 48, 64, 130] {
            let v: Vec<Vec<f32>> = (0..3).map(|_| (0..ng).map(|_| r()).collect()).collect();
            for bias in [0.0, 8.0] {
                let want: f64 = (0..ng).map(|g| (bias as f64 * v[0][g] as f64 - v[1][g] as f64) * v[2][g] as f64).sum();
                let scalar = mins_term(Isa::Scalar, bias, &v[0], &v[1], &v[2]);
                assert!((scalar as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "ng {ng}: {scalar} vs {want}");
                for isa in Isa::available() {
                    let got = mins_term(isa, bias, &v[0], &v[1], &v[2]);
                    assert_eq!(got.to_bits(), scalar.to_bits(), "{isa} ng {ng} bias {bias}");
                }
            }
        }
    }
}
