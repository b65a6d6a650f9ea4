//! How a quantized tensor's scales are stored after its values (`ScaleForm`), the layout
//! marks that name each form, and the bytes a tensor spans with them.

use moescope_kernels::Format;
use moescope_kernels::ggml::BlockType;
use moescope_kernels::ggml_codes::blocks_run_as;

use super::layout::{DENSE_ALIGN, align_up};

/// The layout mark of asymmetric groups (a relayout of GGUF's Q4_K, Q5_K or Q4_1 before those
/// were kept as the file's blocks, and `--quant q4g32` of them): a reader that does not know it
/// refuses the layout rather than read the values without their mins.
pub const MINS: &str = "+mins";
/// The layout mark of q4 codes whose scales are k4 records (GGUF's Q4_K at its own size:
/// `moescope_kernels::kscales`) rather than f32 scales and mins.
pub const K4: &str = "+k4";

/// The layout mark of q6 codes whose scales are k6 records (GGUF's Q6_K at its own size).
pub const K6: &str = "+k6";

/// The layout mark of q8 or q4 codes with an f16 scale per group rather than an f32 one
/// (GGUF's Q8_0 and Q4_0 at their own size).
pub const F16: &str = "+f16";

/// The layout mark of q4 codes with an f16 scale and an f16 min per group, each row's scales
/// followed by its mins (GGUF's Q4_1 at its own size: the mins are `-m`).
pub const F16_MINS: &str = "+f16mins";

/// The start of the layout mark of a tensor kept as a GGUF file's blocks (`+ggml_q2_k`: the
/// type's name in lower case), computed as the q8 matrix of its codes
/// ([`moescope_kernels::ggml_codes::blocks_run_as`]).
pub const BLOCKS: &str = "+ggml_";

/// The layout marks of the types kept as blocks: [`BLOCKS`] and the type's lower-case name.
pub(super) const BLOCK_MARKS: [(BlockType, &str); 14] = [
    (BlockType::Q5_0, "+ggml_q5_0"),
    (BlockType::Q4K, "+ggml_q4_k"),
    (BlockType::Q5K, "+ggml_q5_k"),
    (BlockType::Q2K, "+ggml_q2_k"),
    (BlockType::Q3K, "+ggml_q3_k"),
    (BlockType::Iq4Nl, "+ggml_iq4_nl"),
    (BlockType::Iq4Xs, "+ggml_iq4_xs"),
    (BlockType::Iq2Xxs, "+ggml_iq2_xxs"),
    (BlockType::Iq2Xs, "+ggml_iq2_xs"),
    (BlockType::Iq2S, "+ggml_iq2_s"),
    (BlockType::Iq3Xxs, "+ggml_iq3_xxs"),
    (BlockType::Iq3S, "+ggml_iq3_s"),
    (BlockType::Iq1S, "+ggml_iq1_s"),
    (BlockType::Iq1M, "+ggml_iq1_m"),
];

/// How a quantized tensor's scales are stored after its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleForm {
    /// f32 per group (none for the float formats and MXFP4)
    Plain,
    /// f32 per group, then as many f32 mins ([`MINS`])
    Mins,
    /// one 16-byte k4 record per 256 values of a row ([`K4`]; q4, groups of 32)
    K4,
    /// one 18-byte k6 record per 256 values of a row ([`K6`]; q6, groups of 16)
    K6,
    /// an f16 scale per group, no mins ([`F16`]; q8 or q4)
    F16,
    /// an f16 scale and min per group, a row's scales then its mins ([`F16_MINS`]; q4)
    F16Mins,
    /// no values or scales of moescope's own: the file's blocks of this type, row after row
    /// ([`BLOCKS`]), computed as the q8 matrix named by the entry's type and group
    Blocks(BlockType),
}

impl ScaleForm {
    /// The form a layout's mark names (none: plain).
    pub fn of_layout(layout: &str) -> ScaleForm {
        if layout.ends_with(MINS) {
            ScaleForm::Mins
        } else if layout.ends_with(K4) {
            ScaleForm::K4
        } else if layout.ends_with(K6) {
            ScaleForm::K6
        } else if layout.ends_with(F16) {
            ScaleForm::F16
        } else if layout.ends_with(F16_MINS) {
            ScaleForm::F16Mins
        } else if let Some(&(t, _)) = BLOCK_MARKS.iter().find(|(_, m)| layout.ends_with(m)) {
            ScaleForm::Blocks(t)
        } else {
            ScaleForm::Plain
        }
    }

    /// The mark a layout ends in.
    pub fn mark(self) -> &'static str {
        match self {
            ScaleForm::Plain => "",
            ScaleForm::Mins => MINS,
            ScaleForm::K4 => K4,
            ScaleForm::K6 => K6,
            ScaleForm::F16 => F16,
            ScaleForm::F16Mins => F16_MINS,
            ScaleForm::Blocks(t) => BLOCK_MARKS.iter().find(|(b, _)| *b == t).map_or("", |(_, m)| m),
        }
    }

    /// Whether rows of `cols` values in `f` can have their scales in this form.
    pub fn suits(self, f: Format, cols: usize) -> bool {
        use moescope_kernels::kscales::{K_BLOCK, K4_GROUP, K6_GROUP};
        match self {
            ScaleForm::Plain => true,
            ScaleForm::Mins | ScaleForm::F16 => matches!(f, Format::Q4 { .. } | Format::Q8 { .. }),
            ScaleForm::F16Mins => matches!(f, Format::Q4 { .. }),
            ScaleForm::K4 => f == Format::Q4 { group: K4_GROUP } && cols.is_multiple_of(K_BLOCK),
            ScaleForm::K6 => f == Format::Q6 { group: K6_GROUP } && cols.is_multiple_of(K_BLOCK),
            ScaleForm::Blocks(t) => {
                blocks_run_as(t).is_some_and(|(group, _)| f == Format::Q8 { group }) && cols.is_multiple_of(t.block())
            }
        }
    }

    /// Bytes of the scales of a `[rows, cols]` tensor in format `f` stored in this form.
    pub fn bytes(self, f: Format, rows: usize, cols: usize) -> usize {
        match self {
            ScaleForm::Plain => f.scale_bytes(rows, cols),
            ScaleForm::Mins => 2 * f.scale_bytes(rows, cols),
            ScaleForm::K4 => moescope_kernels::kscales::k4_bytes(rows, cols),
            ScaleForm::K6 => moescope_kernels::kscales::k6_bytes(rows, cols),
            ScaleForm::F16 => f.scale_bytes(rows, cols) / 2,
            ScaleForm::F16Mins => f.scale_bytes(rows, cols),
            ScaleForm::Blocks(_) => 0,
        }
    }

    /// Whether the groups are asymmetric (unsigned codes, a min each: f32 mins, k4 records, or
    /// blocks of a type with mins).
    pub fn asymmetric(self) -> bool {
        match self {
            ScaleForm::Blocks(t) => blocks_run_as(t).is_some_and(|(_, mins)| mins),
            _ => matches!(self, ScaleForm::Mins | ScaleForm::K4 | ScaleForm::F16Mins),
        }
    }

    /// Whether the scales are records a source copies from its blocks (k4, k6, f16 scales and
    /// mins).
    pub fn records(self) -> bool {
        matches!(self, ScaleForm::K4 | ScaleForm::K6 | ScaleForm::F16 | ScaleForm::F16Mins)
    }
}

/// (total bytes, offset of the scales from the start) of a `[rows, cols]` tensor in format `f`
/// with its scales in `form`.
pub fn span(f: Format, rows: usize, cols: usize, form: ScaleForm) -> (u64, Option<u64>) {
    let data = match form {
        ScaleForm::Blocks(t) => t.bytes_of(rows * cols) as u64,
        _ => f.data_bytes(rows, cols) as u64,
    };
    let scales = form.bytes(f, rows, cols) as u64;
    if scales == 0 {
        (data, None)
    } else {
        let so = align_up(data, DENSE_ALIGN);
        (so + scales, Some(so))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_align_scales() {
        assert_eq!(span(Format::Bf16, 3, 5, ScaleForm::Plain), (30, None));
        // q4: 2 rows x 96 -> 96 data bytes, scales at 128, 2*3*4 = 24 bytes
        assert_eq!(span(Format::Q4 { group: 32 }, 2, 96, ScaleForm::Plain), (128 + 24, Some(128)));
        assert_eq!(
            span(Format::Q4 { group: 32 }, 2, 96, ScaleForm::Mins),
            (128 + 48, Some(128)),
            "mins after the scales"
        );
        // k4: 2 rows x 512 -> 512 data bytes, then 2 records a row
        assert_eq!(span(Format::Q4 { group: 32 }, 2, 512, ScaleForm::K4), (512 + 64, Some(512)), "k4 records");
        // f16 scales: 2 rows x 96 q8 -> 192 data bytes, 2 bytes a group of 32
        assert_eq!(span(Format::Q8 { group: 32 }, 2, 96, ScaleForm::F16), (192 + 12, Some(192)), "f16 scales");
        // f16 scales and mins: 2 rows x 96 q4 -> 96 data bytes, scales at 128, 4 bytes a group
        assert_eq!(span(Format::Q4 { group: 32 }, 2, 96, ScaleForm::F16Mins), (128 + 24, Some(128)), "and mins");
        assert!(!ScaleForm::F16Mins.suits(Format::Q8 { group: 32 }, 96) && ScaleForm::F16Mins.asymmetric());
        assert_eq!(ScaleForm::of_layout("q4_lohi32_x4+f16mins"), ScaleForm::F16Mins);
        assert_eq!(ScaleForm::of_layout("q4_lohi32_x4+f16"), ScaleForm::F16);
    }
}
