//! Asymmetric groups (`MatData::Q4` / `Q8` with `mins`): GGUF's Q4_K, Q5_K and Q4_1 store a
//! value as `scale * n - min` of an unsigned code `n`. The products run on the symmetric
//! kernels and the mins' term is added after; rows dequantize with the same two operations as
//! ggml (`scale * n`, then `- min`), so the values equal the file's bit for bit.

use std::ops::Range;

use super::{Mat, MatData};
use crate::act::QuantAct;
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
    /// (`QuantAct::scaled_sums`). One scalar loop over the groups in order, the same bits at
    /// every tier.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_mins(
        &self,
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
                let ss = &a.scaled_sums[t * ng..(t + 1) * ng];
                let mut add = 0f32;
                for g in 0..ng {
                    add += (bias * s[g]) * ss[g] - m[g] * ss[g];
                }
                out[i * n + t] += add;
            }
        }
    }
}
