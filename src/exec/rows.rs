//! Per-row sections: a prompt's per-token work (norms, residual adds, RoPE, routing, the routed
//! sum) split over the compute threads in tasks of whole rows.

use std::ops::Range;
use std::sync::Mutex;

use smallvec::SmallVec;

use super::Exec;
use crate::trace;

impl Exec {
    /// `f(rows, part)` over the rows of `out` (`width` values each) in parallel: per-token work
    /// of a prompt (norms, residual adds, RoPE, routing) that would otherwise leave the other
    /// threads idle. `f` computes each row by itself, so the split never changes a bit. `label`
    /// names the pieces in the trace.
    pub fn rows_mut<T: Send>(
        &self,
        label: &'static str,
        out: &mut [T],
        width: usize,
        f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
    ) {
        self.rows_mut_costed(label, out, width, width * std::mem::size_of::<T>(), f);
    }

    /// [`rows_mut`](Self::rows_mut) where a row's work reads `row_bytes` (more than its output:
    /// a token's top-k scans all its probabilities), which sizes the tasks.
    pub fn rows_mut_costed<T: Send>(
        &self,
        label: &'static str,
        out: &mut [T],
        width: usize,
        row_bytes: usize,
        f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
    ) {
        let n = out.len() / width.max(1);
        if n < 2 || self.threads() == 1 {
            f(0..n, out);
            return;
        }
        let rows = rows_per_task(n, row_bytes, self.threads(), self.min_piece_bytes);
        let parts: SmallVec<[Mutex<&mut [T]>; 64]> = out.chunks_mut(rows * width).map(Mutex::new).collect();
        self.pool.run(parts.len(), &|i, _| {
            let _s = trace::span(label);
            let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
            f(i * rows..((i + 1) * rows).min(n), &mut part);
        });
    }
}

/// Rows per task of a per-row section over `n` rows of `row_bytes` each: about four tasks per
/// thread (the tasks are equal; a few per thread even out a busy core), none much under
/// `min_bytes` ([`MIN_PIECE_BYTES`](super::MIN_PIECE_BYTES)).
pub(super) fn rows_per_task(n: usize, row_bytes: usize, threads: usize, min_bytes: usize) -> usize {
    let least = min_bytes.div_ceil(row_bytes.max(1)).max(1);
    n.div_ceil(4 * threads).max(least).min(n.max(1))
}
