//! A GGUF model as the converter sees it: one file or the parts of a split one (llama.cpp's
//! `gguf-split`: `NAME-00001-of-0000N.gguf`, metadata in the first part, `split.count` in each),
//! every tensor found by name in whichever part holds it, and the `qwen3moe` metadata as a
//! [`ModelConfig`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use moescope_kernels::ggml::BlockType;

use super::file::{self as gguf, Gguf, GgufError, TensorInfo, Value};
use crate::convert::error::ConvertError;
use crate::model_config::{
    Arch, ExpertAct, Features, HybridConfig, LayerKind, ModelConfig, Sliding, Yarn, yarn_mscale,
};

/// A GGUF model in one or more parts.
pub struct GgufModel {
    /// The parts in order; the first holds the model's metadata.
    pub parts: Vec<Gguf>,
    /// Tensor name -> (part, index in that part's tensors).
    index: HashMap<String, (usize, usize)>,
}

/// Path of part `no` (1-based) of `count`, given the first part's path
/// (`x-00001-of-00003.gguf` -> `x-00002-of-00003.gguf`).
fn part_path(first: &Path, no: u64, count: u64) -> Option<PathBuf> {
    let name = first.file_name()?.to_str()?;
    let stem = name.strip_suffix(&format!("-00001-of-{count:05}.gguf"))?;
    Some(first.with_file_name(format!("{stem}-{no:05}-of-{count:05}.gguf")))
}

fn split_u64(g: &Gguf, key: &str) -> Result<Option<u64>, GgufError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| GgufError::Key {
            path: g.path.clone(),
            key: key.into(),
            what: format!("expected a whole number, found {}", v.type_name()),
        }),
    }
}

impl GgufModel {
    /// Open `path` and, when it is the first part of a split model, the other parts beside it.
    pub fn open(path: &Path) -> Result<GgufModel, GgufError> {
        let first = gguf::open(path)?;
        let count = split_u64(&first, "split.count")?.unwrap_or(1);
        let key_err =
            |g: &Gguf, key: &str, what: String| GgufError::Key { path: g.path.clone(), key: key.into(), what };
        if count == 0 || count > 9999 {
            return Err(key_err(&first, "split.count", format!("{count} parts is not a valid split")));
        }
        if split_u64(&first, "split.no")?.unwrap_or(0) != 0 {
            return Err(key_err(
                &first,
                "split.no",
                "this is not the first part of the split model: open part 1".into(),
            ));
        }
        let mut parts = vec![first];
        for no in 1..count {
            let p = part_path(&parts[0].path, no + 1, count).ok_or_else(|| {
                key_err(
                    &parts[0],
                    "split.count",
                    format!("{count} parts, but the file is not named NAME-00001-of-{count:05}.gguf"),
                )
            })?;
            let g = gguf::open(&p)?;
            if split_u64(&g, "split.no")? != Some(no) || split_u64(&g, "split.count")? != Some(count) {
                return Err(key_err(&g, "split.no", format!("expected part {} of {count}", no + 1)));
            }
            parts.push(g);
        }
        let mut index = HashMap::new();
        for (pi, g) in parts.iter().enumerate() {
            for (ti, t) in g.tensors.iter().enumerate() {
                if index.insert(t.name.clone(), (pi, ti)).is_some() {
                    return Err(GgufError::Tensor {
                        path: g.path.clone(),
                        name: t.name.clone(),
                        what: "appears in two parts of the split model".into(),
                    });
                }
            }
        }
        if let Some(n) = split_u64(&parts[0], "split.tensors.count")?
            && n != index.len() as u64
        {
            return Err(key_err(
                &parts[0],
                "split.tensors.count",
                format!("says {n} tensors; the parts hold {}", index.len()),
            ));
        }
        Ok(GgufModel { parts, index })
    }

    pub fn path(&self) -> &Path {
        &self.parts[0].path
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.parts[0].get(key)
    }

    /// A tensor's entry and the file that holds it.
    pub fn tensor(&self, name: &str) -> Option<(&Path, &TensorInfo)> {
        self.index.get(name).map(|&(p, t)| (self.parts[p].path.as_path(), &self.parts[p].tensors[t]))
    }

    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.parts.iter().flat_map(|g| g.tensors.iter())
    }

    pub fn config_err(&self, key: &str, msg: impl Into<String>) -> ConvertError {
        ConvertError::Config { path: self.path().to_path_buf(), key: key.into(), msg: msg.into() }
    }

    pub fn str_key(&self, key: &str) -> Result<Option<&str>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.config_err(key, format!("expected a string, found {}", v.type_name()))),
        }
    }

    pub fn u64_key(&self, key: &str) -> Result<Option<u64>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.config_err(key, format!("expected a whole number, found {}", v.type_name()))),
        }
    }

    pub(super) fn f64_key(&self, key: &str) -> Result<Option<f64>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.config_err(key, format!("expected a number, found {}", v.type_name()))),
        }
    }

    fn bool_key(&self, key: &str) -> Result<Option<bool>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.config_err(key, format!("expected true or false, found {}", v.type_name()))),
        }
    }

    pub(super) fn usize_req(&self, key: &str) -> Result<usize, ConvertError> {
        let v = self.u64_key(key)?.ok_or_else(|| self.config_err(key, "missing"))?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v < 1 << 32)
            .ok_or_else(|| self.config_err(key, format!("{v} is out of range")))
    }

    /// `ne` of a tensor the model must have.
    fn ne(&self, name: &str) -> Result<&[u64], ConvertError> {
        self.tensor(name)
            .map(|(_, t)| t.ne.as_slice())
            .ok_or_else(|| ConvertError::MissingTensor { dir: self.path().to_path_buf(), name: name.into() })
    }

    /// The model's configuration from the `qwen3moe`, `qwen35moe` or `qwen3next` metadata
    /// (llama.cpp's `qwen3moe.cpp`, `qwen35moe.cpp` and `qwen3next.cpp` read the same keys).
    /// Every layer is MoE, the top-k weights are renormalised (llama.cpp always does for these
    /// architectures), and the output layer is the embedding when `output.weight` is absent.
    pub fn config(&self) -> Result<ModelConfig, ConvertError> {
        let arch =
            self.str_key("general.architecture")?.ok_or_else(|| self.config_err("general.architecture", "missing"))?;
        let model_arch = match arch {
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen35moe" => Arch::Qwen35Moe,
            "qwen3next" => Arch::Qwen3Next,
            "gpt-oss" => Arch::GptOss,
            "glm4moe" => Arch::Glm4Moe,
            "deepseek2" => Arch::DeepseekV3,
            other => {
                return Err(ConvertError::Architecture {
                    path: self.path().to_path_buf(),
                    found: other.into(),
                    supported: "qwen3moe, qwen35moe, qwen3next, gpt-oss, glm4moe and deepseek2 GGUF files".into(),
                });
            }
        };
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = self.usize_req(&k("embedding_length"))?;
        let heads = self.usize_req(&k("attention.head_count"))?;
        let deepseek = model_arch == Arch::DeepseekV3;
        // deepseek2: attention.key_length is the absorbed form's (kv_lora + rope); a head's own
        // is key_length_mla (files from before the split state only the head's)
        let key_length = match self.u64_key(&k("attention.key_length_mla"))? {
            Some(d) if deepseek => Some(d),
            _ => self.u64_key(&k("attention.key_length"))?,
        };
        let head_dim = match key_length {
            Some(d) => d as usize,
            None if heads > 0 => hidden / heads,
            None => return Err(self.config_err(&k("attention.head_count"), "is 0")),
        };
        if let Some(v) = self.u64_key(&k("attention.value_length"))?
            && v as usize != head_dim
            && !deepseek
        {
            return Err(
                self.config_err(&k("attention.value_length"), format!("{v} differs from the key length {head_dim}"))
            );
        }
        if let Some(r) = self.u64_key(&k("rope.dimension_count"))?
            && r as usize != head_dim
            && !model_arch.is_hybrid()
            && !matches!(model_arch, Arch::Glm4Moe | Arch::DeepseekV3)
        {
            return Err(self.config_err(
                &k("rope.dimension_count"),
                format!("partial RoPE ({r} of {head_dim} dims) is not supported for qwen3moe"),
            ));
        }
        if let Some(t) = self.str_key(&k("rope.scaling.type"))?
            && t != "none"
            && t != "yarn"
        {
            return Err(self.config_err(&k("rope.scaling.type"), format!("RoPE scaling '{t}' is not supported")));
        }
        let embd = self.ne("token_embd.weight")?;
        if embd.len() != 2 || embd[0] as usize != hidden {
            return Err(self.tensor_err(
                "token_embd.weight",
                format!("dimensions {embd:?} do not match embedding_length {hidden}"),
            ));
        }
        let vocab = embd[1] as usize;
        let experts = self.usize_req(&k("expert_count"))?;
        let moe_i = match self.u64_key(&k("expert_feed_forward_length"))? {
            Some(i) => i as usize,
            None => self.ne("blk.0.ffn_gate_exps.weight").map(|ne| ne.get(1).copied().unwrap_or(0) as usize)?,
        };
        let token = |key: &str| -> Result<Option<u32>, ConvertError> {
            match self.u64_key(key)? {
                Some(id) if (id as usize) < vocab => Ok(Some(id as u32)),
                Some(id) => Err(self.config_err(key, format!("token {id} is outside the vocabulary of {vocab}"))),
                None => Ok(None),
            }
        };
        let mut eos = vec![];
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = token(key)?
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        // hybrids: block_count counts the multi-token-prediction layers after the model's own
        let blocks = self.usize_req(&k("block_count"))?;
        let mtp = self.u64_key(&k("nextn_predict_layers"))?.unwrap_or(0) as usize;
        let layers = blocks
            .checked_sub(mtp)
            .filter(|&n| n > 0)
            .ok_or_else(|| self.config_err(&k("nextn_predict_layers"), format!("{mtp} of {blocks} blocks")))?;
        // a count the file states is checked against what it holds before anything is sized by it
        let last = format!("blk.{}.attn_norm.weight", layers - 1);
        if self.tensor(&last).is_none() {
            return Err(self.config_err(&k("block_count"), format!("{blocks} blocks, but the file has no {last}")));
        }
        let hybrid = match model_arch.is_hybrid() {
            true => Some(self.hybrid_config(arch, layers, head_dim)?),
            false => None,
        };
        let cfg = ModelConfig {
            arch: model_arch,
            vocab_size: vocab,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            // latent attention's heads each expand their own keys (the file states 1: the
            // absorbed form's one shared row)
            num_key_value_heads: match deepseek {
                true => heads,
                false => self.u64_key(&k("attention.head_count_kv"))?.map_or(heads, |v| v as usize),
            },
            head_dim,
            intermediate_size: self.u64_key(&k("feed_forward_length"))?.unwrap_or(0) as usize,
            moe_intermediate_size: moe_i,
            num_experts: experts,
            num_experts_per_tok: self.usize_req(&k("expert_used_count"))?,
            // gpt-oss: the softmax over the chosen k already sums to one; GLM-4.5 and DeepSeek
            // say (llama.cpp: not without the key; its converters write it when true)
            norm_topk_prob: match model_arch {
                Arch::GptOss => false,
                Arch::Glm4Moe | Arch::DeepseekV3 => self.bool_key(&k("expert_weights_norm"))?.unwrap_or(false),
                _ => true,
            },
            decoder_sparse_step: 1,
            mlp_only_layers: match model_arch {
                Arch::Glm4Moe | Arch::DeepseekV3 => {
                    (0..self.u64_key(&k("leading_dense_block_count"))?.unwrap_or(0) as usize).collect()
                }
                _ => vec![],
            },
            rms_norm_eps: self.f64_key(&k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
            rope_theta: self.f64_key(&k("rope.freq_base"))?.unwrap_or(10000.0),
            max_position_embeddings: self.u64_key(&k("context_length"))?.unwrap_or(32768) as usize,
            tie_word_embeddings: self.tensor("output.weight").is_none(),
            bos_token_id: token("tokenizer.ggml.bos_token_id")?,
            eos_token_ids: eos,
            hybrid,
            features: match model_arch {
                Arch::GptOss => self.gpt_oss_features(arch, layers)?,
                Arch::Glm4Moe => {
                    Features { rope_yarn: self.plain_yarn(arch)?, ..self.glm_features(arch, head_dim, moe_i)? }
                }
                Arch::DeepseekV3 => self.deepseek_features(arch, head_dim, moe_i)?,
                _ => Features { rope_yarn: self.plain_yarn(arch)?, ..Default::default() },
            },
        };
        cfg.validate().map_err(|msg| self.config_err(arch, msg))?;
        Ok(cfg)
    }

    /// gpt-oss's attention and experts (llama.cpp's `openai-moe.cpp`): biases, sinks, the
    /// clamped SwiGLU (llama.cpp's fixed limit 7 and alpha 1.702), `attention.sliding_window`
    /// in the layers `attention.sliding_window_pattern` marks (an array of booleans, or a
    /// period: n - 1 sliding layers then a full one; every other layer from the first by
    /// default), YaRN from `rope.scaling.*`. The files carry no `truncate`: gpt-oss's own
    /// (false) is used, as transformers does with its config; llama.cpp always truncates.
    fn gpt_oss_features(&self, arch: &str, layers: usize) -> Result<Features, ConvertError> {
        let k = |s: &str| format!("{arch}.{s}");
        let window = self.usize_req(&k("attention.sliding_window"))?;
        let pattern_key = k("attention.sliding_window_pattern");
        let slides: Vec<bool> = match self.get(&pattern_key) {
            Some(Value::Array(_, v)) => {
                if v.len() != layers {
                    return Err(self.config_err(&pattern_key, format!("{} entries for {layers} layers", v.len())));
                }
                v.iter()
                    .map(|x| match x {
                        Value::Bool(b) => Ok(*b),
                        _ => Err(self.config_err(&pattern_key, "expected booleans")),
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => {
                let n = self.u64_key(&pattern_key)?.unwrap_or(2) as usize;
                (0..layers).map(|l| n == 0 || l % n.max(1) < n.saturating_sub(1)).collect()
            }
        };
        let sliding_layers: Vec<usize> = (0..layers).filter(|&l| slides[l]).collect();
        let rope_yarn = match self.str_key(&k("rope.scaling.type"))? {
            Some("yarn") => {
                let factor = self.f64_key(&k("rope.scaling.factor"))?.unwrap_or(1.0);
                let orig = self.usize_req(&k("rope.scaling.original_context_length"))?;
                let default_factor = yarn_mscale(factor, 1.0);
                Some(Yarn {
                    factor,
                    beta_fast: self.f64_key(&k("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
                    beta_slow: self.f64_key(&k("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
                    original_max_position_embeddings: orig,
                    truncate: false,
                    attention_factor: self.f64_key(&k("rope.scaling.yarn_attn_factor"))?.unwrap_or(default_factor),
                })
            }
            _ => None,
        };
        Ok(Features {
            attention_bias: true,
            attention_sinks: true,
            sliding: (!sliding_layers.is_empty()).then_some(Sliding { window, layers: sliding_layers }),
            rope_yarn,
            expert_bias: true,
            expert_act: ExpertAct::ClampedSwiglu { alpha: 1.702, limit: 7.0 },
            ..Features::default()
        })
    }

    /// A hybrid's linear-attention layers and shared expert: `ssm.group_count` key heads of
    /// `ssm.state_size`, `ssm.time_step_rank` value heads sharing `ssm.inner_size`, the layer
    /// kinds from `attention.recurrent_layers` (or every `full_attention_interval`-th layer full
    /// attention), `rope.dimension_count` rotary dims. Value heads stay in the file's tiled order
    /// (`value_heads_tiled`: value head h reads key head h mod nk).
    fn hybrid_config(&self, arch: &str, layers: usize, head_dim: usize) -> Result<HybridConfig, ConvertError> {
        let k = |s: &str| format!("{arch}.{s}");
        let value_heads = self.usize_req(&k("ssm.time_step_rank"))?;
        let inner = self.usize_req(&k("ssm.inner_size"))?;
        if value_heads == 0 || !inner.is_multiple_of(value_heads) {
            return Err(
                self.config_err(&k("ssm.inner_size"), format!("{inner} is not a multiple of {value_heads} heads"))
            );
        }
        let layer_types = match self.get(&k("attention.recurrent_layers")) {
            Some(Value::Array(_, a)) if a.len() >= layers => a[..layers]
                .iter()
                .map(|v| match v {
                    Value::Bool(true) => Ok(LayerKind::LinearAttention),
                    Value::Bool(false) => Ok(LayerKind::FullAttention),
                    _ => Err(self.config_err(&k("attention.recurrent_layers"), "expected booleans")),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(self.config_err(&k("attention.recurrent_layers"), format!("expected {layers} booleans")));
            }
            None => {
                let every = self.usize_req(&k("full_attention_interval"))?.max(1);
                (0..layers)
                    .map(|l| {
                        if (l + 1).is_multiple_of(every) {
                            LayerKind::FullAttention
                        } else {
                            LayerKind::LinearAttention
                        }
                    })
                    .collect()
            }
        };
        Ok(HybridConfig {
            layer_types,
            rotary_dim: self.u64_key(&k("rope.dimension_count"))?.map_or(head_dim / 4, |r| r as usize),
            conv_kernel: self.usize_req(&k("ssm.conv_kernel"))?,
            key_heads: self.usize_req(&k("ssm.group_count"))?,
            key_head_dim: self.usize_req(&k("ssm.state_size"))?,
            value_heads,
            value_head_dim: inner / value_heads,
            shared_expert_intermediate_size: self.usize_req(&k("expert_shared_feed_forward_length"))?,
            value_heads_tiled: arch == "qwen35moe",
            a_stored_negated_exp: true,
        })
    }

    pub fn tensor_err(&self, name: &str, msg: impl Into<String>) -> ConvertError {
        let file = self.tensor(name).map_or_else(|| self.path().to_path_buf(), |(p, _)| p.to_path_buf());
        ConvertError::Tensor { file, name: name.into(), msg: msg.into() }
    }

    /// The block type of a tensor, or an error naming it and listing what moescope reads.
    pub fn block_type(&self, name: &str) -> Result<BlockType, ConvertError> {
        let (_, t) = self
            .tensor(name)
            .ok_or_else(|| ConvertError::MissingTensor { dir: self.path().to_path_buf(), name: name.into() })?;
        BlockType::from_ggml_id(t.ty.id).ok_or_else(|| {
            let names: Vec<&str> = BlockType::ALL.iter().map(|t| t.name()).collect();
            self.tensor_err(name, format!("type {} is not supported (moescope reads {})", t.ty.name, names.join(", ")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_part_names() {
        let p = Path::new("/m/Qwen3-30B-Q4_K_M-00001-of-00003.gguf");
        assert_eq!(part_path(p, 3, 3), Some(PathBuf::from("/m/Qwen3-30B-Q4_K_M-00003-of-00003.gguf")));
        assert_eq!(part_path(p, 2, 4), None, "the count must match the name");
        assert_eq!(part_path(Path::new("/m/model.gguf"), 2, 2), None);
    }
}
