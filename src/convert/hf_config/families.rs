//! What each family adds to the common config keys: gpt-oss's windows, sinks, YaRN and clamped
//! experts; GLM-4.5's partial rotary, q/k/v biases, sigmoid router and shared expert.

use serde_json::Value;

use super::Keys;
use crate::convert::error::ConvertError;
use crate::model_config::{ExpertAct, Features, Mla, SigmoidRouter, Sliding, Yarn, yarn_mscale};

/// gpt-oss's attention and experts: biases (`attention_bias`, default true), sinks, the
/// sliding layers (`layer_types`, in any order; transformers' default: every other layer from
/// the first), YaRN from `yarn` (the key it sat under and its object) and the clamped SwiGLU
/// (`swiglu_limit`, 7 by default; alpha is fixed at 1.702 in transformers).
pub(super) fn gpt_oss_features(
    k: &Keys,
    layers: usize,
    yarn: Option<(&str, &Value)>,
) -> Result<Features, ConvertError> {
    let sliding_layers: Vec<usize> = match k.v.get("layer_types") {
        Some(Value::Array(a)) => {
            if a.len() != layers {
                return Err(k.err("layer_types", &format!("{} entries for {layers} layers", a.len())));
            }
            let mut slide = vec![];
            for (i, x) in a.iter().enumerate() {
                match x.as_str() {
                    Some("sliding_attention") => slide.push(i),
                    Some("full_attention") => {}
                    _ => {
                        return Err(k.err(
                            &format!("layer_types[{i}]"),
                            &format!("unknown layer kind {x} (expected \"sliding_attention\" or \"full_attention\")"),
                        ));
                    }
                }
            }
            slide
        }
        None | Some(Value::Null) => (0..layers).filter(|i| i % 2 == 0).collect(),
        Some(_) => return Err(k.err("layer_types", "expected a list of layer kinds")),
    };
    let sliding = match k.usize("sliding_window")? {
        Some(window) if !sliding_layers.is_empty() => Some(Sliding { window, layers: sliding_layers }),
        None if !sliding_layers.is_empty() => {
            return Err(k.err("sliding_window", "missing, but layer_types has sliding layers"));
        }
        _ => None,
    };
    let rope_yarn = match yarn {
        Some((key, y)) => Some(yarn_of(k, key, y)?),
        None => None,
    };
    let limit = k.f64("swiglu_limit")?.unwrap_or(7.0);
    Ok(Features {
        attention_bias: k.bool("attention_bias", true)?,
        attention_sinks: true,
        sliding,
        rope_yarn,
        expert_bias: true,
        expert_act: ExpertAct::ClampedSwiglu { alpha: 1.702, limit: limit as f32 },
        ..Features::default()
    })
}

/// YaRN's parameters from the `key` object `y`, with transformers' defaults: beta_fast 32,
/// beta_slow 1, truncate true, the attention factor `mscale(factor, mscale) /
/// mscale(factor, mscale_all_dim)` where both are given and non-zero (DeepSeek-V3), else
/// `mscale(factor, 1)`.
pub(super) fn yarn_of(k: &Keys, key: &str, y: &Value) -> Result<Yarn, ConvertError> {
    let num = |name: &str| -> Result<Option<f64>, ConvertError> {
        match y.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| k.err(&format!("{key}.{name}"), "expected a number")),
        }
    };
    let orig = num("original_max_position_embeddings")?
        .ok_or_else(|| k.err(&format!("{key}.original_max_position_embeddings"), "missing"))?;
    let factor = match num("factor")? {
        Some(f) => f,
        None => k.usize("max_position_embeddings")?.unwrap_or(0) as f64 / orig,
    };
    if !(factor.is_finite() && factor > 0.0 && orig >= 1.0) {
        return Err(k.err(key, "yarn needs a positive factor and original_max_position_embeddings"));
    }
    let truncate = match y.get("truncate") {
        None | Some(Value::Null) => true,
        Some(x) => x.as_bool().ok_or_else(|| k.err(&format!("{key}.truncate"), "expected true or false"))?,
    };
    let default_factor = match (num("mscale")?, num("mscale_all_dim")?) {
        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => yarn_mscale(factor, m) / yarn_mscale(factor, all),
        _ => yarn_mscale(factor, 1.0),
    };
    Ok(Yarn {
        factor,
        // transformers takes a 0 as unset too (`get(...) or 32`)
        beta_fast: num("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
        beta_slow: num("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
        original_max_position_embeddings: orig as usize,
        truncate,
        attention_factor: num("attention_factor")?.unwrap_or(default_factor),
    })
}

/// GLM-4.5's attention and MoE keys, with transformers' defaults: q/k/v biases
/// (`attention_bias`), `use_qk_norm`, rotary on `head_dim x partial_rotary_factor` dims (0.5;
/// `rotary_factor` is where the caller found it, top level or `rope_parameters`), and the MoE
/// keys it shares with DeepSeek-V3 ([sigmoid_moe_features]).
pub(super) fn glm_features(
    k: &Keys,
    head_dim: usize,
    rotary_factor: Option<f64>,
    moe_intermediate: usize,
) -> Result<Features, ConvertError> {
    let factor = rotary_factor.unwrap_or(0.5);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(k.err("partial_rotary_factor", "must be in (0, 1]"));
    }
    Ok(Features {
        qkv_bias: k.bool("attention_bias", false)?,
        qk_norm: k.bool("use_qk_norm", false)?,
        rotary_dim: Some((head_dim as f64 * factor) as usize),
        ..sigmoid_moe_features(k, moe_intermediate)?
    })
}

/// The MoE keys GLM-4.5 and DeepSeek-V3 share, with transformers' defaults: the sigmoid router
/// (`n_group`, `topk_group` 1, `routed_scaling_factor` 1), `n_shared_experts` (1) experts of
/// `moe_intermediate` as one shared MLP, and the MTP layers stated
/// (`num_nextn_predict_layers`, transformers 5: `num_mtp_layers`).
fn sigmoid_moe_features(k: &Keys, moe_intermediate: usize) -> Result<Features, ConvertError> {
    let scale = k.f64("routed_scaling_factor")?.unwrap_or(1.0);
    let nextn = match k.usize("num_nextn_predict_layers")? {
        Some(n) => n,
        None => k.usize("num_mtp_layers")?.unwrap_or(0),
    };
    Ok(Features {
        sigmoid_router: Some(SigmoidRouter {
            n_group: k.usize("n_group")?.unwrap_or(1),
            topk_group: k.usize("topk_group")?.unwrap_or(1),
            routed_scaling_factor: scale as f32,
        }),
        shared_experts: k.usize("n_shared_experts")?.unwrap_or(1).saturating_mul(moe_intermediate),
        nextn_layers: nextn,
        ..Features::default()
    })
}

/// DeepSeek-V3's (and Kimi-K2's) attention and MoE keys, with transformers' defaults: the
/// latent attention (`q_lora_rank` null for a plain q_proj, `kv_lora_rank`, `qk_nope_head_dim`,
/// `qk_rope_head_dim`, `v_head_dim`, `rope_interleave` true), YaRN from `yarn` where the config
/// scales RoPE (its `mscale_all_dim` also scales the softmax), the router and shared experts as
/// GLM-4.5's (`n_group`, `topk_group`, `routed_scaling_factor`, `n_shared_experts`), and the
/// MTP layers it states.
pub(super) fn deepseek_features(
    k: &Keys,
    yarn: Option<(&str, &Value)>,
    moe_intermediate: usize,
) -> Result<Features, ConvertError> {
    if k.bool("attention_bias", false)? {
        return Err(k.err("attention_bias", "true is not supported (DeepSeek-V3 has none)"));
    }
    // the released configs' router keys: DeepSeek-V2's softmax scores and greedy choice differ
    for (key, want) in [("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
        match k.v.get(key) {
            None | Some(Value::Null) => {}
            Some(x) if x.as_str() == Some(want) => {}
            Some(x) => return Err(k.err(key, &format!("{x} is not supported (DeepSeek-V3's router: {want})"))),
        }
    }
    let nope = k.req("qk_nope_head_dim")?;
    let rope = k.req("qk_rope_head_dim")?;
    let rope_yarn = match yarn {
        Some((key, y)) => Some(yarn_of(k, key, y)?),
        None => None,
    };
    // transformers' yarn_apply_mscale: the softmax scale times mscale(factor, mscale_all_dim)^2
    let all_dim = yarn.and_then(|(_, y)| y.get("mscale_all_dim")).and_then(Value::as_f64).filter(|&m| m != 0.0);
    let mscale = match (&rope_yarn, all_dim) {
        (Some(y), Some(m)) => yarn_mscale(y.factor, m),
        _ => 1.0,
    };
    let mla = Mla {
        q_lora_rank: k.usize("q_lora_rank")?,
        kv_lora_rank: k.req("kv_lora_rank")?,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: k.req("v_head_dim")?,
        rope_interleave: k.bool("rope_interleave", true)?,
        softmax_scale: Mla::softmax_scale_of(nope + rope, mscale),
    };
    Ok(Features { rotary_dim: Some(rope), rope_yarn, mla: Some(mla), ..sigmoid_moe_features(k, moe_intermediate)? })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::super::parse_config;
    use crate::model_config::{Arch, SigmoidRouter};

    /// GLM-4.5-Air's config.json keys (the hub's spelling), shrunk.
    fn glm() -> Value {
        json!({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 100,
               "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 32, "intermediate_size": 96, "moe_intermediate_size": 16, "n_routed_experts": 8,
               "num_experts_per_tok": 2, "n_shared_experts": 2, "n_group": 1, "topk_group": 1,
               "first_k_dense_replace": 2, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
               "partial_rotary_factor": 0.5, "use_qk_norm": false, "attention_bias": true, "rope_theta": 1e6,
               "num_nextn_predict_layers": 1, "eos_token_id": [5, 6]})
    }

    #[test]
    fn glm_reads_its_router_shared_expert_dense_layers_and_rotary() {
        let c = parse_config(&glm(), Path::new("c.json")).unwrap();
        assert_eq!(c.arch, Arch::Glm4Moe);
        assert_eq!((c.num_experts, c.moe_intermediate_size, c.norm_topk_prob), (8, 16, true));
        assert_eq!(c.moe_layers(), vec![2, 3]);
        assert_eq!((c.rotary_dim(), c.qk_norm(), c.shared_expert_width()), (16, false, 32));
        let f = &c.features;
        assert!(f.qkv_bias && !f.attention_bias && !f.attention_sinks);
        assert_eq!(f.sigmoid_router, Some(SigmoidRouter { n_group: 1, topk_group: 1, routed_scaling_factor: 2.5 }));
        assert_eq!(f.nextn_layers, 1);
        // transformers 5's spelling: the same config
        let mut t5 = glm();
        let o = t5.as_object_mut().unwrap();
        let (experts, mtp) = (o.remove("n_routed_experts").unwrap(), o.remove("num_nextn_predict_layers").unwrap());
        o.insert("num_local_experts".into(), experts);
        o.insert("num_mtp_layers".into(), mtp);
        o.remove("rope_theta");
        o.remove("partial_rotary_factor");
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
        );
        assert_eq!(parse_config(&t5, Path::new("c.json")).unwrap(), c);
    }

    /// DeepSeek-V3's config.json keys (the hub's spelling, `rope_scaling` with `type`), shrunk.
    fn deepseek() -> Value {
        json!({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 100,
               "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
               "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
               "v_head_dim": 24, "intermediate_size": 96, "moe_intermediate_size": 16, "n_routed_experts": 8,
               "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 4, "topk_group": 2,
               "first_k_dense_replace": 3, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
               "max_position_embeddings": 4096, "rope_theta": 10000.0, "num_nextn_predict_layers": 1,
               "scoring_func": "sigmoid", "topk_method": "noaux_tc",
               "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})
    }

    #[test]
    fn deepseek_reads_latent_attention_yarn_mscale_and_groups() {
        let c = parse_config(&deepseek(), Path::new("c.json")).unwrap();
        assert_eq!(c.arch, Arch::DeepseekV3);
        assert_eq!((c.head_dim, c.rotary_dim(), c.num_key_value_heads, c.qk_norm()), (24, 8, 4, false));
        assert_eq!(c.moe_layers(), vec![3]);
        let m = c.features.mla.unwrap();
        assert_eq!((m.q_lora_rank, m.kv_lora_rank, m.v_head_dim, m.rope_interleave), (Some(48), 32, 24, true));
        // transformers: 24^-1/2 x mscale(40, 1)^2, mscale = 0.1 ln 40 + 1; cos/sin factor
        // mscale(40, 1) / mscale(40, 1) = 1
        let ms = 0.1 * 40f64.ln() + 1.0;
        assert!((m.softmax_scale as f64 - ms * ms / 24f64.sqrt()).abs() < 1e-6, "{}", m.softmax_scale);
        assert_eq!(c.features.rope_yarn.as_ref().unwrap().attention_factor, 1.0);
        let r = c.features.sigmoid_router.unwrap();
        assert_eq!((r.n_group, r.topk_group, r.routed_scaling_factor), (4, 2, 2.5));
        assert_eq!((c.shared_expert_width(), c.features.nextn_layers), (16, 1));
        // q_lora_rank null: a plain q_proj
        let mut v = deepseek();
        v["q_lora_rank"] = Value::Null;
        assert_eq!(parse_config(&v, Path::new("c.json")).unwrap().features.mla.unwrap().q_lora_rank, None);
        // v wider than a query head is refused (the expanded form pads values to it)
        let mut v = deepseek();
        v["v_head_dim"] = json!(40);
        let e = parse_config(&v, Path::new("c.json")).unwrap_err().to_string();
        assert!(e.contains("v_head_dim"), "{e}");
        // DeepSeek-V2's router: refused, naming the key
        for (key, value) in [("scoring_func", "softmax"), ("topk_method", "group_limited_greedy")] {
            let mut v = deepseek();
            v[key] = json!(value);
            let e = parse_config(&v, Path::new("c.json")).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(value), "{e}");
        }
        // DeepSeek-V3.2: refused by name
        let mut v = deepseek();
        v["architectures"] = json!(["DeepseekV32ForCausalLM"]);
        let e = parse_config(&v, Path::new("c.json")).unwrap_err().to_string();
        assert!(e.contains("DeepSeek-V3.2") && e.contains("indexer"), "{e}");
    }

    #[test]
    fn glm_errors_name_the_key() {
        for (key, value, named) in [
            ("n_group", json!(3), "n_group"),
            ("topk_group", json!(0), "n_group"),
            ("routed_scaling_factor", json!(-1.0), "routed_scaling_factor"),
            ("partial_rotary_factor", json!(1.5), "partial_rotary_factor"),
            ("first_k_dense_replace", json!(9), "first_k_dense_replace"),
            ("n_routed_experts", json!("eight"), "n_routed_experts"),
        ] {
            let mut v = glm();
            v[key] = value;
            let e = parse_config(&v, Path::new("c.json")).unwrap_err().to_string();
            assert!(e.contains(named), "{key}: {e}");
        }
    }
}
