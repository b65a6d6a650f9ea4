//! `moescope serve`: an OpenAI-compatible HTTP server. axum and tokio take the connections; the
//! engine runs on its own OS thread and takes requests from one bounded FIFO queue, one at a
//! time, reusing the KV cache's longest common prefix between them (llama-server's
//! `cache_prompt`, mollm's one-engine design).
//!
//! ```text
//! client -> axum handler: parse, template, tokenize, context check -> Job -> queue (bounded)
//!        <- JSON or SSE chunks <- Event (Started, Text*, Done | Error) <- engine thread
//! ```

pub mod api;
pub mod expert_reads;
pub mod http;
pub mod metrics;
pub mod reply;
pub mod slots;
pub mod text;
pub mod think;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use serde_json::Value;

use crate::engine::chat_template::ChatTemplate;
use crate::engine::tokenizer::Tok;
use crate::engine::{Engine, GenStats};
use crate::experts::Experts;
use crate::model::{NoObserver, Observer};
use api::{ApiError, Defaults};
use metrics::Metrics;
use worker::Job;

/// What the HTTP side knows of the loaded model.
pub struct Loaded {
    /// The model's name in responses (`--alias`, else the package's name).
    pub id: String,
    pub tok: Arc<Tok>,
    pub template: Option<Arc<ChatTemplate>>,
    pub ctx: usize,
    pub vocab: usize,
    /// `/v1/models`' entry.
    pub card: Value,
    pub experts: Option<Arc<Experts>>,
}

/// State shared by the handlers and the engine thread.
pub struct Server {
    pub loaded: OnceLock<Loaded>,
    pub metrics: Metrics,
    pub metrics_on: bool,
    pub api_key: Option<String>,
    pub defaults: Defaults,
    pub next_id: AtomicU64,
    /// Start time (unix seconds): response ids are unique across restarts.
    pub started: u64,
    jobs: Sender<Job>,
    /// Set on shutdown: the engine thread drops the running requests and returns.
    stopping: AtomicBool,
    on_queue: Option<QueueHook>,
}

impl Server {
    /// Queue a request, or refuse it when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        match self.jobs.try_send(job) {
            Ok(()) => {
                Metrics::add(&self.metrics.requests, 1);
                let n = self.jobs.len();
                self.metrics.queued.store(n as u64, Ordering::Relaxed);
                if let Some(h) = &self.on_queue {
                    h(n);
                }
                Ok(())
            }
            Err(TrySendError::Full(_)) => {
                Metrics::add(&self.metrics.rejected_full, 1);
                let n = self.jobs.capacity().unwrap_or(0);
                Err(ApiError::new(
                    503,
                    "unavailable_error",
                    format!("the server is busy: {n} requests are waiting; retry later"),
                ))
            }
            Err(TrySendError::Disconnected(_)) => {
                Err(ApiError::new(503, "unavailable_error", "the server is shutting down"))
            }
        }
    }

    /// Stop taking requests and end the running ones.
    fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    pub fn queue_depth(&self) -> usize {
        self.jobs.len()
    }
}

/// Someone watching the engine thread serve (the workbench): built on the engine thread once
/// the model is loaded, told about each request as it runs, and given the engine between
/// requests (to apply what the user changed).
pub trait Watch {
    /// What sees every forward pass (routing for the heatmap).
    fn passes(&mut self) -> &mut dyn Observer;
    /// A request begins in `slot`: its prompt, how much of it the cache holds, and how many
    /// still wait.
    fn started(&mut self, id: &str, slot: usize, prompt_tokens: usize, cached: usize, waiting: usize);
    /// The request in `slot` sampled `token`.
    fn token(&mut self, slot: usize, token: u32);
    /// A step (one forward pass over the running requests) ended.
    fn step(&mut self, report: &StepReport);
    /// The request ended: `outcome` is stop, length, cancelled or an error's text.
    fn finished(&mut self, id: &str, slot: usize, outcome: &str, stats: Option<&GenStats>, waiting: usize);
    /// Between requests, and while the engine waits for one.
    fn between(&mut self, engine: &mut Engine);
}

/// What one step did: the sequences and tokens it held, the routed experts it read and the
/// tokens' choices of them, and the prefix cache so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepReport {
    pub sequences: usize,
    pub tokens: usize,
    pub experts_read: u64,
    pub expert_choices: u64,
    pub step_ms: f64,
    pub prefix_hits: u64,
    pub prefix_tokens: u64,
}

/// Builds the watch on the engine thread.
pub type WatchStart = Box<dyn FnOnce(&Engine) -> Box<dyn Watch> + Send>;

/// Told the queue's depth each time a request joins it.
pub type QueueHook = Arc<dyn Fn(usize) + Send + Sync>;

pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    pub alias: Option<String>,
    /// Requests that may wait behind the running ones.
    pub queue: usize,
    pub metrics: bool,
    pub body_limit: usize,
    pub defaults: Defaults,
    pub watch: Option<WatchStart>,
    pub on_queue: Option<QueueHook>,
    /// Stops the server when it fires (or its sender is dropped), as Ctrl+C does.
    pub shutdown: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// Loads the engine on the engine thread (the server answers `/health` with 503 meanwhile).
pub type Loader = Box<dyn FnOnce() -> Result<Engine, String> + Send>;

/// Serve until Ctrl+C or SIGTERM. `on_listen` is told the bound address (port 0 picks one).
pub fn run(mut opts: ServeOptions, load: Loader, on_listen: impl FnOnce(SocketAddr)) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("moescope-http")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the HTTP runtime: {e}"))?;
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = rt.block_on(tokio::net::TcpListener::bind(&addr)).map_err(|e| format!("binding {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| format!("{addr}: {e}"))?;
    let (tx, rx) = crossbeam_channel::bounded(opts.queue.max(1));
    let server = Arc::new(Server {
        loaded: OnceLock::new(),
        metrics: Metrics::default(),
        metrics_on: opts.metrics,
        api_key: opts.api_key.clone(),
        defaults: opts.defaults.clone(),
        next_id: AtomicU64::new(0),
        started: http::unix_now(),
        jobs: tx,
        stopping: AtomicBool::new(false),
        on_queue: opts.on_queue.clone(),
    });
    on_listen(local);
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<String>();
    let outside = opts.shutdown.take();
    let engine = {
        let (s, alias, watch) = (server.clone(), opts.alias.clone(), opts.watch.take());
        std::thread::Builder::new()
            .name("moescope-engine".into())
            .spawn(move || engine_thread(s, load, alias, watch, rx, fail_tx))
            .map_err(|e| format!("starting the engine thread: {e}"))?
    };
    let app = http::router(server.clone(), opts.body_limit);
    let s_async = server.clone();
    let res = rt.block_on(async move {
        let failed = std::sync::Arc::new(tokio::sync::Mutex::new(None));
        let (f2, s2) = (failed.clone(), s_async);
        let stop = async move {
            let outside = async move {
                match outside {
                    Some(rx) => {
                        let _ = rx.await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = outside => {}
                msg = fail_rx => if let Ok(m) = msg { *f2.lock().await = Some(m) },
            }
            // the running request stops at its next chunk or token, the waiting ones are
            // dropped: their streams end with an error and [DONE], and the connections close
            s2.stop();
        };
        let serve = axum::serve(listener, app).with_graceful_shutdown(stop);
        let r = serve.await.map_err(|e| format!("serving {local}: {e}"));
        let failed = failed.lock().await.take();
        match failed {
            Some(m) => Err(m),
            None => r,
        }
    });
    server.stop();
    drop(rt);
    let _ = engine.join();
    res
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn engine_thread(
    s: Arc<Server>,
    load: Loader,
    alias: Option<String>,
    watch: Option<WatchStart>,
    rx: Receiver<Job>,
    fail: tokio::sync::oneshot::Sender<String>,
) {
    crate::trace::recorder::set_thread_name("engine");
    let mut engine = match load() {
        Ok(e) => e,
        Err(m) => {
            let _ = fail.send(m);
            return;
        }
    };
    let Some(tok) = engine.tokenizer().cloned() else {
        let _ = fail.send("this package has no tokenizer, so it cannot be served".into());
        return;
    };
    let id = alias.unwrap_or_else(|| engine.package().meta.display_name());
    let mut card = model_card(&engine);
    card["id"] = id.clone().into();
    let _ = s.loaded.set(Loaded {
        id,
        vocab: tok.vocab_size().max(engine.config().vocab_size),
        tok,
        template: engine.template().cloned(),
        ctx: engine.ctx_size(),
        card,
        experts: engine.streamed().cloned(),
    });
    let mut watch = watch.map(|w| w(&engine));
    let mut quiet = Quiet { obs: NoObserver };
    let w: &mut dyn Watch = match watch.as_mut() {
        Some(w) => w.as_mut(),
        None => &mut quiet,
    };
    // the slots and prefix cache the memory plan fitted (`Engine::load_serving`)
    let seqs = engine.sequences();
    slots::serve(&s, &mut engine, &rx, w, slots::SlotOptions { parallel: seqs.slots, cache_ram: seqs.cache_bytes });
}

/// `/v1/models`' entry (llama-server's `meta`, plus the experts and the package's format).
fn model_card(e: &Engine) -> Value {
    let p = e.package();
    let c = e.config();
    serde_json::json!({
        "id": "", "object": "model", "created": http::unix_now(), "owned_by": "moescope",
        "meta": {
            "n_vocab": c.vocab_size, "n_ctx_train": c.max_position_embeddings, "n_ctx": e.ctx_size(),
            "n_embd": c.hidden_size, "n_layer": c.num_hidden_layers, "size": p.file_size(),
            "n_experts": c.num_experts, "n_experts_used": c.num_experts_per_tok, "quant": p.meta.quant.mode,
            "expert_pool_bytes": e.pool().map(|p| p.budget_bytes()),
        },
    })
}

/// No one watching: a server without the workbench.
struct Quiet {
    obs: NoObserver,
}

impl Watch for Quiet {
    fn passes(&mut self) -> &mut dyn Observer {
        &mut self.obs
    }
    fn started(&mut self, _: &str, _: usize, _: usize, _: usize, _: usize) {}
    fn token(&mut self, _: usize, _: u32) {}
    fn step(&mut self, _: &StepReport) {}
    fn finished(&mut self, _: &str, _: usize, _: &str, _: Option<&GenStats>, _: usize) {}
    fn between(&mut self, _: &mut Engine) {}
}
