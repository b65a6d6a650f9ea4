//! A hybrid checkpoint (Qwen3-Next, Qwen3.5) seen under the package's names and in its one
//! layout (`convert::plan`), whichever of the two checkpoint layouts it has:
//!
//! - names: `model.language_model.` (Qwen3.5's composite model) or `model.` -> `model.`;
//! - zero-centred norms (input, post-attention, final, q and k) -> the (1 + w) they multiply by,
//!   in f32 as transformers computes it, so the forward pass has one RMSNorm;
//! - `self_attn.q_proj` `[nh * 2 hd, H]`, rows per head `[query(hd) | gate(hd)]` ->
//!   `q_proj` (the queries) and `o_gate_proj` (the output gates), `[nh * hd, H]` each;
//! - Qwen3-Next's `in_proj_qkvz` `[nk * (2 dk + 2 r dv), H]`, grouped per key head
//!   `[q(dk) k(dk) v(r dv) z(r dv)]`, and `in_proj_ba` `[nk * 2 r, H]`, grouped `[b(r) a(r)]` ->
//!   Qwen3.5's flat `in_proj_qkv` (`[q all | k all | v all]`, value heads in natural order:
//!   value head h belongs to key head h / r), `in_proj_z`, `in_proj_b`, `in_proj_a`;
//! - `conv1d.weight` `[channels, 1, K]` -> `[channels, K]`.
//!
//! Everything else (experts, fused or not, the shared expert, the router) passes through.

use super::error::ConvertError;
use super::source::TensorSource;
use crate::model_config::{HybridConfig, ModelConfig};

/// The norms stored as w and applied as (1 + w) (besides the final `model.norm`); the linear
/// mixer's gated norm is not one of them.
const ZERO_CENTRED: [&str; 4] =
    ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight"];

pub struct HybridSource<'a> {
    src: &'a dyn TensorSource,
    /// The checkpoint's prefix of what the package calls `model.`.
    prefix: &'static str,
    heads: usize,
    head_dim: usize,
    hy: HybridConfig,
}

/// How one package tensor is made from the checkpoint's.
enum View {
    Same(String),
    /// The stored w of a (1 + w) norm.
    PlusOne(String),
    /// These rows of a matrix, in this order.
    Rows(String, Vec<usize>),
}

impl<'a> HybridSource<'a> {
    /// `None` when `cfg` is not a hybrid model.
    pub fn new(src: &'a dyn TensorSource, cfg: &ModelConfig) -> Option<HybridSource<'a>> {
        let hy = cfg.hybrid.clone()?;
        let prefix = if src.shape("model.language_model.embed_tokens.weight").is_some() {
            "model.language_model."
        } else {
            "model."
        };
        Some(HybridSource { src, prefix, heads: cfg.num_attention_heads, head_dim: cfg.head_dim, hy })
    }

    fn view(&self, name: &str) -> View {
        let Some(rest) = name.strip_prefix("model.") else {
            return View::Same(name.to_string()); // lm_head.weight
        };
        let src = |r: &str| format!("{}{r}", self.prefix);
        let zero_centred = ZERO_CENTRED.iter().any(|s| rest.ends_with(s)) || rest == "norm.weight";
        if zero_centred {
            return View::PlusOne(src(rest));
        }
        let Some((layer, tensor)) = rest.rsplit_once(".self_attn.").or_else(|| rest.rsplit_once(".linear_attn."))
        else {
            return View::Same(src(rest));
        };
        let (hd, nh) = (self.head_dim, self.heads);
        let hy = &self.hy;
        let (nk, dk, dv) = (hy.key_heads, hy.key_head_dim, hy.value_head_dim);
        let r = hy.value_heads / nk;
        let qkvz = format!("{}{layer}.linear_attn.in_proj_qkvz.weight", self.prefix);
        let ba = format!("{}{layer}.linear_attn.in_proj_ba.weight", self.prefix);
        let grouped = self.src.shape(&qkvz).is_some();
        // row `x` of group `g` in a grouped matrix of `size`-row groups
        let gather = |size: usize, from: usize, len: usize| -> Vec<usize> {
            (0..nk).flat_map(|g| (0..len).map(move |x| g * size + from + x)).collect()
        };
        let q_rows = |gate: bool| -> Vec<usize> {
            (0..nh).flat_map(|h| (0..hd).map(move |d| h * 2 * hd + if gate { hd } else { 0 } + d)).collect()
        };
        let group = 2 * dk + 2 * r * dv;
        match tensor {
            "q_proj.weight" => View::Rows(format!("{}{layer}.self_attn.q_proj.weight", self.prefix), q_rows(false)),
            "o_gate_proj.weight" => View::Rows(format!("{}{layer}.self_attn.q_proj.weight", self.prefix), q_rows(true)),
            "in_proj_qkv.weight" if grouped => {
                let mut rows = gather(group, 0, dk);
                rows.extend(gather(group, dk, dk));
                rows.extend(gather(group, 2 * dk, r * dv));
                View::Rows(qkvz, rows)
            }
            "in_proj_z.weight" if grouped => View::Rows(qkvz, gather(group, 2 * dk + r * dv, r * dv)),
            "in_proj_b.weight" if grouped => View::Rows(ba, gather(2 * r, 0, r)),
            "in_proj_a.weight" if grouped => View::Rows(ba, gather(2 * r, r, r)),
            _ => View::Same(src(rest)),
        }
    }
}

impl TensorSource for HybridSource<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.view(name) {
            View::Same(n) | View::PlusOne(n) => {
                let s = self.src.shape(&n)?;
                // conv1d [channels, 1, K] is read as [channels, K]
                Some(if name.ends_with("conv1d.weight") && s.len() == 3 && s[1] == 1 { vec![s[0], s[2]] } else { s })
            }
            View::Rows(n, rows) => match self.src.shape(&n)?.as_slice() {
                [total, cols] if rows.iter().all(|&r| r < *total) => Some(vec![rows.len(), *cols]),
                // rows that do not fit: report the source's shape, which the converter's shape
                // check then names as wrong
                s => Some(s.to_vec()),
            },
        }
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        match self.view(name) {
            View::Same(src) => self.src.read_rows(&src, r0, n, out),
            View::PlusOne(src) => {
                self.src.read_rows(&src, r0, n, out)?;
                out.iter_mut().for_each(|w| *w += 1.0);
                Ok(())
            }
            View::Rows(src, rows) => {
                let want = rows.get(r0..r0 + n).ok_or_else(|| ConvertError::Tensor {
                    file: self.src.origin(&src).into(),
                    name: name.into(),
                    msg: format!("rows {r0}..{} out of range", r0 + n),
                })?;
                out.clear();
                let mut part = Vec::new();
                // runs of consecutive source rows, one read each
                let mut i = 0;
                while i < want.len() {
                    let mut j = i + 1;
                    while j < want.len() && want[j] == want[j - 1] + 1 {
                        j += 1;
                    }
                    self.src.read_rows(&src, want[i], j - i, &mut part)?;
                    out.extend_from_slice(&part);
                    i = j;
                }
                Ok(())
            }
        }
    }

    fn origin(&self, name: &str) -> String {
        self.src.origin(&self.source_name(name))
    }

    fn source_name(&self, name: &str) -> String {
        match self.view(name) {
            View::Same(n) | View::PlusOne(n) | View::Rows(n, _) => n,
        }
    }
}
