//! Products written token-major: each token's results a run of a larger `[n, ld]` matrix, the
//! layout the engine's activations take (`[tokens, features]`), where [`Mat::matmul_rows`]
//! writes `[rows, n]`. The q4 lanes kernel writes this way itself (a token's 16 rows are one
//! vector of its tiles); every other kernel writes weight-row-major into the caller's buffer,
//! then transposed 16 rows at a time (each token's 16 results one cache line).

use std::ops::Range;

use super::{Input, Mat};
use crate::isa::Isa;

/// A q4 matrix's values, scales, group and row order `(x4, panels, lanes)`.
#[cfg(target_arch = "x86_64")]
type Q4Parts<'a> = (&'a [u8], super::avx512::WeightScales<'a>, usize, (bool, bool, bool));

impl Mat<'_> {
    /// `out[t * ld + (r - rows.start)] = W[r] · x[t]` for the rows of `rows` and the `n` inputs;
    /// the same bits as [`Mat::matmul_rows`]. `buf` (`rows.len() * n` values) takes the results
    /// weight-row-major first where the kernel writes them that way.
    ///
    /// # Safety
    /// `out + t * ld + i` for every token `t < n` and `i < rows.len()` is inside one allocation
    /// that nothing else reads or writes meanwhile (other threads may write other rows' columns).
    pub unsafe fn matmul_rows_tokens(
        &self,
        isa: Isa,
        input: Input<'_>,
        n: usize,
        rows: Range<usize>,
        buf: &mut [f32],
        (out, ld): (*mut f32, usize),
    ) {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx512
            && let Some((q, ws, group, order)) = self.q4_symmetric()
            && let Input::Quant(a) = input
            && group.is_multiple_of(32)
            && super::avx512::supports_q4(group)
            && a.group == group
            && a.permuted.len() >= n * self.cols
        {
            // SAFETY: the tier was detected on this CPU (or capped down to); the q4 lanes kernel
            // takes these groups and scales (as `matmul_rows` would run it: the same bits); the
            // caller's guarantees for `out`
            unsafe {
                let dst = super::avx512_q4_rows::Dst::tokens(out, ld);
                super::avx512_q4_rows::q4_matmul_tokens(isa, order, q, ws, self.cols, a, n, rows, dst);
            }
            return;
        }
        let b = &mut buf[..rows.len() * n];
        self.matmul_rows(isa, input, n, rows.clone(), b);
        for r0 in (0..rows.len()).step_by(16) {
            let r1 = (r0 + 16).min(rows.len());
            for t in 0..n {
                for r in r0..r1 {
                    // SAFETY: the caller's guarantees (token t, row r of the piece)
                    unsafe { *out.add(t * ld + r) = b[r * n + t] };
                }
            }
        }
    }

    /// A q4 matrix with symmetric groups (f32 or f16 scales, no mins): its values, scales, group
    /// and row order `(x4, panels, lanes)`.
    #[cfg(target_arch = "x86_64")]
    fn q4_symmetric(&self) -> Option<Q4Parts<'_>> {
        use super::MatData;
        use super::avx512::WeightScales;
        match self.data {
            MatData::Q4 { q, scales, group, x4, panels, lanes, mins: None } => {
                Some((q, WeightScales::F32 { scales, mins: None }, group, (x4, panels, lanes)))
            }
            MatData::Q4F16 { q, scales, group, x4, panels, lanes, mins: false } => {
                Some((q, WeightScales::F16 { scales, mins: false }, group, (x4, panels, lanes)))
            }
            _ => None,
        }
    }
}
