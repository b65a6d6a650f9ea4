//! The demo model built into the binary, used when no model is given.
//!
//! It is a small Qwen3-MoE with a real tokenizer (a byte-level BPE of 4096 tokens trained on
//! the Rust documentation, with Qwen's special tokens and the Qwen3 chat template; see
//! `tests/reference/make_demo_tokenizer.py`) and, for now, seeded random weights: it speaks
//! gibberish, but every part of the engine runs on it. On first use it is written as a q4
//! package into the user's cache directory, through the same writer as `moescope convert`, so
//! its experts live on disk like a real model's.

use std::path::{Path, PathBuf};

use crate::convert::{ConvertError, ConvertOptions, QuantMode, TensorSource, add_tokenizer_eos, write_package};
use crate::engine::sampler::Rng;
use crate::model::config::{Arch, ModelConfig};
use crate::package::{TokenizerInfo, layout::VERSION};

const TOKENIZER_JSON: &str = include_str!("tokenizer.json");
const TOKENIZER_CONFIG: &str = include_str!("tokenizer_config.json");

/// Bumped whenever the demo's weights or shape change, so a stale cached package is replaced.
const DEMO_REVISION: u32 = 2;

/// The demo streams its experts through a pool of half their size by default, so even this
/// small model shows real hits, misses, prefetches and reads.
pub const DEFAULT_POOL_FRACTION: f64 = 0.5;

pub fn config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3Moe,
        vocab_size: 4096,
        hidden_size: 256,
        num_hidden_layers: 6,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        intermediate_size: 512,
        moe_intermediate_size: 256,
        num_experts: 32,
        num_experts_per_tok: 4,
        norm_topk_prob: true,
        decoder_sparse_step: 1,
        mlp_only_layers: vec![],
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        max_position_embeddings: 4096,
        tie_word_embeddings: true,
        bos_token_id: None,
        eos_token_ids: vec![],
    }
}

/// Seeded N(0, 0.02) weights (norms 1), each row drawn from its own seed so any row range can
/// be produced on its own.
struct RandomWeights {
    shapes: std::collections::HashMap<String, Vec<usize>>,
}

impl RandomWeights {
    fn new(cfg: &ModelConfig) -> RandomWeights {
        let mut shapes = std::collections::HashMap::new();
        for t in crate::convert::plan::dense_tensors(cfg) {
            shapes.insert(t.name, t.shape);
        }
        for l in cfg.moe_layers() {
            for e in 0..cfg.num_experts {
                for (n, s) in crate::convert::plan::expert_tensors(cfg, l, e) {
                    shapes.insert(n, s.to_vec());
                }
            }
        }
        RandomWeights { shapes }
    }
}

impl TensorSource for RandomWeights {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.shapes.get(name).cloned()
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        let shape = self.shapes.get(name).cloned().unwrap_or_default();
        let cols = *shape.last().unwrap_or(&0);
        out.clear();
        if shape.len() == 1 {
            out.resize(cols, 1.0);
            return Ok(());
        }
        let base = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        for r in r0..r0 + n {
            let mut rng = Rng::new(base ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for _ in 0..cols {
                // Box-Muller
                let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                out.push((z * 0.02) as f32);
            }
        }
        Ok(())
    }

    fn origin(&self, _name: &str) -> String {
        "built-in demo".into()
    }
}

fn tokenizer_info() -> TokenizerInfo {
    let cfg: serde_json::Value = serde_json::from_str(TOKENIZER_CONFIG).unwrap_or_default();
    let s = |k: &str| cfg.get(k).and_then(|v| v.as_str()).map(String::from);
    TokenizerInfo {
        tokenizer_json: Some(TOKENIZER_JSON.to_string()),
        chat_template: s("chat_template"),
        bos_token: s("bos_token"),
        eos_token: s("eos_token"),
        pad_token: s("pad_token"),
    }
}

/// Path of the demo package in `cache_dir`, written there first if missing.
/// Returns (path, whether it was just written).
pub fn ensure_package(cache_dir: &Path) -> Result<(PathBuf, bool), ConvertError> {
    let path = cache_dir.join(format!("demo-r{DEMO_REVISION}-v{VERSION}-q4.moe"));
    if path.exists() {
        return Ok((path, false));
    }
    std::fs::create_dir_all(cache_dir)
        .map_err(|source| ConvertError::Io { path: cache_dir.to_path_buf(), error: source })?;
    let mut cfg = config();
    let tok = tokenizer_info();
    add_tokenizer_eos(&mut cfg, &tok);
    let src = RandomWeights::new(&cfg);
    let opts = ConvertOptions {
        default_pool_fraction: Some(DEFAULT_POOL_FRACTION),
        ..ConvertOptions::new(QuantMode::Q4 { max_group: 128 })
    };
    write_package(&src, &cfg, tok, "moescope demo (random weights)", opts, &path)?;
    Ok((path, true))
}
