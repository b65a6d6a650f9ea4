//! A prompt's per-token steps around the products, each row computed by itself and the rows
//! split over the threads ([`Exec::rows_mut`]): the same bits at any thread count.

use moescope_kernels::ops::{add_inplace, apply_rope, rms_norm, rms_norm_inplace};

use crate::exec::Exec;

/// `out` row by row = RMS norm of `x`'s rows with weight `w` (rows of `w.len()` values), the
/// rows in parallel.
pub(super) fn norm_rows(exec: &Exec, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    exec.rows_mut("norm_rows", out, h, &|r, o| {
        for (t, o) in r.zip(o.chunks_exact_mut(h)) {
            rms_norm(&x[t * h..(t + 1) * h], w, eps, o);
        }
    });
}

/// Each position's RoPE angles: `cos`, `sin` of `[T, half]`.
#[derive(Clone, Copy)]
pub(super) struct Angles<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub half: usize,
}

/// The per-head RMS norm of rows of `width` values: heads of `w.len()` values, each normed with
/// weight `w`.
#[derive(Clone, Copy)]
pub(super) struct HeadNorm<'a> {
    pub width: usize,
    pub w: &'a [f32],
    pub eps: f32,
}

/// Every head of every row (one token's heads) of `x`: RMS norm, then RoPE at the row's
/// position; the rows in parallel.
pub(super) fn norm_rope_rows(exec: &Exec, label: &'static str, x: &mut [f32], norm: HeadNorm<'_>, rope: Angles<'_>) {
    let (half, HeadNorm { width, w, eps }) = (rope.half, norm);
    let hd = w.len();
    exec.rows_mut(label, x, width, &|r, rows| {
        for (t, row) in r.zip(rows.chunks_exact_mut(width)) {
            let (cs, sn) = (&rope.cos[t * half..(t + 1) * half], &rope.sin[t * half..(t + 1) * half]);
            for head in row.chunks_exact_mut(hd) {
                rms_norm_inplace(head, w, eps);
                apply_rope(head, cs, sn);
            }
        }
    });
}

/// `x += d`, rows of `h` values in parallel.
pub(super) fn add_rows(exec: &Exec, x: &mut [f32], d: &[f32], h: usize) {
    exec.rows_mut("add_rows", x, h, &|r, x| add_inplace(x, &d[r.start * h..r.end * h]));
}
