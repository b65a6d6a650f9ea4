//! Which moescope format keeps each GGUF type's values exactly (what `convert` of a GGUF
//! writes by default), how `inspect` names it, and the bytes it takes.

use moescope_kernels::Format;
use moescope_kernels::ggml::BlockType;
use moescope_kernels::ggml_codes::{block_halves, blocks_run_as};

use crate::package::layout::ScaleForm;

/// The moescope format that holds every value of a tensor of type `t` exactly, as the kernels
/// run it, and how its scales are stored (the blocks' own f16 scales or records, at the file's
/// size): F32 and BF16 as they are; Q8_0 as q8 and Q4_0 as q4 at group 32 (the same codes, the
/// blocks' f16 scales as they are); Q6_K as q6 group 16 with k6 records (its 6-bit codes, scale
/// d * sc: an f16 times an 8-bit integer, exact in f32); Q4_1 as q4 group 32 with its f16 scales
/// and mins (d and -m: `scale * n - min`); Q5_0, Q4_K, Q5_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS and the
/// codebook types IQ1_S ... IQ3_S as the file's blocks, byte for byte
/// (`ScaleForm::Blocks`): Q2_K, Q3_K, Q4_K and IQ4_XS computed from their codes as integer sums
/// per block (`moescope_kernels::mat::block_sums`), the others decoded as they go into the q8
/// matrix of their codes with the sub-blocks as groups
/// (`moescope_kernels::ggml_codes::blocks_run_as`: Q5_K with mins; IQ1 in eighths, see
/// `moescope_kernels::ggml_iq`). F16 runs as f32.
pub fn exact_format(t: BlockType) -> (Format, ScaleForm) {
    use ScaleForm::{F16, F16Mins, K6, Plain};
    // the file's blocks as they are, computed as the q8 matrix of their codes
    if let Some((group, _)) = moescope_kernels::ggml_codes::blocks_run_as(t) {
        return (Format::Q8 { group }, ScaleForm::Blocks(t));
    }
    match t {
        BlockType::Bf16 => (Format::Bf16, Plain),
        BlockType::Q8_0 => (Format::Q8 { group: 32 }, F16),
        BlockType::Q4_0 => (Format::Q4 { group: 32 }, F16),
        BlockType::Q4_1 => (Format::Q4 { group: 32 }, F16Mins),
        BlockType::Q6K => (Format::Q6 { group: 16 }, K6),
        BlockType::Mxfp4 => (Format::Mxfp4, Plain),
        // F32, F16 (and no other: every remaining type is kept as blocks above)
        _ => (Format::F32, Plain),
    }
}

/// Whether a block's f16 scales are finite (so are its values then).
pub(super) fn halves_finite(t: BlockType, b: &[u8]) -> bool {
    block_halves(t, b).iter().all(|&h| h & 0x7C00 != 0x7C00)
}

/// How moescope runs tensors of ggml type `id` when it keeps the file's values, in words.
pub fn runs_as(id: u32) -> String {
    match BlockType::from_ggml_id(id) {
        None => "not supported".into(),
        Some(t) => {
            let (f, form) = exact_format(t);
            let m = match form {
                ScaleForm::Plain => "",
                ScaleForm::Mins => " with mins",
                ScaleForm::K4 => " with k4 records",
                ScaleForm::K6 => " with k6 records",
                ScaleForm::F16 => " with f16 scales",
                ScaleForm::F16Mins => " with f16 scales and mins",
                ScaleForm::Blocks(_) => "",
            };
            if moescope_kernels::mat::block_sums(t) {
                return "its own blocks (integer sums a block, activations quantized per 256)".into();
            }
            if let (ScaleForm::Blocks(_), Some((group, mins))) = (form, blocks_run_as(t)) {
                let m = if mins { " with mins" } else { "" };
                return format!("its own blocks (computed as q8, group {group}{m})");
            }
            match (t, f) {
                (BlockType::F32, _) => "f32".into(),
                (_, Format::F32) => "f32 (dequantized)".into(),
                (_, Format::Bf16) => "bf16".into(),
                (_, Format::Q8 { group }) => format!("q8, group {group}{m}"),
                (_, Format::Q4 { group }) => format!("q4, group {group}{m}"),
                (_, Format::Q6 { group }) => format!("q6, group {group}{m}"),
                (_, Format::Mxfp4) => "mxfp4".into(),
            }
        }
    }
}

/// Bytes a package holds for a GGUF tensor of ggml type `id` and shape `ne` (ggml's order:
/// `ne[0]` values a row) when it keeps the file's values, values and scales unpadded; None
/// for a type that is not read.
pub fn package_bytes(id: u32, ne: &[u64]) -> Option<u64> {
    let t = BlockType::from_ggml_id(id)?;
    let (f, form) = exact_format(t);
    let cols = *ne.first()? as usize;
    let rows = ne.iter().skip(1).product::<u64>() as usize;
    if let ScaleForm::Blocks(_) = form {
        return Some(t.bytes_of(rows * cols) as u64);
    }
    Some((f.data_bytes(rows, cols) + form.bytes(f, rows, cols)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every quantized type the package keeps at the file's bytes, against ggml's block sizes
    /// (F16 runs as f32: twice its bytes).
    #[test]
    fn every_quantized_type_keeps_the_files_bytes() {
        let (cols, rows) = (512, 4);
        for t in BlockType::ALL {
            let file = t.bytes_of(cols * rows) as u64;
            let package = package_bytes(t.ggml_id(), &[cols as u64, rows as u64]);
            let want = if t == BlockType::F16 { 2 * file } else { file };
            assert_eq!(package, Some(want), "{}: package bytes against the file's", t.name());
        }
    }
}
