//! `moescope serve`: the OpenAI-compatible server (src/serve/) with `run`'s model, engine,
//! streaming and trace options; its sampling options are the defaults of requests that leave
//! them out.

use std::io::Write;

use anyhow::{Result, bail};
use moescope::engine::Engine;
use moescope::serve::{self, ServeOptions, api::Defaults};
use serde_json::json;

use super::run::RunConfig;
use super::{experts_report, trace_out};
use crate::cli::ServeArgs;

pub fn run(a: &ServeArgs) -> Result<()> {
    let r = &a.run;
    if r.prompt.is_some() || r.prompt_ids.is_some() || r.json || r.logits_out.is_some() || r.chat {
        bail!(
            "serve takes its prompts from requests: --prompt, --prompt-ids, --chat, --json and --logits-out belong to `moescope run`"
        );
    }
    if r.system.is_some() {
        bail!("serve: --system does not apply (a request's messages carry their own system message)");
    }
    if r.experts.routing_out.is_some() {
        bail!("serve: --routing-out is not supported here (record routing with `moescope run`)");
    }
    if a.queue == 0 {
        bail!("--queue must be at least 1");
    }
    let cfg = RunConfig::from_args(r)?;
    let trace = trace_out::begin(&r.trace);
    let (model, engine_opts) = (cfg.model.clone(), cfg.engine);
    let (route_from, aware) = (r.experts.route_from.clone(), r.experts.aware.cache_aware_routing);
    let load: serve::Loader = Box::new(move || {
        let mut engine = Engine::load(&model, engine_opts).map_err(|e| format!("{}: {e}", model.display()))?;
        for w in &engine.warnings {
            eprintln!("warning: {w}");
        }
        if let Some(s) = &engine.sizing {
            eprintln!("moescope: memory: {s}");
        }
        for line in [
            experts_report::start_route_replay(&mut engine, route_from.as_deref()).map_err(|e| format!("{e:#}"))?,
            experts_report::start_cache_aware(&mut engine, aware).map_err(|e| format!("{e:#}"))?,
        ]
        .into_iter()
        .flatten()
        {
            eprintln!("moescope: {line}");
        }
        eprintln!(
            "moescope: {} ({}), {} threads, {} kernels, context {} tokens",
            engine.package().meta.display_name(),
            engine.package().meta.quant.mode,
            engine.exec.threads(),
            engine.exec.isa,
            engine.kv.capacity()
        );
        eprintln!("moescope: {}", experts_report::describe(&engine));
        eprintln!("moescope: {}", experts_report::memory_line(&engine));
        eprintln!("moescope: ready");
        Ok(engine)
    });
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone(),
        alias: a.alias.clone(),
        queue: a.queue,
        metrics: a.metrics,
        body_limit: a.max_body_bytes,
        defaults: Defaults {
            sampler: cfg.sampler,
            seed: r.seed,
            max_tokens: r.n_predict,
            enable_thinking: cfg.enable_thinking,
        },
    };
    if opts.host != "127.0.0.1" && opts.host != "localhost" && opts.host != "::1" && opts.api_key.is_none() {
        eprintln!("warning: serving on {} without --api-key: anyone who can reach it can use it", opts.host);
    }
    serve::run(opts, load, |addr| {
        // the one line on stdout: scripts and tests read the port from it
        println!("listening on {addr}");
        let _ = std::io::stdout().flush();
    })
    .map_err(anyhow::Error::msg)?;
    if let Some(t) = trace {
        t.finish(
            json!({"command": "serve", "package": cfg.model.display().to_string(), "threads": cfg.engine.threads}),
        )?;
    }
    Ok(())
}
