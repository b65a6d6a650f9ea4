//! `moescope run`: one prompt (text, chat-templated text or token ids), or the REPL.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use moescope::engine::chat_template::Message;
use moescope::engine::sampler::{Sampler, SamplerParams};
use moescope::engine::tokenizer::StreamDecoder;
use moescope::engine::{Engine, EngineOptions, GenRequest, GenStats, Reuse};
use moescope::experts::routing_log::RoutingLog;
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::KvCache;
use moescope::trace::hist::Latency;
use moescope_kernels::Isa;
use serde_json::json;

use super::interrupt::{self, Interruptible};
use super::{experts_report, model_arg, trace_out};
use crate::cli::{ExpertArgs, RunArgs};

/// Tokens `run` and `chat` generate at most when `-n` is not given.
pub const DEFAULT_N_PREDICT: usize = 256;

/// The prompt, as given.
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// Validated arguments.
pub struct RunConfig {
    pub model: PathBuf,
    pub prompt: Option<Prompt>,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub sampler: SamplerParams,
    pub chat: bool,
    pub system: Option<String>,
    pub enable_thinking: Option<bool>,
    pub engine: EngineOptions,
    pub json: bool,
    pub logits_out: Option<PathBuf>,
}

/// `--prefetch on|off`.
pub fn parse_on_off(flag: &str, v: &str) -> Result<bool> {
    match v {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        o => bail!("{flag}: '{o}' (expected on or off)"),
    }
}

/// `--cache-mb`: a number of MiB or `auto`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheMb {
    Auto,
    Mib(f64),
}

pub fn parse_cache_mb(v: &str) -> Result<CacheMb> {
    match v.trim() {
        "auto" => Ok(CacheMb::Auto),
        x => match x.parse::<f64>() {
            Ok(m) if m > 0.0 && m.is_finite() => Ok(CacheMb::Mib(m)),
            _ => bail!("--cache-mb: '{x}' is not a positive number of MiB or auto"),
        },
    }
}

/// The streaming settings from the command line.
pub fn stream_config(e: &ExpertArgs, cache_mb: Option<&str>, prefetch: bool) -> Result<StreamConfig> {
    let cache = cache_mb.map(parse_cache_mb).transpose()?;
    if e.io_workers == 0 {
        bail!("--io-workers must be at least 1");
    }
    let io = match e.io.as_deref() {
        None => None,
        Some("direct") => Some(IoMode::Direct),
        Some("buffered") => Some(IoMode::Buffered),
        Some(o) => bail!("--io: '{o}' (expected direct or buffered)"),
    };
    Ok(StreamConfig {
        budget_bytes: match cache {
            Some(CacheMb::Mib(mb)) => Some((mb * (1u64 << 20) as f64) as u64),
            _ => None,
        },
        auto: cache == Some(CacheMb::Auto),
        force: e.force,
        policy: PolicyKind::parse(&e.policy).map_err(anyhow::Error::msg)?,
        prefetch,
        io_workers: e.io_workers,
        io,
        verify: !e.no_verify_experts,
    })
}

pub fn isa_from_env() -> Result<Isa> {
    let cap = match std::env::var("MOESCOPE_ISA") {
        Ok(v) if !v.is_empty() => Some(v.parse::<Isa>().map_err(|e| anyhow::anyhow!("MOESCOPE_ISA: {e}"))?),
        _ => None,
    };
    Ok(Isa::detect_capped(cap))
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids: Vec<u32> = s
        .split(',')
        .map(|x| x.trim())
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<u32>().with_context(|| format!("--prompt-ids: '{x}' is not a token id")))
        .collect::<Result<_>>()?;
    if ids.is_empty() {
        bail!("--prompt-ids: no token ids given");
    }
    Ok(ids)
}

impl RunConfig {
    pub fn from_args(a: &RunArgs) -> Result<RunConfig> {
        let sampler = SamplerParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repeat_penalty: a.repeat_penalty,
            repeat_last_n: a.repeat_last_n,
            seed: a.seed.unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
            }),
        };
        sampler.validate().map_err(anyhow::Error::msg)?;
        super::output_path("--logits-out", a.logits_out.as_deref())?;
        super::output_path("--routing-out", a.experts.routing_out.as_deref())?;
        super::output_path("--trace", a.trace.trace.as_deref())?;
        let prompt = match (&a.prompt, &a.prompt_ids) {
            (Some(t), None) => Some(Prompt::Text(t.clone())),
            (None, Some(ids)) => Some(Prompt::Ids(parse_ids(ids)?)),
            _ => None,
        };
        if a.chat && matches!(prompt, Some(Prompt::Ids(_))) {
            bail!("--chat applies the chat template to --prompt text, not to --prompt-ids");
        }
        if prompt.is_none() && (a.json || a.logits_out.is_some()) {
            bail!("--json and --logits-out need a prompt (--prompt or --prompt-ids)");
        }
        let threads = super::thread_count("--threads", a.threads, moescope::sysinfo::physical_cores())?;
        if a.ctx_size == Some(0) {
            bail!("--ctx-size must be positive");
        }
        let model = model_arg::resolve(a.model.as_deref(), a.quant.as_deref())?;
        Ok(RunConfig {
            model,
            prompt,
            max_tokens: a.n_predict.unwrap_or(DEFAULT_N_PREDICT),
            ignore_eos: a.ignore_eos,
            sampler,
            chat: a.chat,
            system: a.system.clone(),
            enable_thinking: a.no_think.then_some(false),
            engine: EngineOptions {
                threads,
                ctx_size: a.ctx_size,
                isa: isa_from_env()?,
                stream: if a.experts.no_stream {
                    None
                } else {
                    Some(stream_config(&a.experts, a.cache_mb.as_deref(), parse_on_off("--prefetch", &a.prefetch)?)?)
                },
            },
            json: a.json,
            logits_out: a.logits_out.clone(),
        })
    }
}

pub fn run(a: &RunArgs) -> Result<()> {
    let cfg = RunConfig::from_args(a)?;
    let trace = trace_out::begin(&a.trace);
    let mut engine = Engine::load(&cfg.model, cfg.engine)?;
    for w in &engine.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(s) = &engine.sizing {
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
    let kv_mb = KvCache::bytes_at_capacity(&engine.model.cfg, engine.kv.capacity()) as f64 / 1e6;
    eprintln!(
        "moescope: {} ({}), {} threads, {} kernels, {}, context {} tokens (KV cache up to {kv_mb:.1} MB)",
        engine.package().meta.display_name(),
        engine.package().meta.quant.mode,
        engine.exec.threads(),
        engine.exec.isa,
        moescope_kernels::prefetch::describe(),
        engine.kv.capacity()
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

/// What a trace of `run` records about the model and the settings.
pub fn trace_meta(engine: &Engine, cfg: &RunConfig, a: &RunArgs) -> serde_json::Value {
    let m = &engine.package().meta;
    json!({
        "command": "run",
        "model": m.name,
        "package": cfg.model.display().to_string(),
        "quant": m.quant.mode,
        "config": m.model,
        "threads": engine.exec.threads(),
        "isa": engine.exec.isa.name(),
        "weight_prefetch_bytes": moescope_kernels::prefetch::distance(),
        "ctx_size": engine.kv.capacity(),
        "route_from": engine.model.route_replay().map(|r| r.name()),
        "cache_aware_routing": engine.model.cache_aware_routing(),
        "settings": {
            "n_predict": cfg.max_tokens, "temperature": a.temperature, "top_k": a.top_k, "top_p": a.top_p,
            "min_p": a.min_p, "repeat_penalty": a.repeat_penalty, "seed": cfg.sampler.seed, "chat": a.chat,
            "ignore_eos": a.ignore_eos,
        },
    })
}

fn one_shot(mut engine: Engine, cfg: &RunConfig, prompt: &Prompt, log: &mut Option<RoutingLog>) -> Result<()> {
    let before = engine.experts.as_ref().map(|e| e.cache.total_stats()).unwrap_or_default();
    let ids = match prompt {
        Prompt::Ids(ids) => ids.clone(),
        Prompt::Text(text) => {
            let Some(tok) = &engine.tok else {
                bail!("{}: this package has no tokenizer: give the prompt as --prompt-ids", cfg.model.display());
            };
            let text = if cfg.chat {
                let tmpl = engine.template.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("{}: this package has no chat template (drop --chat)", cfg.model.display())
                })?;
                let mut msgs = vec![];
                if let Some(s) = &cfg.system {
                    msgs.push(Message::new("system", s));
                }
                msgs.push(Message::new("user", text));
                tmpl.render(&msgs, true, cfg.enable_thinking).map_err(anyhow::Error::msg)?
            } else {
                text.clone()
            };
            tok.encode(&text).map_err(anyhow::Error::msg)?
        }
    };
    let vocab = engine.model.cfg.vocab_size;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("prompt token id {bad} is out of range (the vocabulary has {vocab} tokens)");
    }
    let mut sampler = Sampler::new(cfg.sampler);
    let mut logits_rows: Vec<f32> = Vec::new();
    let keep_logits = cfg.logits_out.is_some();
    let stream = !cfg.json;
    let tok = engine.tok.clone();
    let mut dec = tok.as_deref().map(|t| StreamDecoder::new(t, true));
    let mut out = std::io::stdout().lock();
    let mut write_err: Option<std::io::Error> = None;
    let stats = {
        let _g = Interruptible::start();
        let req = GenRequest {
            max_tokens: cfg.max_tokens,
            stop_at_eos: !cfg.ignore_eos,
            cancel: &interrupt::STOP,
            progress: None,
        };
        engine.generate(&ids, &mut sampler, req, log, &mut |id, logits| {
            if keep_logits {
                logits_rows.extend_from_slice(logits);
            }
            if stream {
                let piece = match dec.as_mut() {
                    Some(d) => d.push(id).unwrap_or(None),
                    None => Some(format!("{id} ")),
                };
                if let Some(p) = piece
                    && let Err(e) = out.write_all(p.as_bytes()).and_then(|_| out.flush())
                {
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
        if let Some(p) = dec.as_mut().and_then(|d| d.flush().ok().flatten()) {
            let _ = out.write_all(p.as_bytes());
        }
        let _ = writeln!(out);
    }
    if let Some(path) = &cfg.logits_out {
        moescope::npy::write_f32(path, &[stats.generated.len(), engine.model.cfg.vocab_size], &logits_rows)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if cfg.json {
        let text =
            engine.tok.as_ref().map(|t| t.decode(&stats.generated, true)).transpose().map_err(anyhow::Error::msg)?;
        let v = json!({
            "model": engine.package().meta.name,
            "synthetic": engine.package().meta.synthetic.is_some(),
            "quant": engine.package().meta.quant.mode,
            "threads": engine.exec.threads(),
            "isa": engine.exec.isa.name(),
            "weight_prefetch_bytes": moescope_kernels::prefetch::distance(),
            "seed": cfg.sampler.seed,
            "route_from": engine.model.route_replay().map(|r| r.name()),
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
        if engine.experts.is_some() {
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
                engine.model.route_replay().map_or(String::new(), |r| format!("; routes from {}", r.name())),
            );
        }
        if let Some(tol) = engine.model.cache_aware_routing() {
            eprintln!("[cache-aware routing (tolerance {tol}): {} experts substituted]", engine.model.substitutions());
        }
    }
    Ok(())
}

pub fn timings_json(s: &GenStats) -> serde_json::Value {
    let mut lat = Latency::new();
    for &ms in &s.token_ms {
        lat.record_ms(ms);
    }
    json!({
        "decode_latency_ms": lat.summary(),
        "prompt_tokens": s.prompt_evaluated,
        "prompt_cached": s.prompt_cached,
        "prompt_reuse": s.reuse.name(),
        "generated_tokens": s.generated.len(),
        "prefill_ms": s.prefill_ms,
        "decode_ms": s.decode_ms,
        "ttft_ms": s.ttft_ms,
        "prefill_tps": s.prefill_tps(),
        "decode_tps": s.decode_tps(),
    })
}

pub fn stats_line(s: &GenStats, seed: u64) -> String {
    format!(
        "[prefill {} tokens in {:.0} ms ({:.1} tok/s){} | decode {} tokens, {:.1} tok/s | ttft {:.0} ms | stop: {} | seed {seed}]",
        s.prompt_evaluated,
        s.prefill_ms,
        s.prefill_tps(),
        match s.reuse {
            Reuse::None => String::new(),
            Reuse::Prefix => format!(", {} cached", s.prompt_cached),
            Reuse::Snapshot => format!(", {} cached from the last turn's state", s.prompt_cached),
            Reuse::Recomputed => ", recomputed: the model's recurrent state cannot go back to the common prefix".into(),
        },
        s.generated.len(),
        s.decode_tps(),
        s.ttft_ms,
        s.stop.name()
    )
}
