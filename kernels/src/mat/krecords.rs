//! K-quant matrices at their own size (`MatData::Q4K`, `MatData::Q6K`): q4 or q6 codes with a
//! k4 or k6 record per 256 values of a row ([`crate::kscales`]). The AVX-512 tiles decode the
//! records as they go; the other tiers decode a block of rows' records into f32 scales (and
//! mins) and run the block as the Q4 or Q6 matrix that it equals, so every tier gives that
//! matrix's bits.

use std::ops::Range;

use super::{Input, Mat, MatData};
use crate::isa::Isa;
use crate::kscales::{K_BLOCK, K4_GROUP, K4_RECORD, K6_GROUP, K6_RECORD, k4_scales_mins, k6_scales};
use crate::quant::{PANEL_ROWS, ROW_BLOCK};

/// The parts of a K-quant matrix: codes, records, whether q6, row order.
struct Parts<'a> {
    q: &'a [u8],
    k: &'a [u8],
    six: bool,
    x4: bool,
    panels: bool,
}

impl<'a> Mat<'a> {
    fn k_parts(&self) -> Option<Parts<'a>> {
        match self.data {
            MatData::Q4K { q, k, x4, panels } => Some(Parts { q, k, six: false, x4, panels }),
            MatData::Q6K { q, k, x4, panels } => Some(Parts { q, k, six: true, x4, panels }),
            _ => None,
        }
    }

    /// The rows of row `r`'s block: a whole interleaved block of 4 or panel-major superblock of
    /// 16 (4 where rows are row-major), so the block's bytes are a matrix of their own with the
    /// same row order.
    fn k_block_of(&self, p: &Parts<'_>, r: usize) -> Range<usize> {
        let blk = if p.panels { PANEL_ROWS } else { ROW_BLOCK };
        let b0 = r / blk * blk;
        b0..(b0 + blk).min(self.rows)
    }

    /// Rows `rows` of a K-quant matrix as the Q4 or Q6 matrix with f32 scales (and mins) that
    /// they stand for, their records decoded into `s` and `m` (room for [`PANEL_ROWS`] rows).
    fn k_block<'b>(&self, p: &Parts<'b>, rows: Range<usize>, s: &'b mut [f32], m: &'b mut [f32]) -> Mat<'b> {
        let (fmt, n) = (self.format(), rows.len());
        let (rb, group) = (fmt.data_bytes(1, self.cols), fmt.group().unwrap_or(K4_GROUP));
        let ng = self.cols / group;
        let (s, m) = (&mut s[..n * ng], &mut m[..n * ng]);
        let q = &p.q[rows.start * rb..rows.end * rb];
        let data = if p.six {
            let kb = self.cols / K_BLOCK * K6_RECORD;
            k6_scales(&p.k[rows.start * kb..rows.end * kb], s);
            MatData::Q6 { q, scales: s, group: K6_GROUP, x4: p.x4, panels: p.panels }
        } else {
            let kb = self.cols / K_BLOCK * K4_RECORD;
            k4_scales_mins(&p.k[rows.start * kb..rows.end * kb], s, m);
            MatData::Q4 { q, scales: s, group: K4_GROUP, x4: p.x4, panels: p.panels, mins: Some(m) }
        };
        Mat { rows: n, cols: self.cols, data }
    }

    /// Row `r` of a K-quant matrix as f32 (its records decoded, then as Q4 or Q6).
    pub(super) fn k_dequant_row(&self, r: usize, out: &mut [f32]) {
        let Some(p) = self.k_parts() else { return };
        let block = self.k_block_of(&p, r);
        let ng = PANEL_ROWS * self.cols / K6_GROUP;
        let (mut s, mut m) = (vec![0f32; ng], vec![0f32; ng]);
        let b0 = block.start;
        self.k_block(&p, block, &mut s, &mut m).dequant_row(r - b0, out);
    }

    /// [`Mat::matmul_rows`] of a K-quant matrix.
    pub(super) fn k_matmul_rows(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        let Some(p) = self.k_parts() else { return };
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx512
            && let Input::Quant(a) = input
            && a.permuted.len() >= n * self.cols
        {
            use super::avx512::WeightScales;
            let ws = if p.six { WeightScales::K6(p.k) } else { WeightScales::K4(p.k) };
            // SAFETY: the Avx512 tier was detected (or capped down to) on this CPU; groups of 32
            // (q4) and 16 (q6) suit the kernel; the slices are the matrix's and the tokens'
            // (permuted with them)
            unsafe {
                super::avx512::q_matmul(p.six, (p.x4, p.panels), p.q, ws, self.cols, a, &a.permuted, n, rows, out)
            };
            return;
        }
        // a block of rows at a time, as the Q4 or Q6 matrix it equals
        let ng = PANEL_ROWS * self.cols / K6_GROUP;
        let (mut s, mut m) = (vec![0f32; ng], vec![0f32; ng]);
        let mut r = rows.start;
        while r < rows.end {
            let b = self.k_block_of(&p, r);
            let (b0, end) = (b.start, rows.end.min(b.end));
            let block = self.k_block(&p, b, &mut s, &mut m);
            block.matmul_rows(isa, input, n, r - b0..end - b0, &mut out[(r - rows.start) * n..(end - rows.start) * n]);
            r = end;
        }
    }
}
