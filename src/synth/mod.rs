//! `moescope synth`: a package of a real model's shape with seeded random weights, written
//! directly in the package format (no checkpoint), with the real tokenizer and chat template.
//! Its text is noise; its sizes, reads, routing load and memory are the real model's, which is
//! what streaming at full depth needs measured when the weights cannot be downloaded.

pub mod shapes;
pub mod tokenizers;
pub mod weights;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::convert::{ConvertError, ConvertOptions, Origin, QuantMode, add_tokenizer_eos, write_package_with};
use crate::engine::tokenizer::Tok;
use crate::model_config::ModelConfig;
use crate::package::layout::Synthetic;
pub use shapes::{SHAPES, Shape};

/// What to synthesize.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub shape: Shape,
    /// Overrides of the shape's layer count, expert count and vocabulary.
    pub layers: Option<usize>,
    pub experts: Option<usize>,
    pub vocab: Option<usize>,
    pub quant: QuantMode,
    pub seed: u64,
}

impl SynthSpec {
    /// The model configuration, overrides applied; the message names the bad override.
    pub fn config(&self) -> Result<ModelConfig, String> {
        let mut c = self.shape.config();
        if let Some(l) = self.layers {
            if l == 0 {
                return Err("--layers must be positive".into());
            }
            c.num_hidden_layers = l;
            if let Some(hy) = &mut c.hybrid {
                hy.layer_types = shapes::layer_types(l, 4);
            }
            if c.features.sliding.is_some() {
                c.features.sliding = Some(shapes::gpt_oss_sliding(l));
            }
            // the leading dense layers that remain (DeepSeek-V3's 3 of 5 layers)
            c.mlp_only_layers.retain(|&d| d < l);
        }
        if let Some(e) = self.experts {
            if e < c.num_experts_per_tok {
                return Err(format!("--experts {e}: fewer than the {} experts each token uses", c.num_experts_per_tok));
            }
            c.num_experts = e;
            // expert groups: as many as still divide the experts, keeping the share kept
            if let Some(r) = &mut c.features.sigmoid_router
                && !e.is_multiple_of(r.n_group)
            {
                (r.n_group, r.topk_group) = (1, 1);
            }
        }
        if let Some(v) = self.vocab {
            if v == 0 {
                return Err("--vocab must be positive".into());
            }
            c.vocab_size = v;
            c.eos_token_ids.retain(|&id| (id as usize) < v);
            c.bos_token_id = c.bos_token_id.filter(|&id| (id as usize) < v);
        }
        c.validate()?;
        Ok(c)
    }

    /// The package's name: the imitated model, and what was changed.
    pub fn name(&self) -> String {
        let mut changes = vec![];
        for (what, v) in [("layers", self.layers), ("experts", self.experts), ("vocab", self.vocab)] {
            if let Some(v) = v {
                changes.push(format!("{v} {what}"));
            }
        }
        let base = format!("{} shape", self.shape.model);
        if changes.is_empty() { base } else { format!("{base}, {}", changes.join(", ")) }
    }
}

#[derive(Debug, Clone)]
pub struct SynthReport {
    pub bytes: u64,
    pub seconds: f64,
    pub warnings: Vec<String>,
}

/// Write the synthetic package `out`.
pub fn synthesize(
    spec: &SynthSpec,
    out: &Path,
    progress: bool,
    cancel: Option<&'static AtomicBool>,
) -> Result<SynthReport, ConvertError> {
    let t0 = std::time::Instant::now();
    let bad = |msg: String| ConvertError::File { path: out.to_path_buf(), msg };
    if matches!(spec.quant, QuantMode::Ggml(_) | QuantMode::File) {
        // its weights are drawn in moescope's own formats; GGUF blocks come from a quantizer
        return Err(bad(format!(
            "synth writes q4, q4g32, q8, bf16 or mxfp4, not {} (convert a checkpoint or GGUF file with --quant {0})",
            spec.quant.name()
        )));
    }
    let mut cfg = spec.config().map_err(bad)?;
    let mut warnings = vec![];
    let mut tok = tokenizers::load(spec.shape.tokenizer).map_err(bad)?;
    if spec.shape.tokenizer == shapes::TokFamily::Absent {
        warnings.push(format!(
            "{}'s tokenizer is not among moescope's: the package takes --prompt-ids only",
            spec.shape.model
        ));
    }
    let tok_size = tok.tokenizer_json.as_deref().and_then(|j| Tok::from_json(j).ok()).map(|t| t.vocab_size());
    if let Some(n) = tok_size
        && n > cfg.vocab_size
    {
        warnings.push(format!(
            "--vocab {} is smaller than the tokenizer's {n} tokens: the package takes --prompt-ids only",
            cfg.vocab_size
        ));
        tok = Default::default();
    }
    add_tokenizer_eos(&mut cfg, &tok);
    let name = spec.name();
    let origin = Origin {
        name: &name,
        ignored: vec![],
        synthetic: Some(Synthetic { shape: spec.shape.name.into(), seed: spec.seed, weights: weights::description() }),
    };
    let opts = ConvertOptions { progress, cancel, verb: "synthesizing", ..ConvertOptions::new(spec.quant) };
    let src = weights::SynthSource::new(&cfg, spec.seed);
    let blobs = weights::SynthBlobs::new(&cfg, spec.seed);
    let bytes = write_package_with(&src, &blobs, &cfg, tok, origin, opts, out)?;
    Ok(SynthReport { bytes, seconds: t0.elapsed().as_secs_f64(), warnings })
}
