//! `moescope perplexity`: how well a model predicts a text, the usual measure of what
//! quantization costs.
//!
//! The protocol is `tests/reference/train_demo.py`'s, so the numbers compare with transformers':
//! the text is tokenized whole (no special tokens added), cut into consecutive windows of
//! `--window` tokens (the last one shorter), each evaluated from an empty context in one
//! batch; every token of a window but its first is predicted, and ppl = exp(mean NLL).

use std::time::Instant;

use anyhow::{Context, Result, bail};
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{Logits, NoObserver};
use serde_json::json;

use super::model_arg;
use super::run::isa_from_env;
use crate::cli::PerplexityArgs;

/// Negative log-likelihoods of a window's next tokens, from its logits (`[n, vocab]`).
fn window_nlls(logits: &[f32], ids: &[u32], vocab: usize, out: &mut Vec<f64>) {
    for (row, &next) in logits.chunks_exact(vocab).zip(&ids[1..]) {
        // log-softmax in f64: the sum over 150k logits must not lose the small ones
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
        out.push(lse - row[next as usize] as f64);
    }
}

pub fn run(a: &PerplexityArgs) -> Result<()> {
    if a.window < 2 {
        bail!("--window must be at least 2 tokens");
    }
    let threads = match a.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text (byte {})", a.file.display(), e.utf8_error().valid_up_to()))?;
    let path = model_arg::resolve(a.model.as_deref(), &a.quant)?;
    let opts = EngineOptions { threads, ctx_size: Some(a.window), isa: isa_from_env()?, stream: None };
    let mut eng = Engine::load(&path, opts).with_context(|| format!("loading {}", path.display()))?;
    let Some(tok) = eng.tok.clone() else {
        bail!("{}: this package has no tokenizer", path.display());
    };
    let ids =
        tok.encode(&text).map_err(anyhow::Error::msg).with_context(|| format!("tokenizing {}", a.file.display()))?;
    if ids.len() < 2 {
        bail!("{}: fewer than 2 tokens: nothing to predict", a.file.display());
    }
    let vocab = eng.model.cfg.vocab_size;
    let t0 = Instant::now();
    let mut nll = Vec::with_capacity(ids.len());
    let mut windows = 0;
    for w in ids.chunks(a.window).filter(|w| w.len() >= 2) {
        eng.reset();
        let logits = eng.eval(w, Logits::All, &mut NoObserver)?;
        window_nlls(&logits, w, vocab, &mut nll);
        windows += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = nll.len() as f64;
    let mean = nll.iter().sum::<f64>() / n;
    let var = nll.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    // the standard error of the mean NLL, carried to the perplexity (as llama.cpp reports it)
    let se = (var / n).sqrt();
    let ppl = mean.exp();
    let name = eng.package().meta.name.clone();
    if a.json {
        let j = json!({
            "model": name, "file": a.file.display().to_string(), "window": a.window, "windows": windows,
            "tokens": ids.len(), "predicted": nll.len(), "nll": mean, "nll_stderr": se, "perplexity": ppl,
            "perplexity_stderr": ppl * se, "seconds": secs, "tokens_per_second": ids.len() as f64 / secs,
            "threads": threads, "isa": eng.exec.isa.name(),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!(
            "perplexity {ppl:.4} ± {:.4} (mean NLL {mean:.4}) over {} predicted tokens, {windows} windows of {}, {name}, {:.1} s ({:.0} tok/s)",
            ppl * se,
            nll.len(),
            a.window,
            secs,
            ids.len() as f64 / secs
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_is_the_log_softmax_of_the_next_token() {
        // two positions, vocabulary 3: uniform logits give ln 3; a one-hot-ish row gives
        // ln(1 + 2 e^-10) for the favoured token
        let logits = [0.0, 0.0, 0.0, 10.0, 0.0, 0.0];
        let mut out = vec![];
        window_nlls(&logits, &[7, 2, 0], 3, &mut out);
        assert_eq!(out.len(), 2);
        assert!((out[0] - 3f64.ln()).abs() < 1e-12);
        assert!((out[1] - (1.0 + 2.0 * (-10f64).exp()).ln()).abs() < 1e-12);
    }
}
