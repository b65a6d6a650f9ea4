//! config.json (and generation_config.json) of a HuggingFace checkpoint -> [`ModelConfig`].
//!
//! Both spellings are read: the hub's (`num_experts`, top-level `rope_theta`, `torch_dtype`) and
//! transformers 5's (`num_local_experts`, `rope_parameters{rope_theta}`, `dtype`).

use std::path::Path;

use serde_json::Value;

use super::error::ConvertError;
use crate::model_config::{Arch, ModelConfig};

/// Read `dir/config.json` (+ `dir/generation_config.json` for extra end-of-sequence ids).
pub fn read_config(dir: &Path) -> Result<ModelConfig, ConvertError> {
    let path = dir.join("config.json");
    let v = read_json(&path)?;
    let mut cfg = parse_config(&v, &path)?;
    let gen_path = dir.join("generation_config.json");
    if gen_path.exists() {
        let g = read_json(&gen_path)?;
        for id in token_ids(&g, "eos_token_id", &gen_path)? {
            if !cfg.eos_token_ids.contains(&id) {
                cfg.eos_token_ids.push(id);
            }
        }
    }
    Ok(cfg)
}

pub fn read_json(path: &Path) -> Result<Value, ConvertError> {
    let bytes = std::fs::read(path).map_err(|source| ConvertError::Io { path: path.to_path_buf(), error: source })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ConvertError::File { path: path.to_path_buf(), msg: format!("invalid JSON: {e}") })
}

fn token_ids(v: &Value, key: &str, path: &Path) -> Result<Vec<u32>, ConvertError> {
    let bad = || ConvertError::Config {
        path: path.to_path_buf(),
        key: key.into(),
        msg: "expected a token id or a list of token ids".into(),
    };
    match v.get(key) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Number(n)) => Ok(vec![n.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad)?]),
        Some(Value::Array(a)) => {
            a.iter().map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad)).collect()
        }
        Some(_) => Err(bad()),
    }
}

/// Parse a config.json value (`path` is only for messages).
pub fn parse_config(v: &Value, path: &Path) -> Result<ModelConfig, ConvertError> {
    let err =
        |key: &str, msg: &str| ConvertError::Config { path: path.to_path_buf(), key: key.into(), msg: msg.into() };
    let archs: Vec<String> = v
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let model_type = v.get("model_type").and_then(|s| s.as_str()).unwrap_or("");
    let arch = if archs.iter().any(|a| a == "Qwen3MoeForCausalLM") || (archs.is_empty() && model_type == "qwen3_moe") {
        Arch::Qwen3Moe
    } else {
        let found = if archs.is_empty() { format!("model_type {model_type}") } else { archs.join(", ") };
        return Err(ConvertError::Architecture {
            path: path.to_path_buf(),
            found,
            supported: Arch::Qwen3Moe.hf_class().into(),
        });
    };

    let usize_key = |key: &str| -> Result<Option<usize>, ConvertError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_u64().map(|n| Some(n as usize)).ok_or_else(|| err(key, "expected a non-negative integer")),
        }
    };
    let req = |key: &str| usize_key(key)?.ok_or_else(|| err(key, "missing"));
    let f64_key = |key: &str| -> Result<Option<f64>, ConvertError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| err(key, "expected a number")),
        }
    };
    let bool_key = |key: &str, default: bool| -> Result<bool, ConvertError> {
        match v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| err(key, "expected true or false")),
        }
    };

    if bool_key("attention_bias", false)? {
        return Err(err("attention_bias", "true is not supported (Qwen3-MoE has no attention biases)"));
    }
    if bool_key("use_sliding_window", false)? {
        return Err(err("use_sliding_window", "sliding-window attention is not supported"));
    }
    if let Some(act) = v.get("hidden_act").and_then(|a| a.as_str())
        && act != "silu"
    {
        return Err(err("hidden_act", &format!("'{act}' is not supported (only silu)")));
    }
    // rope: top-level (hub) or rope_parameters (transformers 5); only plain RoPE for now
    let rp = v.get("rope_parameters").filter(|x| !x.is_null());
    for (key, scaling) in [("rope_scaling", v.get("rope_scaling")), ("rope_parameters", rp)] {
        if let Some(s) = scaling.filter(|x| !x.is_null()) {
            let ty = s.get("rope_type").or_else(|| s.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
            if ty != "default" {
                return Err(err(key, &format!("RoPE scaling '{ty}' is not supported yet")));
            }
        }
    }
    let rope_theta = match f64_key("rope_theta")? {
        Some(t) => t,
        None => match rp.and_then(|p| p.get("rope_theta")) {
            Some(t) => t.as_f64().ok_or_else(|| err("rope_parameters.rope_theta", "expected a number"))?,
            None => 10000.0, // transformers' default for Qwen3-MoE
        },
    };
    let num_experts = match usize_key("num_experts")? {
        Some(n) => n,
        None => usize_key("num_local_experts")?.ok_or_else(|| err("num_experts", "missing (nor num_local_experts)"))?,
    };
    let hidden_size = req("hidden_size")?;
    let num_attention_heads = req("num_attention_heads")?;
    if num_attention_heads == 0 {
        return Err(err("num_attention_heads", "must be positive"));
    }
    let mlp_only_layers = match v.get("mlp_only_layers") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().map(|n| n as usize).ok_or_else(|| err("mlp_only_layers", "expected layer indices")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(err("mlp_only_layers", "expected a list of layer indices")),
    };
    let bos = token_ids(v, "bos_token_id", path)?;
    let cfg = ModelConfig {
        arch,
        vocab_size: req("vocab_size")?,
        hidden_size,
        num_hidden_layers: req("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads: usize_key("num_key_value_heads")?.unwrap_or(num_attention_heads),
        head_dim: usize_key("head_dim")?.unwrap_or(hidden_size / num_attention_heads),
        intermediate_size: usize_key("intermediate_size")?.unwrap_or(0),
        moe_intermediate_size: usize_key("moe_intermediate_size")?.unwrap_or(0),
        num_experts,
        num_experts_per_tok: req("num_experts_per_tok")?,
        norm_topk_prob: bool_key("norm_topk_prob", false)?,
        decoder_sparse_step: usize_key("decoder_sparse_step")?.unwrap_or(1),
        mlp_only_layers,
        rms_norm_eps: f64_key("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta,
        max_position_embeddings: usize_key("max_position_embeddings")?.unwrap_or(32768),
        tie_word_embeddings: bool_key("tie_word_embeddings", false)?,
        bos_token_id: bos.first().copied(),
        eos_token_ids: token_ids(v, "eos_token_id", path)?,
    };
    cfg.validate().map_err(|msg| {
        let key = msg.split_whitespace().next().unwrap_or("config").to_string();
        ConvertError::Config { path: path.to_path_buf(), key, msg }
    })?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 100,
               "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
               "num_experts_per_tok": 2, "norm_topk_prob": true, "rope_theta": 1e6, "eos_token_id": 5})
    }

    #[test]
    fn both_spellings_give_the_same_config() {
        let hub = parse_config(&base(), Path::new("c.json")).unwrap();
        let mut t5 = base();
        let o = t5.as_object_mut().unwrap();
        o.remove("num_experts");
        o.remove("rope_theta");
        o.insert("num_local_experts".into(), json!(8));
        o.insert("rope_parameters".into(), json!({"rope_type": "default", "rope_theta": 1e6}));
        let t5 = parse_config(&t5, Path::new("c.json")).unwrap();
        assert_eq!(hub, t5);
        assert_eq!(hub.num_experts, 8);
        assert_eq!(hub.rope_theta, 1e6);
        assert_eq!(hub.eos_token_ids, vec![5]);
    }

    #[test]
    fn errors_name_the_key() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("num_experts_per_tok");
        let e = parse_config(&v, Path::new("x/config.json")).unwrap_err().to_string();
        assert!(e.contains("x/config.json") && e.contains("num_experts_per_tok"), "{e}");
        let mut v = base();
        v["architectures"] = json!(["LlamaForCausalLM"]);
        let e = parse_config(&v, Path::new("config.json")).unwrap_err().to_string();
        assert!(e.contains("unsupported architecture 'LlamaForCausalLM'"), "{e}");
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = parse_config(&v, Path::new("config.json")).unwrap_err().to_string();
        assert!(e.contains("rope_scaling") && e.contains("yarn"), "{e}");
    }
}
