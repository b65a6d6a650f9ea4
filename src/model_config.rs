//! The model configuration as the engine uses it: one normalized struct, whatever spelling the
//! checkpoint's config.json used (see `convert::hf_config`). Stored in the package metadata.

use serde::{Deserialize, Serialize};

/// The most layers a model may state: released models have at most ~100, and a reader sizes
/// per-layer tables by this count before anything else checks it.
pub const MAX_LAYERS: usize = 1 << 10;

/// The most routed experts a layer may state (released models have at most 512).
pub const MAX_EXPERTS: usize = 1 << 14;

/// Each `(key, value, most)` with `value <= most`, else an error naming the first key past it.
fn at_most(limits: &[(&str, usize, usize)]) -> Result<(), String> {
    match limits.iter().find(|(_, v, most)| v > most) {
        Some((k, v, most)) => Err(format!("{k} ({v}) is beyond what moescope runs (at most {most})")),
        None => Ok(()),
    }
}

/// Architectures the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): `Qwen3MoeForCausalLM`.
    Qwen3Moe,
    /// Qwen3-Next (Qwen3-Next-80B-A3B): `Qwen3NextForCausalLM`, a hybrid of Gated DeltaNet and
    /// gated attention layers with a shared expert.
    Qwen3Next,
    /// Qwen3.5 / Qwen3.6 MoE (Qwen3.5-35B-A3B ... 397B-A17B): the text model of
    /// `Qwen3_5MoeForConditionalGeneration`, Qwen3-Next's layers with flat projections.
    #[serde(rename = "qwen3_5_moe")]
    Qwen35Moe,
    /// gpt-oss (gpt-oss-20b, gpt-oss-120b): `GptOssForCausalLM`, attention with biases, sinks
    /// and sliding windows, a top-k-then-softmax router with a bias, experts with biases and a
    /// clamped SwiGLU.
    GptOss,
    /// GLM-4.5 / 4.5-Air / 4.6: `Glm4MoeForCausalLM`, attention with q/k/v biases, partial
    /// rotary and optional q/k norms, a sigmoid router with a correction bias, a shared expert,
    /// the first layers dense.
    #[serde(rename = "glm4_moe")]
    Glm4Moe,
    /// DeepSeek-V3 / R1 / V3.1 and Kimi-K2: `DeepseekV3ForCausalLM`, multi-head latent attention,
    /// a sigmoid router with expert groups and a correction bias, shared experts, the first
    /// layers dense.
    #[serde(rename = "deepseek_v3")]
    DeepseekV3,
}

impl Arch {
    pub const ALL: [Arch; 6] =
        [Arch::Qwen3Moe, Arch::Qwen3Next, Arch::Qwen35Moe, Arch::GptOss, Arch::Glm4Moe, Arch::DeepseekV3];

    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::Qwen3Next => "Qwen3NextForCausalLM",
            Arch::Qwen35Moe => "Qwen3_5MoeForConditionalGeneration",
            Arch::GptOss => "GptOssForCausalLM",
            Arch::Glm4Moe => "Glm4MoeForCausalLM",
            Arch::DeepseekV3 => "DeepseekV3ForCausalLM",
        }
    }

    /// The HF `model_type`, which is also how packages and `bench` name it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen3Next => "qwen3_next",
            Arch::Qwen35Moe => "qwen3_5_moe",
            Arch::GptOss => "gpt_oss",
            Arch::Glm4Moe => "glm4_moe",
            Arch::DeepseekV3 => "deepseek_v3",
        }
    }

    /// Hybrid models: Gated DeltaNet and gated attention layers, (1 + w) norms, a shared expert.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen3Next | Arch::Qwen35Moe)
    }
}

/// Sliding-window attention in some layers (gpt-oss's `layer_types` `sliding_attention`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sliding {
    /// `sliding_window` W: a query attends the W latest positions, itself included.
    pub window: usize,
    /// The layers that slide, ascending; the others attend every position.
    pub layers: Vec<usize>,
}

/// YaRN RoPE scaling (`rope_scaling` / `rope_parameters` with `rope_type` "yarn"), as
/// transformers' `_compute_yarn_parameters` computes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Yarn {
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub original_max_position_embeddings: usize,
    /// Round the correction range outward to whole dims (transformers' default: true).
    pub truncate: bool,
    /// What cos and sin are multiplied by (`attention_factor`, or 0.1 ln(factor) + 1).
    pub attention_factor: f64,
}

/// YaRN's magnitude `mscale(factor, m)` (transformers' `get_mscale`, llama.cpp's): 1 up to a
/// factor of 1, else `0.1 m ln(factor) + 1`.
pub fn yarn_mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 }
}

impl Yarn {
    /// The `dim / 2` frequencies of a head's `dim` rotary dims at base `theta`: each blends
    /// the plain frequency (fast dims, many turns over the original context) and the one
    /// interpolated by `factor` (slow dims), by a ramp between the dims that turn `beta_fast`
    /// and `beta_slow` times; in f32, in the order transformers computes them.
    pub fn inv_freq(&self, theta: f64, dim: usize) -> Vec<f32> {
        let correction_dim = |turns: f64| {
            dim as f64 * (self.original_max_position_embeddings as f64 / (turns * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (correction_dim(self.beta_fast), correction_dim(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
        if low == high {
            high += 0.001; // transformers' guard against a zero-width ramp
        }
        (0..dim / 2)
            .map(|i| {
                let pos_freq = (theta as f32).powf((2 * i) as f32 / dim as f32);
                let (extra, inter) = (1.0 / pos_freq, 1.0 / (self.factor as f32 * pos_freq));
                let ramp = ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                inter * (1.0 - keep) + extra * keep
            })
            .collect()
    }
}

/// The activation between an expert's gate and up products and its down product.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertAct {
    /// `silu(gate) * up`
    #[default]
    Silu,
    /// gpt-oss: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha g)`
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl ExpertAct {
    fn is_silu(&self) -> bool {
        *self == ExpertAct::Silu
    }
}

/// What mixes tokens in a layer of a hybrid model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Softmax attention over the KV cache (gated in hybrid models).
    FullAttention,
    /// Gated DeltaNet: a causal conv and a recurrent state per value head, no KV cache.
    LinearAttention,
}

/// The shapes only hybrid models have (HF keys in comments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HybridConfig {
    /// `layer_types`, one per layer (or derived from `full_attention_interval`).
    pub layer_types: Vec<LayerKind>,
    /// RoPE dims of an attention head: `head_dim * partial_rotary_factor`, pairing i with
    /// i + rotary_dim / 2; the rest pass through.
    pub rotary_dim: usize,
    /// `linear_conv_kernel_dim` K: the causal conv reads the K - 1 inputs before each token.
    pub conv_kernel: usize,
    /// `linear_num_key_heads` nk, `linear_key_head_dim` dk.
    pub key_heads: usize,
    pub key_head_dim: usize,
    /// `linear_num_value_heads` nv (a multiple of nk: value head h reads key head h / (nv/nk)),
    /// `linear_value_head_dim` dv.
    pub value_heads: usize,
    pub value_head_dim: usize,
    /// `shared_expert_intermediate_size`: the MLP every token runs beside its routed experts.
    pub shared_expert_intermediate_size: usize,
    /// The value heads in llama.cpp's tiled order (a GGUF's): value head h reads key head
    /// h mod nk instead of h / (nv / nk).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub value_heads_tiled: bool,
    /// The linear layers' `A_log` tensors hold -exp(A_log), the decay rate as it is used (a
    /// GGUF's `ssm_a`): taken as they are, not exponentiated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub a_stored_negated_exp: bool,
}

impl HybridConfig {
    /// Channels of the causal conv: q (nk dk), k (nk dk), v (nv dv).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }

    /// Width of the mixer's output before `out_proj`: nv dv.
    pub fn value_dim(&self) -> usize {
        self.value_heads * self.value_head_dim
    }

    /// f32 values of one layer's recurrent state: nv x dk x dv.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_head_dim * self.value_head_dim
    }

    /// f32 values of one layer's conv state: the last K - 1 inputs of every channel.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    fn validate(&self, layers: usize, head_dim: usize) -> Result<(), String> {
        let positive = [
            ("linear_conv_kernel_dim", self.conv_kernel),
            ("linear_num_key_heads", self.key_heads),
            ("linear_key_head_dim", self.key_head_dim),
            ("linear_num_value_heads", self.value_heads),
            ("linear_value_head_dim", self.value_head_dim),
            ("shared_expert_intermediate_size", self.shared_expert_intermediate_size),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(format!("{k} must be positive"));
            }
        }
        at_most(&[
            ("linear_conv_kernel_dim", self.conv_kernel, 1 << 6),
            ("linear_num_key_heads", self.key_heads, 1 << 10),
            ("linear_key_head_dim", self.key_head_dim, 1 << 12),
            ("linear_num_value_heads", self.value_heads, 1 << 10),
            ("linear_value_head_dim", self.value_head_dim, 1 << 12),
            ("shared_expert_intermediate_size", self.shared_expert_intermediate_size, 1 << 20),
        ])?;
        if !self.value_heads.is_multiple_of(self.key_heads) {
            return Err(format!(
                "linear_num_value_heads ({}) is not a multiple of linear_num_key_heads ({})",
                self.value_heads, self.key_heads
            ));
        }
        if self.layer_types.len() != layers {
            return Err(format!("layer_types has {} entries for {layers} layers", self.layer_types.len()));
        }
        if self.rotary_dim > head_dim || !self.rotary_dim.is_multiple_of(2) {
            return Err(format!(
                "partial_rotary_factor gives {} rotary dims: must be even and at most head_dim ({head_dim})",
                self.rotary_dim
            ));
        }
        Ok(())
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
    /// Qwen3-Next / Qwen3.5: the linear-attention layers and the shared expert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<HybridConfig>,
    /// What the family adds to the common layer (none for the Qwen families).
    #[serde(flatten)]
    pub features: Features,
}

/// What a family adds to the common layer, each off by default (and then absent from a
/// package's metadata, so packages made before these existed read the same).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Features {
    /// q, k, v and o projections with biases (gpt-oss's `attention_bias`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_bias: bool,
    /// One learned sink logit per attention head (gpt-oss).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_sinks: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding: Option<Sliding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_yarn: Option<Yarn>,
    /// Routed experts with biases on gate, up and down (gpt-oss).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expert_bias: bool,
    #[serde(default, skip_serializing_if = "ExpertAct::is_silu")]
    pub expert_act: ExpertAct,
    /// q, k and v projections with biases, o without (GLM-4.5's `attention_bias`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qkv_bias: bool,
    /// Per-head q/k RMSNorm where the family makes it optional (GLM-4.5's `use_qk_norm`; the
    /// Qwen families always have it, gpt-oss never).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// RoPE on only the first this many dims of each head outside the hybrids (GLM-4.5's
    /// `partial_rotary_factor`), pairing i with i + rotary_dim / 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_dim: Option<usize>,
    /// The sigmoid router of DeepSeek-V3 and GLM-4.5 (with `e_score_correction_bias`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigmoid_router: Option<SigmoidRouter>,
    /// Width of the ungated shared expert every MoE layer adds (`n_shared_experts x
    /// moe_intermediate_size`, `mlp.shared_experts.*`); 0 for none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_experts: usize,
    /// Multi-token-prediction layers after the stack (`num_nextn_predict_layers`): stated by
    /// the checkpoint, not run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nextn_layers: usize,
    /// Multi-head latent attention (DeepSeek-V3); `head_dim` is then `qk_nope + qk_rope` and
    /// `rotary_dim` `qk_rope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<Mla>,
}

/// DeepSeek-V3's multi-head latent attention (config.json's names). Per token: queries through
/// `q_a_proj` (`q_lora_rank`), its norm and `q_b_proj`, or one `q_proj`; `kv_a_proj_with_mqa`
/// gives the compressed kv (`kv_lora_rank`, normed by `kv_a_layernorm`) and one rotary key
/// (`qk_rope_head_dim`) all heads share; `kv_b_proj` expands the compressed kv to each head's
/// `qk_nope_head_dim` key dims and `v_head_dim` values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mla {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// The rotary dims in interleaved pairs (2i, 2i + 1), not halves (`rope_interleave`).
    pub rope_interleave: bool,
    /// The softmax scale: `(qk_nope + qk_rope)^-1/2`, times YaRN's `mscale^2` where the config
    /// has `mscale_all_dim` (transformers' `yarn_apply_mscale`).
    pub softmax_scale: f32,
}

impl Mla {
    /// The softmax scale of a `head`-dim query and key with YaRN's `mscale` (1 without YaRN):
    /// `head^-1/2 x mscale^2`, each factor rounded to f32 first, as transformers computes it.
    pub fn softmax_scale_of(head: usize, mscale: f64) -> f32 {
        (head as f64).powf(-0.5) as f32 * (mscale * mscale) as f32
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// DeepSeek-V3's and GLM-4.5's router: sigmoid scores, the choice made on them plus
/// `e_score_correction_bias` among the experts of the `topk_group` best of `n_group` groups,
/// the weights the uncorrected scores (renormalised when `norm_topk_prob`) times
/// `routed_scaling_factor`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SigmoidRouter {
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f32,
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

    /// What mixes tokens in `layer` (attention unless a hybrid says otherwise).
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        match &self.hybrid {
            Some(h) => h.layer_types.get(layer).copied().unwrap_or(LayerKind::FullAttention),
            None => LayerKind::FullAttention,
        }
    }

    /// Layers with softmax attention (and so a KV cache).
    pub fn attention_layers(&self) -> usize {
        (0..self.num_hidden_layers).filter(|&l| self.layer_kind(l) == LayerKind::FullAttention).count()
    }

    /// The window of layer `layer`'s attention, if it slides.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.features.sliding.as_ref().filter(|s| s.layers.contains(&layer)).map(|s| s.window)
    }

    /// RoPE dims of an attention head (all of them for Qwen3-MoE).
    pub fn rotary_dim(&self) -> usize {
        match (&self.hybrid, self.features.rotary_dim) {
            (Some(h), _) => h.rotary_dim,
            (None, Some(r)) => r,
            (None, None) => self.head_dim,
        }
    }

    /// Width of the shared expert every MoE layer runs (0 for none): the hybrids' gated one,
    /// GLM-4.5's and DeepSeek-V3's plain ones.
    pub fn shared_expert_width(&self) -> usize {
        self.hybrid.as_ref().map_or(self.features.shared_experts, |h| h.shared_expert_intermediate_size)
    }

    /// Attention heads normed per head (`q_norm`, `k_norm`) before RoPE.
    pub fn qk_norm(&self) -> bool {
        match self.arch {
            Arch::Qwen3Moe | Arch::Qwen3Next | Arch::Qwen35Moe => true,
            Arch::GptOss | Arch::DeepseekV3 => false,
            Arch::Glm4Moe => self.features.qk_norm,
        }
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
        // sizes past any released model's by orders of magnitude are refused before anything
        // loops over them or sizes a buffer by them (a config's num_hidden_layers of 10^9 made
        // `convert` list 10^9 layers)
        at_most(&[
            ("vocab_size", self.vocab_size, 1 << 22),
            ("hidden_size", self.hidden_size, 1 << 16),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, 1 << 10),
            ("num_key_value_heads", self.num_key_value_heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 12),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("moe_intermediate_size", self.moe_intermediate_size, 1 << 20),
            ("num_experts", self.num_experts, MAX_EXPERTS),
            ("max_position_embeddings", self.max_position_embeddings, 1 << 24),
        ])?;
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if let Some(hy) = &self.hybrid {
            hy.validate(self.num_hidden_layers, self.head_dim)?;
        }
        let f = &self.features;
        if let Some(s) = &f.sliding {
            if s.window == 0 {
                return Err("sliding_window must be positive".into());
            }
            if let Some(&l) = s.layers.iter().find(|&&l| l >= self.num_hidden_layers) {
                return Err(format!("layer_types marks layer {l} sliding, past num_hidden_layers"));
            }
        }
        if let Some(y) = &f.rope_yarn {
            let finite = [y.factor, y.beta_fast, y.beta_slow, y.attention_factor].iter().all(|x| x.is_finite());
            if !finite || y.factor <= 0.0 || y.original_max_position_embeddings == 0 {
                return Err("rope_scaling (yarn) needs a positive factor and original_max_position_embeddings".into());
            }
        }
        if let ExpertAct::ClampedSwiglu { alpha, limit } = f.expert_act
            && !(alpha.is_finite() && limit.is_finite() && limit > 0.0)
        {
            return Err("swiglu_limit must be a positive number".into());
        }
        if let Some(r) = f.rotary_dim
            && (r == 0 || r > self.head_dim || !r.is_multiple_of(2))
        {
            return Err(format!(
                "partial_rotary_factor gives {r} rotary dims: must be even, positive and at most head_dim ({})",
                self.head_dim
            ));
        }
        if let Some(r) = f.sigmoid_router {
            let groups_ok = r.n_group >= 1
                && r.n_group <= crate::model::router::MAX_GROUPS
                && self.num_experts.is_multiple_of(r.n_group)
                && (1..=r.n_group).contains(&r.topk_group);
            if !groups_ok {
                return Err(format!(
                    "n_group ({}) must divide n_routed_experts ({}) into at most {} groups, and topk_group ({}) be between 1 and n_group",
                    r.n_group,
                    self.num_experts,
                    crate::model::router::MAX_GROUPS,
                    r.topk_group
                ));
            }
            // each kept group must offer k experts between them
            if r.topk_group * (self.num_experts / r.n_group) < self.num_experts_per_tok {
                return Err(format!(
                    "topk_group ({}) groups of {} experts cannot hold num_experts_per_tok ({})",
                    r.topk_group,
                    self.num_experts / r.n_group,
                    self.num_experts_per_tok
                ));
            }
            if !(r.routed_scaling_factor.is_finite() && r.routed_scaling_factor > 0.0) {
                return Err("routed_scaling_factor must be a positive number".into());
            }
        }
        at_most(&[("shared_experts", f.shared_experts, 1 << 20), ("num_nextn_predict_layers", f.nextn_layers, 16)])?;
        if let Some(m) = f.mla {
            at_most(&[
                ("q_lora_rank", m.q_lora_rank.unwrap_or(0), 1 << 16),
                ("kv_lora_rank", m.kv_lora_rank, 1 << 16),
                ("qk_rope_head_dim", m.qk_rope_head_dim, 1 << 12),
                ("v_head_dim", m.v_head_dim, 1 << 12),
            ])?;
            let positive = [m.q_lora_rank.unwrap_or(1), m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim];
            if positive.contains(&0) || !m.qk_rope_head_dim.is_multiple_of(2) {
                return Err("kv_lora_rank, q_lora_rank, v_head_dim and qk_rope_head_dim (even) must be positive".into());
            }
            if self.head_dim != m.qk_nope_head_dim + m.qk_rope_head_dim || m.v_head_dim > self.head_dim {
                return Err(format!(
                    "v_head_dim ({}) must be at most qk_nope_head_dim + qk_rope_head_dim ({})",
                    m.v_head_dim, self.head_dim
                ));
            }
            if !(m.softmax_scale.is_finite() && m.softmax_scale > 0.0) {
                return Err("mscale_all_dim gives no usable softmax scale".into());
            }
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
