//! config.json (and generation_config.json) of a HuggingFace checkpoint -> [`ModelConfig`].
//!
//! Both spellings are read: the hub's (`num_experts`, top-level `rope_theta`, `torch_dtype`) and
//! transformers 5's (`num_local_experts`, `rope_parameters{rope_theta}`, `dtype`).

use std::path::Path;

use serde_json::Value;

use super::error::ConvertError;
use crate::model_config::{Arch, Features, HybridConfig, LayerKind, MAX_LAYERS, ModelConfig};

mod families;
use families::{deepseek_features, glm_features, gpt_oss_features};

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
    let arch = detect_arch(v, path)?;
    // Qwen3.5 keeps the text model's keys under text_config (beside vision_config, ignored)
    let (t, prefix) = match (arch, v.get("text_config")) {
        (Arch::Qwen35Moe, Some(t)) if t.is_object() => (t, "text_config."),
        _ => (v, ""),
    };
    let k = Keys { v: t, prefix, path };

    let gpt_oss = arch == Arch::GptOss;
    let glm = arch == Arch::Glm4Moe;
    let deepseek = arch == Arch::DeepseekV3;
    // GLM-4.5 and DeepSeek-V3 share the hub's MoE spellings (n_routed_experts,
    // first_k_dense_replace); DeepSeek reads its own attention_bias
    let sigmoid_family = glm || deepseek;
    if !gpt_oss && !sigmoid_family && k.bool("attention_bias", false)? {
        return Err(k.err("attention_bias", "true is not supported (these models have no attention biases)"));
    }
    if let Some(q) = t.get("quantization_config").filter(|q| !q.is_null()) {
        // gpt-oss's release: its experts in MXFP4 (convert::gpt_oss reads them)
        let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("unknown");
        if !(gpt_oss && method == "mxfp4") {
            return Err(k.err("quantization_config", &format!("quant_method '{method}' is not supported")));
        }
    }
    if k.bool("use_sliding_window", false)? {
        return Err(k.err("use_sliding_window", "sliding-window attention is not supported"));
    }
    if let Some(act) = t.get("hidden_act").and_then(|a| a.as_str())
        && act != "silu"
    {
        return Err(k.err("hidden_act", &format!("'{act}' is not supported (only silu)")));
    }
    // rope: top-level (hub) or rope_parameters (transformers 5); only plain RoPE. Qwen3.5's
    // interleaved MRoPE is plain RoPE for text, where all three position ids are equal.
    let rp = t.get("rope_parameters").filter(|x| !x.is_null());
    // YaRN (read below: gpt-oss and DeepSeek-V3 in their families' keys, the others as
    // transformers reads any model's `rope_scaling`)
    let mut yarn_at = None;
    for (key, scaling) in [("rope_scaling", t.get("rope_scaling")), ("rope_parameters", rp)] {
        if let Some(s) = scaling.filter(|x| !x.is_null()) {
            let ty = s.get("rope_type").or_else(|| s.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
            match ty {
                "default" => {}
                "yarn" => yarn_at = Some((key, s)),
                _ => return Err(k.err(key, &format!("RoPE scaling '{ty}' is not supported yet"))),
            }
        }
    }
    let rope_key = |key: &str| -> Result<Option<f64>, ConvertError> {
        match k.f64(key)? {
            Some(x) => Ok(Some(x)),
            None => match rp.and_then(|p| p.get(key)) {
                Some(x) => {
                    x.as_f64().map(Some).ok_or_else(|| k.err(&format!("rope_parameters.{key}"), "expected a number"))
                }
                None => Ok(None),
            },
        }
    };
    let rope_theta = rope_key("rope_theta")?.unwrap_or(10000.0); // transformers' default
    // the hub's name (GLM-4.5 and DeepSeek-V3: n_routed_experts), or transformers 5's
    let experts_key = if sigmoid_family { "n_routed_experts" } else { "num_experts" };
    let num_experts = match k.usize(experts_key)? {
        Some(n) => n,
        None => k.usize("num_local_experts")?.ok_or_else(|| k.err(experts_key, "missing (nor num_local_experts)"))?,
    };
    let hidden_size = k.req("hidden_size")?;
    let num_attention_heads = k.req("num_attention_heads")?;
    if num_attention_heads == 0 {
        return Err(k.err("num_attention_heads", "must be positive"));
    }
    let num_hidden_layers = k.req("num_hidden_layers")?;
    // before the hybrids' layer table is sized by it (validate checks the rest)
    if num_hidden_layers > MAX_LAYERS {
        return Err(k.err(
            "num_hidden_layers",
            &format!("num_hidden_layers ({num_hidden_layers}) is beyond what moescope runs (at most {MAX_LAYERS})"),
        ));
    }
    // DeepSeek-V3: a query / key head is its nope and rope dims (transformers' head_dim there is
    // the rope part alone)
    let head_dim = match deepseek {
        true => k.req("qk_nope_head_dim")? + k.req("qk_rope_head_dim")?,
        false => k.usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads),
    };
    let mlp_only_layers = match t.get("mlp_only_layers") {
        _ if arch == Arch::Qwen35Moe => vec![], // every Qwen3.5 layer is MoE
        // GLM-4.5's and DeepSeek-V3's first layers are dense (transformers' default: one)
        _ if sigmoid_family => {
            let dense = k.usize("first_k_dense_replace")?.unwrap_or(1);
            if dense > num_hidden_layers {
                return Err(k.err("first_k_dense_replace", "is more than num_hidden_layers"));
            }
            (0..dense).collect()
        }
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().map(|n| n as usize).ok_or_else(|| k.err("mlp_only_layers", "expected layer indices")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(k.err("mlp_only_layers", "expected a list of layer indices")),
    };
    let features = match arch {
        Arch::GptOss => gpt_oss_features(&k, num_hidden_layers, yarn_at)?,
        Arch::DeepseekV3 => deepseek_features(&k, yarn_at, k.usize("moe_intermediate_size")?.unwrap_or(0))?,
        Arch::Glm4Moe => glm_features(
            &k,
            head_dim,
            rope_key("partial_rotary_factor")?,
            k.usize("moe_intermediate_size")?.unwrap_or(0),
        )?,
        _ => Features::default(),
    };
    let features = match yarn_at {
        Some((key, y)) if features.rope_yarn.is_none() => {
            Features { rope_yarn: Some(families::yarn_of(&k, key, y)?), ..features }
        }
        _ => features,
    };
    let hybrid = if arch.is_hybrid() {
        let factor = rope_key("partial_rotary_factor")?.unwrap_or(0.25);
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(k.err("partial_rotary_factor", "must be in (0, 1]"));
        }
        Some(HybridConfig {
            layer_types: layer_types(&k, num_hidden_layers)?,
            rotary_dim: (head_dim as f64 * factor) as usize,
            conv_kernel: k.req("linear_conv_kernel_dim")?,
            key_heads: k.req("linear_num_key_heads")?,
            key_head_dim: k.req("linear_key_head_dim")?,
            value_heads: k.req("linear_num_value_heads")?,
            value_head_dim: k.req("linear_value_head_dim")?,
            shared_expert_intermediate_size: k.req("shared_expert_intermediate_size")?,
            value_heads_tiled: false,
            a_stored_negated_exp: false,
        })
    } else {
        None
    };
    // a tie stated at the top level (Qwen3.5's composite config) wins over the text model's
    let tie = match v.get("tie_word_embeddings") {
        Some(Value::Bool(b)) => *b,
        _ => k.bool("tie_word_embeddings", false)?,
    };
    let mut eos = token_ids(t, "eos_token_id", path)?;
    if !prefix.is_empty() {
        for id in token_ids(v, "eos_token_id", path)? {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let bos = token_ids(t, "bos_token_id", path)?;
    let cfg = ModelConfig {
        arch,
        vocab_size: k.req("vocab_size")?,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        // every latent-attention head has its own expanded keys and values
        num_key_value_heads: match deepseek {
            true => num_attention_heads,
            false => k.usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
        },
        head_dim,
        intermediate_size: k.usize("intermediate_size")?.unwrap_or(0),
        // gpt-oss's experts are `intermediate_size` wide (it has no dense layers)
        moe_intermediate_size: k
            .usize(if gpt_oss { "intermediate_size" } else { "moe_intermediate_size" })?
            .unwrap_or(0),
        num_experts,
        num_experts_per_tok: k.req("num_experts_per_tok")?,
        // Qwen3.5 always renormalises the top-k (the key is gone); Qwen3-Next defaults to it
        norm_topk_prob: match arch {
            Arch::Qwen35Moe => true,
            Arch::Qwen3Next => k.bool("norm_topk_prob", true)?,
            Arch::Qwen3Moe => k.bool("norm_topk_prob", false)?,
            Arch::Glm4Moe | Arch::DeepseekV3 => k.bool("norm_topk_prob", true)?,
            // the softmax over the chosen k already sums to one
            Arch::GptOss => false,
        },
        decoder_sparse_step: if arch == Arch::Qwen35Moe { 1 } else { k.usize("decoder_sparse_step")?.unwrap_or(1) },
        mlp_only_layers,
        rms_norm_eps: k.f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta,
        max_position_embeddings: k.usize("max_position_embeddings")?.unwrap_or(32768),
        tie_word_embeddings: tie,
        bos_token_id: bos.first().copied(),
        eos_token_ids: eos,
        hybrid,
        features,
    };
    cfg.validate().map_err(|msg| {
        let key = msg.split_whitespace().next().unwrap_or("config").to_string();
        ConvertError::Config { path: path.to_path_buf(), key: format!("{prefix}{key}"), msg }
    })?;
    Ok(cfg)
}

/// The architecture from `architectures` (or, when that is absent, `model_type`).
fn detect_arch(v: &Value, path: &Path) -> Result<Arch, ConvertError> {
    let archs: Vec<&str> = v
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    let model_type = v.get("model_type").and_then(|s| s.as_str()).unwrap_or("");
    if archs.contains(&"DeepseekV32ForCausalLM") || model_type == "deepseek_v32" {
        return Err(ConvertError::Config {
            path: path.to_path_buf(),
            key: "architectures".into(),
            msg:
                "DeepSeek-V3.2's sparse attention (its indexer) is not supported; DeepSeek-V3, V3.1, R1 and Kimi-K2 are"
                    .into(),
        });
    }
    let by_class = |c: &str| match c {
        "Qwen3MoeForCausalLM" => Some(Arch::Qwen3Moe),
        "Qwen3NextForCausalLM" => Some(Arch::Qwen3Next),
        "Qwen3_5MoeForConditionalGeneration" | "Qwen3_5MoeForCausalLM" => Some(Arch::Qwen35Moe),
        "GptOssForCausalLM" => Some(Arch::GptOss),
        "Glm4MoeForCausalLM" => Some(Arch::Glm4Moe),
        "DeepseekV3ForCausalLM" => Some(Arch::DeepseekV3),
        _ => None,
    };
    let by_type = match model_type {
        "qwen3_moe" => Some(Arch::Qwen3Moe),
        "qwen3_next" => Some(Arch::Qwen3Next),
        "qwen3_5_moe" | "qwen3_5_moe_text" => Some(Arch::Qwen35Moe),
        "gpt_oss" => Some(Arch::GptOss),
        "glm4_moe" => Some(Arch::Glm4Moe),
        "deepseek_v3" | "kimi_k2" => Some(Arch::DeepseekV3),
        _ => None,
    };
    let found = if archs.is_empty() { by_type } else { archs.iter().find_map(|c| by_class(c)) };
    found.ok_or_else(|| ConvertError::Architecture {
        path: path.to_path_buf(),
        found: if archs.is_empty() { format!("model_type {model_type}") } else { archs.join(", ") },
        supported: Arch::ALL.map(|a| a.hf_class()).join(", "),
    })
}

/// `layer_types`, or the layers `full_attention_interval` makes full attention (every
/// interval-th; transformers' default interval is 4).
fn layer_types(k: &Keys, layers: usize) -> Result<Vec<LayerKind>, ConvertError> {
    match k.v.get("layer_types") {
        Some(Value::Array(a)) => {
            if a.len() != layers {
                return Err(k.err("layer_types", &format!("{} entries for {layers} layers", a.len())));
            }
            a.iter()
                .enumerate()
                .map(|(i, x)| match x.as_str() {
                    Some("full_attention") => Ok(LayerKind::FullAttention),
                    Some("linear_attention") => Ok(LayerKind::LinearAttention),
                    _ => Err(k.err(
                        &format!("layer_types[{i}]"),
                        &format!("unknown layer kind {x} (expected \"full_attention\" or \"linear_attention\")"),
                    )),
                })
                .collect()
        }
        None | Some(Value::Null) => {
            let every = k.usize("full_attention_interval")?.unwrap_or(4);
            if every == 0 {
                return Err(k.err("full_attention_interval", "must be positive"));
            }
            Ok((0..layers)
                .map(
                    |i| {
                        if (i + 1).is_multiple_of(every) {
                            LayerKind::FullAttention
                        } else {
                            LayerKind::LinearAttention
                        }
                    },
                )
                .collect())
        }
        Some(_) => Err(k.err("layer_types", "expected a list of layer kinds")),
    }
}

/// Typed reads of one config object; errors name the key with its place (`text_config.`).
pub(super) struct Keys<'a> {
    pub(super) v: &'a Value,
    prefix: &'a str,
    path: &'a Path,
}

impl Keys<'_> {
    pub(super) fn err(&self, key: &str, msg: &str) -> ConvertError {
        ConvertError::Config { path: self.path.to_path_buf(), key: format!("{}{key}", self.prefix), msg: msg.into() }
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>, ConvertError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(key, "expected a non-negative integer")),
        }
    }

    pub(super) fn req(&self, key: &str) -> Result<usize, ConvertError> {
        self.usize(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>, ConvertError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| self.err(key, "expected a number")),
        }
    }

    pub(super) fn bool(&self, key: &str, default: bool) -> Result<bool, ConvertError> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| self.err(key, "expected true or false")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::ExpertAct;
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
        assert!(e.contains("rope_scaling.original_max_position_embeddings") && e.contains("missing"), "{e}");
        v["rope_scaling"] = json!({"rope_type": "dynamic", "factor": 4.0});
        let e = parse_config(&v, Path::new("config.json")).unwrap_err().to_string();
        assert!(e.contains("rope_scaling") && e.contains("'dynamic' is not supported"), "{e}");
        // Qwen3's YaRN as its model card adds it: transformers' attention factor 0.1 ln 4 + 1
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let y = parse_config(&v, Path::new("config.json")).unwrap().features.rope_yarn.unwrap();
        assert_eq!((y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow), (4.0, 32768, 32.0, 1.0));
        assert!((y.attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12, "{y:?}");
    }

    fn gpt_oss() -> Value {
        json!({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 100,
               "hidden_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 32, "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 3,
               "sliding_window": 20, "rope_theta": 150000.0, "swiglu_limit": 7.0,
               "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
               "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": false, "original_max_position_embeddings": 4096}})
    }

    #[test]
    fn gpt_oss_reads_windows_in_any_order_yarn_and_its_experts() {
        let c = parse_config(&gpt_oss(), Path::new("c.json")).unwrap();
        assert_eq!(c.arch, Arch::GptOss);
        assert_eq!((c.moe_intermediate_size, c.num_experts, c.norm_topk_prob), (64, 8, false));
        assert_eq!((c.window(0), c.window(1), c.window(2), c.window(3)), (None, Some(20), Some(20), None));
        let f = &c.features;
        assert!(f.attention_bias && f.attention_sinks && f.expert_bias);
        assert_eq!(f.expert_act, ExpertAct::ClampedSwiglu { alpha: 1.702, limit: 7.0 });
        let y = f.rope_yarn.clone().unwrap();
        // transformers' default attention factor: 0.1 ln(32) + 1
        assert!((y.attention_factor - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-12);
        // YaRN keeps the fastest dims as they are and divides the slowest by the factor
        let plain = |i: usize| 1.0 / 150000f32.powf((2 * i) as f32 / 32.0);
        let inv = y.inv_freq(150000.0, 32);
        assert_eq!(inv[0], plain(0));
        assert!((inv[15] - plain(15) / 32.0).abs() <= 1e-6 * plain(15));
        // transformers 5's spelling, and its default layer kinds (every other layer slides)
        let mut t5 = gpt_oss();
        let o = t5.as_object_mut().unwrap();
        let mut rp = o.remove("rope_scaling").unwrap();
        rp["rope_theta"] = o.remove("rope_theta").unwrap();
        o.insert("rope_parameters".into(), rp);
        o.remove("layer_types");
        let d = parse_config(&t5, Path::new("c.json")).unwrap();
        assert_eq!(d.features.rope_yarn, f.rope_yarn);
        assert_eq!((d.window(0), d.window(1), d.window(2), d.window(3)), (Some(20), None, Some(20), None));
        // what is refused names its key
        let mut v = gpt_oss();
        v["layer_types"][2] = json!("chunked_attention");
        let e = parse_config(&v, Path::new("c.json")).unwrap_err().to_string();
        assert!(e.contains("layer_types[2]") && e.contains("chunked_attention"), "{e}");
        let mut v = gpt_oss();
        v["quantization_config"] = json!({"quant_method": "gptq"});
        let e = parse_config(&v, Path::new("c.json")).unwrap_err().to_string();
        assert!(e.contains("quantization_config") && e.contains("gptq"), "{e}");
    }

    fn next() -> Value {
        json!({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 100,
               "hidden_size": 80, "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 32, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
               "shared_expert_intermediate_size": 24, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
               "linear_value_head_dim": 24, "linear_num_key_heads": 2, "linear_num_value_heads": 6,
               "full_attention_interval": 2, "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    }

    #[test]
    fn hybrid_layer_kinds_come_from_either_key_and_rope_from_either_place() {
        let hub = parse_config(&next(), Path::new("c.json")).unwrap();
        let hy = hub.hybrid.clone().unwrap();
        use LayerKind::{FullAttention as F, LinearAttention as L};
        assert_eq!(hy.layer_types, vec![L, F, L, F, L]);
        assert_eq!((hy.rotary_dim, hy.conv_dim(), hy.value_dim()), (8, 2 * 2 * 16 + 6 * 24, 6 * 24));
        assert!(hub.norm_topk_prob, "Qwen3-Next renormalises unless told not to");
        // transformers 5: layer_types and rope_parameters
        let mut t5 = next();
        let o = t5.as_object_mut().unwrap();
        o.remove("full_attention_interval");
        o.remove("rope_theta");
        o.remove("partial_rotary_factor");
        o.insert(
            "layer_types".into(),
            json!(["linear_attention", "full_attention", "linear_attention", "full_attention", "linear_attention"]),
        );
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}),
        );
        assert_eq!(parse_config(&t5, Path::new("c.json")).unwrap(), hub);
        // Qwen3.5: the same keys under text_config; always renormalised, every layer MoE
        let mut text = next();
        text.as_object_mut().unwrap().insert("norm_topk_prob".into(), json!(false));
        text.as_object_mut().unwrap().insert("mlp_only_layers".into(), json!([1]));
        let q35 = json!({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                         "text_config": text, "vision_config": {"depth": 1}, "tie_word_embeddings": true});
        let c = parse_config(&q35, Path::new("c.json")).unwrap();
        assert_eq!(c.arch, Arch::Qwen35Moe);
        assert!(c.norm_topk_prob && c.mlp_only_layers.is_empty() && c.tie_word_embeddings);
        assert_eq!(c.hybrid, hub.hybrid);
    }

    #[test]
    fn hybrid_errors_name_the_key() {
        let cases: [(&str, Value, &str); 4] = [
            (
                "layer_types[1]",
                json!([
                    "linear_attention",
                    "sliding_attention",
                    "linear_attention",
                    "full_attention",
                    "linear_attention"
                ]),
                "unknown layer kind",
            ),
            ("layer_types", json!(["full_attention"]), "1 entries for 5 layers"),
            ("linear_num_value_heads", json!(5), "not a multiple of linear_num_key_heads"),
            ("linear_key_head_dim", Value::Null, "missing"),
        ];
        for (key, value, needle) in cases {
            let mut v = next();
            let target = if key.starts_with("layer_types") { "layer_types" } else { key };
            v.as_object_mut().unwrap().insert(target.into(), value);
            let e = parse_config(&v, Path::new("x/config.json")).unwrap_err().to_string();
            assert!(e.contains("x/config.json") && e.contains(key) && e.contains(needle), "{key}: {e}");
        }
        // under text_config the key says so
        let q35 = json!({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": {"hidden_size": 8}});
        let e = parse_config(&q35, Path::new("c.json")).unwrap_err().to_string();
        assert!(e.contains("text_config."), "{e}");
    }
}
