//! A checkpoint's multi-token-prediction layers (DeepSeek-V3's and GLM-4.5's
//! `num_nextn_predict_layers`, after the stack): whether it holds them, and what the converter
//! says of them. The package keeps them ([`crate::package::MtpSection`]; the tensors:
//! [`super::plan::mtp_tensors`]) but does not run them.

use std::path::Path;

use super::source::TensorSource;
use crate::model_config::ModelConfig;

/// Whether `src` holds the multi-token-prediction layers `cfg` states (their first `eh_proj`).
pub fn held(src: &dyn TensorSource, cfg: &ModelConfig) -> bool {
    cfg.features.nextn_layers > 0
        && src.shape(&format!("model.layers.{}.eh_proj.weight", cfg.num_hidden_layers)).is_some()
}

/// What becomes of the multi-token-prediction layers `cfg` states: a warning when `src` holds
/// none (the package then keeps none), and their copies of the embedding and output layer
/// (`embed_tokens`, `shared_head.head`: the model's own again) recorded as left out.
pub fn notes(
    src: &dyn TensorSource,
    cfg: &ModelConfig,
    from: &Path,
    ignored: &mut Vec<String>,
    warnings: &mut Vec<String>,
) {
    let n = cfg.features.nextn_layers;
    if n == 0 {
        return;
    }
    if !held(src, cfg) {
        warnings.push(format!(
            "{}: the config states {n} multi-token-prediction layer(s) and the checkpoint holds none; the package keeps none",
            from.display()
        ));
        return;
    }
    for l in cfg.num_hidden_layers..cfg.num_hidden_layers + n {
        for t in ["embed_tokens.weight", "shared_head.head.weight"] {
            let name = format!("model.layers.{l}.{t}");
            if src.shape(&name).is_some() {
                ignored.push(format!("{} (the model's own embedding or output layer again)", src.source_name(&name)));
            }
        }
    }
}
