//! Activations quantized to int8 once per matrix product, so quantized weights can use integer
//! dot products (the weight bytes, not the arithmetic, are what decode must stream).

/// One or more activation rows (`x` of `[n, cols]`), int8 with one f32 scale per `group`, plus
/// the integer sum of each group (a q4 kernel stores weights biased by +8 and subtracts
/// `8 * sum` once per group instead of sign-extending every nibble).
#[derive(Debug, Default, Clone)]
pub struct QuantAct {
    pub cols: usize,
    pub group: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
    pub sums: Vec<i32>,
    /// `q` in the order the AVX-512 q4/q6 kernels read it (`avx512::permute_q4_act`), made
    /// once here rather than by each chunk of each product; empty where rows are not whole
    /// 128-value chunks (or off x86-64).
    pub permuted: Vec<i8>,
}

impl QuantAct {
    /// Quantize `n` rows of `x` (`[n, cols]`) with groups of `group` values.
    pub fn quantize(&mut self, x: &[f32], cols: usize, group: usize) {
        debug_assert!(cols % group == 0 && x.len() % cols == 0);
        let ng = x.len() / group;
        self.cols = cols;
        self.group = group;
        self.q.resize(x.len(), 0);
        self.scales.resize(ng, 0.0);
        self.sums.resize(ng, 0);
        for (gi, xs) in x.chunks_exact(group).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            self.scales[gi] = d;
            let mut sum = 0i32;
            for (qo, &v) in self.q[gi * group..(gi + 1) * group].iter_mut().zip(xs) {
                let qv = round_even_small(v * id).clamp(-127.0, 127.0) as i8;
                *qo = qv;
                sum += qv as i32;
            }
            self.sums[gi] = sum;
        }
        self.permuted.clear();
        #[cfg(target_arch = "x86_64")]
        if cols % 128 == 0 {
            crate::avx512::permute_q4_act(&self.q, &mut self.permuted);
        }
    }

    /// Row `t` as borrowed slices.
    #[inline]
    pub fn row(&self, t: usize) -> QuantRow<'_> {
        let ng = self.cols / self.group;
        QuantRow {
            group: self.group,
            q: &self.q[t * self.cols..(t + 1) * self.cols],
            scales: &self.scales[t * ng..(t + 1) * ng],
            sums: &self.sums[t * ng..(t + 1) * ng],
        }
    }

    pub fn rows(&self) -> usize {
        if self.cols == 0 { 0 } else { self.q.len() / self.cols }
    }
}

/// One quantized activation row.
#[derive(Debug, Clone, Copy)]
pub struct QuantRow<'a> {
    pub group: usize,
    pub q: &'a [i8],
    pub scales: &'a [f32],
    pub sums: &'a [i32],
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^22` (here `|x| <= 127`):
/// adding and taking off 1.5 x 2^23 leaves no fraction bits. Plain SSE2 arithmetic, so the
/// quantization loop vectorizes, where `round` and `round_ties_even` are libm calls on the
/// baseline x86-64 target.
#[inline]
fn round_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_rounding_is_round_ties_even() {
        for i in -140_000..=140_000 {
            let x = i as f32 / 1000.0;
            assert_eq!(round_even_small(x), x.round_ties_even(), "{x}");
        }
        for x in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 0.49999997, -0.49999997, 127.49999] {
            assert_eq!(round_even_small(x), x.round_ties_even(), "{x}");
        }
    }
}
