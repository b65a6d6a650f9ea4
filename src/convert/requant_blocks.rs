//! A source's weights quantized into GGUF blocks as they are converted (`convert --quant q4_k |
//! q2_k | iq4_xs`): the attention, dense MLP and expert matrices whose rows are whole 256-value
//! super-blocks become blocks of the type (`moescope_kernels::ggml_quant`), and the package keeps
//! them as it keeps a GGUF file of that type (the blocks themselves,
//! `gguf::exact::exact_format`): the same bytes a weight, and the same kernels. Every other
//! tensor takes the mode's plain format (`QuantMode::format`).

use std::collections::HashSet;

use moescope_kernels::Format;
use moescope_kernels::ggml::{BlockType, QK_K};
use moescope_kernels::ggml_quant::quantize_row;

use super::error::ConvertError;
use super::gguf::codes::{encode_blocks, encodes_as};
use super::gguf::exact::exact_format;
use super::plan::{self, Kind};
use super::source::TensorSource;
use crate::model_config::ModelConfig;
use crate::package::layout::ScaleForm;

/// `inner`'s tensors, the matrices of [`RequantBlocks::new`]'s choice as blocks of `t`.
pub struct RequantBlocks<'a> {
    inner: &'a dyn TensorSource,
    t: BlockType,
    /// the tensors quantized into blocks
    names: HashSet<String>,
}

impl<'a> RequantBlocks<'a> {
    /// The linear layers and routed experts of `cfg` (and of its multi-token-prediction layers)
    /// with rows of whole super-blocks, as blocks of `t`.
    pub fn new(inner: &'a dyn TensorSource, cfg: &ModelConfig, t: BlockType) -> RequantBlocks<'a> {
        let whole = |shape: &[usize]| shape.len() == 2 && shape[1].is_multiple_of(QK_K);
        let mut names: HashSet<String> = plan::dense_tensors(cfg)
            .into_iter()
            .chain(plan::mtp_tensors(cfg))
            .filter(|d| matches!(d.kind, Kind::Linear | Kind::Expert) && whole(&d.shape))
            .map(|d| d.name)
            .collect();
        for l in cfg.moe_layers() {
            for e in 0..cfg.num_experts {
                names.extend(plan::expert_tensors(cfg, l, e).into_iter().filter(|(_, s)| whole(s)).map(|(n, _)| n));
            }
        }
        RequantBlocks { inner, t, names }
    }

    /// Rows `[r0, r0 + n)` of `name` quantized into blocks.
    fn blocks(&self, name: &str, r0: usize, n: usize) -> Result<Vec<u8>, ConvertError> {
        let mut x = vec![];
        self.inner.read_rows(name, r0, n, &mut x)?;
        let mut out = Vec::with_capacity(self.t.bytes_of(x.len()));
        quantize_row(self.t, &x, &mut out);
        Ok(out)
    }
}

impl TensorSource for RequantBlocks<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.shape(name)
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        self.inner.read_rows(name, r0, n, out)
    }

    fn encoded_rows(
        &self,
        name: &str,
        f: Format,
        r0: usize,
        n: usize,
        vals: &mut Vec<u8>,
        scales: &mut Vec<f32>,
        mins: Option<&mut Vec<f32>>,
    ) -> Result<bool, ConvertError> {
        if !self.names.contains(name) {
            return self.inner.encoded_rows(name, f, r0, n, vals, scales, mins);
        }
        if !encodes_as(self.t, f, mins.is_some()) {
            return Ok(false);
        }
        let cols = self.inner.shape(name).and_then(|s| s.last().copied()).unwrap_or(QK_K);
        Ok(encode_blocks(self.t, &self.blocks(name, r0, n)?, f, cols, vals, scales, mins))
    }

    fn file_bytes(&self, name: &str, r0: usize, n: usize, out: &mut Vec<u8>) -> Result<bool, ConvertError> {
        if !self.names.contains(name) {
            return Ok(false);
        }
        // every type quantized here is kept as its blocks (`exact_format`)
        if !matches!(exact_format(self.t).1, ScaleForm::Blocks(_)) {
            return Ok(false);
        }
        *out = self.blocks(name, r0, n)?;
        Ok(true)
    }

    fn exact_format(&self, name: &str) -> Option<(Format, ScaleForm)> {
        self.names.contains(name).then(|| exact_format(self.t))
    }

    fn origin(&self, name: &str) -> String {
        self.inner.origin(name)
    }

    fn source_name(&self, name: &str) -> String {
        self.inner.source_name(name)
    }
}
