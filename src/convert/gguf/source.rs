//! A GGUF model as a [`TensorSource`]: HuggingFace tensor names mapped to llama.cpp's, experts
//! sliced from the 3-D slabs (`ffn_{gate,up,down}_exps`, or the fused `ffn_gate_up_exps`:
//! expert `e` is rows `[e * R, (e + 1) * R)` of the slab's `[E * R, C]` matrix), rows
//! dequantized exactly, and each tensor's block type relaid into a moescope format without
//! loss where one holds it (see [`exact_format`]).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use moescope_kernels::Format;
use moescope_kernels::ggml::{BlockType, dequantize};

use super::codes::{encode_blocks, encodes_as, records_of};
use super::exact::{exact_format, halves_finite};
use super::model::GgufModel;
use crate::convert::error::ConvertError;
use crate::convert::source::TensorSource;
use crate::model_config::Arch;
use crate::package::layout::ScaleForm;

/// Where an HF tensor's rows are: a GGUF tensor, and the first of its rows (an expert's slice).
#[derive(Debug, Clone)]
struct Slice {
    gguf: String,
    row0: usize,
    rows: usize,
    cols: usize,
    ty: BlockType,
    /// `(period, offset, len)`: row i is the file's row `(i / len) * period + offset + i % len`
    /// (after `row0`), a run of `len` rows out of every `period` (a hybrid's `attn_q`: the
    /// queries or the gates of each head); None: rows in order.
    runs: Option<(usize, usize, usize)>,
}

impl Slice {
    /// The file's row (after `row0`) of row `i`.
    fn file_row(&self, i: usize) -> usize {
        self.runs.map_or(i, |(period, offset, len)| (i / len) * period + offset + i % len)
    }
}

pub struct GgufSource {
    pub model: GgufModel,
    files: Vec<(PathBuf, File)>,
    num_experts: usize,
    hybrid: Option<HybridRows>,
    /// the family's per-layer tensor names (`layer_name`, `layer_name_gpt_oss`, `layer_name_glm`)
    names: fn(&str) -> Option<&'static str>,
}

/// How a hybrid's (qwen35moe, qwen3next) fused tensors hold the package's.
#[derive(Debug, Clone, Copy)]
struct HybridRows {
    /// `attn_q` holds each head's `head_dim` queries, then its `head_dim` output gates
    head_dim: usize,
    /// qwen3next: beta and alpha in one `ssm_ba` holding, per key head, r beta rows then r alpha
    /// rows (Qwen3-Next's `in_proj_ba` as it is), r = this many value heads per key head;
    /// None: qwen35moe's `ssm_beta` and `ssm_alpha`
    ba_fused: Option<usize>,
}

impl HybridRows {
    /// qwen3next's fused `ssm_ba` and which half of each key head's rows `rest` is, if it is one.
    fn ba_half(&self, rest: &str) -> Option<(usize, bool)> {
        let r = self.ba_fused?;
        match rest {
            "linear_attn.in_proj_b.weight" => Some((r, false)),
            "linear_attn.in_proj_a.weight" => Some((r, true)),
            _ => None,
        }
    }
}

/// A hybrid's layer tensors under the package's names (after `model.layers.N.`), besides
/// `attn_q`'s two halves, qwen3next's `ssm_ba` and the experts. qwen3next and qwen35moe files
/// name them alike; their value heads' order differs (`HybridConfig::value_heads_tiled`).
fn hybrid_layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        // -exp(A_log): HybridConfig::a_stored_negated_exp says so
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        _ => return None,
    })
}

/// The llama.cpp name of a per-layer HF tensor (after `model.layers.{l}.`).
fn layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        // a multi-token-prediction layer's own (llama.cpp's `nextn.*`)
        "eh_proj.weight" => "nextn.eh_proj.weight",
        "enorm.weight" => "nextn.enorm.weight",
        "hnorm.weight" => "nextn.hnorm.weight",
        "shared_head.norm.weight" => "nextn.shared_head_norm.weight",
        "embed_tokens.weight" => "nextn.embed_tokens.weight",
        "shared_head.head.weight" => "nextn.shared_head_head.weight",
        _ => return None,
    })
}

/// GLM-4.5's layer tensors (llama.cpp's `glm4-moe.cpp`) under the package's names (after
/// `model.layers.{l}.`), besides the routed experts' matrices.
fn layer_name_glm(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "mlp.gate.e_score_correction_bias" => "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        _ => return layer_name(rest),
    })
}

/// DeepSeek-V3's layer tensors (llama.cpp's `deepseek2.cpp`) under the package's names (after
/// `model.layers.{l}.`), besides the routed experts' matrices: the latent attention's
/// (`k_b_proj` / `v_b_proj` are the file's `attn_k_b` / `attn_v_b`; an older file's unsplit
/// `attn_kv_b` is split by `convert::mla`), GLM-4.5's router bias and shared experts.
fn layer_name_deepseek(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "self_attn.q_a_proj.weight" => "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight" => "attn_q_b.weight",
        "self_attn.kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "self_attn.kv_b_proj.weight" => "attn_kv_b.weight",
        "self_attn.k_b_proj.weight" => "attn_k_b.weight",
        "self_attn.v_b_proj.weight" => "attn_v_b.weight",
        "mlp.gate.e_score_correction_bias" => "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        _ => return layer_name(rest),
    })
}

/// gpt-oss's layer tensors (llama.cpp's `openai-moe.cpp`) under the package's names (after
/// `model.layers.{l}.`), besides the experts' own matrices.
fn layer_name_gpt_oss(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "self_attn.sinks" => "attn_sinks.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.gate.bias" => "ffn_gate_inp.bias",
        "mlp.experts.gate_proj.bias" => "ffn_gate_exps.bias",
        "mlp.experts.up_proj.bias" => "ffn_up_exps.bias",
        "mlp.experts.down_proj.bias" => "ffn_down_exps.bias",
        _ => return None,
    })
}

impl GgufSource {
    pub fn open(path: &Path) -> Result<GgufSource, ConvertError> {
        let model = GgufModel::open(path)?;
        let mut files = vec![];
        for g in &model.parts {
            let f = File::open(&g.path).map_err(|error| ConvertError::Io { path: g.path.clone(), error })?;
            files.push((g.path.clone(), f));
        }
        let cfg = model.config().ok();
        let num_experts = cfg.as_ref().map_or(0, |c| c.num_experts);
        let names = match cfg.as_ref().map(|c| c.arch) {
            Some(Arch::GptOss) => layer_name_gpt_oss,
            Some(Arch::Glm4Moe) => layer_name_glm,
            Some(Arch::DeepseekV3) => layer_name_deepseek,
            _ => layer_name,
        };
        let hybrid = cfg.and_then(|c| {
            let hy = c.hybrid.as_ref()?;
            let fused = c.arch == Arch::Qwen3Next;
            Some(HybridRows { head_dim: c.head_dim, ba_fused: fused.then(|| hy.value_heads / hy.key_heads.max(1)) })
        });
        Ok(GgufSource { model, files, num_experts, hybrid, names })
    }

    /// Where the HF tensor `name`'s rows are, with its HF shape `[rows, cols]`.
    fn slice(&self, name: &str) -> Option<Slice> {
        let whole = |gguf: &str| {
            let (_, t) = self.model.tensor(gguf)?;
            let ty = BlockType::from_ggml_id(t.ty.id)?;
            let cols = t.ne[0] as usize;
            let rows = t.ne[1..].iter().product::<u64>() as usize;
            Some(Slice { gguf: gguf.into(), row0: 0, rows, cols, ty, runs: None })
        };
        match name {
            "model.embed_tokens.weight" => return whole("token_embd.weight"),
            "model.norm.weight" => return whole("output_norm.weight"),
            "lm_head.weight" => return whole("output.weight"),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (l, rest) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        if let Some(hy) = self.hybrid {
            let hd = hy.head_dim;
            if let Some((r, alpha)) = hy.ba_half(rest) {
                let s = whole(&format!("blk.{l}.ssm_ba.weight"))?;
                return (r > 0 && s.rows.is_multiple_of(2 * r)).then(|| Slice {
                    rows: s.rows / 2,
                    runs: Some((2 * r, if alpha { r } else { 0 }, r)),
                    ..s
                });
            }
            if let Some(g) = hybrid_layer_name(rest) {
                return whole(&format!("blk.{l}.{g}"));
            }
            // attn_q: per head, hd rows of queries then hd rows of output gates
            let gate = rest == "self_attn.o_gate_proj.weight";
            if gate || rest == "self_attn.q_proj.weight" {
                let s = whole(&format!("blk.{l}.attn_q.weight"))?;
                return (hd > 0 && s.rows.is_multiple_of(2 * hd)).then(|| Slice {
                    rows: s.rows / 2,
                    runs: Some((2 * hd, if gate { hd } else { 0 }, hd)),
                    ..s
                });
            }
        } else if let Some(g) = (self.names)(rest) {
            return whole(&format!("blk.{l}.{g}"));
        }
        // mlp.experts.{e}.{gate,up,down}_proj.weight
        let (e, proj) = rest.strip_prefix("mlp.experts.")?.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let (ne, ex) = (self.num_experts, e);
        if ex >= ne {
            return None;
        }
        let part = |gguf: String, sub: usize, of: usize| {
            let s = whole(&gguf)?;
            let per = s.rows / ne;
            let rows = per / of;
            (s.rows.is_multiple_of(ne) && per.is_multiple_of(of)).then(|| Slice {
                row0: ex * per + sub * rows,
                rows,
                ..s
            })
        };
        let fused = format!("blk.{l}.ffn_gate_up_exps.weight");
        match proj {
            "gate_proj.weight" | "up_proj.weight" if self.model.tensor(&fused).is_some() => {
                part(fused, usize::from(proj == "up_proj.weight"), 2)
            }
            "gate_proj.weight" => part(format!("blk.{l}.ffn_gate_exps.weight"), 0, 1),
            "up_proj.weight" => part(format!("blk.{l}.ffn_up_exps.weight"), 0, 1),
            "down_proj.weight" => part(format!("blk.{l}.ffn_down_exps.weight"), 0, 1),
            _ => None,
        }
    }

    fn located(&self, name: &str) -> Result<Slice, ConvertError> {
        match self.slice(name) {
            Some(s) => Ok(s),
            // a tensor of a type moescope does not read names the type
            None => Err(match self.gguf_name(name) {
                Some(g) if self.model.tensor(&g).is_some() => match self.model.block_type(&g) {
                    Err(e) => e,
                    Ok(_) => self.model.tensor_err(&g, "its shape does not fit the model"),
                },
                _ => ConvertError::MissingTensor { dir: self.model.path().to_path_buf(), name: self.source_name(name) },
            }),
        }
    }

    fn gguf_name(&self, name: &str) -> Option<String> {
        let s = self.source_name(name);
        (s != name).then_some(s)
    }

    /// The raw blocks of rows `[r0, r0 + n)` of `s`.
    fn raw(&self, name: &str, s: &Slice, r0: usize, n: usize) -> Result<Vec<u8>, ConvertError> {
        if r0 + n > s.rows {
            return Err(self.model.tensor_err(&s.gguf, format!("rows {r0}..{} of {name} out of range", r0 + n)));
        }
        let (path, t) = self.model.tensor(&s.gguf).ok_or_else(|| self.model.tensor_err(&s.gguf, "missing"))?;
        let rb = s.ty.bytes_of(s.cols);
        let mut raw = vec![0u8; n * rb];
        let (_, f) = self
            .files
            .iter()
            .find(|(p, _)| p == path)
            .ok_or_else(|| self.model.tensor_err(&s.gguf, "file not open"))?;
        // rows in order: one read; rows in runs: a read per run of consecutive file rows
        let mut i = 0;
        while i < n {
            let first = s.file_row(r0 + i);
            let mut k = 1;
            while i + k < n && s.file_row(r0 + i + k) == first + k {
                k += 1;
            }
            f.read_exact_at(&mut raw[i * rb..(i + k) * rb], t.offset + ((s.row0 + first) * rb) as u64)
                .map_err(|error| ConvertError::Io { path: path.to_path_buf(), error })?;
            i += k;
        }
        Ok(raw)
    }

    /// The exact format of HF tensor `name`, and how its scales are stored (see [`exact_format`]).
    pub fn native_format(&self, name: &str) -> Result<(Format, ScaleForm), ConvertError> {
        Ok(exact_format(self.located(name)?.ty))
    }
}

impl TensorSource for GgufSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let s = self.slice(name)?;
        let (_, t) = self.model.tensor(&s.gguf)?;
        Some(if t.ne.len() == 1 { vec![s.cols] } else { vec![s.rows, s.cols] })
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        let s = self.located(name)?;
        let raw = self.raw(name, &s, r0, n)?;
        out.clear();
        out.resize(n * s.cols, 0.0);
        dequantize(s.ty, &raw, out);
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(ConvertError::NonFinite {
                file: self.model.tensor(&s.gguf).map_or_else(PathBuf::new, |(p, _)| p.to_path_buf()),
                name: s.gguf.clone(),
                row: s.row0 + r0 + i / s.cols,
                col: i % s.cols,
                value: out[i],
            });
        }
        Ok(())
    }

    /// Rows in format `f` straight from the file's codes, when `f` holds them exactly (q8 of a
    /// group dividing the type's sub-block, q4 group 32 of codes that fit 4 bits, bf16 of
    /// BF16), with mins where asked for: bit for bit the file's values, with no rounding of a
    /// requantization.
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
        let s = self.located(name)?;
        let (cols, t) = (s.cols, s.ty);
        if !encodes_as(t, f, mins.is_some()) {
            return Ok(false);
        }
        let raw = self.raw(name, &s, r0, n)?;
        Ok(encode_blocks(t, &raw, f, cols, vals, scales, mins))
    }

    fn file_bytes(&self, name: &str, r0: usize, n: usize, out: &mut Vec<u8>) -> Result<bool, ConvertError> {
        let s = self.located(name)?;
        let form = exact_format(s.ty).1;
        if let ScaleForm::Blocks(t) = form {
            *out = self.raw(name, &s, r0, n)?;
            return match out.chunks_exact(t.block_bytes()).position(|b| !halves_finite(t, b)) {
                None => Ok(true),
                Some(i) => Err(ConvertError::Tensor {
                    file: PathBuf::from(self.origin(name)),
                    name: s.gguf.clone(),
                    msg: format!(
                        "a non-finite scale in block {} of row {}",
                        i % (s.cols / t.block()),
                        s.row0 + r0 + i / (s.cols / t.block())
                    ),
                }),
            };
        }
        if !form.records() {
            return Ok(false);
        }
        let raw = self.raw(name, &s, r0, n)?;
        records_of(s.ty, &raw, s.cols, out);
        Ok(true)
    }

    fn exact_format(&self, name: &str) -> Option<(Format, ScaleForm)> {
        self.native_format(name).ok()
    }

    fn origin(&self, name: &str) -> String {
        match self.slice(name).and_then(|s| self.model.tensor(&s.gguf).map(|(p, _)| p.display().to_string())) {
            Some(p) => p,
            None => self.model.path().display().to_string(),
        }
    }

    fn source_name(&self, name: &str) -> String {
        if let Some(s) = self.slice(name) {
            return s.gguf;
        }
        match name {
            "model.embed_tokens.weight" => "token_embd.weight".into(),
            "model.norm.weight" => "output_norm.weight".into(),
            "lm_head.weight" => "output.weight".into(),
            _ => {
                let Some((l, rest)) = name.strip_prefix("model.layers.").and_then(|r| r.split_once('.')) else {
                    return name.into();
                };
                let g = match self.hybrid {
                    Some(hy) if hy.ba_half(rest).is_some() => Some("ssm_ba.weight"),
                    Some(_) => hybrid_layer_name(rest),
                    None => (self.names)(rest),
                };
                match (g, rest.strip_prefix("mlp.experts.").and_then(|r| r.split_once('.'))) {
                    (Some(g), _) => format!("blk.{l}.{g}"),
                    (None, Some((_, p))) => format!("blk.{l}.ffn_{}_exps.weight", p.trim_end_matches("_proj.weight")),
                    _ => name.into(),
                }
            }
        }
    }
}
