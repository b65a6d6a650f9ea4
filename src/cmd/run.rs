//! `moescope run`: one prompt (text, chat-templated text or token ids), or the REPL.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result, bail};
use moescope::engine::chat_template::Message;
use moescope::engine::harmony::HarmonySplitter;
use moescope::engine::sampler::Sampler;
use moescope::engine::tokenizer::StreamDecoder;
use moescope::engine::{Engine, GenRequest};
use moescope::experts::routing_log::RoutingLog;
use moescope::model::KvCache;
use serde_json::json;

use super::interrupt::{self, Interruptible};
use super::run_config::{Prompt, RunConfig, stats_line, timings_json};
use super::{experts_report, trace_out};
use crate::cli::RunArgs;

pub fn run(a: &RunArgs) -> Result<()> {
    let cfg = RunConfig::from_args(a)?;
    let trace = trace_out::begin(&a.trace);
    let mut engine = Engine::load(&cfg.model, cfg.engine)?;
    engine.set_speculation(cfg.spec);
    for w in engine.warnings() {
        eprintln!("warning: {w}");
    }
    if let Some(s) = engine.sizing() {
        eprintln!("moescope: memory: {s}");
    }
    if let Some(line) = experts_report::start_route_replay(&mut engine, a.experts.route_from.as_deref())? {
        eprintln!("moescope: {line}");
    }
    if let Some(line) = experts_report::start_cache_aware(&mut engine, a.experts.aware.cache_aware_routing)? {
        eprintln!("moescope: {line}");
    }
    let mut log =
        a.experts.routing_out.as_deref().map(|p| experts_report::start_routing_log(&engine, p)).transpose()?;
    let kv = engine.kv_types();
    let kv_mb = KvCache::bytes_at_capacity(engine.config(), engine.ctx_size(), kv) as f64 / 1e6;
    eprintln!(
        "moescope: {} ({}), {} threads, {} kernels, {}, context {} tokens (KV cache {kv} up to {kv_mb:.1} MB)",
        engine.package().meta.display_name(),
        engine.package().meta.quant.mode,
        engine.threads(),
        engine.isa(),
        moescope_kernels::prefetch::describe(),
        engine.ctx_size()
    );
    eprintln!("moescope: {}", experts_report::describe(&engine));
    eprintln!("moescope: {}", experts_report::memory_line(&engine));
    interrupt::install();
    let meta = trace_meta(&engine, &cfg, a);
    match &cfg.prompt {
        Some(p) => {
            one_shot(engine, &cfg, p, &mut log)?;
            experts_report::finish_routing_log(log)?;
        }
        None => super::repl::repl(engine, &cfg, log)?,
    }
    if let Some(t) = trace {
        t.finish(meta)?;
    }
    Ok(())
}

/// The KV cache's types and bytes: a position's, and the whole context's.
fn kv_json(engine: &Engine) -> serde_json::Value {
    let (cfg, kv) = (engine.config(), engine.kv_types());
    json!({"type_k": kv.k.name(), "type_v": kv.v.name(),
           "bytes_per_token": KvCache::bytes_per_token(cfg, kv),
           "bytes_at_ctx": KvCache::bytes_at_capacity(cfg, engine.ctx_size(), kv)})
}

/// What a trace of `run` records about the model and the settings.
pub fn trace_meta(engine: &Engine, cfg: &RunConfig, a: &RunArgs) -> serde_json::Value {
    let m = &engine.package().meta;
    json!({
        "command": "run",
        "model": m.name,
        "package": cfg.model.display().to_string(),
        "quant": m.quant.mode,
        "config": m.model,
        "threads": engine.threads(),
        "isa": engine.isa().name(),
        "weight_prefetch_bytes": moescope_kernels::prefetch::distance(),
        "ctx_size": engine.ctx_size(),
        "kv_cache": kv_json(engine),
        "route_from": engine.model().route_replay().map(|r| r.name()),
        "cache_aware_routing": engine.model().cache_aware_routing(),
        "settings": {
            "n_predict": cfg.max_tokens, "temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p,
            "min_p": a.min_p, "repeat_penalty": a.repeat_penalty, "seed": cfg.sampler.seed, "chat": a.chat,
            "ignore_eos": a.ignore_eos,
        },
    })
}

fn one_shot(mut engine: Engine, cfg: &RunConfig, prompt: &Prompt, log: &mut Option<RoutingLog>) -> Result<()> {
    let before = engine.pool().map(|p| p.total_stats()).unwrap_or_default();
    let ids = match prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(text) => {
            let Some(tok) = engine.tokenizer() else {
                bail!("{}: this package has no tokenizer: give the prompt as --prompt-ids", cfg.model.display());
            };
            let text = if cfg.chat {
                let tmpl = engine.template().ok_or_else(|| {
                    anyhow::anyhow!("{}: this package has no chat template (drop --chat)", cfg.model.display())
                })?;
                let mut msgs = vec![];
                if let Some(s) = &cfg.system {
                    msgs.push(Message::new("system", s));
                }
                msgs.push(Message::new("user", text));
                tmpl.render(&msgs, true, &cfg.template_args).map_err(anyhow::Error::msg)?
            } else {
                text.clone()
            };
            tok.encode(&text).map_err(anyhow::Error::msg)?
        }
    };
    let vocab = engine.config().vocab_size;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("prompt token id {bad} is out of range (the vocabulary has {vocab} tokens)");
    }
    let mut sampler = Sampler::new(cfg.sampler);
    let mut logits_rows: Vec<f32> = Vec::new();
    let keep_logits = cfg.logits_out.is_some();
    let stream = !cfg.json;
    let tok = engine.tokenizer().cloned();
    // gpt-oss with --chat: the channels split as the REPL splits them (markup kept to split on)
    let mut harmony = (cfg.chat && engine.harmony()).then(HarmonySplitter::default);
    let eos = engine.eos_ids().to_vec();
    let mut dec = tok.as_deref().map(|t| StreamDecoder::new(t, harmony.is_none()));
    let tty = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let mut write_err: Option<std::io::Error> = None;
    // a long prompt's progress on a terminal's stderr (the cache is empty: the whole prompt)
    let prefill = super::prefill_progress::PrefillProgress::default();
    prefill.start(ids.len());
    let report = |n: usize| prefill.report(n);
    let stats = {
        let _g = Interruptible::start();
        let req = GenRequest {
            max_tokens: cfg.max_tokens,
            stop_at_eos: !cfg.ignore_eos,
            cancel: &interrupt::STOP,
            progress: std::io::stderr().is_terminal().then_some(&report as &(dyn Fn(usize) + Sync)),
        };
        engine.generate(&ids, &mut sampler, req, log, &mut |id, logits| {
            prefill.clear_line();
            if keep_logits {
                logits_rows.extend_from_slice(logits);
            }
            if stream {
                let piece = match dec.as_mut() {
                    Some(_) if harmony.is_some() && eos.contains(&id) => None,
                    Some(d) => d.push(id).unwrap_or(None),
                    None => Some(format!("{id} ")),
                };
                let written = match (piece, harmony.as_mut()) {
                    (Some(p), Some(h)) => super::repl::show_parts(&mut out, &mut std::io::stderr(), tty, h.push(&p)),
                    (Some(p), None) => out.write_all(p.as_bytes()).and_then(|_| out.flush()),
                    (None, _) => Ok(()),
                };
                if let Err(e) = written {
                    write_err = Some(e);
                    return false;
                }
            }
            true
        })?
    };
    if let Some(e) = write_err
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e).context("writing to stdout");
    }
    if stream {
        let tail = dec.as_mut().and_then(|d| d.flush().ok().flatten()).unwrap_or_default();
        match harmony.as_mut() {
            Some(h) => {
                let mut parts = h.push(&tail);
                parts.extend(h.finish());
                let _ = super::repl::show_parts(&mut out, &mut std::io::stderr(), tty, parts);
            }
            None => {
                let _ = out.write_all(tail.as_bytes());
            }
        }
        let _ = writeln!(out);
    }
    if let Some(path) = &cfg.logits_out {
        moescope::npy::write_f32(path, &[stats.generated.len(), engine.config().vocab_size], &logits_rows)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if cfg.json {
        let text =
            engine.tokenizer().map(|t| t.decode(&stats.generated, true)).transpose().map_err(anyhow::Error::msg)?;
        let v = json!({
            "model": engine.package().meta.name,
            "synthetic": engine.package().meta.synthetic.is_some(),
            "quant": engine.package().meta.quant.mode,
            "threads": engine.threads(),
            "isa": engine.isa().name(),
            "weight_prefetch_bytes": moescope_kernels::prefetch::distance(),
            "seed": cfg.sampler.seed,
            "ctx_size": engine.ctx_size(),
            "kv_cache": kv_json(&engine),
            "speculation": { "mode": cfg.spec.mode.name(), "draft": cfg.spec.draft },
            "route_from": engine.model().route_replay().map(|r| r.name()),
            "cache_aware_routing": experts_report::cache_aware_json(&engine, ids.len() + stats.generated.len()),
            "prompt_ids": ids,
            "generated_ids": stats.generated,
            "text": text,
            "stop": stats.stop.name(),
            "timings": timings_json(&stats),
            "experts": experts_report::experts_json(&engine, &before, stats.generated.len()),
            "memory": experts_report::memory_json(&engine),
        });
        writeln!(out, "{v}")?;
    } else {
        eprintln!("{}", stats_line(&stats, cfg.sampler.seed));
        if engine.streamed().is_some() {
            let e = experts_report::experts_json(&engine, &before, stats.generated.len());
            eprintln!(
                "[experts: {:.1}% hits, {:.1} MB read ({:.1} MB/token), {:.0} ms stalled; predictor recall {:.0}% \
                 ({:.0}% of the gate mass), precision {:.0}%, ready {:.2} ms ahead; {:.0}% of would-be reads used, \
                 {:.0}% of predictions withheld; two ahead: recall {:.0}%, {} reads, {:.0}% used{}]",
                e["hit_pct"].as_f64().unwrap_or(0.0),
                e["read_mb"].as_f64().unwrap_or(0.0),
                e["read_mb_per_token"].as_f64().unwrap_or(0.0),
                e["stall_ms"].as_f64().unwrap_or(0.0),
                100.0 * e["predictor"]["recall"].as_f64().unwrap_or(0.0),
                100.0 * e["predictor"]["gate_mass_recall"].as_f64().unwrap_or(0.0),
                100.0 * e["predictor"]["precision"].as_f64().unwrap_or(0.0),
                e["predictor"]["lead_ms"].as_f64().unwrap_or(0.0),
                100.0 * e["predictor"]["read_usefulness"].as_f64().unwrap_or(0.0),
                100.0 * e["predictor"]["withheld_share"].as_f64().unwrap_or(0.0),
                100.0 * e["predictor"]["two_ahead"]["recall"].as_f64().unwrap_or(0.0),
                e["predictor"]["two_ahead"]["reads"].as_u64().unwrap_or(0),
                100.0 * e["predictor"]["two_ahead"]["precision"].as_f64().unwrap_or(0.0),
                engine.model().route_replay().map_or(String::new(), |r| format!("; routes from {}", r.name())),
            );
        }
        if let Some(tol) = engine.model().cache_aware_routing() {
            eprintln!(
                "[cache-aware routing (tolerance {tol}): {} experts substituted]",
                engine.model().substitutions()
            );
        }
    }
    Ok(())
}
