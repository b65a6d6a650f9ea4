//! Where the converter gets weights from: anything that can hand out rows of named tensors as
//! f32 (a HuggingFace checkpoint, or the demo model's generator).

use super::error::ConvertError;
use crate::package::layout::ScaleForm;

pub trait TensorSource: Sync {
    /// Shape of a tensor, or None when absent. Per-expert names
    /// (`...mlp.experts.{e}.gate_proj.weight`) resolve even when the checkpoint stores the
    /// experts fused.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;

    /// Rows `[r0, r0 + n)` of a matrix (a vector is one row) as f32, row-major, into `out`
    /// (resized). Non-finite values are an error naming the tensor, row and column.
    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError>;

    /// Rows `[r0, r0 + n)` already in format `f` (value bytes in the stored row order, f32
    /// scales row-major; with `mins`, asymmetric groups and their mins row-major), for a source
    /// that makes them directly (`moescope synth`, a GGUF file); `Ok(false)` when it cannot, and
    /// the converter quantizes [`read_rows`](Self::read_rows) instead.
    #[allow(clippy::too_many_arguments)]
    fn encoded_rows(
        &self,
        _name: &str,
        _f: moescope_kernels::Format,
        _r0: usize,
        _n: usize,
        _vals: &mut Vec<u8>,
        _scales: &mut Vec<f32>,
        _mins: Option<&mut Vec<f32>>,
    ) -> Result<bool, ConvertError> {
        Ok(false)
    }

    /// Rows `[r0, r0 + n)`'s bytes that the tensor's scale form ([`exact_format`](Self::exact_format))
    /// copies from the file: k4 or k6 records (GGUF's Q4_K or Q6_K scales as the file stores
    /// them, one per 256 values of a row, see `moescope_kernels::kscales`), or the file's blocks
    /// whole ([`ScaleForm::Blocks`]), for a source that holds them; `Ok(false)` when it does not.
    fn file_bytes(&self, _name: &str, _r0: usize, _n: usize, _out: &mut Vec<u8>) -> Result<bool, ConvertError> {
        Ok(false)
    }

    /// The format that holds the tensor's values exactly, and how its scales are stored (with
    /// mins, or as k4 records), for a source that stores them quantized (a GGUF file); what
    /// [`QuantMode::File`](super::QuantMode::File) writes.
    fn exact_format(&self, _name: &str) -> Option<(moescope_kernels::Format, ScaleForm)> {
        None
    }

    /// Where the tensor comes from, for messages (a file path).
    fn origin(&self, name: &str) -> String;

    /// The name the source itself gives the tensor, for messages (the same unless the source
    /// renames).
    fn source_name(&self, name: &str) -> String {
        name.to_string()
    }
}
