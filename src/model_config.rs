//! The model configuration as the engine uses it: one normalized struct, whatever spelling the
//! checkpoint's config.json used (see `convert::hf_config`). Stored in the package metadata.

use serde::{Deserialize, Serialize};

/// Architectures the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): `Qwen3MoeForCausalLM`.
    Qwen3Moe,
}

impl Arch {
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }
}

/// Field names follow the HuggingFace keys where one exists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Width of the dense SwiGLU MLP of non-MoE layers.
    pub intermediate_size: usize,
    // MoE specific configuration
    pub moe_intermediate_size: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Divide the top-k routing weights by their sum.
    pub norm_topk_prob: bool,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// Every id that ends generation (config.json and generation_config.json together).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// A layer is MoE unless listed in `mlp_only_layers` or skipped by `decoder_sparse_step`
    /// (the rule of transformers' Qwen3MoeDecoderLayer).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && self.decoder_sparse_step > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }

    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_hidden_layers).filter(|&l| self.is_moe_layer(l)).collect()
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Checks the engine relies on; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(format!("{k} must be positive"));
            }
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim ({}) must be even for rotary embeddings", self.head_dim));
        }
        let moe = self.moe_layers();
        if !moe.is_empty() {
            if self.moe_intermediate_size == 0 {
                return Err("moe_intermediate_size must be positive".into());
            }
            if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts {
                return Err(format!(
                    "num_experts_per_tok ({}) must be between 1 and num_experts ({})",
                    self.num_experts_per_tok, self.num_experts
                ));
            }
        }
        if moe.len() < self.num_hidden_layers && self.intermediate_size == 0 {
            return Err("intermediate_size must be positive when some layers are dense".into());
        }
        if let Some(&l) = self.mlp_only_layers.iter().find(|&&l| l >= self.num_hidden_layers) {
            return Err(format!("mlp_only_layers lists layer {l}, past num_hidden_layers"));
        }
        // NaN fails both tests
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps < 0.0 || self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err("rms_norm_eps must be >= 0 and rope_theta > 0".into());
        }
        Ok(())
    }
}
