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

/// How the heads of rows of `width` values (one token's heads, `hd` values each) are made
/// ready for attention: a bias added to the row (gpt-oss), then each head RMS-normed with
/// weight `norm.0` and eps `norm.1` (the Qwen families' q_norm / k_norm), then RoPE.
#[derive(Clone, Copy)]
pub(super) struct HeadPrep<'a> {
    pub width: usize,
    pub hd: usize,
    pub bias: Option<&'a [f32]>,
    pub norm: Option<(&'a [f32], f32)>,
}

/// Every head of every row (one token's heads) of `x` made ready as `prep` says, RoPE at the
/// row's position; the rows in parallel.
pub(super) fn prepare_heads(exec: &Exec, label: &'static str, x: &mut [f32], prep: HeadPrep<'_>, rope: Angles<'_>) {
    let (half, HeadPrep { width, hd, bias, norm }) = (rope.half, prep);
    exec.rows_mut(label, x, width, &|r, rows| {
        for (t, row) in r.zip(rows.chunks_exact_mut(width)) {
            if let Some(b) = bias {
                add_inplace(row, b);
            }
            let (cs, sn) = (&rope.cos[t * half..(t + 1) * half], &rope.sin[t * half..(t + 1) * half]);
            for head in row.chunks_exact_mut(hd) {
                if let Some((w, eps)) = norm {
                    rms_norm_inplace(head, w, eps);
                }
                apply_rope(head, cs, sn);
            }
        }
    });
}

/// `x += bias` on every row (rows of `bias.len()` values), in parallel.
pub(super) fn add_bias_rows(exec: &Exec, label: &'static str, x: &mut [f32], bias: &[f32]) {
    exec.rows_mut(label, x, bias.len(), &|_, rows| {
        rows.chunks_exact_mut(bias.len()).for_each(|r| add_inplace(r, bias))
    });
}

/// `x += d`, rows of `h` values in parallel.
pub(super) fn add_rows(exec: &Exec, x: &mut [f32], d: &[f32], h: usize) {
    exec.rows_mut("add_rows", x, h, &|r, x| add_inplace(x, &d[r.start * h..r.end * h]));
}
