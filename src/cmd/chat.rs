//! `moescope chat` (and `moescope` alone): the workbench, or the line REPL with `--plain` or
//! when stdin or stdout is not a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Result, bail};
use moescope::engine::Engine;
use moescope::trace::recorder;
use moescope::tui::{self, theme::Theme, worker::ChatSettings};
use serde_json::json;

use super::run_config::RunConfig;
use super::{experts_report, trace_out};
use crate::cli::ChatArgs;

/// Where `t` writes traces, under the current directory.
pub const TRACE_DIR: &str = "traces";

pub fn run(a: &ChatArgs) -> Result<()> {
    let r = &a.run;
    if r.prompt.is_some() || r.prompt_ids.is_some() || r.json || r.logits_out.is_some() {
        bail!("chat is interactive: --prompt, --prompt-ids, --json and --logits-out belong to `moescope run`");
    }
    let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
    if a.plain || dumb || !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        return super::run::run(r);
    }
    if a.fps == 0 || a.fps > 120 {
        bail!("--fps must be between 1 and 120");
    }
    let cfg = RunConfig::from_args(r)?;
    // recording from the start, so `t` can export the session so far (0 events: off)
    if r.trace.trace_max_events > 0 {
        // the newest events: a long session's export shows its latest tokens
        recorder::start_ring(r.trace.trace_max_events);
        recorder::set_thread_name("ui");
    } else if r.trace.trace.is_some() {
        bail!("--trace needs --trace-max-events above 0");
    }
    let (model, opts, routing_out, spec) = (cfg.model.clone(), cfg.engine, r.experts.routing_out.clone(), cfg.spec);
    let (route_from, aware) = (r.experts.route_from.clone(), r.experts.aware.cache_aware_routing);
    let label = model.file_name().map_or_else(|| model.display().to_string(), |n| n.to_string_lossy().into_owned());
    let load: tui::worker::Loader = Box::new(move || {
        let mut engine = Engine::load(&model, opts).map_err(|e| format!("{}: {e}", model.display()))?;
        engine.set_speculation(spec);
        experts_report::start_route_replay(&mut engine, route_from.as_deref()).map_err(|e| format!("{e:#}"))?;
        experts_report::start_cache_aware(&mut engine, aware).map_err(|e| format!("{e:#}"))?;
        let routing_log = match &routing_out {
            Some(p) => Some(experts_report::start_routing_log(&engine, p).map_err(|e| format!("{e:#}"))?),
            None => None,
        };
        Ok(tui::worker::Loaded { engine, routing_log })
    });
    let settings = ChatSettings {
        sampler: cfg.sampler,
        max_tokens: cfg.max_tokens,
        ignore_eos: cfg.ignore_eos,
        system: cfg.system.clone(),
        template_args: cfg.template_args.clone(),
    };
    let meta = json!({
        "command": "chat",
        "package": cfg.model.display().to_string(),
        "threads": cfg.engine.threads,
        "settings": {
            "n_predict": cfg.max_tokens, "temperature": r.temperature, "top_k": r.top_k, "top_p": r.top_p,
            "min_p": r.min_p, "repeat_penalty": r.repeat_penalty, "seed": cfg.sampler.seed,
            "cache_mb": r.cache_mb, "prefetch": r.prefetch, "policy": r.experts.policy,
            "route_from": r.experts.route_from,
            "cache_aware_routing": aware,
        },
    });
    let options = tui::Options {
        theme: Theme::detect(),
        trace_dir: PathBuf::from(TRACE_DIR),
        trace_meta: meta.clone(),
        model_label: label,
        mouse: a.mouse,
        fps: a.fps,
    };
    if let Some(loaded) = tui::run(load, settings, options)? {
        // the terminal is the shell's again: how full the pool's buffers ever were
        if let Some(l) = experts_report::pool_peak_line(&loaded.engine) {
            eprintln!("moescope: {l}");
        }
        experts_report::finish_routing_log(loaded.routing_log)?;
    }
    match &r.trace.trace {
        Some(p) => trace_out::TraceOut::to(p.clone()).finish(meta)?,
        None => {
            recorder::stop();
        }
    }
    Ok(())
}
