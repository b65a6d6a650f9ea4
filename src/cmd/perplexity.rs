//! `moescope perplexity`: how well a model predicts a text, the usual measure of what
//! quantization costs.
//!
//! The protocol is `tests/reference/train_demo.py`'s, so the numbers compare with transformers':
//! the text is tokenized whole (no special tokens added), cut into consecutive windows of
//! `--window` tokens (the last one shorter), each evaluated from an empty context in one
//! batch; every token of a window but its first is predicted, and ppl = exp(mean NLL).
//!
//! `--against BASE` runs a second model on the same windows and compares the two next-token
//! distributions at every predicted position (llama.cpp's `--kl-divergence`): mean
//! KL(p_base || p_model) and how often both put the same token first.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{KvTypes, Logits, NoObserver};
use serde_json::json;

use moescope::experts::{PolicyKind, StreamConfig};

use super::run_config::{self as run, isa_from_env, panels_from_env};
use super::{experts_report, model_arg};
use crate::cli::PerplexityArgs;

/// log-sum-exp of a row of logits, in f64: the sum over 150k logits must not lose the small ones.
fn logsumexp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln()
}

/// The largest text scored: it is tokenized whole, and its tokens and logits are held in memory
/// (wikitext-2's test set is 1.3 MB).
const MAX_TEXT: u64 = 64 << 20;

/// Negative log-likelihoods of a window's next tokens from position `from` on, from its logits
/// (`[n, vocab]`).
fn window_nlls(logits: &[f32], ids: &[u32], vocab: usize, from: usize, out: &mut Vec<f64>) {
    for (row, &next) in logits.chunks_exact(vocab).zip(&ids[1..]).skip(from) {
        out.push(logsumexp(row) - row[next as usize] as f64);
    }
}

/// Index of the largest logit (the first of equals).
fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}

/// Per position of a window (`[n, vocab]` logits, the last row predicting nothing):
/// KL(p_base || p_model) in nats and whether both rank the same token first.
fn window_divergence(
    base: &[f32],
    model: &[f32],
    vocab: usize,
    (from, predicted): (usize, usize),
    out: &mut Vec<(f64, bool)>,
) {
    for (b, m) in base.chunks_exact(vocab).zip(model.chunks_exact(vocab)).take(predicted).skip(from) {
        let (lb, lm) = (logsumexp(b), logsumexp(m));
        let kl: f64 = b
            .iter()
            .zip(m)
            .map(|(&x, &y)| {
                let lpb = x as f64 - lb;
                lpb.exp() * (lpb - (y as f64 - lm))
            })
            .sum();
        // rounding can leave a tiny negative sum where the two are equal
        out.push((kl.max(0.0), argmax(b) == argmax(m)));
    }
}

/// Mean, median and largest of a list (sorted in place).
fn summary(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len().max(1) as f64;
    let med = if v.is_empty() { 0.0 } else { v[v.len() / 2] };
    (v.iter().sum::<f64>() / n, med, v.last().copied().unwrap_or(0.0))
}

pub fn run(a: &PerplexityArgs) -> Result<()> {
    if a.window < 2 {
        bail!("--window must be at least 2 tokens");
    }
    let threads = super::thread_count("--threads", a.threads, moescope::sysinfo::physical_cores())?;
    let bytes = moescope::bounded_read::read_file(&a.file, MAX_TEXT).map_err(anyhow::Error::msg)?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{}: not UTF-8 text (byte {})", a.file.display(), e.utf8_error().valid_up_to()))?;
    let path = model_arg::resolve(a.model.as_deref(), a.quant.as_deref())?;
    let opts = |stream: Option<StreamConfig>, kv: KvTypes| -> Result<EngineOptions> {
        Ok(EngineOptions {
            threads,
            ctx_size: Some(a.window),
            isa: isa_from_env()?,
            stream,
            panels: panels_from_env()?,
            kv,
        })
    };
    // the model streams as `run` would (pool options given or not) and keeps the KV cache's
    // types as asked; the base is always exact (resident, f32 KV)
    let stream = StreamConfig {
        budget_bytes: None,
        policy: PolicyKind::parse(&a.policy).map_err(anyhow::Error::msg)?,
        prefetch: run::parse_on_off("--prefetch", &a.prefetch)?,
        ..StreamConfig::default()
    };
    let cache = a.cache_mb.as_deref().map(run::parse_cache_mb).transpose()?;
    let stream = StreamConfig {
        budget_bytes: match cache {
            Some(run::CacheMb::Mib(mb)) => Some((mb * (1u64 << 20) as f64) as u64),
            _ => None,
        },
        auto: cache == Some(run::CacheMb::Auto),
        force: a.force,
        ..stream
    };
    let mut eng = Engine::load(&path, opts(Some(stream), a.kv.types())?)
        .with_context(|| format!("loading {}", path.display()))?;
    if let Some(s) = eng.sizing() {
        eprintln!("moescope perplexity: memory: {s}");
    }
    if let Some(line) = experts_report::start_cache_aware(&mut eng, a.aware.cache_aware_routing)? {
        eprintln!("moescope perplexity: {line}");
    }
    let mut base = match &a.against {
        Some(b) => {
            // a base GGUF keeps its own values; a HuggingFace base becomes bf16
            let quant = (!moescope::convert::gguf::is_gguf(b)).then_some("bf16");
            let bp = model_arg::resolve(Some(b), quant)?;
            let be =
                Engine::load(&bp, opts(None, KvTypes::F32)?).with_context(|| format!("loading {}", bp.display()))?;
            if be.config().vocab_size != eng.config().vocab_size {
                bail!(
                    "{}: vocabulary of {} tokens, {} has {}: not the same model",
                    bp.display(),
                    be.config().vocab_size,
                    path.display(),
                    eng.config().vocab_size
                );
            }
            Some(be)
        }
        None => None,
    };
    let Some(tok) = eng.tokenizer().cloned() else {
        bail!("{}: this package has no tokenizer", path.display());
    };
    let mut ids =
        tok.encode(&text).map_err(anyhow::Error::msg).with_context(|| format!("tokenizing {}", a.file.display()))?;
    if let Some(n) = a.tokens {
        ids.truncate(n);
    }
    if ids.len() < 2 {
        bail!("{}: fewer than 2 tokens: nothing to predict", a.file.display());
    }
    let vocab = eng.config().vocab_size;
    let t0 = Instant::now();
    let mut nll = Vec::with_capacity(ids.len());
    let (mut base_nll, mut div) = (Vec::new(), Vec::new());
    let mut windows = 0;
    // --second-half: whole windows only, their first half context (llama-perplexity's scoring)
    let from = if a.second_half { a.window / 2 } else { 0 };
    for w in ids.chunks(a.window).filter(|w| w.len() >= 2 && (!a.second_half || w.len() == a.window)) {
        eng.reset();
        let logits = eng.eval(w, Logits::All, &mut NoObserver)?.to_vec();
        window_nlls(&logits, w, vocab, from, &mut nll);
        if let Some(be) = base.as_mut() {
            be.reset();
            let bl = be.eval(w, Logits::All, &mut NoObserver)?.to_vec();
            window_nlls(&bl, w, vocab, from, &mut base_nll);
            window_divergence(&bl, &logits, vocab, (from, w.len() - 1), &mut div);
        }
        windows += 1;
    }
    if nll.is_empty() {
        bail!(
            "{}: shorter than one window of {} tokens: nothing to score with --second-half",
            a.file.display(),
            a.window
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = nll.len() as f64;
    let mean = nll.iter().sum::<f64>() / n;
    let var = nll.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    // the standard error of the mean NLL, carried to the perplexity (as llama.cpp reports it)
    let se = (var / n).sqrt();
    let ppl = mean.exp();
    let name = eng.package().meta.name.clone();
    let against = base.as_ref().map(|_| {
        let bmean = base_nll.iter().sum::<f64>() / n;
        let same = div.iter().filter(|d| d.1).count() as f64 / div.len().max(1) as f64;
        let mut kls: Vec<f64> = div.iter().map(|d| d.0).collect();
        let (kl, kl_median, kl_max) = summary(&mut kls);
        (bmean, same, kl, kl_median, kl_max)
    });
    if a.json {
        let mut j = json!({
            "model": name, "file": a.file.display().to_string(), "window": a.window, "windows": windows, "second_half": a.second_half,
            "tokens": ids.len(), "predicted": nll.len(), "nll": mean, "nll_stderr": se, "perplexity": ppl,
            "perplexity_stderr": ppl * se, "seconds": secs, "tokens_per_second": ids.len() as f64 / secs,
            "threads": threads, "isa": eng.isa().name(),
            "cache_aware_routing": experts_report::cache_aware_json(&eng, ids.len()),
            "experts": experts_report::experts_json(&eng, &Default::default(), ids.len()),
        });
        if let (Some((bmean, same, kl, kl_median, kl_max)), Some(b)) = (against, &a.against) {
            j["against"] = json!({
                "model": b.display().to_string(), "nll": bmean, "perplexity": bmean.exp(),
                "top1_agreement": same, "kl_mean": kl, "kl_median": kl_median, "kl_max": kl_max,
            });
        }
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
        if let (Some((bmean, same, kl, kl_median, kl_max)), Some(b)) = (against, &a.against) {
            println!(
                "against {}: perplexity {:.4}; KL(base || model) mean {kl:.6} median {kl_median:.6} max {kl_max:.6} nats; same top-1 {:.2}%",
                b.display(),
                bmean.exp(),
                same * 100.0
            );
        }
        if let Some(tol) = eng.model().cache_aware_routing() {
            println!(
                "cache-aware routing (tolerance {tol}): {} experts substituted ({:.2} per token)",
                eng.model().substitutions(),
                eng.model().substitutions() as f64 / ids.len() as f64
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_is_kl_of_the_softmaxes_and_top1_compares_argmaxes() {
        // vocabulary 2: p = softmax(0, ln 3) = (1/4, 3/4), q = softmax(0, 0) = (1/2, 1/2);
        // KL(p || q) = 1/4 ln(1/2) + 3/4 ln(3/2); the second row equal (KL 0, same top-1);
        // the third row predicts nothing and is skipped
        let base = [0.0, 3f32.ln(), 1.0, 2.0, 9.0, 9.0];
        let model = [0.0, 0.0, 11.0, 12.0, 0.0, 0.0];
        let mut out = vec![];
        window_divergence(&base, &model, 2, (0, 2), &mut out);
        assert_eq!(out.len(), 2);
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((out[0].0 - want).abs() < 1e-7, "{} vs {want}", out[0].0);
        assert!(!out[0].1, "argmax 1 vs 0 (first of equals)");
        assert!(out[1].0.abs() < 1e-12 && out[1].1);
        let mut v = vec![3.0, 1.0, 2.0];
        assert_eq!(summary(&mut v), (2.0, 2.0, 3.0));
    }

    #[test]
    fn nll_is_the_log_softmax_of_the_next_token() {
        // two positions, vocabulary 3: uniform logits give ln 3; a one-hot-ish row gives
        // ln(1 + 2 e^-10) for the favoured token
        let logits = [0.0, 0.0, 0.0, 10.0, 0.0, 0.0];
        let mut out = vec![];
        window_nlls(&logits, &[7, 2, 0], 3, 0, &mut out);
        assert_eq!(out.len(), 2);
        assert!((out[0] - 3f64.ln()).abs() < 1e-12);
        assert!((out[1] - (1.0 + 2.0 * (-10f64).exp()).ln()).abs() < 1e-12);
    }
}
