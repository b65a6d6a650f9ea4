//! The quantization plan: which tensors a Qwen3-MoE package holds, in which format.
//!
//! | tensor                          | bf16 | q8   | q4 / q4g32                    |
//! |---------------------------------|------|------|-------------------------------|
//! | norms, router (`mlp.gate`)      | f32  | f32  | f32                           |
//! | hybrids: conv1d, A_log, dt_bias,| f32  | f32  | f32                           |
//! |   shared_expert_gate            |      |      |                               |
//! | embedding                       | bf16 | q8   | q8                            |
//! | lm_head (untied)                | bf16 | q8   | q6 (q8 where 128 does not fit)|
//! | attention q/k/v/o, dense MLP    | bf16 | q8   | q4 (q8 where no group fits)   |
//! | hybrids: linear mixer in/out,   | bf16 | q8   | q4 (q8 where no group fits)   |
//! |   gated q, shared expert        |      |      |                               |
//! | routed experts (expert region)  | bf16 | q8   | q4 (q8 where no group fits)   |
//!
//! `mxfp4` is `q8` with the routed experts in MXFP4 (rows a multiple of 32; else q8): the
//! layout gpt-oss is released in, for the experts of any checkpoint.
//!
//! q8 uses group 128, else the largest of 64/32/16 dividing the row, else the whole row.
//! q4 uses group 128 (`q4g32`: 32), else the largest smaller power of two down to 16 dividing
//! the row; a row none divides stays q8.
//! q6 uses group 128 (whole 128-value chunks), else the output layer stays q8.
//! Why: norms and the router are tiny and decide everything downstream (a flipped expert choice
//! costs more than any weight error), so they stay exact. The embedding is only looked up (one
//! row per token, so its size costs memory, not time) and keeps 8 bits. The lm_head's errors land
//! directly on the logits, but it is also the largest matrix a decode token reads (Qwen3-30B-A3B:
//! 311 M weights, 45% of a q4 token's bytes at q8), so q4 packages store it at 6 bits, as
//! llama.cpp stores its output layer in Q6_K in Q4 files. A tied output layer is the embedding
//! and keeps its q8.
//!
//! Hybrid packages (Qwen3-Next, Qwen3.5) name tensors as Qwen3-Next does under `model.`, in one
//! layout whatever the checkpoint's (see `convert::hybrid`): the linear mixer's projections flat
//! (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`), the attention's query rows and its
//! output gate rows as two matrices (`q_proj`, `o_gate_proj`), `conv1d` as `[channels, K]`, and
//! the zero-centred norms stored as the (1 + w) they multiply by.
//!
//! gpt-oss packages (see `convert::gpt_oss`) add f32 vectors kept exact: the attention biases
//! (`self_attn.{q,k,v,o}_proj.bias`), the sinks (`self_attn.sinks`), the router's bias
//! (`mlp.gate.bias`) and every expert's biases, a layer's in one `[E, width]` tensor each
//! (`mlp.experts.{gate,up,down}_proj.bias`: in RAM with the dense weights, 0.3% of an
//! expert's bytes, so the blobs keep their three parts); no q/k norms.
//!
//! DeepSeek-V3 packages keep the checkpoint's latent-attention tensors (`self_attn.q_a_proj`,
//! `q_a_layernorm`, `q_b_proj` or `q_proj`, `kv_a_proj_with_mqa`, `kv_a_layernorm`, `o_proj`;
//! norms f32, the rest linear layers) with `kv_b_proj` as the absorbed form reads it
//! (`k_b_proj` `[nh * kv_lora, nope]`, each head's key rows transposed, and `v_b_proj`
//! `[nh * v, kv_lora]`; see `convert::mla`), and GLM-4.5's router and shared experts.
//!
//! GLM-4.5 packages keep the checkpoint's names: q/k/v biases (`self_attn.{q,k,v}_proj.bias`)
//! exact, q/k norms where `use_qk_norm`, the router's `mlp.gate.e_score_correction_bias` f32,
//! the shared expert (`mlp.shared_experts.*`) as a linear layer.

use moescope_kernels::Format;
use moescope_kernels::quant::pick_group;

use moescope_kernels::ggml::BlockType;

use crate::model_config::{Arch, LayerKind, ModelConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    Bf16,
    Q8,
    /// q4 with this largest group (128, or 32 for `q4g32`).
    Q4 {
        max_group: usize,
    },
    /// The routed experts in MXFP4, everything else as `Q8`.
    Mxfp4,
    /// Each tensor in the format that holds its source's values exactly (a GGUF file's types;
    /// see `convert::gguf::exact::exact_format`), none requantized.
    File,
    /// Linear layers and experts quantized into GGUF blocks of this type (Q4_K, Q2_K or IQ4_XS,
    /// `convert::requant_blocks`) where rows are whole super-blocks; the rest as `Q4`'s.
    Ggml(BlockType),
}

impl QuantMode {
    pub fn parse(s: &str) -> Result<QuantMode, String> {
        match s {
            "bf16" => Ok(QuantMode::Bf16),
            "q8" => Ok(QuantMode::Q8),
            "q4" => Ok(QuantMode::Q4 { max_group: 128 }),
            "q4g32" => Ok(QuantMode::Q4 { max_group: 32 }),
            "mxfp4" => Ok(QuantMode::Mxfp4),
            "q4_k" => Ok(QuantMode::Ggml(BlockType::Q4K)),
            "q2_k" => Ok(QuantMode::Ggml(BlockType::Q2K)),
            "iq4_xs" => Ok(QuantMode::Ggml(BlockType::Iq4Xs)),
            other => Err(format!(
                "unknown quantization '{other}' (expected bf16, q8, q4, q4g32, mxfp4, q4_k, q2_k or iq4_xs)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Bf16 => "bf16",
            QuantMode::Q8 => "q8",
            QuantMode::Q4 { max_group: 32 } => "q4g32",
            QuantMode::Q4 { .. } => "q4",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::File => "file",
            QuantMode::Ggml(BlockType::Q2K) => "q2_k",
            QuantMode::Ggml(BlockType::Iq4Xs) => "iq4_xs",
            QuantMode::Ggml(_) => "q4_k",
        }
    }

    pub fn description(self) -> String {
        match self {
            QuantMode::Bf16 => "norms and router f32; all other weights bf16".into(),
            QuantMode::Q8 => "norms and router f32; all other weights q8 (int8, group 128 or the largest of 64/32/16 dividing the row, else one group per row)".into(),
            QuantMode::Mxfp4 => "norms and router f32; routed experts mxfp4 (e2m1 values, a power-of-two scale per 32; q8 where rows are not whole blocks); all other weights q8 (group 128 or the largest of 64/32/16 dividing the row)".into(),
            QuantMode::File => "each tensor as the file holds it: F32 and BF16 as they are; Q8_0 as q8 and Q4_0 as q4 at group 32 with their f16 scales, Q4_1 as q4 group 32 with its f16 scales and mins, Q6_K as q6 group 16 with its blocks' scales (k6 records), the other types (Q4_K, Q5_K, Q2_K, Q3_K, Q5_0, IQ4_NL, IQ4_XS, IQ1-IQ3) as the file's blocks; F16 as f32".into(),
            QuantMode::Ggml(t) => format!(
                "norms and router f32; embedding q8; lm_head q6 (int6, group 128; else q8); attention, dense MLP and experts as GGUF {} blocks where rows are whole 256-value super-blocks (the file's bytes a weight), else q4 (group 32 or the largest smaller one down to 16 dividing the row, else q8)",
                t.name()
            ),
            QuantMode::Q4 { max_group } => format!(
                "norms and router f32; embedding q8; lm_head q6 (int6, group 128; else q8); attention, dense MLP and experts q4 (int4, group {max_group} or the largest smaller one down to 16 dividing the row, else q8)"
            ),
        }
    }

    /// Format of a weight of kind `k` with rows of `cols` values.
    pub fn format(self, k: Kind, cols: usize) -> Format {
        let q8 = || Format::Q8 { group: pick_group(cols, 128).unwrap_or(cols) };
        match (k, self) {
            (Kind::Norm | Kind::Router | Kind::Exact, _) | (_, QuantMode::File) => Format::F32,
            (_, QuantMode::Bf16) => Format::Bf16,
            (Kind::Expert, QuantMode::Mxfp4) if Format::Mxfp4.fits(cols) => Format::Mxfp4,
            (_, QuantMode::Q8 | QuantMode::Mxfp4) | (Kind::Embedding, QuantMode::Q4 { .. }) => q8(),
            (Kind::LmHead, QuantMode::Q4 { .. }) => {
                let q6 = Format::Q6 { group: 128 };
                if q6.fits(cols) { q6 } else { q8() }
            }
            // the blocks' rows are `convert::requant_blocks`'s; this is the format the others take
            (Kind::Embedding, QuantMode::Ggml(_)) => q8(),
            (Kind::LmHead, QuantMode::Ggml(_)) => QuantMode::Q4 { max_group: 32 }.format(k, cols),
            (Kind::Linear | Kind::Expert, QuantMode::Ggml(_)) => QuantMode::Q4 { max_group: 32 }.format(k, cols),
            (Kind::Linear | Kind::Expert, QuantMode::Q4 { max_group }) => match pick_group(cols, max_group) {
                Some(group) => Format::Q4 { group },
                None => q8(),
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Norm,
    Router,
    Embedding,
    LmHead,
    Linear,
    /// A routed expert's matrix (as `Linear`, but MXFP4 in the `mxfp4` mode).
    Expert,
    /// Small tensors that stay exact: the linear mixer's conv, decay and gated norm.
    Exact,
}

/// One dense tensor of the package: name (as in the HF checkpoint), kind and shape.
#[derive(Debug, Clone)]
pub struct DenseTensor {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<usize>,
}

/// Every dense tensor of a Qwen3-MoE model, in file order (layer by layer, so that a layer's
/// weights sit together).
pub fn dense_tensors(c: &ModelConfig) -> Vec<DenseTensor> {
    let h = c.hidden_size;
    let t = |name: String, kind, shape: &[usize]| DenseTensor { name, kind, shape: shape.to_vec() };
    let mut v = vec![t("model.embed_tokens.weight".into(), Kind::Embedding, &[c.vocab_size, h])];
    for l in 0..c.num_hidden_layers {
        layer_tensors(c, l, &mut v);
    }
    v.push(t("model.norm.weight".into(), Kind::Norm, &[h]));
    if !c.tie_word_embeddings {
        v.push(t("lm_head.weight".into(), Kind::LmHead, &[c.vocab_size, h]));
    }
    v
}

/// The multi-token-prediction layers' tensors (`num_nextn_predict_layers` of them, as
/// DeepSeek-V3's and GLM-4.5's checkpoints hold them after the stack, `model.layers.{L}.` for L
/// from `num_hidden_layers`): a decoder layer's, its routed experts as plain tensors, then
/// `enorm` and `hnorm` (the normed embedding and hidden state), `eh_proj` `[h, 2h]` (their
/// concatenation back to h) and `shared_head.norm`. The layer's `embed_tokens` and
/// `shared_head.head` are the model's embedding and output layer again and are not listed.
pub fn mtp_tensors(c: &ModelConfig) -> Vec<DenseTensor> {
    let h = c.hidden_size;
    let mut v = vec![];
    for l in c.num_hidden_layers..c.num_hidden_layers + c.features.nextn_layers {
        layer_tensors(c, l, &mut v);
        if c.is_moe_layer(l) {
            for e in 0..c.num_experts {
                v.extend(expert_tensors(c, l, e).map(|(name, s)| DenseTensor {
                    name,
                    kind: Kind::Expert,
                    shape: s.into(),
                }));
            }
        }
        let p = format!("model.layers.{l}.");
        for (name, kind, shape) in [
            ("enorm.weight", Kind::Norm, vec![h]),
            ("hnorm.weight", Kind::Norm, vec![h]),
            ("eh_proj.weight", Kind::Linear, vec![h, 2 * h]),
            ("shared_head.norm.weight", Kind::Norm, vec![h]),
        ] {
            v.push(DenseTensor { name: format!("{p}{name}"), kind, shape });
        }
    }
    v
}

/// Decoder layer `l`'s dense tensors (its routed experts are the expert region's).
fn layer_tensors(c: &ModelConfig, l: usize, v: &mut Vec<DenseTensor>) {
    let (h, hd) = (c.hidden_size, c.head_dim);
    let t = |name: String, kind, shape: &[usize]| DenseTensor { name, kind, shape: shape.to_vec() };
    let p = format!("model.layers.{l}.");
    v.push(t(format!("{p}input_layernorm.weight"), Kind::Norm, &[h]));
    match (c.layer_kind(l), &c.hybrid) {
        (LayerKind::LinearAttention, Some(hy)) => {
            let (conv, vd, nv) = (hy.conv_dim(), hy.value_dim(), hy.value_heads);
            let a = format!("{p}linear_attn.");
            v.push(t(format!("{a}in_proj_qkv.weight"), Kind::Linear, &[conv, h]));
            v.push(t(format!("{a}in_proj_z.weight"), Kind::Linear, &[vd, h]));
            v.push(t(format!("{a}in_proj_b.weight"), Kind::Linear, &[nv, h]));
            v.push(t(format!("{a}in_proj_a.weight"), Kind::Linear, &[nv, h]));
            v.push(t(format!("{a}conv1d.weight"), Kind::Exact, &[conv, hy.conv_kernel]));
            v.push(t(format!("{a}A_log"), Kind::Exact, &[nv]));
            v.push(t(format!("{a}dt_bias"), Kind::Exact, &[nv]));
            v.push(t(format!("{a}norm.weight"), Kind::Exact, &[hy.value_head_dim]));
            v.push(t(format!("{a}out_proj.weight"), Kind::Linear, &[h, vd]));
        }
        _ if c.features.mla.is_some() => mla_tensors(c, &p, v),
        _ => {
            v.push(t(format!("{p}self_attn.q_proj.weight"), Kind::Linear, &[c.q_dim(), h]));
            if c.hybrid.is_some() {
                v.push(t(format!("{p}self_attn.o_gate_proj.weight"), Kind::Linear, &[c.q_dim(), h]));
            }
            v.push(t(format!("{p}self_attn.k_proj.weight"), Kind::Linear, &[c.kv_dim(), h]));
            v.push(t(format!("{p}self_attn.v_proj.weight"), Kind::Linear, &[c.kv_dim(), h]));
            v.push(t(format!("{p}self_attn.o_proj.weight"), Kind::Linear, &[h, c.q_dim()]));
            if c.qk_norm() {
                v.push(t(format!("{p}self_attn.q_norm.weight"), Kind::Norm, &[hd]));
                v.push(t(format!("{p}self_attn.k_norm.weight"), Kind::Norm, &[hd]));
            }
            if c.features.attention_bias || c.features.qkv_bias {
                let o = [("o_proj", h)];
                let qkv = [("q_proj", c.q_dim()), ("k_proj", c.kv_dim()), ("v_proj", c.kv_dim())];
                let with_o = if c.features.attention_bias { &o[..] } else { &[] };
                for (name, len) in qkv.iter().chain(with_o) {
                    v.push(t(format!("{p}self_attn.{name}.bias"), Kind::Exact, &[*len]));
                }
            }
            if c.features.attention_sinks {
                v.push(t(format!("{p}self_attn.sinks"), Kind::Exact, &[c.num_attention_heads]));
            }
        }
    }
    v.push(t(format!("{p}post_attention_layernorm.weight"), Kind::Norm, &[h]));
    if c.is_moe_layer(l) {
        v.push(t(format!("{p}mlp.gate.weight"), Kind::Router, &[c.num_experts, h]));
        if c.arch == Arch::GptOss {
            v.push(t(format!("{p}mlp.gate.bias"), Kind::Router, &[c.num_experts]));
        }
        if c.features.sigmoid_router.is_some() {
            v.push(t(format!("{p}mlp.gate.e_score_correction_bias"), Kind::Router, &[c.num_experts]));
        }
        if c.features.shared_experts > 0 {
            let i = c.features.shared_experts;
            v.push(t(format!("{p}mlp.shared_experts.gate_proj.weight"), Kind::Linear, &[i, h]));
            v.push(t(format!("{p}mlp.shared_experts.up_proj.weight"), Kind::Linear, &[i, h]));
            v.push(t(format!("{p}mlp.shared_experts.down_proj.weight"), Kind::Linear, &[h, i]));
        }
        if c.features.expert_bias {
            let (e, i) = (c.num_experts, c.moe_intermediate_size);
            v.push(t(format!("{p}mlp.experts.gate_proj.bias"), Kind::Exact, &[e, i]));
            v.push(t(format!("{p}mlp.experts.up_proj.bias"), Kind::Exact, &[e, i]));
            v.push(t(format!("{p}mlp.experts.down_proj.bias"), Kind::Exact, &[e, h]));
        }
        if let Some(hy) = &c.hybrid {
            let i = hy.shared_expert_intermediate_size;
            v.push(t(format!("{p}mlp.shared_expert.gate_proj.weight"), Kind::Linear, &[i, h]));
            v.push(t(format!("{p}mlp.shared_expert.up_proj.weight"), Kind::Linear, &[i, h]));
            v.push(t(format!("{p}mlp.shared_expert.down_proj.weight"), Kind::Linear, &[h, i]));
            v.push(t(format!("{p}mlp.shared_expert_gate.weight"), Kind::Router, &[1, h]));
        }
    } else {
        let i = c.intermediate_size;
        v.push(t(format!("{p}mlp.gate_proj.weight"), Kind::Linear, &[i, h]));
        v.push(t(format!("{p}mlp.up_proj.weight"), Kind::Linear, &[i, h]));
        v.push(t(format!("{p}mlp.down_proj.weight"), Kind::Linear, &[h, i]));
    }
}

/// A latent-attention layer's tensors (DeepSeek-V3's names, under `{p}self_attn.`).
fn mla_tensors(c: &ModelConfig, p: &str, v: &mut Vec<DenseTensor>) {
    let Some(m) = c.features.mla else { return };
    let (h, nh) = (c.hidden_size, c.num_attention_heads);
    let t = |name: &str, kind, shape: &[usize]| DenseTensor {
        name: format!("{p}self_attn.{name}"),
        kind,
        shape: shape.to_vec(),
    };
    match m.q_lora_rank {
        Some(r) => {
            v.push(t("q_a_proj.weight", Kind::Linear, &[r, h]));
            v.push(t("q_a_layernorm.weight", Kind::Norm, &[r]));
            v.push(t("q_b_proj.weight", Kind::Linear, &[c.q_dim(), r]));
        }
        None => v.push(t("q_proj.weight", Kind::Linear, &[c.q_dim(), h])),
    }
    let (kvl, nope, vd) = (m.kv_lora_rank, m.qk_nope_head_dim, m.v_head_dim);
    v.push(t("kv_a_proj_with_mqa.weight", Kind::Linear, &[kvl + m.qk_rope_head_dim, h]));
    v.push(t("kv_a_layernorm.weight", Kind::Norm, &[kvl]));
    v.push(t("k_b_proj.weight", Kind::Linear, &[nh * kvl, nope]));
    v.push(t("v_b_proj.weight", Kind::Linear, &[nh * vd, kvl]));
    v.push(t("o_proj.weight", Kind::Linear, &[h, nh * vd]));
}

/// HF names of the three matrices of expert `e` of layer `l`, with their shapes.
pub fn expert_tensors(c: &ModelConfig, l: usize, e: usize) -> [(String, [usize; 2]); 3] {
    let (h, i) = (c.hidden_size, c.moe_intermediate_size);
    let p = format!("model.layers.{l}.mlp.experts.{e}.");
    [
        (format!("{p}gate_proj.weight"), [i, h]),
        (format!("{p}up_proj.weight"), [i, h]),
        (format!("{p}down_proj.weight"), [h, i]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_the_table() {
        let q4 = QuantMode::Q4 { max_group: 128 };
        assert_eq!(q4.format(Kind::Linear, 2048), Format::Q4 { group: 128 });
        assert_eq!(q4.format(Kind::Linear, 80), Format::Q4 { group: 16 });
        assert_eq!(q4.format(Kind::Linear, 72), Format::Q8 { group: 72 });
        assert_eq!(q4.format(Kind::LmHead, 2048), Format::Q6 { group: 128 });
        assert_eq!(q4.format(Kind::LmHead, 96), Format::Q8 { group: 32 });
        assert_eq!(q4.format(Kind::Embedding, 2048), Format::Q8 { group: 128 });
        assert_eq!(q4.format(Kind::Router, 2048), Format::F32);
        let q4g32 = QuantMode::Q4 { max_group: 32 };
        assert_eq!(q4g32.format(Kind::Linear, 2048), Format::Q4 { group: 32 });
        assert_eq!(q4g32.format(Kind::Linear, 48), Format::Q4 { group: 16 });
        assert_eq!(QuantMode::Q8.format(Kind::Linear, 96), Format::Q8 { group: 32 });
        assert_eq!(QuantMode::Bf16.format(Kind::Embedding, 96), Format::Bf16);
        assert_eq!(QuantMode::Bf16.format(Kind::Norm, 96), Format::F32);
        let mx = QuantMode::Mxfp4;
        assert_eq!(mx.format(Kind::Expert, 2880), Format::Mxfp4);
        assert_eq!(mx.format(Kind::Expert, 80), Format::Q8 { group: 16 });
        assert_eq!(mx.format(Kind::Linear, 2880), Format::Q8 { group: 64 });
        assert_eq!(mx.format(Kind::Router, 2880), Format::F32);
        assert_eq!(q4.format(Kind::Expert, 2048), Format::Q4 { group: 128 });
    }
}
