//! A borrowed weight matrix in one of the storage formats, and its products with activations:
//! the row-by-row path here (through `dot`'s scalar and AVX2 forms), the AVX-512 tiles in
//! `avx512.rs` (q4, q6) and `avx512_q8.rs` (q8).

#[cfg(target_arch = "x86_64")]
mod amx_q4;
#[cfg(target_arch = "x86_64")]
mod avx2_k23;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_finish;
#[cfg(target_arch = "x86_64")]
mod avx512_k23;
#[cfg(target_arch = "x86_64")]
mod avx512_k23_rows;
#[cfg(all(test, target_arch = "x86_64"))]
mod avx512_model;
#[cfg(target_arch = "x86_64")]
mod avx512_mxfp4;
#[cfg(target_arch = "x86_64")]
mod avx512_nibbles;
#[cfg(target_arch = "x86_64")]
mod avx512_panels;
#[cfg(target_arch = "x86_64")]
mod avx512_q4_decode;
#[cfg(target_arch = "x86_64")]
mod avx512_q4_prompt;
#[cfg(target_arch = "x86_64")]
mod avx512_q4_rows;
#[cfg(target_arch = "x86_64")]
mod avx512_q4k_rows;
#[cfg(target_arch = "x86_64")]
mod avx512_q8;
#[cfg(target_arch = "x86_64")]
mod avx512_records;
mod blocks;
mod k23;
mod mins;
mod packed_scales;
mod tokens;

use std::ops::Range;

/// Whether a type kept as blocks is computed with integer sums per block against activations
/// quantized per [`K23_GROUP`] (Q2_K, Q3_K, IQ4_XS), rather than as the q8 matrix of its codes.
pub use k23::{K23_GROUP, fused as block_sums};

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
        /// with `x4`: superblocks of 16 rows stored panel by panel ([`crate::quant::panel_offset`]),
        /// the order a loader may give long rows for decode ([`crate::quant::panels_pay`])
        panels: bool,
        /// with `x4` (not `panels`): 16-row blocks in lane order ([`crate::quant::lanes_offset`]),
        /// their scales too ([`crate::quant::lane_scale_index`]), the order a loader may give
        /// symmetric groups for the AVX-512 kernels
        /// ([`crate::quant::lanes_pay`])
        lanes: bool,
        mins: Option<&'a [f32]>,
    },
    /// GGUF's Q4_K at its own size: `q` as for Q4 (groups of 32, unsigned nibbles `n`), and per
    /// 256 values of a row one k4 record (`k`: `[rows, cols / 256]` records of 16 bytes, see
    /// [`crate::kscales`]) whose scales and mins give value `scale * n - min`. Products equal
    /// those of Q4 with the records' scales and mins as f32, bit for bit.
    Q4K {
        q: &'a [u8],
        k: &'a [u8],
        x4: bool,
        /// as for Q4
        panels: bool,
    },
    /// GGUF's Q6_K at its own size: `q` as for Q6 (groups of 16) and per 256 values of a row one
    /// k6 record (`k`: `[rows, cols / 256]` records of 18 bytes, see [`crate::kscales`]). Products
    /// equal those of Q6 with the records' scales as f32, bit for bit.
    Q6K {
        q: &'a [u8],
        k: &'a [u8],
        x4: bool,
        /// as for Q4
        panels: bool,
    },
    /// Q8 with f16 scales (`scales`: `[rows, cols / group]` f16 bits, no mins): GGUF's Q8_0 at
    /// its own size. Products equal those of Q8 with the scales as f32, bit for bit.
    Q8F16 {
        q: &'a [i8],
        scales: &'a [u16],
        group: usize,
    },
    /// Q4 with f16 scales (as [`MatData::Q8F16`]; nibbles `q + 8`): GGUF's Q4_0 at its own
    /// size. With `mins`, each row's scales are followed by as many f16 mins (`[rows, 2 * cols /
    /// group]`) and a value is `scale * n - min` of its unsigned nibble `n`: GGUF's Q4_1 (`d n +
    /// m`, the min `-m`). Products equal those of Q4 with the scales (and mins) as f32, bit for
    /// bit.
    Q4F16 {
        q: &'a [u8],
        scales: &'a [u16],
        group: usize,
        x4: bool,
        /// as for Q4
        panels: bool,
        /// as for Q4 (without mins)
        lanes: bool,
        mins: bool,
    },
    /// `q`: `[rows, cols / 128 * 96]` bytes in the `q6_lo4hi2` layout (`_x4`: rows interleaved
    /// as for Q4); `scales` as for Q8.
    Q6 {
        q: &'a [u8],
        scales: &'a [f32],
        group: usize,
        x4: bool,
        /// as for Q4
        panels: bool,
    },
    /// A GGUF file's blocks as they are (`q`: `[rows, t.bytes_of(cols)]` bytes, row-major), for
    /// the types [`crate::ggml_codes::blocks_run_as`] names: products and values are those of
    /// the q8 matrix of their codes, scales and mins, bit for bit.
    Blocks {
        t: crate::ggml::BlockType,
        q: &'a [u8],
    },
    /// `q`: `[rows, cols / 32 * 17]` bytes, ggml's MXFP4 blocks (`mxfp4_ggml`, see
    /// [`crate::mxfp4`]).
    Mxfp4 {
        q: &'a [u8],
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

/// Bytes of a gathered row kept on the stack.
const STACK_ROW: usize = 16 << 10;

thread_local! {
    /// One row of a row-interleaved matrix, gathered for the kernels that take a row-major row
    /// (rows longer than [`STACK_ROW`] bytes).
    static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> Mat<'a> {
    pub fn format(&self) -> Format {
        match self.data {
            MatData::F32(_) => Format::F32,
            MatData::Bf16(_) => Format::Bf16,
            MatData::Q8 { group, .. } => Format::Q8 { group },
            MatData::Q4 { group, .. } => Format::Q4 { group },
            MatData::Q4K { .. } => Format::Q4 { group: crate::kscales::K4_GROUP },
            MatData::Q8F16 { group, .. } => Format::Q8 { group },
            MatData::Q4F16 { group, .. } => Format::Q4 { group },
            MatData::Q6K { .. } => Format::Q6 { group: crate::kscales::K6_GROUP },
            MatData::Q6 { group, .. } => Format::Q6 { group },
            MatData::Mxfp4 { .. } => Format::Mxfp4,
            MatData::Blocks { t, .. } => {
                let group = crate::ggml_codes::blocks_run_as(t).map_or(t.block(), |(g, _)| g);
                Format::Q8 { group }
            }
        }
    }

    /// Bytes one row occupies: values, scales (f32, f16 or records), and mins where it has them.
    pub fn row_bytes(&self) -> usize {
        let (f, c) = (self.format(), self.cols);
        if let MatData::Blocks { t, .. } = self.data {
            return t.bytes_of(c);
        }
        let scales = match self.data {
            MatData::Q4K { .. } => crate::kscales::k4_bytes(1, c),
            MatData::Q6K { .. } => crate::kscales::k6_bytes(1, c),
            MatData::Q8F16 { .. } | MatData::Q4F16 { mins: false, .. } => f.scale_bytes(1, c) / 2,
            MatData::Q4F16 { mins: true, .. } => f.scale_bytes(1, c),
            MatData::Q4 { mins: Some(_), .. } | MatData::Q8 { mins: Some(_), .. } => 2 * f.scale_bytes(1, c),
            _ => f.scale_bytes(1, c),
        };
        f.data_bytes(1, c) + scales
    }

    /// Row `r`'s blocks of an MXFP4 matrix.
    fn mxfp4_row(&self, q: &'a [u8], r: usize) -> &'a [u8] {
        let rb = Format::Mxfp4.data_bytes(1, self.cols);
        &q[r * rb..(r + 1) * rb]
    }

    /// Whether a product of this matrix reads the same input as one of `other` (the same input
    /// size, format and activation group): then one quantized input serves both. A format alone
    /// does not say it: IQ4_XS kept as blocks and IQ4_NL are both q8 groups of 32, the first
    /// read with activations quantized per 256 ([`block_sums`]).
    pub fn reads_like(&self, other: &Mat<'_>) -> bool {
        self.cols == other.cols && self.format() == other.format() && self.quant_group() == other.quant_group()
    }

    /// The group the activations must be quantized with, or None for float weights.
    pub fn quant_group(&self) -> Option<usize> {
        if let MatData::Blocks { t, .. } = self.data
            && k23::fused(t)
        {
            return Some(k23::K23_GROUP);
        }
        self.format().group()
    }

    /// `f` applied to row `r`'s value bytes of a q4 or q6 matrix (`q`, interleaved when `x4`,
    /// panel-major when `panels`): the row itself, or gathered into a thread-local buffer.
    fn with_q_row<R>(
        &self,
        q: &[u8],
        (x4, panels, lanes): (bool, bool, bool),
        r: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        let fmt = self.format();
        let rb = fmt.data_bytes(1, self.cols);
        if !x4 {
            return f(&q[r * rb..(r + 1) * rb]);
        }
        let cb = fmt.chunk_bytes().unwrap_or(rb);
        // on the stack where it fits (rows of up to 32768 q4 values): a buffer of the thread's
        // own would be allocated by whichever thread first meets such a row, and which thread
        // takes which rows changes from pass to pass
        if rb <= STACK_ROW {
            let mut b = [0u8; STACK_ROW];
            gather_row(q, r, cb, (panels, lanes), &mut b[..rb]);
            return f(&b[..rb]);
        }
        ROW.with(|b| {
            let mut b = b.borrow_mut();
            b.resize(rb, 0);
            gather_row(q, r, cb, (panels, lanes), &mut b);
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
            MatData::Q4 { q, scales, group, x4, panels, lanes, mins } => {
                let ng = c / group;
                with_row_scales(scales, r, ng, lanes, |wd| {
                    self.with_q_row(q, (x4, panels, lanes), r, |q| match mins {
                        None => dequantize_q4_row(q, wd, group, out),
                        Some(m) => mins::dequant_q4_row(q, wd, &m[r * ng..(r + 1) * ng], group, out),
                    })
                })
            }
            MatData::Q4K { .. } | MatData::Q6K { .. } | MatData::Q8F16 { .. } | MatData::Q4F16 { .. } => {
                self.packed_dequant_row(r, out)
            }
            MatData::Q6 { q, scales, group, x4, panels } => {
                let ng = c / group;
                self.with_q_row(q, (x4, panels, false), r, |q| {
                    dequantize_q6_row(q, &scales[r * ng..(r + 1) * ng], group, out)
                })
            }
            MatData::Mxfp4 { q } => crate::mxfp4::dequantize_row(self.mxfp4_row(q, r), out),
            MatData::Blocks { .. } => self.blocks_dequant_row(r, out),
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
            (MatData::Q4 { q, scales, group, x4, panels, lanes, .. }, Input::Quant(a)) => {
                with_row_scales(scales, r, c / group, lanes, |wd| {
                    self.with_q_row(q, (x4, panels, lanes), r, |q| {
                        for (t, o) in out.iter_mut().enumerate() {
                            *o = dot::dot_q4(isa, q, wd, a.row(t));
                        }
                    })
                })
            }
            (MatData::Q6 { q, scales, group, x4, panels }, Input::Quant(a)) => {
                let wd = &scales[r * (c / group)..(r + 1) * (c / group)];
                self.with_q_row(q, (x4, panels, false), r, |q| {
                    for (t, o) in out.iter_mut().enumerate() {
                        *o = dot::dot_q6(isa, q, wd, a.row(t));
                    }
                })
            }
            (MatData::Mxfp4 { q }, Input::Quant(a)) => {
                let w = self.mxfp4_row(q, r);
                for (t, o) in out.iter_mut().enumerate() {
                    *o = dot::dot_mxfp4(isa, w, a.row(t));
                }
            }
            _ => panic!("moescope-kernels: input kind does not match the weight format (caller bug)"),
        }
    }

    /// Products of rows `rows` with all `n` input rows, written weight-row-major:
    /// `out[(r - rows.start) * n + t] = W[r] · x[t]`, `out.len() == rows.len() * n`.
    /// Each weight row is read from memory once for the whole batch.
    pub fn matmul_rows(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        debug_assert_eq!(out.len(), rows.len() * n);
        match self.data {
            MatData::Q4K { .. } | MatData::Q6K { .. } | MatData::Q8F16 { .. } | MatData::Q4F16 { .. } => {
                return self.packed_matmul_rows(isa, input, n, rows, out);
            }
            MatData::Blocks { t, q } if k23::fused(t) => {
                if let Input::Quant(a) = input {
                    return k23::matmul_rows(t, isa, (q, self.cols), a, n, rows, out);
                }
                panic!("moescope-kernels: input kind does not match the weight format (caller bug)")
            }
            MatData::Blocks { .. } => return self.blocks_matmul_rows(isa, input, n, rows, out),
            _ => {}
        }
        #[cfg(target_arch = "x86_64")]
        let done = if isa >= Isa::Avx512 { self.matmul_avx512(isa, input, n, rows.clone(), out) } else { None };
        #[cfg(not(target_arch = "x86_64"))]
        let done = None;
        let with_mins = done.unwrap_or_else(|| {
            self.symmetric_products(isa, input, n, rows.clone(), out);
            false
        });
        if let (
            MatData::Q4 { scales, group, mins: Some(m), .. } | MatData::Q8 { scales, group, mins: Some(m), .. },
            Input::Quant(a),
        ) = (self.data, input)
            && !with_mins
        {
            self.add_mins(isa, scales, m, self.cols / group, a, n, rows, out);
        }
    }

    /// [`Mat::matmul_rows`] below the AVX-512 tier, as if the matrix had no mins.
    fn symmetric_products(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        match (self.data, input) {
            // bf16 weights with several inputs (a prompt, a server's batch): as f32 rows are,
            // each product the bits of the one-token dot
            (MatData::Bf16(w), Input::F32(x)) if n > 1 => {
                let c = self.cols;
                let w = &w[rows.start * c..rows.end * c];
                for t0 in (0..n).step_by(TOKEN_RUN) {
                    let tn = (n - t0).min(TOKEN_RUN);
                    dot::dot_bf16_rows_tokens(isa, c, w, &x[t0 * c..(t0 + tn) * c], &mut out[t0..], n);
                }
            }
            // f32 weights with several inputs (a prompt's router): 16 tokens at a time over
            // every row of the piece (the tokens of a long prompt outgrow the cache: row by row
            // over all of them streamed them from memory once a row), in tiles of rows x
            // tokens, each dot as one alone
            (MatData::F32(w), Input::F32(x)) if n > 1 => {
                let c = self.cols;
                let w = &w[rows.start * c..rows.end * c];
                for t0 in (0..n).step_by(TOKEN_RUN) {
                    let tn = (n - t0).min(TOKEN_RUN);
                    dot::dot_f32_rows_tokens(isa, c, w, &x[t0 * c..(t0 + tn) * c], &mut out[t0..], n);
                }
            }
            // interleaved rows: whole blocks through the block kernel (one stream of weights);
            // panel-major ones (made only where the AVX-512 kernels run) row by row, gathered
            (
                MatData::Q4 { q, scales, group, x4: true, panels: false, lanes: false, .. }
                | MatData::Q6 { q, scales, group, x4: true, panels: false },
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

/// `f` applied to row `r`'s `ng` scales: the row's own, or gathered from lane order when
/// `lanes` (on the stack up to 1024 groups: rows of 32768 values in groups of 32).
fn with_row_scales<R>(scales: &[f32], r: usize, ng: usize, lanes: bool, f: impl FnOnce(&[f32]) -> R) -> R {
    if !lanes {
        return f(&scales[r * ng..(r + 1) * ng]);
    }
    let mut stack = [0f32; 1024];
    let mut heap = Vec::new();
    let b = if ng <= stack.len() {
        &mut stack[..ng]
    } else {
        heap.resize(ng, 0f32);
        &mut heap[..]
    };
    crate::quant::lane_row_scales(scales, r, b);
    f(b)
}

/// Tokens of a prompt an f32 product takes over all its rows before the next ones (16 rows of
/// 2048 floats: 128 KiB, beside the rows, in a core's L2).
const TOKEN_RUN: usize = 16;

impl Mat<'_> {
    /// The AVX-512 VNNI kernels, where the format and group suit them (`None` when they do
    /// not: the caller falls back), and whether the products hold the mins' term (the q4 and
    /// the sub-vector q8 kernels add it with their lanes). Each (row, token) product is computed
    /// the same way whatever the batch, so a prompt's logits equal those of decoding its tokens
    /// one by one.
    #[cfg(target_arch = "x86_64")]
    fn matmul_avx512(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) -> Option<bool> {
        let c = self.cols;
        match (self.data, input) {
            (
                MatData::Q4 { q, scales, group, x4, panels, .. } | MatData::Q6 { q, scales, group, x4, panels },
                Input::Quant(a),
            ) if (if matches!(self.data, MatData::Q6 { .. }) {
                avx512::supports_q6(group)
            } else {
                avx512::supports_q4(group)
            }) && a.permuted.len() >= n * c =>
            {
                let mins = if let MatData::Q4 { mins, .. } = self.data { mins } else { None };
                // q6 groups are whole 128-value chunks, as the q4 kernel's; the same tiles
                let six = matches!(self.data, MatData::Q6 { .. });
                let ws = avx512::WeightScales::F32 { scales, mins };
                let lanes = matches!(self.data, MatData::Q4 { lanes: true, .. });
                // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU; the
                // group suits the kernel; the slices are the matrix's and the tokens' (the
                // permuted rows were made with the rows, `QuantAct::quantize`)
                unsafe { avx512::q_matmul(isa, six, (x4, panels, lanes), q, ws, c, a, &a.permuted, n, rows, out) };
                Some(true)
            }
            (MatData::Q8 { q, scales, group, mins }, Input::Quant(a)) if avx512_q8::supports_q8(group, c) => {
                // SAFETY: as above
                unsafe { avx512_q8::q8_products(q, scales, mins, c, a, n, rows, out) };
                Some(avx512_q8::with_mins(group))
            }
            // one token: row by row, VNNI on 256-bit vectors (VBMI picks the exponents; without
            // it, the AVX2 row kernel)
            (MatData::Mxfp4 { q }, Input::Quant(a)) if n == 1 && Isa::Avx512.vbmi() => {
                // SAFETY: the Avx512 tier and VBMI were detected on this CPU; `q` is the matrix's
                // blocks, `a` its one activation row in groups of 32
                unsafe { avx512_mxfp4::mxfp4_matvec(q, c, a.row(0), rows, out) };
                Some(true)
            }
            (MatData::Mxfp4 { q }, Input::Quant(a)) if n > 1 => {
                // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU; `q` is the
                // matrix's blocks, `a` its `n` activation rows in groups of 32
                unsafe { avx512_mxfp4::mxfp4_matmul(q, c, a, n, rows, out) };
                Some(true)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_float;
#[cfg(test)]
mod tests_tiles;
