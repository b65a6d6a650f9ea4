//! `moescope serve`: the OpenAI-compatible server (src/serve/) with `run`'s model, engine,
//! streaming and trace options; its sampling options are the defaults of requests that leave
//! them out.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use moescope::engine::Engine;
use moescope::serve::{self, ServeOptions, api::Defaults};
use moescope::trace::recorder;
use moescope::tui::{
    self,
    event::{EngineEvent, Event, RequestEvent},
    theme::Theme,
};
use serde_json::json;

use super::run_config::RunConfig;
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
    if a.parallel == Some(0) {
        bail!("--parallel must be at least 1");
    }
    if a.workbench && (!std::io::stdin().is_terminal() || !std::io::stdout().is_terminal()) {
        bail!("serve --workbench needs a terminal (stdin and stdout)");
    }
    let cfg = RunConfig::from_args(r)?;
    // the workbench records from the start, so `t` can export the session so far
    let trace = if a.workbench && r.trace.trace_max_events > 0 {
        recorder::start_ring(r.trace.trace_max_events);
        recorder::set_thread_name("ui");
        r.trace.trace.clone().map(trace_out::TraceOut::to)
    } else {
        trace_out::begin(&r.trace)
    };
    let (model, engine_opts) = (cfg.model.clone(), cfg.engine);
    let (route_from, aware) = (r.experts.route_from.clone(), r.experts.aware.cache_aware_routing);
    // under the workbench, the terminal is the workbench's: the loader says nothing
    let quiet = a.workbench;
    let serving = Some((a.parallel, a.cache_ram.map(|mib| mib << 20)));
    let load: serve::Loader = Box::new(move || {
        let mut engine =
            Engine::load_serving(&model, engine_opts, serving).map_err(|e| format!("{}: {e}", model.display()))?;
        if quiet {
            experts_report::start_route_replay(&mut engine, route_from.as_deref()).map_err(|e| format!("{e:#}"))?;
            experts_report::start_cache_aware(&mut engine, aware).map_err(|e| format!("{e:#}"))?;
            return Ok(engine);
        }
        for w in engine.warnings() {
            eprintln!("warning: {w}");
        }
        if let Some(s) = engine.sizing() {
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
            engine.threads(),
            engine.isa(),
            engine.ctx_size()
        );
        eprintln!("moescope: {}", experts_report::describe(&engine));
        eprintln!("moescope: {}", experts_report::memory_line(&engine));
        let seqs = engine.sequences();
        eprintln!(
            "moescope: {} slots (requests at once), each with a KV cache of {} positions; prefix cache {} MiB",
            seqs.slots,
            engine.ctx_size(),
            seqs.cache_bytes >> 20
        );
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
            template_args: cfg.template_args.clone(),
        },
        watch: None,
        on_queue: None,
        shutdown: None,
    };
    if opts.host != "127.0.0.1" && opts.host != "localhost" && opts.host != "::1" && opts.api_key.is_none() {
        eprintln!("warning: serving on {} without --api-key: anyone who can reach it can use it", opts.host);
    }
    let meta = json!({"command": "serve", "package": cfg.model.display().to_string(), "threads": cfg.engine.threads});
    let say = |addr: std::net::SocketAddr| {
        // the one line on stdout: scripts and tests read the port from it
        println!("listening on {addr}");
        let _ = std::io::stdout().flush();
    };
    if a.workbench {
        with_workbench(opts, load, &cfg, meta.clone(), say)?;
    } else {
        serve::run(opts, load, say).map_err(anyhow::Error::msg)?;
    }
    if let Some(t) = trace {
        t.finish(meta)?;
    }
    Ok(())
}

/// The server on a thread of its own, the workbench on this one; quitting the workbench stops
/// the server.
fn with_workbench(
    mut opts: ServeOptions,
    load: serve::Loader,
    cfg: &RunConfig,
    meta: serde_json::Value,
    say: impl FnOnce(std::net::SocketAddr) + Send + 'static,
) -> Result<()> {
    let (ev_tx, ev_rx) = crossbeam_channel::unbounded::<Event>();
    let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    opts.watch = Some(tui::serving::watch(ev_tx.clone(), cmd_rx));
    let q = ev_tx.clone();
    opts.on_queue = Some(Arc::new(move |waiting| {
        let _ = q.send(Event::Engine(EngineEvent::Request(RequestEvent::Queued { waiting })));
    }));
    opts.shutdown = Some(stop_rx);
    // a model that does not load: the workbench says why
    let failed = ev_tx.clone();
    let load: serve::Loader = Box::new(move || {
        load().inspect_err(|e| {
            let _ = failed.send(Event::Engine(EngineEvent::LoadFailed(e.clone())));
        })
    });
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::Builder::new().name("moescope-serve".into()).spawn(move || {
        serve::run(opts, load, move |addr| {
            say(addr);
            let _ = addr_tx.send(addr);
        })
    })?;
    let Ok(addr) = addr_rx.recv() else {
        return match server.join() {
            Ok(r) => r.map_err(anyhow::Error::msg),
            Err(_) => bail!("the server thread failed"),
        };
    };
    let label =
        cfg.model.file_name().map_or_else(|| cfg.model.display().to_string(), |n| n.to_string_lossy().into_owned());
    let options = tui::Options {
        theme: Theme::detect(),
        trace_dir: PathBuf::from(super::chat::TRACE_DIR),
        trace_meta: meta,
        model_label: label,
        mouse: false,
        fps: tui::DEFAULT_FPS,
    };
    let ui = tui::run_serving(options, ev_tx, ev_rx, cmd_tx, addr.to_string());
    let _ = stop_tx.send(());
    let served = server.join();
    ui?;
    match served {
        Ok(r) => r.map_err(anyhow::Error::msg),
        Err(_) => bail!("the server thread failed"),
    }
}
