//! Matrices kept as a GGUF file's own blocks (`MatData::Blocks`: Q2_K, Q3_K, Q5_K, Q5_0, IQ4_NL,
//! IQ4_XS and the codebook types), so a package holds exactly the file's bytes. Their products
//! decode a block of rows at a time into the q8 matrix the blocks stand for
//! ([`crate::ggml_codes::blocks_run_as`]: the codes, f32 scales and mins a relayout would have
//! written) in a per-thread buffer, and run that matrix's kernels on it: every tier gives the
//! relaid matrix's bits, and memory is read at the file's bits a weight.

use std::cell::RefCell;
use std::ops::Range;

use super::{Input, Mat, MatData};
use crate::ggml::BlockType;
use crate::ggml_codes::{blocks_run_as, decode_blocks};
use crate::isa::Isa;

/// Values decoded at a time: rows of the decoded block stay in the core's L2 (16 Ki codes plus
/// their scales is 20-24 KiB) while every token of the batch runs over them.
const DECODED_VALUES: usize = 16 << 10;

/// Rows decoded together, whatever the matrix (a multiple of the q8 tiles' 4 rows).
const MAX_ROWS: usize = 64;

/// A block of rows decoded: q8 codes, a scale per group, a min per group where the type has them.
#[derive(Default)]
struct Decoded {
    codes: Vec<i8>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

thread_local! {
    static DECODED: RefCell<Decoded> = RefCell::new(Decoded::default());
}

impl<'a> Mat<'a> {
    /// The type and bytes of a matrix kept as blocks.
    fn blocks_parts(&self) -> Option<(BlockType, &'a [u8])> {
        match self.data {
            MatData::Blocks { t, q } => Some((t, q)),
            _ => None,
        }
    }

    /// Rows decoded together for this matrix's row length.
    fn blocks_rows(&self) -> usize {
        (DECODED_VALUES / self.cols.max(1)).clamp(4, MAX_ROWS) / 4 * 4
    }

    /// `f` applied to rows `rows` of a matrix kept as blocks, decoded into the q8 matrix they
    /// stand for (its row 0 is row `rows.start`).
    fn with_decoded<R>(&self, isa: Isa, rows: Range<usize>, f: impl FnOnce(&Mat<'_>) -> R) -> Option<R> {
        let (t, q) = self.blocks_parts()?;
        let (group, with_mins) = blocks_run_as(t)?;
        let (n, rb) = (rows.len(), t.bytes_of(self.cols));
        DECODED.with(|d| {
            let mut d = d.borrow_mut();
            let Decoded { codes, scales, mins } = &mut *d;
            let (nv, ng) = (n * self.cols, n * self.cols / group);
            codes.resize(nv, 0);
            scales.resize(ng, 0.0);
            mins.resize(if with_mins { ng } else { 0 }, 0.0);
            decode_blocks(t, &q[rows.start * rb..rows.end * rb], &mut codes[..nv], &mut scales[..ng], mins, isa);
            let mins = with_mins.then_some(&mins[..]);
            let data = MatData::Q8 { q: &codes[..nv], scales: &scales[..ng], group, mins };
            Some(f(&Mat { rows: n, cols: self.cols, data }))
        })
    }

    /// Row `r` of a matrix kept as blocks, as f32.
    pub(super) fn blocks_dequant_row(&self, r: usize, out: &mut [f32]) {
        self.with_decoded(Isa::Scalar, r..r + 1, |m| m.dequant_row(0, out));
    }

    /// [`Mat::matmul_rows`] of a matrix kept as blocks: a block of rows at a time, decoded, as
    /// the q8 matrix it equals.
    pub(super) fn blocks_matmul_rows(&self, isa: Isa, input: Input<'_>, n: usize, rows: Range<usize>, out: &mut [f32]) {
        let step = self.blocks_rows();
        let mut r = rows.start;
        while r < rows.end {
            let end = rows.end.min(r + step);
            let o = &mut out[(r - rows.start) * n..(end - rows.start) * n];
            self.with_decoded(isa, r..end, |m| m.matmul_rows(isa, input, n, 0..end - r, o));
            r = end;
        }
    }
}
