//! The real models `moescope synth` can imitate: their configurations as their config.json files
//! give them (Qwen3-MoE from the HF configs; the hybrids from `Qwen3NextConfig` /
//! `Qwen3_5MoeTextConfig` defaults and llama.cpp's qwen35moe type switch; gpt-oss and GLM-4.5
//! from their released config.json files).

use crate::convert::QuantMode;
use crate::model_config::{
    Arch, ExpertAct, Features, HybridConfig, LayerKind, Mla, ModelConfig, SigmoidRouter, Sliding, Yarn, yarn_mscale,
};

/// Which real tokenizer a shape ships with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokFamily {
    /// Qwen3 (151,669 tokens; Qwen3-MoE and Qwen3-Next).
    Qwen3,
    /// Qwen3.5 / 3.6 (248,077 tokens).
    Qwen35,
    /// gpt-oss's o200k_harmony (201,088 ids: o200k_base's 199,998 BPE tokens, then specials).
    Harmony,
    /// None in assets/tokenizers (GLM-4.5's): the package takes `--prompt-ids` only.
    Absent,
}

/// A named model shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub name: &'static str,
    /// The model it imitates.
    pub model: &'static str,
    pub tokenizer: TokFamily,
    make: fn() -> ModelConfig,
}

impl Shape {
    pub fn config(&self) -> ModelConfig {
        (self.make)()
    }

    /// The quantization the model is released in, as near as a package holds it: gpt-oss's
    /// MXFP4 experts; q4g32 (llama.cpp's Q4_0 values) for the others.
    pub fn default_quant(&self) -> QuantMode {
        match self.tokenizer {
            TokFamily::Harmony => QuantMode::Mxfp4,
            TokFamily::Qwen3 | TokFamily::Qwen35 | TokFamily::Absent => QuantMode::Q4 { max_group: 32 },
        }
    }
}

pub const SHAPES: [Shape; 12] = [
    Shape { name: "qwen3-30b-a3b", model: "Qwen3-30B-A3B", tokenizer: TokFamily::Qwen3, make: qwen3_30b },
    Shape { name: "qwen3-235b-a22b", model: "Qwen3-235B-A22B", tokenizer: TokFamily::Qwen3, make: qwen3_235b },
    Shape { name: "qwen3-next-80b-a3b", model: "Qwen3-Next-80B-A3B", tokenizer: TokFamily::Qwen3, make: next_80b },
    Shape { name: "qwen3.5-35b-a3b", model: "Qwen3.5-35B-A3B", tokenizer: TokFamily::Qwen35, make: q35_35b },
    Shape { name: "qwen3.5-122b-a10b", model: "Qwen3.5-122B-A10B", tokenizer: TokFamily::Qwen35, make: q35_122b },
    Shape { name: "qwen3.5-397b-a17b", model: "Qwen3.5-397B-A17B", tokenizer: TokFamily::Qwen35, make: q35_397b },
    Shape { name: "gpt-oss-20b", model: "gpt-oss-20b", tokenizer: TokFamily::Harmony, make: gpt_oss_20b },
    Shape { name: "gpt-oss-120b", model: "gpt-oss-120b", tokenizer: TokFamily::Harmony, make: gpt_oss_120b },
    Shape { name: "glm-4.5", model: "GLM-4.5", tokenizer: TokFamily::Absent, make: glm_45 },
    Shape { name: "glm-4.5-air", model: "GLM-4.5-Air", tokenizer: TokFamily::Absent, make: glm_45_air },
    Shape { name: "deepseek-v3", model: "DeepSeek-V3", tokenizer: TokFamily::Absent, make: deepseek_v3 },
    Shape { name: "kimi-k2", model: "Kimi-K2", tokenizer: TokFamily::Absent, make: kimi_k2 },
];

pub fn find(name: &str) -> Result<Shape, String> {
    SHAPES.iter().find(|s| s.name == name).copied().ok_or_else(|| {
        let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        format!("unknown shape '{name}' (known: {})", names.join(", "))
    })
}

/// Qwen3-MoE: every layer MoE, the top-k weights renormalised.
fn qwen3(hidden: usize, layers: usize, heads: usize, expert_width: usize, dense_width: usize) -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3Moe,
        vocab_size: 151_936,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: 4,
        head_dim: 128,
        intermediate_size: dense_width,
        moe_intermediate_size: expert_width,
        num_experts: 128,
        num_experts_per_tok: 8,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: vec![],
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        max_position_embeddings: 40_960,
        tie_word_embeddings: false,
        bos_token_id: Some(151_643),
        eos_token_ids: vec![151_645, 151_643],
        hybrid: None,
        features: Default::default(),
    }
}

fn qwen3_30b() -> ModelConfig {
    qwen3(2048, 48, 32, 768, 6144)
}

fn qwen3_235b() -> ModelConfig {
    qwen3(4096, 94, 64, 1536, 12_288)
}

/// The hybrid layer pattern: full attention every `interval`-th layer, Gated DeltaNet between.
pub fn layer_types(layers: usize, interval: usize) -> Vec<LayerKind> {
    (0..layers)
        .map(|i| if (i + 1) % interval == 0 { LayerKind::FullAttention } else { LayerKind::LinearAttention })
        .collect()
}

/// Qwen3-Next / Qwen3.5: attention heads of 256 with 64 rotary dims, GDN heads of 128, a shared
/// expert as wide as a routed one.
#[allow(clippy::too_many_arguments)]
fn hybrid(
    arch: Arch,
    hidden: usize,
    layers: usize,
    heads: usize,
    value_heads: usize,
    experts: usize,
    top_k: usize,
    expert_width: usize,
) -> ModelConfig {
    let (vocab, eos) = match arch {
        Arch::Qwen35Moe => (248_320, vec![248_046, 248_044]),
        _ => (151_936, vec![151_645, 151_643]),
    };
    ModelConfig {
        arch,
        vocab_size: vocab,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: 2,
        head_dim: 256,
        intermediate_size: 0,
        moe_intermediate_size: expert_width,
        num_experts: experts,
        num_experts_per_tok: top_k,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: vec![],
        rms_norm_eps: 1e-6,
        rope_theta: 1e7,
        max_position_embeddings: 262_144,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: eos,
        hybrid: Some(HybridConfig {
            layer_types: layer_types(layers, 4),
            rotary_dim: 64,
            conv_kernel: 4,
            key_heads: 16,
            key_head_dim: 128,
            value_heads,
            value_head_dim: 128,
            shared_expert_intermediate_size: expert_width,
            value_heads_tiled: false,
            a_stored_negated_exp: false,
        }),
        features: Default::default(),
    }
}

fn next_80b() -> ModelConfig {
    hybrid(Arch::Qwen3Next, 2048, 48, 16, 32, 512, 10, 512)
}

fn q35_35b() -> ModelConfig {
    hybrid(Arch::Qwen35Moe, 2048, 40, 16, 32, 256, 8, 512)
}

fn q35_122b() -> ModelConfig {
    hybrid(Arch::Qwen35Moe, 3072, 48, 32, 64, 256, 8, 1024)
}

fn q35_397b() -> ModelConfig {
    hybrid(Arch::Qwen35Moe, 4096, 60, 32, 64, 512, 10, 1024)
}

/// gpt-oss (openai/gpt-oss-20b and -120b config.json): hidden 2880, 64 query heads and 8 KV
/// heads of 64, experts as wide as the model, top-4, every other layer sliding over 128
/// positions from the first, YaRN x32 over 4096 (beta 32 / 1, not truncated), theta 150000.
fn gpt_oss(layers: usize, experts: usize) -> ModelConfig {
    ModelConfig {
        arch: Arch::GptOss,
        vocab_size: 201_088,
        hidden_size: 2880,
        num_hidden_layers: layers,
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 64,
        intermediate_size: 2880,
        moe_intermediate_size: 2880,
        num_experts: experts,
        num_experts_per_tok: 4,
        norm_topk_prob: false,
        decoder_sparse_step: 1,
        mlp_only_layers: vec![],
        rms_norm_eps: 1e-5,
        rope_theta: 150_000.0,
        max_position_embeddings: 131_072,
        tie_word_embeddings: false,
        bos_token_id: Some(199_998),
        // <|return|>, <|endoftext|>, <|call|> (generation_config.json)
        eos_token_ids: vec![200_002, 199_999, 200_012],
        hybrid: None,
        features: Features {
            attention_bias: true,
            attention_sinks: true,
            sliding: Some(gpt_oss_sliding(layers)),
            rope_yarn: Some(Yarn {
                factor: 32.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: 4096,
                truncate: false,
                attention_factor: 0.1 * 32f64.ln() + 1.0,
            }),
            expert_bias: true,
            expert_act: ExpertAct::ClampedSwiglu { alpha: 1.702, limit: 7.0 },
            ..Features::default()
        },
    }
}

/// gpt-oss's layer kinds: every other layer slides over 128 positions, from the first.
pub fn gpt_oss_sliding(layers: usize) -> Sliding {
    Sliding { window: 128, layers: (0..layers).step_by(2).collect() }
}

fn gpt_oss_20b() -> ModelConfig {
    gpt_oss(24, 32)
}

fn gpt_oss_120b() -> ModelConfig {
    gpt_oss(36, 128)
}

/// GLM-4.5 (zai-org's config.json files): 96 query heads and 8 KV heads of 128 with q/k/v
/// biases, rotary on half of each head, a sigmoid router (one group) over experts of width
/// `expert_width` with one shared expert as wide, the first `dense` layers dense, one MTP layer.
#[allow(clippy::too_many_arguments)]
fn glm(
    hidden: usize,
    layers: usize,
    experts: usize,
    expert_width: usize,
    dense_width: usize,
    dense: usize,
    scale: f32,
    qk_norm: bool,
) -> ModelConfig {
    ModelConfig {
        arch: Arch::Glm4Moe,
        vocab_size: 151_552,
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: 96,
        num_key_value_heads: 8,
        head_dim: 128,
        intermediate_size: dense_width,
        moe_intermediate_size: expert_width,
        num_experts: experts,
        num_experts_per_tok: 8,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: (0..dense).collect(),
        rms_norm_eps: 1e-5,
        rope_theta: 1e6,
        max_position_embeddings: 131_072,
        tie_word_embeddings: false,
        bos_token_id: None,
        // <|endoftext|>, <|user|>, <|observation|>
        eos_token_ids: vec![151_329, 151_336, 151_338],
        hybrid: None,
        features: Features {
            qkv_bias: true,
            qk_norm,
            rotary_dim: Some(64),
            sigmoid_router: Some(SigmoidRouter { n_group: 1, topk_group: 1, routed_scaling_factor: scale }),
            shared_experts: expert_width,
            nextn_layers: 1,
            ..Features::default()
        },
    }
}

fn glm_45() -> ModelConfig {
    glm(5120, 92, 160, 1536, 12_288, 3, 2.5, true)
}

fn glm_45_air() -> ModelConfig {
    glm(4096, 46, 128, 1408, 10_944, 1, 1.0, false)
}

/// DeepSeek-V3 and Kimi-K2 (their config.json files): 61 layers of hidden 7168, latent attention
/// (q_lora 1536, kv_lora 512, qk 128 + 64 rotary interleaved, v 128) with YaRN over 4096
/// positions (mscale and mscale_all_dim 1), experts of 2048 top-8 in `groups` groups keeping
/// `keep`, one shared expert, the first `dense` layers dense (18432 wide).
#[allow(clippy::too_many_arguments)]
fn deepseek(
    heads: usize,
    experts: usize,
    (groups, keep): (usize, usize),
    dense: usize,
    vocab: usize,
    scale: f32,
    (theta, factor, max_pos): (f64, f64, usize),
    nextn: usize,
) -> ModelConfig {
    let ms = yarn_mscale(factor, 1.0);
    ModelConfig {
        arch: Arch::DeepseekV3,
        vocab_size: vocab,
        hidden_size: 7168,
        num_hidden_layers: 61,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim: 192,
        intermediate_size: 18_432,
        moe_intermediate_size: 2048,
        num_experts: experts,
        num_experts_per_tok: 8,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: (0..dense).collect(),
        rms_norm_eps: 1e-6,
        rope_theta: theta,
        max_position_embeddings: max_pos,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        hybrid: None,
        features: Features {
            rotary_dim: Some(64),
            rope_yarn: Some(Yarn {
                factor,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: 4096,
                truncate: true,
                attention_factor: 1.0,
            }),
            sigmoid_router: Some(SigmoidRouter { n_group: groups, topk_group: keep, routed_scaling_factor: scale }),
            shared_experts: 2048,
            nextn_layers: nextn,
            mla: Some(Mla {
                q_lora_rank: Some(1536),
                kv_lora_rank: 512,
                qk_nope_head_dim: 128,
                qk_rope_head_dim: 64,
                v_head_dim: 128,
                rope_interleave: true,
                softmax_scale: (ms * ms / 192f64.sqrt()) as f32,
            }),
            ..Features::default()
        },
    }
}

fn deepseek_v3() -> ModelConfig {
    deepseek(128, 256, (8, 4), 3, 129_280, 2.5, (10_000.0, 40.0, 163_840), 1)
}

fn kimi_k2() -> ModelConfig {
    deepseek(64, 384, (1, 1), 1, 163_840, 2.827, (50_000.0, 32.0, 131_072), 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_is_a_valid_config() {
        for s in SHAPES {
            s.config().validate().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }

    #[test]
    fn parameter_counts_match_the_model_names() {
        // total parameters in billions, from the names (30B, 235B, 80B, 35B, 122B, 397B, 355B, 106B, 671B, 1T): the
        // shapes are right to within the rounding a model name does
        for (name, billions) in [
            ("qwen3-30b-a3b", 30.5),
            ("qwen3-235b-a22b", 235.1),
            ("qwen3-next-80b-a3b", 79.7),
            ("qwen3.5-35b-a3b", 34.7),
            ("qwen3.5-122b-a10b", 122.0),
            ("qwen3.5-397b-a17b", 396.0),
            // GLM-4.5 355B-A32B, GLM-4.5-Air 106B-A12B (the MTP layer not counted)
            ("glm-4.5", 355.0),
            ("glm-4.5-air", 106.0),
            // DeepSeek-V3 671B (the MTP module not counted), Kimi-K2 1T
            ("deepseek-v3", 671.0),
            ("kimi-k2", 1000.0),
        ] {
            let c = find(name).unwrap().config();
            let plan = crate::convert::plan::dense_tensors(&c);
            let dense: usize = plan.iter().map(|t| t.shape.iter().product::<usize>()).sum();
            let experts = c.moe_layers().len() * c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size;
            let b = (dense + experts) as f64 / 1e9;
            assert!((b - billions).abs() / billions < 0.03, "{name}: {b:.1} B parameters");
        }
    }
}
