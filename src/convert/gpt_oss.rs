//! A gpt-oss checkpoint seen under the package's names and layout (`convert::plan`):
//!
//! - the router `mlp.router.{weight,bias}` -> `mlp.gate.{weight,bias}`;
//! - the experts stored fused and transposed, `mlp.experts.gate_up_proj [E, H, 2I]` with gate
//!   and up interleaved by column (gate = even columns, up = odd) and `mlp.experts.down_proj
//!   [E, I, H]` -> each expert's `gate_proj [I, H]`, `up_proj [I, H]`, `down_proj [H, I]`;
//! - their biases `gate_up_proj_bias [E, 2I]` (interleaved the same way) and `down_proj_bias
//!   [E, H]` -> `experts.{gate,up}_proj.bias [E, I]` and `experts.down_proj.bias [E, H]`.
//!
//! Everything else (norms, attention with its biases and sinks, embeddings, lm_head) passes
//! through.

use super::error::ConvertError;
use super::source::TensorSource;

pub struct GptOssSource<'a> {
    src: &'a dyn TensorSource,
}

/// Which half of an interleaved gate/up tensor.
#[derive(Debug, Clone, Copy)]
enum Half {
    Gate,
    Up,
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
}

impl<'a> GptOssSource<'a> {
    pub fn new(src: &'a dyn TensorSource) -> GptOssSource<'a> {
        GptOssSource { src }
    }

    fn view(&self, name: &str) -> View {
        let Some((layer, rest)) = name.split_once(".mlp.") else {
            return View::Same(name.to_string());
        };
        let experts = format!("{layer}.mlp.experts.");
        match rest {
            "gate.weight" => View::Same(format!("{layer}.mlp.router.weight")),
            "gate.bias" => View::Same(format!("{layer}.mlp.router.bias")),
            "experts.gate_proj.bias" => {
                View::BiasHalf { fused: format!("{experts}gate_up_proj_bias"), half: Half::Gate }
            }
            "experts.up_proj.bias" => View::BiasHalf { fused: format!("{experts}gate_up_proj_bias"), half: Half::Up },
            "experts.down_proj.bias" => View::Same(format!("{experts}down_proj_bias")),
            _ => {
                let per_expert = rest
                    .strip_prefix("experts.")
                    .and_then(|r| r.split_once('.'))
                    .and_then(|(e, part)| Some((e.parse::<usize>().ok()?, part)));
                match per_expert {
                    Some((e, "gate_proj.weight")) => {
                        View::GateUp { fused: format!("{experts}gate_up_proj"), e, half: Half::Gate }
                    }
                    Some((e, "up_proj.weight")) => {
                        View::GateUp { fused: format!("{experts}gate_up_proj"), e, half: Half::Up }
                    }
                    Some((e, "down_proj.weight")) => View::Down { fused: format!("{experts}down_proj"), e },
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
        }
        Ok(())
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
        }
    }
}
