//! A borrowed weight matrix in one of the storage formats, and its products with activations:
//! the row-by-row path here (through `dot`'s scalar and AVX2 forms), the AVX-512 tiles in
//! `avx512.rs` (q4, q6), `avx512_q8.rs` (q8) and `avx512_bf16.rs` (bf16 prefill).

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
#[cfg(target_arch = "x86_64")]
mod avx512_q8;
mod mins;

use std::ops::Range;

use crate::act::QuantAct;
use crate::dot;
use crate::isa::Isa;
use crate::quant::{
    Format, ROW_BLOCK, bf16_to_f32, dequantize_q4_row, dequantize_q6_row, dequantize_q8_row, gather_row,
};

/// The values of a matrix, borrowed (usually from the mmapped package).
#[derive(Debug, Clone, Copy)]
pub enum MatData<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    /// `q`: `[rows, cols]` int8; `scales`: `[rows, cols / group]`. With `mins` (`[rows, cols /
    /// group]`, asymmetric groups such as GGUF's Q5_K), value `j` of group `g` is
    /// `scale * q - min` rather than `scale * q`.
    Q8 {
        q: &'a [i8],
        scales: &'a [f32],
        group: usize,
        mins: Option<&'a [f32]>,
    },
    /// `q`: `[rows, cols / 2]` bytes in the `q4_lohi32` layout, rows interleaved by 4 when `x4`
    /// (`q4_lohi32_x4`, see [`crate::quant`]); `scales` as for Q8. With `mins` (GGUF's Q4_K and
    /// Q4_1), a value is `scale * n - min` of its unsigned nibble `n` (`q + 8`), not `scale * q`.
    Q4 {
        q: &'a [u8],
        scales: &'a [f32],
        group: usize,
        x4: bool,
        mins: Option<&'a [f32]>,
    },
    /// `q`: `[rows, cols / 128 * 96]` bytes in the `q6_lo4hi2` layout (`_x4`: rows interleaved
    /// as for Q4); `scales` as for Q8.
    Q6 {
        q: &'a [u8],
        scales: &'a [f32],
        group: usize,
        x4: bool,
    },
}

/// `[rows, cols]` weight matrix: `y = W x` maps `cols` inputs to `rows` outputs.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: MatData<'a>,
}

/// The activations a product reads: plain f32 rows for float weights, or the same rows
/// quantized with the weight's group for quantized weights (see [`Mat::quant_group`]).
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// `[n, cols]`
    F32(&'a [f32]),
    Quant(&'a QuantAct),
}

thread_local! {
    /// One row of a row-interleaved matrix, gathered for the kernels that take a row-major row.
    static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> Mat<'a> {
    pub fn format(&self) -> Format {
        match self.data {
            MatData::F32(_) => Format::F32,
            MatData::Bf16(_) => Format::Bf16,
            MatData::Q8 { group, .. } => Format::Q8 { group },
            MatData::Q4 { group, .. } => Format::Q4 { group },
            MatData::Q6 { group, .. } => Format::Q6 { group },
        }
    }

    /// The group the activations must be quantized with, or None for float weights.
    pub fn quant_group(&self) -> Option<usize> {
        self.format().group()
    }

    /// `f` applied to row `r`'s value bytes of a q4 or q6 matrix (`q`, interleaved when `x4`):
    /// the row itself, or gathered into a thread-local buffer.
    fn with_q_row<R>(&self, q: &[u8], x4: bool, r: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let fmt = self.format();
        let rb = fmt.data_bytes(1, self.cols);
        if !x4 {
            return f(&q[r * rb..(r + 1) * rb]);
        }
        let cb = fmt.chunk_bytes().unwrap_or(rb);
        ROW.with(|b| {
            let mut b = b.borrow_mut();
            b.resize(rb, 0);
            gather_row(q, r, cb, &mut b);
            f(&b)
        })
    }

    /// Row `r` as f32.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        match self.data {
            MatData::F32(w) => out.copy_from_slice(&w[r * c..(r + 1) * c]),
            MatData::Bf16(w) => {
                for (o, &b) in out.iter_mut().zip(&w[r * c..(r + 1) * c]) {
                    *o = bf16_to_f32(b);
                }
            }
            MatData::Q8 { q, scales, group, mins } => {
                let (ng, q) = (c / group, &q[r * c..(r + 1) * c]);
                match mins {
                    None => dequantize_q8_row(q, &scales[r * ng..(r + 1) * ng], group, out),
                    Some(m) => {
                        mins::dequant_q8_row(q, &scales[r * ng..(r + 1) * ng], &m[r * ng..(r + 1) * ng], group, out)
                    }
                }
            }
            MatData::Q4 { q, scales, group, x4, mins } => {
                let ng = c / group;
                self.with_q_row(q, x4, r, |q| match mins {
                    None => dequantize_q4_row(q, &scales[r * ng..(r + 1) * ng], group, out),
                    Some(m) => {
                        mins::dequant_q4_row(q, &scales[r * ng..(r + 1) * ng], &m[r * ng..(r + 1) * ng], group, out)
                    }
                })
            }
            MatData::Q6 { q, scales, group, x4 } => {
                let ng = c / group;
                self.with_q_row(q, x4, r, |q| dequantize_q6_row(q, &scales[r * ng..(r + 1) * ng], group, out))
            }
        }
    }

    /// Dot products of row `r` with input rows `0..out.len()`.
    fn row_dots(&self, isa: Isa, r: usize, input: Input<'_>, out: &mut [f32]) {
        let c = self.cols;
        match (self.data, input) {
            (MatData::F32(w), Input::F32(x)) => {
                // one token (decode): the row is read once, straight from memory
                let pf = if out.len() == 1 { crate::prefetch::distance() } else { 0 };
                for (t, o) in out.iter_mut().enumerate() {
                    *o = dot::dot_f32_streamed(isa, &w[r * c..(r + 1) * c], &x[t * c..(t + 1) * c], pf);
                }
            }
            (MatData::Bf16(w), Input::F32(x)) => {
                for (t, o) in out.iter_mut().enumerate() {
                    *o = dot::dot_bf16(isa, &w[r * c..(r + 1) * c], &x[t * c..(t + 1) * c]);
                }
            }
            (MatData::Q8 { q, scales, group, .. }, Input::Quant(a)) => {
                let ng = c / group;
                if out.len() == 1 && isa.has_avx2() {
                    crate::prefetch::scales_ahead(scales, r, 1, ng);
                }
                for (t, o) in out.iter_mut().enumerate() {
                    *o = dot::dot_q8(isa, &q[r * c..(r + 1) * c], &scales[r * ng..(r + 1) * ng], a.row(t));
                }
            }
            (MatData::Q4 { q, scales, group, x4, .. }, Input::Quant(a)) => {
                let wd = &scales[r * (c / group)..(r + 1) * (c / group)];
                self.with_q_row(q, x4, r, |q| {
                    for (t, o) in out.iter_mut().enumerate() {
                        *o = dot::dot_q4(isa, q, wd, a.row(t));
                    }
                })
            }
            (MatData::Q6 { q, scales, group, x4 }, Input::Quant(a)) => {
                let wd = &scales[r * (c / group)..(r + 1) * (c / group)];
                self.with_q_row(q, x4, r, |q| {
                    for (t, o) in out.iter_mut().enumerate() {
                        *o = dot::dot_q6(isa, q, wd, a.row(t));
                    }
                })
            }
            _ => panic!("moescope-kernels: input kind does not match the weight format (caller bug)"),
        }
    }

    /// Products of rows `rows` with all `n` input rows, written weight-row-major:
    /// `out[(r - rows.start) * n + t] = W[r] · x[t]`, `out.len() == rows.len() * n`.
    /// Each weight row is read from memory once for the whole batch.
    pub fn matmul_rows(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        debug_assert_eq!(out.len(), rows.len() * n);
        self.symmetric_products(isa, input, n, rows.clone(), out);
        if let (
            MatData::Q4 { scales, group, mins: Some(m), .. } | MatData::Q8 { scales, group, mins: Some(m), .. },
            Input::Quant(a),
        ) = (self.data, input)
        {
            self.add_mins(scales, m, self.cols / group, a, n, rows, out);
        }
    }

    /// [`Mat::matmul_rows`] as if the matrix had no mins.
    fn symmetric_products(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx512 && self.matmul_avx512(input, n, rows.clone(), out) {
            return;
        }
        match (self.data, input) {
            // float weights with several inputs: widen the row to f32 once, then reuse it
            (MatData::Bf16(_), Input::F32(x)) if n > 1 => {
                let mut row = vec![0f32; self.cols];
                let c = self.cols;
                for (i, r) in rows.enumerate() {
                    self.dequant_row(r, &mut row);
                    for t in 0..n {
                        out[i * n + t] = dot::dot_f32(isa, &row, &x[t * c..(t + 1) * c]);
                    }
                }
            }
            // interleaved rows: whole blocks through the block kernel (one stream of weights)
            (
                MatData::Q4 { q, scales, group, x4: true, .. } | MatData::Q6 { q, scales, group, x4: true },
                Input::Quant(a),
            ) => {
                let six = matches!(self.data, MatData::Q6 { .. });
                let (bb, ng) = (self.format().data_bytes(ROW_BLOCK, self.cols), self.cols / group);
                // decode reads the blocks as one stream
                let pf = if n == 1 { crate::prefetch::distance() } else { 0 };
                let mut r = rows.start;
                while r < rows.end {
                    let i = r - rows.start;
                    if r.is_multiple_of(ROW_BLOCK) && r + ROW_BLOCK <= rows.end {
                        if n == 1 && isa.has_avx2() {
                            crate::prefetch::scales_ahead(scales, r, ROW_BLOCK, ng);
                        }
                        let (block, wd) = (&q[r / ROW_BLOCK * bb..][..bb], &scales[r * ng..(r + ROW_BLOCK) * ng]);
                        let mut t = 0;
                        // q4 over several tokens: two at a time, the block decoded once for both
                        while !six && t + 2 <= n {
                            let pair = dot::dot_x4_q4_pair(isa, block, wd, a.row(t), a.row(t + 1));
                            for (dt, vals) in pair.into_iter().enumerate() {
                                for (k, v) in vals.into_iter().enumerate() {
                                    out[(i + k) * n + t + dt] = v;
                                }
                            }
                            t += 2;
                        }
                        for t in t..n {
                            for (k, v) in dot::dot_x4(isa, six, block, wd, a.row(t), pf).into_iter().enumerate() {
                                out[(i + k) * n + t] = v;
                            }
                        }
                        r += ROW_BLOCK;
                    } else {
                        self.row_dots(isa, r, input, &mut out[i * n..(i + 1) * n]);
                        r += 1;
                    }
                }
            }
            _ => {
                for (i, r) in rows.enumerate() {
                    self.row_dots(isa, r, input, &mut out[i * n..(i + 1) * n]);
                }
            }
        }
    }
}

impl Mat<'_> {
    /// The AVX-512 VNNI kernels, where the format and group suit them (false when they do
    /// not: the caller falls back). Each (row, token) product is computed the same way whatever
    /// the batch, so a prompt's logits equal those of decoding its tokens one by one.
    #[cfg(target_arch = "x86_64")]
    fn matmul_avx512(&self, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) -> bool {
        let c = self.cols;
        match (self.data, input) {
            (MatData::Q4 { q, scales, group, x4, .. } | MatData::Q6 { q, scales, group, x4 }, Input::Quant(a))
                if avx512::supports_q4(group) && a.permuted.len() >= n * c =>
            {
                // q6 groups are whole 128-value chunks, as the q4 kernel's; the same tiles
                let six = matches!(self.data, MatData::Q6 { .. });
                // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU; the
                // group suits the kernel; the slices are the matrix's and the tokens' (the
                // permuted rows were made with the rows, `QuantAct::quantize`)
                unsafe { avx512::q_matmul(six, x4, q, scales, c, a, &a.permuted, n, rows, out) };
                true
            }
            // several tokens (prefill): tiles of rows x tokens
            (MatData::Q8 { q, scales, group, .. }, Input::Quant(a)) if avx512_q8::supports_q8(group) && n > 1 => {
                // SAFETY: as above
                unsafe { avx512_q8::q8_matmul(q, scales, c, a, n, rows, out) };
                true
            }
            (MatData::Q8 { q, scales, group, .. }, Input::Quant(a)) if avx512_q8::supports_q8(group) => {
                for (i, r) in rows.enumerate() {
                    if n == 1 {
                        crate::prefetch::scales_ahead(scales, r, 1, c / group);
                    }
                    for t in 0..n {
                        // SAFETY: as above
                        unsafe {
                            avx512_q8::q8_matvec(q, scales, c, a.row(t), r..r + 1, &mut out[i * n + t..i * n + t + 1])
                        };
                    }
                }
                true
            }
            // bf16 weights over several tokens (prefill): vdpbf16ps where the CPU has it
            (MatData::Bf16(w), Input::F32(x)) if n > 1 && Isa::Avx512.bf16_dot() => {
                // SAFETY: AVX-512 BF16 was detected; the slices are the matrix's and the tokens'
                unsafe { avx512_bf16::bf16_matmul(w, c, x, n, rows, out) };
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{bf16_to_f32, f32_to_bf16, interleave_rows, quantize_q4_row, quantize_q6_row, quantize_q8_row};

    use crate::testutil::uniform;

    #[test]
    fn matmul_rows_matches_dequantized_f64_product() {
        let (rows, cols, n) = (5, 96, 3);
        let mut r = uniform(5);
        let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
        let x: Vec<f32> = (0..n * cols).map(|_| r()).collect();
        let wb: Vec<u16> = w.iter().map(|v| f32_to_bf16(*v)).collect();
        let mut q8 = vec![0i8; rows * cols];
        let mut d8 = vec![0f32; rows * cols / 32];
        let mut q4 = vec![0u8; rows * cols / 2];
        let mut d4 = vec![0f32; rows * cols / 32];
        for i in 0..rows {
            quantize_q8_row(
                &w[i * cols..(i + 1) * cols],
                32,
                &mut q8[i * cols..(i + 1) * cols],
                &mut d8[i * 3..(i + 1) * 3],
            );
            quantize_q4_row(
                &w[i * cols..(i + 1) * cols],
                32,
                &mut q4[i * cols / 2..(i + 1) * cols / 2],
                &mut d4[i * 3..(i + 1) * 3],
            );
        }
        let mats = [
            Mat { rows, cols, data: MatData::F32(&w) },
            Mat { rows, cols, data: MatData::Bf16(&wb) },
            Mat { rows, cols, data: MatData::Q8 { q: &q8, scales: &d8, group: 32, mins: None } },
            Mat { rows, cols, data: MatData::Q4 { q: &q4, scales: &d4, group: 32, x4: false, mins: None } },
        ];
        let mut qa = QuantAct::default();
        qa.quantize(&x, cols, 32, Isa::detect());
        for m in mats {
            let input = if m.quant_group().is_some() { Input::Quant(&qa) } else { Input::F32(&x) };
            for isa in Isa::available() {
                let mut out = vec![0f32; 3 * n];
                m.matmul_rows(isa, input, n, 1..4, &mut out);
                let mut row = vec![0f32; cols];
                for (i, rr) in (1..4).enumerate() {
                    m.dequant_row(rr, &mut row);
                    for t in 0..n {
                        let xs: Vec<f32> = match input {
                            Input::F32(x) => x[t * cols..(t + 1) * cols].to_vec(),
                            Input::Quant(a) => {
                                let q = a.row(t);
                                (0..cols).map(|j| q.q[j] as f32 * q.scales[j / 32]).collect()
                            }
                        };
                        let want: f64 = row.iter().zip(&xs).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let got = out[i * n + t] as f64;
                        assert!((got - want).abs() < 1e-4, "{:?} {isa}: {got} vs {want}", m.format());
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_over_several_tokens_matches_the_f64_product_at_every_tier() {
        // the AVX-512 BF16 kernel where the CPU has it (tiles of 4 x 4 and their remainders,
        // a last step of 32 values masked): its activations carry 16 mantissa bits, so each
        // product is held to 2^-15 of the sum of |w x| (the exact f32 paths are far closer)
        let mut r = uniform(23);
        for (rows, cols, n) in [(1, 32, 2), (4, 64, 4), (5, 75, 3), (9, 200, 9), (8, 2048, 5)] {
            let w: Vec<u16> = (0..rows * cols).map(|_| f32_to_bf16(r())).collect();
            // activations over a few orders of magnitude, as hidden states have
            let x: Vec<f32> = (0..n * cols).map(|i| r() * [1.0, 37.0, 0.01][i % 3]).collect();
            let m = Mat { rows, cols, data: MatData::Bf16(&w) };
            for isa in Isa::available() {
                let mut out = vec![0f32; rows * n];
                m.matmul_rows(isa, Input::F32(&x), n, 0..rows, &mut out);
                for i in 0..rows {
                    for t in 0..n {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for j in 0..cols {
                            let p = bf16_to_f32(w[i * cols + j]) as f64 * x[t * cols + j] as f64;
                            want += p;
                            mag += p.abs();
                        }
                        let got = out[i * n + t] as f64;
                        assert!(
                            (got - want).abs() <= mag / 32768.0,
                            "{isa} {rows}x{cols} n {n} row {i} token {t}: {got} vs {want} (bf16 kernel: {})",
                            isa.bf16_dot()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matvec_tiers_agree_with_the_scalar_reference() {
        // every tier, every row count up to two blocks and a remainder, one token and several
        // (tiles of 4 tokens and their remainders), q4 and q8 groups the vector kernels take and
        // some they do not
        let mut r = uniform(17);
        for (cols, group) in
            [(128, 128), (256, 128), (512, 256), (384, 128), (192, 64), (96, 32), (256, 32), (2304, 32), (384, 64)]
        {
            for (rows, n) in [(1, 1), (2, 5), (3, 1), (4, 4), (5, 9), (7, 2), (9, 1), (9, 6)] {
                let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
                let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
                let ng = cols / group;
                let mut q8 = vec![0i8; rows * cols];
                let mut d8 = vec![0f32; rows * ng];
                let mut q4 = vec![0u8; rows * cols / 2];
                let mut d4 = vec![0f32; rows * ng];
                for i in 0..rows {
                    let wr = &w[i * cols..(i + 1) * cols];
                    quantize_q8_row(wr, group, &mut q8[i * cols..(i + 1) * cols], &mut d8[i * ng..(i + 1) * ng]);
                    quantize_q4_row(
                        wr,
                        group,
                        &mut q4[i * cols / 2..(i + 1) * cols / 2],
                        &mut d4[i * ng..(i + 1) * ng],
                    );
                }
                let mut q6 = vec![0u8; rows * cols / 128 * 96];
                let mut d6 = vec![0f32; rows * ng];
                let six = Format::Q6 { group }.fits(cols);
                if six {
                    let rb = cols / 128 * 96;
                    for i in 0..rows {
                        let wr = &w[i * cols..(i + 1) * cols];
                        quantize_q6_row(wr, group, &mut q6[i * rb..(i + 1) * rb], &mut d6[i * ng..(i + 1) * ng]);
                    }
                }
                let mut qa = QuantAct::default();
                qa.quantize(&x, cols, group, Isa::detect());
                let mut mats = vec![
                    Mat { rows, cols, data: MatData::Q8 { q: &q8, scales: &d8, group, mins: None } },
                    Mat { rows, cols, data: MatData::Q4 { q: &q4, scales: &d4, group, x4: false, mins: None } },
                ];
                if six {
                    mats.push(Mat { rows, cols, data: MatData::Q6 { q: &q6, scales: &d6, group, x4: false } });
                }
                for m in mats {
                    let mut want = vec![0f32; rows * n];
                    m.matmul_rows(Isa::Scalar, Input::Quant(&qa), n, 0..rows, &mut want);
                    // the scale of the rounding: the sum of the products' magnitudes
                    let mut row = vec![0f32; cols];
                    let mut mag = vec![0f64; rows * n];
                    for i in 0..rows {
                        m.dequant_row(i, &mut row);
                        for t in 0..n {
                            let xt = &x[t * cols..(t + 1) * cols];
                            mag[i * n + t] = row.iter().zip(xt).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                        }
                    }
                    for isa in Isa::available() {
                        // a sub-range too, so block offsets are exercised
                        for range in [0..rows, (rows / 2)..rows] {
                            let mut got = vec![0f32; range.len() * n];
                            m.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                            for (j, g) in got.iter().enumerate() {
                                let at = range.start * n + j;
                                let (w, tol) = (want[at], 1e-5 * mag[at] + 1e-6);
                                assert!(
                                    ((*g - w) as f64).abs() <= tol,
                                    "{:?} {isa} rows={rows} cols={cols} n={n} row {} token {}: {g} vs {w}",
                                    m.format(),
                                    range.start + j / n,
                                    j % n
                                );
                            }
                            // a prompt's products are its tokens' one at a time, bit for bit
                            for t in 0..n {
                                let mut one = QuantAct::default();
                                one.quantize(&x[t * cols..(t + 1) * cols], cols, group, Isa::detect());
                                let mut single = vec![0f32; range.len()];
                                m.matmul_rows(isa, Input::Quant(&one), 1, range.clone(), &mut single);
                                for (i, v) in single.iter().enumerate() {
                                    assert_eq!(
                                        v.to_bits(),
                                        got[i * n + t].to_bits(),
                                        "{:?} {isa} rows={rows} cols={cols} n={n}: token {t} alone",
                                        m.format()
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn interleaved_rows_give_the_row_major_products_bit_for_bit() {
        // the x4 layouts hold the same bytes in another order: every tier, every sub-range
        // (thread chunks start anywhere, not only at a block), one token and tiles of several,
        // must give exactly what the row-major matrix gives at that tier
        let mut r = uniform(23);
        for (cols, group) in
            [(128, 128), (384, 128), (768, 128), (256, 64), (512, 256), (512, 32), (2304, 32), (640, 64)]
        {
            for rows in [4, 8, 20] {
                let w: Vec<f32> = (0..rows * cols).map(|_| r()).collect();
                let ng = cols / group;
                let mut d = vec![0f32; rows * ng];
                for six in [false, true] {
                    let f = if six { Format::Q6 { group } } else { Format::Q4 { group } };
                    if !f.fits(cols) {
                        continue;
                    }
                    assert!(f.interleaves(rows, cols));
                    let (rb, cb) = (f.data_bytes(1, cols), f.chunk_bytes().unwrap_or(0));
                    let mut q = vec![0u8; rows * rb];
                    for i in 0..rows {
                        let (wr, qr, dr) =
                            (&w[i * cols..(i + 1) * cols], &mut q[i * rb..(i + 1) * rb], &mut d[i * ng..(i + 1) * ng]);
                        if six { quantize_q6_row(wr, group, qr, dr) } else { quantize_q4_row(wr, group, qr, dr) }
                    }
                    let mut qx = vec![0u8; q.len()];
                    interleave_rows(&q, rb, cb, &mut qx);
                    // (rows of one chunk are the same either way)
                    assert_eq!(q == qx, cols == 128, "{f:?} rows={rows} cols={cols}");
                    let mk = |q, x4| {
                        let data = if six {
                            MatData::Q6 { q, scales: &d, group, x4 }
                        } else {
                            MatData::Q4 { q, scales: &d, group, x4, mins: None }
                        };
                        Mat { rows, cols, data }
                    };
                    let (plain, x4) = (mk(&q, false), mk(&qx, true));
                    let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                    for i in 0..rows {
                        plain.dequant_row(i, &mut a);
                        x4.dequant_row(i, &mut b);
                        assert_eq!(a, b, "{f:?} row {i}");
                    }
                    for n in [1, 3, 4, 9] {
                        let x: Vec<f32> = (0..n * cols).map(|_| 4.0 * r()).collect();
                        let mut qa = QuantAct::default();
                        qa.quantize(&x, cols, group, Isa::detect());
                        for isa in Isa::available() {
                            for range in [0..rows, 1..rows, 2..rows - 1, 3..4] {
                                let (mut want, mut got) = (vec![0f32; range.len() * n], vec![0f32; range.len() * n]);
                                plain.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut want);
                                // with and without software prefetch (decode's x4 kernels
                                // prefetch along the stream; any distance, any address)
                                for pf in [0, 64, 4096] {
                                    crate::prefetch::set_distance(pf);
                                    x4.matmul_rows(isa, Input::Quant(&qa), n, range.clone(), &mut got);
                                    let (wb, gb): (Vec<u32>, Vec<u32>) = (
                                        want.iter().map(|v| v.to_bits()).collect(),
                                        got.iter().map(|v| v.to_bits()).collect(),
                                    );
                                    assert_eq!(
                                        wb, gb,
                                        "{f:?} {isa} rows={rows} cols={cols} n={n} range {range:?} pf {pf}"
                                    );
                                }
                                crate::prefetch::set_distance(0);
                            }
                        }
                    }
                }
            }
        }
    }
}
