//! `run`'s and `chat`'s validated arguments (`RunConfig::from_args`), the parsers of the
//! flags other commands share (`--cache-mb`, `--prefetch`, the expert pool's settings,
//! `MOESCOPE_ISA`), and the one-line and JSON summaries of a reply.

use moescope::engine::chat_template::{TemplateArgs, reasoning_effort};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use moescope::engine::draft::{SpecMode, Speculation};
use moescope::engine::sampler::SamplerParams;
use moescope::engine::{EngineOptions, GenStats, Reuse};
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::trace::hist::Latency;
use moescope_kernels::Isa;
use serde_json::json;

use super::model_arg;
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
    /// `enable_thinking`, `reasoning_effort` for the chat template.
    pub template_args: TemplateArgs,
    pub engine: EngineOptions,
    pub json: bool,
    pub logits_out: Option<PathBuf>,
    /// `--spec`, `--draft`
    pub spec: Speculation,
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

/// Whether long rows go panel-major at load (`EngineOptions::panels`): `MOESCOPE_PANELS` `on`
/// (or unset) or `off`, for measuring what the order buys.
pub fn panels_from_env() -> Result<bool> {
    match std::env::var("MOESCOPE_PANELS").as_deref() {
        Ok("" | "on") | Err(_) => Ok(true),
        Ok("off") => Ok(false),
        Ok(v) => anyhow::bail!("MOESCOPE_PANELS: '{v}' (expected on or off)"),
    }
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
            template_args: TemplateArgs {
                enable_thinking: a.no_think.then_some(false),
                reasoning_effort: a
                    .reasoning_effort
                    .as_deref()
                    .map(reasoning_effort)
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("--reasoning-effort: {e}"))?,
                extra: Default::default(),
            },
            engine: EngineOptions {
                threads,
                ctx_size: a.ctx_size,
                isa: isa_from_env()?,
                panels: panels_from_env()?,
                kv: a.kv.types(),
                stream: if a.experts.no_stream {
                    None
                } else {
                    Some(stream_config(&a.experts, a.cache_mb.as_deref(), parse_on_off("--prefetch", &a.prefetch)?)?)
                },
            },
            json: a.json,
            logits_out: a.logits_out.clone(),
            spec: SpecMode::parse(&a.spec).and_then(|m| Speculation::new(m, a.draft)).map_err(anyhow::Error::msg)?,
        })
    }
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
        "decode_passes": s.passes,
        "tokens_per_pass": s.tokens_per_pass(),
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance": s.acceptance(),
    })
}

pub fn stats_line(s: &GenStats, seed: u64) -> String {
    format!(
        "[prefill {} tokens in {:.0} ms ({:.1} tok/s){} | decode {} tokens, {:.1} tok/s{} | ttft {:.0} ms | stop: {} | seed {seed}]",
        s.prompt_evaluated,
        s.prefill_ms,
        s.prefill_tps(),
        match s.reuse {
            Reuse::None => String::new(),
            Reuse::Prefix => format!(", {} cached", s.prompt_cached),
            Reuse::Snapshot => format!(", {} cached from a checkpoint of the state", s.prompt_cached),
            Reuse::PrefixCache => format!(", {} from the prefix cache", s.prompt_cached),
            Reuse::Recomputed => ", recomputed: the model's recurrent state cannot go back to the common prefix".into(),
        },
        s.generated.len(),
        s.decode_tps(),
        match s.acceptance() {
            Some(a) => format!(
                " ({} drafts, {:.0}% accepted, {:.2} tokens a pass)",
                s.drafted,
                a * 100.0,
                s.tokens_per_pass().unwrap_or(1.0)
            ),
            None => String::new(),
        },
        s.ttft_ms,
        s.stop.name()
    )
}
