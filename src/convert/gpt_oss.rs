//! A gpt-oss checkpoint seen under the package's names and layout (`convert::plan`):
//!
//! - the router `mlp.router.{weight,bias}` -> `mlp.gate.{weight,bias}`;
//! - the experts stored fused and transposed, `mlp.experts.gate_up_proj [E, H, 2I]` with gate
//!   and up interleaved by column (gate = even columns, up = odd) and `mlp.experts.down_proj
//!   [E, I, H]` -> each expert's `gate_proj [I, H]`, `up_proj [I, H]`, `down_proj [H, I]`;
//! - their biases `gate_up_proj_bias [E, 2I]` (interleaved the same way) and `down_proj_bias
//!   [E, H]` -> `experts.{gate,up}_proj.bias [E, I]` and `experts.down_proj.bias [E, H]`.
//!
//! - or, in the hub's MXFP4 release (`quantization_config.quant_method` mxfp4), the experts as
//!   `gate_up_proj_blocks [E, 2I, H/32, 16]` / `gate_up_proj_scales [E, 2I, H/32]` (rows are
//!   outputs, gate = even rows) and `down_proj_blocks [E, H, I/32, 16]` / `down_proj_scales`:
//!   each expert's matrices as MXFP4 rows (`encoded_rows`: the same codes and exponents in
//!   ggml's block order) or as the values transformers dequantizes them to (`read_rows`).
//!
//! Everything else (norms, attention with its biases and sinks, embeddings, lm_head) passes
//! through.

use moescope_kernels::Format;
use moescope_kernels::mxfp4::{self, BLOCK_BYTES};

use super::error::ConvertError;
use super::safetensors::HfCheckpoint;
use super::source::TensorSource;
use crate::package::layout::ScaleForm;

pub struct GptOssSource<'a> {
    src: &'a HfCheckpoint,
}

/// Which half of an interleaved gate/up tensor.
#[derive(Debug, Clone, Copy)]
enum Half {
    Gate,
    Up,
}

/// Expert `e`'s rows `step * r + first` of an MXFP4 `{name}_blocks` / `{name}_scales` pair
/// (gate: step 2, first 0; up: 2, 1; down: 1, 0).
#[derive(Debug, Clone)]
struct MxRows {
    name: String,
    e: usize,
    step: usize,
    first: usize,
}

/// How one package tensor is made from the checkpoint's.
enum View {
    Same(String),
    /// Expert `e`'s gate or up `[I, H]`: the even or odd columns of its `[H, 2I]` slab,
    /// transposed.
    GateUp {
        fused: String,
        e: usize,
        half: Half,
    },
    /// Expert `e`'s down `[H, I]`: its `[I, H]` slab transposed.
    Down {
        fused: String,
        e: usize,
    },
    /// The even or odd columns of a `[E, 2I]` bias.
    BiasHalf {
        fused: String,
        half: Half,
    },
    Mx(MxRows),
}

impl<'a> GptOssSource<'a> {
    pub fn new(src: &'a HfCheckpoint) -> GptOssSource<'a> {
        GptOssSource { src }
    }

    fn view(&self, name: &str) -> View {
        let Some((layer, rest)) = name.split_once(".mlp.") else {
            return View::Same(name.to_string());
        };
        let experts = format!("{layer}.mlp.experts.");
        let fused = |n: &str| format!("{experts}{n}");
        match rest {
            "gate.weight" => View::Same(format!("{layer}.mlp.router.weight")),
            "gate.bias" => View::Same(format!("{layer}.mlp.router.bias")),
            "experts.gate_proj.bias" => View::BiasHalf { fused: fused("gate_up_proj_bias"), half: Half::Gate },
            "experts.up_proj.bias" => View::BiasHalf { fused: fused("gate_up_proj_bias"), half: Half::Up },
            "experts.down_proj.bias" => View::Same(fused("down_proj_bias")),
            _ => {
                let per_expert = rest
                    .strip_prefix("experts.")
                    .and_then(|r| r.split_once('.'))
                    .and_then(|(e, part)| Some((e.parse::<usize>().ok()?, part)));
                let mx = self.src.shape(&fused("gate_up_proj_blocks")).is_some();
                let rows = |name: &str, e, step, first| View::Mx(MxRows { name: fused(name), e, step, first });
                match per_expert {
                    Some((e, "gate_proj.weight")) if mx => rows("gate_up_proj", e, 2, 0),
                    Some((e, "up_proj.weight")) if mx => rows("gate_up_proj", e, 2, 1),
                    Some((e, "down_proj.weight")) if mx => rows("down_proj", e, 1, 0),
                    Some((e, "gate_proj.weight")) => View::GateUp { fused: fused("gate_up_proj"), e, half: Half::Gate },
                    Some((e, "up_proj.weight")) => View::GateUp { fused: fused("gate_up_proj"), e, half: Half::Up },
                    Some((e, "down_proj.weight")) => View::Down { fused: fused("down_proj"), e },
                    _ => View::Same(name.to_string()),
                }
            }
        }
    }

    /// Expert `e`'s `[a, b]` slab of the fused `[E, a, b]` tensor, and `(a, b)`.
    fn slab(&self, fused: &str, e: usize, out: &mut Vec<f32>) -> Result<(usize, usize), ConvertError> {
        let Some([_, a, b]) = self.src.shape(fused).as_deref().and_then(|s| <[usize; 3]>::try_from(s).ok()) else {
            return Err(self.bad(fused, "expected a 3-D [experts, rows, cols] tensor".into()));
        };
        self.src.read_rows(fused, e, 1, out)?;
        Ok((a, b))
    }

    fn bad(&self, name: &str, msg: String) -> ConvertError {
        ConvertError::Tensor { file: self.src.origin(name).into(), name: name.into(), msg }
    }

    /// `(experts, hub rows, blocks a row)` of an MXFP4 pair, checked against each other.
    fn mx_shape(&self, name: &str) -> Result<(usize, usize, usize), ConvertError> {
        let (b, sc) = (format!("{name}_blocks"), format!("{name}_scales"));
        match (self.src.shape(&b).as_deref(), self.src.shape(&sc).as_deref()) {
            (Some(&[e, r, g, 16]), Some(s)) if s == [e, r, g] => Ok((e, r, g)),
            (bs, ss) => {
                Err(self.bad(&b, format!("blocks {bs:?} and scales {ss:?} do not pair as [E, R, G, 16] and [E, R, G]")))
            }
        }
    }

    /// Rows `r0..r0 + n` of an MXFP4 view as ggml's blocks (`G * 17` bytes a row) into `out`.
    fn mx_rows(&self, v: &MxRows, r0: usize, n: usize, out: &mut Vec<u8>) -> Result<(), ConvertError> {
        let (experts, rows, g) = self.mx_shape(&v.name)?;
        let last = (r0 + n).saturating_sub(1) * v.step + v.first;
        if v.e >= experts || (n > 0 && last >= rows) {
            let msg = format!("expert {} rows {r0}..{} out of range", v.e, r0 + n);
            return Err(self.bad(&format!("{}_blocks", v.name), msg));
        }
        let (mut blocks, mut scales) = (Vec::new(), Vec::new());
        self.src.read_bytes(&format!("{}_blocks", v.name), v.e, 1, &mut blocks)?;
        self.src.read_bytes(&format!("{}_scales", v.name), v.e, 1, &mut scales)?;
        let rb = g * BLOCK_BYTES;
        out.clear();
        out.resize(n * rb, 0);
        for (i, o) in out.chunks_exact_mut(rb).enumerate() {
            let hr = (r0 + i) * v.step + v.first;
            mxfp4::from_hub(&blocks[hr * g * 16..(hr + 1) * g * 16], &scales[hr * g..(hr + 1) * g], o);
        }
        Ok(())
    }
}

impl TensorSource for GptOssSource<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.view(name) {
            View::Same(n) => self.src.shape(&n),
            View::GateUp { fused, e, .. } => match self.src.shape(&fused)?.as_slice() {
                &[n, h, two_i] if e < n && two_i % 2 == 0 => Some(vec![two_i / 2, h]),
                // not this layout: the source's shape, which the converter names as wrong
                s => Some(s.to_vec()),
            },
            View::Down { fused, e } => match self.src.shape(&fused)?.as_slice() {
                &[n, i, h] if e < n => Some(vec![h, i]),
                s => Some(s.to_vec()),
            },
            View::BiasHalf { fused, .. } => match self.src.shape(&fused)?.as_slice() {
                &[n, two_i] if two_i % 2 == 0 => Some(vec![n, two_i / 2]),
                s => Some(s.to_vec()),
            },
            View::Mx(v) => match self.mx_shape(&v.name) {
                Ok((_, rows, g)) if rows.is_multiple_of(v.step) => Some(vec![rows / v.step, g * 32]),
                _ => self.src.shape(&format!("{}_blocks", v.name)),
            },
        }
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        let mut x = Vec::new();
        out.clear();
        match self.view(name) {
            View::Same(src) => return self.src.read_rows(&src, r0, n, out),
            View::GateUp { fused, e, half } => {
                // rows r0.. of [I, H] = columns 2 r + half of the [H, 2I] slab
                let (h, two_i) = self.slab(&fused, e, &mut x)?;
                if r0 + n > two_i / 2 {
                    return Err(self.bad(&fused, format!("rows {r0}..{} out of range", r0 + n)));
                }
                for r in r0..r0 + n {
                    let col = 2 * r + half as usize;
                    out.extend((0..h).map(|c| x[c * two_i + col]));
                }
            }
            View::Down { fused, e } => {
                // rows r0.. of [H, I] = columns r of the [I, H] slab
                let (i, h) = self.slab(&fused, e, &mut x)?;
                if r0 + n > h {
                    return Err(self.bad(&fused, format!("rows {r0}..{} out of range", r0 + n)));
                }
                for r in r0..r0 + n {
                    out.extend((0..i).map(|c| x[c * h + r]));
                }
            }
            View::BiasHalf { fused, half } => {
                self.src.read_rows(&fused, r0, n, &mut x)?;
                out.extend(x.iter().skip(half as usize).step_by(2));
            }
            View::Mx(v) => {
                // the values transformers dequantizes the codes to
                let mut bytes = Vec::new();
                self.mx_rows(&v, r0, n, &mut bytes)?;
                let rb = bytes.len() / n.max(1);
                let cols = rb / BLOCK_BYTES * 32;
                out.resize(n * cols, 0.0);
                for (b, o) in bytes.chunks_exact(rb.max(1)).zip(out.chunks_exact_mut(cols.max(1))) {
                    mxfp4::dequantize_row(b, o);
                }
            }
        }
        Ok(())
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
        match (self.view(name), f, mins) {
            (View::Mx(v), Format::Mxfp4, None) => {
                scales.clear();
                self.mx_rows(&v, r0, n, vals)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn exact_format(&self, name: &str) -> Option<(Format, ScaleForm)> {
        matches!(self.view(name), View::Mx(_)).then_some((Format::Mxfp4, ScaleForm::Plain))
    }

    fn origin(&self, name: &str) -> String {
        self.src.origin(&self.source_name(name))
    }

    fn source_name(&self, name: &str) -> String {
        match self.view(name) {
            View::Same(n)
            | View::GateUp { fused: n, .. }
            | View::Down { fused: n, .. }
            | View::BiasHalf { fused: n, .. } => n,
            View::Mx(v) => format!("{}_blocks", v.name),
        }
    }
}
