//! What the families' GGUF metadata adds to the common layer, read as llama.cpp reads it: the
//! sigmoid-router families GLM-4.5 (`glm4moe`, llama.cpp's `glm4-moe.cpp`) and DeepSeek-V3 /
//! Kimi-K2 (`deepseek2`, llama.cpp's `deepseek2.cpp`), and YaRN for the Qwen families and GLM.

use super::model::GgufModel;
use crate::convert::error::ConvertError;
use crate::model_config::{Features, Mla, SigmoidRouter, Yarn, yarn_mscale};

impl GgufModel {
    /// The router and shared experts both families state alike: sigmoid scores
    /// (`expert_gating_func` 2),
    /// `expert_group_count` / `_used_count` groups, `expert_weights_scale`,
    /// `expert_shared_count` shared experts of the routed width `moe_i`, the MTP layers
    /// `nextn_predict_layers` states.
    fn sigmoid_moe_features(&self, arch: &str, moe_i: usize) -> Result<Features, ConvertError> {
        let k = |s: &str| format!("{arch}.{s}");
        if let Some(f) = self.u64_key(&k("expert_gating_func"))?
            && f != 2
        {
            return Err(self.config_err(&k("expert_gating_func"), format!("{f} is not sigmoid (2)")));
        }
        Ok(Features {
            sigmoid_router: Some(SigmoidRouter {
                n_group: self.u64_key(&k("expert_group_count"))?.unwrap_or(1) as usize,
                topk_group: self.u64_key(&k("expert_group_used_count"))?.unwrap_or(1) as usize,
                routed_scaling_factor: self.f64_key(&k("expert_weights_scale"))?.unwrap_or(1.0) as f32,
            }),
            shared_experts: (self.u64_key(&k("expert_shared_count"))?.unwrap_or(0) as usize).saturating_mul(moe_i),
            nextn_layers: self.u64_key(&k("nextn_predict_layers"))?.unwrap_or(0) as usize,
            ..Features::default()
        })
    }

    /// YaRN (`rope.scaling.type` "yarn") as llama.cpp applies it to an architecture without
    /// its own rule (Qwen3-MoE, Qwen3.5/3.6, Qwen3-Next, GLM-4.5): the factor
    /// `rope.scaling.factor`, the original context `rope.scaling.original_context_length`
    /// (else `context_length`), betas 32 and 1 unless the file states others, the correction
    /// range rounded outward (ggml's `floorf` / `ceilf`), and cos and sin times
    /// `rope.scaling.attn_factor` (default 1) x `0.1 ln(factor) + 1` (ggml's `rope_yarn`
    /// applies the second; llama.cpp cancels its own `yarn_attn_factor` against it). That is
    /// what transformers computes from the checkpoint's `rope_scaling` the converter read.
    /// `None` without scaling; any other type is refused naming the key.
    pub(super) fn plain_yarn(&self, arch: &str) -> Result<Option<Yarn>, ConvertError> {
        let k = |s: &str| format!("{arch}.{s}");
        match self.str_key(&k("rope.scaling.type"))? {
            None | Some("none") => Ok(None),
            Some("yarn") => {
                let factor = self.f64_key(&k("rope.scaling.factor"))?.unwrap_or(1.0);
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(
                        self.config_err(&k("rope.scaling.factor"), format!("{factor} is not a positive factor"))
                    );
                }
                let orig = match self.u64_key(&k("rope.scaling.original_context_length"))? {
                    Some(n) => n as usize,
                    None => self.usize_req(&k("context_length"))?,
                };
                if orig == 0 {
                    return Err(self.config_err(&k("rope.scaling.original_context_length"), "0 positions"));
                }
                let attn = self.f64_key(&k("rope.scaling.attn_factor"))?.unwrap_or(1.0);
                Ok(Some(Yarn {
                    factor,
                    beta_fast: self.f64_key(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
                    beta_slow: self.f64_key(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
                    original_max_position_embeddings: orig,
                    truncate: true,
                    attention_factor: attn * yarn_mscale(factor, 1.0),
                }))
            }
            Some(t) => Err(self.config_err(&k("rope.scaling.type"), format!("RoPE scaling '{t}' is not supported"))),
        }
    }

    /// GLM-4.5's attention: q/k/v biases and q/k norms where the file holds them (it states
    /// neither), `rope.dimension_count` rotary dims; the router and shared expert as
    /// [`sigmoid_moe_features`](Self::sigmoid_moe_features).
    pub(super) fn glm_features(&self, arch: &str, head_dim: usize, moe_i: usize) -> Result<Features, ConvertError> {
        let k = |s: &str| format!("{arch}.{s}");
        // what the first MoE layer holds (every layer holds the same attention tensors)
        let moe_layer = (0..self.usize_req(&k("block_count"))?)
            .find(|l| self.tensor(&format!("blk.{l}.ffn_gate_inp.weight")).is_some())
            .unwrap_or(0);
        let has = |name: &str| self.tensor(&format!("blk.{moe_layer}.{name}")).is_some();
        Ok(Features {
            qkv_bias: has("attn_q.bias"),
            qk_norm: has("attn_q_norm.weight"),
            rotary_dim: Some(self.u64_key(&k("rope.dimension_count"))?.map_or(head_dim, |r| r as usize)),
            ..self.sigmoid_moe_features(arch, moe_i)?
        })
    }

    /// DeepSeek-V3's latent attention as llama.cpp's `deepseek2` reads it: `attention.q_lora_rank`
    /// (absent or 0: a plain `attn_q`), `attention.kv_lora_rank`, `head_dim` = the key length
    /// of a head (`attention.key_length_mla`, nope + rope), `rope.dimension_count` rotary dims
    /// in interleaved pairs (llama.cpp's normal RoPE), `attention.value_length_mla` values.
    /// YaRN (`rope.scaling.*`) as llama.cpp runs it for this architecture: cos and sin
    /// unscaled when `rope.scaling.yarn_log_multiplier` (0.1 x `mscale_all_dim`) is given,
    /// since llama.cpp then takes `mscale` equal to `mscale_all_dim` (as DeepSeek-V3's and
    /// Kimi-K2's configs have it), the softmax scale times `mscale(factor, mscale_all_dim)^2`;
    /// without it, both times `mscale(factor, 1)`. The router and shared experts as
    /// [`sigmoid_moe_features`](Self::sigmoid_moe_features).
    pub(super) fn deepseek_features(
        &self,
        arch: &str,
        head_dim: usize,
        moe_i: usize,
    ) -> Result<Features, ConvertError> {
        let k = |s: &str| format!("{arch}.{s}");
        // llama.cpp takes a deepseek2 file without the key for DeepSeek-V2's softmax router
        if self.u64_key(&k("expert_gating_func"))?.is_none() {
            return Err(
                self.config_err(&k("expert_gating_func"), "missing: DeepSeek-V2's softmax router is not supported")
            );
        }
        let rope = self.usize_req(&k("rope.dimension_count"))?;
        let nope = head_dim
            .checked_sub(rope)
            .filter(|&n| n > 0)
            .ok_or_else(|| self.config_err(&k("rope.dimension_count"), format!("{rope} of a {head_dim}-dim key")))?;
        let value = match self.u64_key(&k("attention.value_length_mla"))? {
            Some(v) => v as usize,
            None => self.usize_req(&k("attention.value_length"))?,
        };
        let (mut rope_yarn, mut mscale) = (None, 1.0);
        match self.str_key(&k("rope.scaling.type"))? {
            None | Some("none") => {}
            Some("yarn") => {
                let factor = self.f64_key(&k("rope.scaling.factor"))?.unwrap_or(1.0);
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(
                        self.config_err(&k("rope.scaling.factor"), format!("{factor} is not a positive factor"))
                    );
                }
                let log_mul = self.f64_key(&k("rope.scaling.yarn_log_multiplier"))?;
                mscale = match log_mul {
                    Some(m) => yarn_mscale(factor, m / 0.1),
                    None => yarn_mscale(factor, 1.0),
                };
                rope_yarn = Some(Yarn {
                    factor,
                    beta_fast: self.f64_key(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
                    beta_slow: self.f64_key(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
                    original_max_position_embeddings: self.usize_req(&k("rope.scaling.original_context_length"))?,
                    truncate: true,
                    attention_factor: if log_mul.is_some() { 1.0 } else { mscale },
                });
            }
            Some(t) => {
                return Err(self.config_err(&k("rope.scaling.type"), format!("RoPE scaling '{t}' is not supported")));
            }
        }
        let mla = Mla {
            q_lora_rank: self.u64_key(&k("attention.q_lora_rank"))?.filter(|&r| r > 0).map(|r| r as usize),
            kv_lora_rank: self.usize_req(&k("attention.kv_lora_rank"))?,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope,
            v_head_dim: value,
            rope_interleave: true,
            softmax_scale: Mla::softmax_scale_of(head_dim, mscale),
        };
        Ok(Features { rotary_dim: Some(rope), rope_yarn, mla: Some(mla), ..self.sigmoid_moe_features(arch, moe_i)? })
    }
}
