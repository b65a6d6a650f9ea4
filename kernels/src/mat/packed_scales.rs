//! Matrices whose scales are stored packed rather than as f32: q4 or q6 codes with a k4 or k6
//! record per 256 values of a row (`MatData::Q4K`, `MatData::Q6K`, [`crate::kscales`]), and q8
//! or q4 codes with an f16 scale (and min) per group (`MatData::Q8F16`, `MatData::Q4F16`: GGUF's
//! Q8_0, Q4_0 and Q4_1 at their own size). The AVX-512 q4 / q6 tiles read records and f16 scales as they go
//! (`avx512_records.rs`), the AVX-512 q8 kernels f16 scales too (`avx512_q8::Halves`); everything
//! else decodes a block of rows' scales (and mins) into f32 and runs the block as the Q4, Q6 or
//! Q8 matrix it equals, so every tier gives that matrix's bits.

use std::ops::Range;

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::{Input, Mat, MatData};
use crate::isa::Isa;
use crate::kscales::{K_BLOCK, K4_GROUP, K4_RECORD, K6_GROUP, K6_RECORD, k4_scales_mins, k6_scales};
use crate::quant::{PANEL_ROWS, ROW_BLOCK};

/// Most rows whose scales are decoded at a time for a product: a whole number of interleaved
/// blocks and panel-major superblocks (each block starts on one, `Mat::packed_unit`, so its
/// bytes are a matrix of their own with the same row order), and few enough that their f32 scales stay in L1 (2048 values a row in groups of 32:
/// 8 KiB).
const BLOCK_ROWS: usize = 32;

/// f16 scales `h` as f32 into `out` (F16C where the CPU has it: exact either way).
pub(super) fn widen(h: &[u16], out: &mut [f32]) {
    HalfBitsSliceExt::reinterpret_cast::<half::f16>(h).convert_to_f32_slice(&mut out[..h.len()]);
}

thread_local! {
    /// A block of rows' scales and mins as f32 ([`Mat::packed_matmul_rows`]): a buffer of the
    /// thread's own, as a product is cut into pieces of a few rows.
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> Mat<'a> {
    /// Rows in the smallest block that is a matrix of its own: an interleaved block of 4, a
    /// panel-major superblock or a lane-order block of 16, or one row.
    fn packed_unit(&self) -> usize {
        match self.data {
            MatData::Q4F16 { lanes: true, .. } => crate::quant::LANE_ROWS,
            MatData::Q4K { x4, panels, .. } | MatData::Q6K { x4, panels, .. } | MatData::Q4F16 { x4, panels, .. } => {
                if x4 && panels {
                    PANEL_ROWS
                } else if x4 {
                    ROW_BLOCK
                } else {
                    1
                }
            }
            _ => 1,
        }
    }

    /// Floats a block of `rows` rows' decoded scales and mins take.
    fn packed_floats(&self, rows: usize) -> usize {
        2 * rows * self.cols / self.format().group().unwrap_or(K6_GROUP)
    }

    /// Rows `rows` (a whole number of [`Mat::packed_unit`]s from a multiple of it) as the Q4, Q6
    /// or Q8 matrix with f32 scales (and mins) that they stand for, the scales decoded into `buf`
    /// (at least [`Mat::packed_floats`]).
    fn packed_block<'b>(&self, rows: Range<usize>, buf: &'b mut [f32]) -> Mat<'b>
    where
        'a: 'b,
    {
        let (fmt, n) = (self.format(), rows.len());
        let (rb, group) = (fmt.data_bytes(1, self.cols), fmt.group().unwrap_or(K4_GROUP));
        let ng = self.cols / group;
        let (s, m) = buf.split_at_mut(n * ng);
        let (s, m) = (&mut s[..], &mut m[..n * ng]);
        let (k4, k6) = (self.cols / K_BLOCK * K4_RECORD, self.cols / K_BLOCK * K6_RECORD);
        let data = match self.data {
            MatData::Q6K { q, k, x4, panels } => {
                k6_scales(&k[rows.start * k6..rows.end * k6], s);
                MatData::Q6 { q: &q[rows.start * rb..rows.end * rb], scales: s, group: K6_GROUP, x4, panels }
            }
            MatData::Q4K { q, k, x4, panels } => {
                k4_scales_mins(&k[rows.start * k4..rows.end * k4], s, m);
                let q = &q[rows.start * rb..rows.end * rb];
                MatData::Q4 { q, scales: s, group: K4_GROUP, x4, panels, lanes: false, mins: Some(m) }
            }
            MatData::Q8F16 { q, scales, group } => {
                widen(&scales[rows.start * ng..rows.end * ng], s);
                MatData::Q8 { q: &q[rows.start * rb..rows.end * rb], scales: s, group, mins: None }
            }
            MatData::Q4F16 { q, scales, group, x4, panels, lanes, mins: false } => {
                widen(&scales[rows.start * ng..rows.end * ng], s);
                MatData::Q4 { q: &q[rows.start * rb..rows.end * rb], scales: s, group, x4, panels, lanes, mins: None }
            }
            MatData::Q4F16 { q, scales, group, x4, panels, lanes, mins: true } => {
                // each row: its scales, then its mins
                let h = &scales[rows.start * 2 * ng..rows.end * 2 * ng];
                for ((h, s), m) in h.chunks_exact(2 * ng).zip(s.chunks_exact_mut(ng)).zip(m.chunks_exact_mut(ng)) {
                    widen(&h[..ng], s);
                    widen(&h[ng..], m);
                }
                let q = &q[rows.start * rb..rows.end * rb];
                MatData::Q4 { q, scales: s, group, x4, panels, lanes, mins: Some(m) }
            }
            _ => unreachable!("packed_block of a matrix without packed scales"),
        };
        Mat { rows: n, cols: self.cols, data }
    }

    /// Row `r` of a matrix with packed scales as f32 (its unit's scales decoded, then as Q4, Q6
    /// or Q8).
    pub(super) fn packed_dequant_row(&self, r: usize, out: &mut [f32]) {
        let unit = self.packed_unit();
        let b0 = r / unit * unit;
        let block = b0..(b0 + unit).min(self.rows);
        let mut buf = vec![0f32; self.packed_floats(unit)];
        self.packed_block(block, &mut buf).dequant_row(r - b0, out);
    }

    /// [`Mat::matmul_rows`] of a matrix with packed scales.
    pub(super) fn packed_matmul_rows(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx512
            && let (MatData::Q8F16 { q, scales, group }, Input::Quant(a)) = (self.data, input)
            && super::avx512_q8::supports_q8(group, self.cols)
        {
            use super::avx512_q8::{Halves, q8_products};
            // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU; the group
            // suits the kernels; the slices are the matrix's and the tokens'
            unsafe { q8_products(q, Halves(scales), None, self.cols, a, n, rows, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx512
            && let Input::Quant(a) = input
            && a.permuted.len() >= n * self.cols
        {
            use super::avx512::{WeightScales, q_matmul, supports_q4};
            let tiles = match self.data {
                MatData::Q6K { q, k, x4, panels } => Some((true, q, WeightScales::K6(k), (x4, panels, false))),
                MatData::Q4K { q, k, x4, panels } => Some((false, q, WeightScales::K4(k), (x4, panels, false))),
                MatData::Q4F16 { q, scales, group, x4, panels, lanes, mins } if supports_q4(group) => {
                    Some((false, q, WeightScales::F16 { scales, mins }, (x4, panels, lanes)))
                }
                // q8: blocks decoded below, then the AVX-512 q8 kernels
                _ => None,
            };
            if let Some((six, q, ws, order)) = tiles {
                // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU; the
                // groups suit the kernel (q6: 16, k4 records: 32, f16 scales: checked); the
                // slices are the matrix's and the tokens' (permuted with them)
                unsafe { q_matmul(isa, six, order, q, ws, self.cols, a, &a.permuted, n, rows, out) };
                return;
            }
        }
        // a block of rows at a time, as the Q4, Q6 or Q8 matrix it equals
        DECODED.with(|b| {
            let mut buf = b.borrow_mut();
            let len = buf.len().max(self.packed_floats(BLOCK_ROWS));
            buf.resize(len, 0.0);
            // from the unit holding r to the one holding the piece's last row in this block: a
            // piece of a few rows decodes those rows' units, not the whole block
            let unit = self.packed_unit();
            let mut r = rows.start;
            while r < rows.end {
                let b0 = r / unit * unit;
                let end = rows.end.min(b0 + BLOCK_ROWS);
                let block = self.packed_block(b0..(end.div_ceil(unit) * unit).min(self.rows), &mut buf);
                let o = &mut out[(r - rows.start) * n..(end - rows.start) * n];
                block.matmul_rows(isa, input, n, r - b0..end - b0, o);
                r = end;
            }
        });
    }
}
