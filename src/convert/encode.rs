//! Rows of f32 weights into a package format's bytes and scales, as the converter writes them,
//! or the rows a source encodes itself ([`EncodedRows`]).

use std::path::PathBuf;

use moescope_kernels::Format;
use moescope_kernels::quant::{f32_to_bf16, interleave_rows, quantize_q4_row, quantize_q6_row, quantize_q8_row};

use super::error::ConvertError;
use super::source::TensorSource;
use crate::package::layout::ScaleForm;

/// Encode rows of `x` (`[n, cols]`) in format `f`: value bytes into `vals`, scales into `scales`;
/// with `x4`, the rows interleaved in blocks (`n` a multiple of the block).
pub fn encode_rows(f: Format, x: &[f32], cols: usize, x4: bool, vals: &mut Vec<u8>, scales: &mut Vec<f32>) {
    vals.clear();
    scales.clear();
    match f {
        Format::F32 => vals.extend_from_slice(bytemuck::cast_slice(x)),
        Format::Bf16 => {
            for v in x {
                vals.extend_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        Format::Q8 { group } => {
            vals.resize(x.len(), 0);
            scales.resize(x.len() / group, 0.0);
            let q: &mut [i8] = bytemuck::cast_slice_mut(vals.as_mut_slice());
            for (r, row) in x.chunks_exact(cols).enumerate() {
                let ng = cols / group;
                quantize_q8_row(row, group, &mut q[r * cols..(r + 1) * cols], &mut scales[r * ng..(r + 1) * ng]);
            }
        }
        Format::Q4 { group } => {
            vals.resize(x.len() / 2, 0);
            scales.resize(x.len() / group, 0.0);
            for (r, row) in x.chunks_exact(cols).enumerate() {
                let ng = cols / group;
                quantize_q4_row(
                    row,
                    group,
                    &mut vals[r * cols / 2..(r + 1) * cols / 2],
                    &mut scales[r * ng..(r + 1) * ng],
                );
            }
        }
        Format::Mxfp4 => {
            let rb = f.data_bytes(1, cols);
            vals.resize(x.len() / cols * rb, 0);
            for (r, row) in x.chunks_exact(cols).enumerate() {
                moescope_kernels::mxfp4::quantize_row(row, &mut vals[r * rb..(r + 1) * rb]);
            }
        }
        Format::Q6 { group } => {
            let rb = f.data_bytes(1, cols);
            vals.resize(x.len() / cols * rb, 0);
            scales.resize(x.len() / group, 0.0);
            for (r, row) in x.chunks_exact(cols).enumerate() {
                let ng = cols / group;
                quantize_q6_row(row, group, &mut vals[r * rb..(r + 1) * rb], &mut scales[r * ng..(r + 1) * ng]);
            }
        }
    }
    // rows interleaved (`x4`: the matrix these rows come from is, and they are whole blocks)
    if x4 {
        debug_assert!(f.interleaves(x.len() / cols, cols));
        let (rb, cb) = (f.data_bytes(1, cols), f.chunk_bytes().unwrap_or(cols));
        let mut x4 = vec![0u8; vals.len()];
        interleave_rows(vals, rb, cb, &mut x4);
        *vals = x4;
    }
}

/// Rows as a source encodes them: values, f32 scales and mins, or k4 / k6 records.
#[derive(Default)]
pub(super) struct EncodedRows {
    pub vals: Vec<u8>,
    pub scales: Vec<f32>,
    pub mins: Vec<f32>,
    pub records: Vec<u8>,
}

impl EncodedRows {
    /// Rows `[r0, r0 + n)` of `name` in format `f` with scales in `form`, from the source's own
    /// codes; `Ok(false)` when it has none and the form is plain (the caller quantizes), an
    /// error when the plan asked for mins or records that the source cannot give (a plan bug).
    pub(super) fn fill(
        &mut self,
        src: &dyn TensorSource,
        name: &str,
        (f, form): (Format, ScaleForm),
        r0: usize,
        n: usize,
    ) -> Result<bool, ConvertError> {
        if let ScaleForm::Blocks(_) = form {
            // the file's blocks are the values; nothing follows them
            self.scales.clear();
            self.records.clear();
            if !src.file_bytes(name, r0, n, &mut self.vals)? {
                return Err(no_scale_form(src, name, form));
            }
            return Ok(true);
        }
        let mins = form.asymmetric().then_some(&mut self.mins);
        let coded = src.encoded_rows(name, f, r0, n, &mut self.vals, &mut self.scales, mins)?;
        let whole = coded && (!form.records() || src.file_bytes(name, r0, n, &mut self.records)?);
        if !whole && form != ScaleForm::Plain {
            return Err(no_scale_form(src, name, form));
        }
        Ok(whole)
    }
}

/// A tensor planned with mins or records whose source could not give them (a plan bug).
fn no_scale_form(src: &dyn TensorSource, name: &str, form: ScaleForm) -> ConvertError {
    let what = match form {
        ScaleForm::Blocks(_) => "the file's blocks",
        _ if form.records() => "the blocks' scales (k4 or k6 records, f16 scales and mins)",
        _ => "mins (asymmetric groups)",
    };
    ConvertError::Tensor {
        file: PathBuf::from(src.origin(name)),
        name: src.source_name(name),
        msg: format!("planned with {what}, but the source cannot give them"),
    }
}
