//! The engine worker: owns the engine on a thread of its own, takes commands from the UI and
//! reports tokens, routing and pool state as events. The UI never touches the engine.

use crate::engine::chat_template::{TemplateArgs, reasoning_effort};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::event::{Cmd, DoneInfo, EngineEvent, Event, Knobs, ModelInfo, PANE_PERIOD, PoolView, Step};
use crate::engine::harmony::ThinkTags;
use crate::engine::sampler::{Sampler, SamplerParams};
use crate::engine::session::{ChatSession, TurnEvent};
use crate::engine::{Engine, GenRequest};
use crate::experts::Experts;
use crate::experts::routing_log::RoutingLog;
use crate::model::{Observer, Tee};

/// Loads the engine on the worker thread; the error is one line for the user.
pub type Loader = Box<dyn FnOnce() -> Result<Loaded, String> + Send>;

/// What the worker runs: the engine, and the routing log its passes are recorded into.
pub struct Loaded {
    pub engine: Engine,
    pub routing_log: Option<RoutingLog>,
}

impl From<Engine> for Loaded {
    fn from(engine: Engine) -> Loaded {
        Loaded { engine, routing_log: None }
    }
}

/// Settings of a chat that are not the engine's.
#[derive(Debug, Clone)]
pub struct ChatSettings {
    pub sampler: SamplerParams,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub system: Option<String>,
    /// `enable_thinking`, `reasoning_effort`, ... for the template.
    pub template_args: TemplateArgs,
}

/// Collects routing per pass for the heatmap, and reports prompt progress. It and the token
/// callback both live on the worker's thread and share its data through a `RefCell`, never
/// borrowed across a call of the other.
pub(crate) struct Tap {
    shared: Rc<RefCell<TapData>>,
    ui: Sender<Event>,
    moe_layers: Vec<usize>,
}

#[derive(Default)]
pub(crate) struct TapData {
    counts: Vec<Vec<u32>>,
    last: Vec<Vec<usize>>,
    pub(crate) prefill_total: usize,
    pub(crate) prefill_base: usize,
    pub(crate) last_report: Option<Instant>,
}

impl Observer for Tap {
    fn routing(&mut self, layer: usize, pos: usize, experts: &[usize], _w: &[f32], _p: &[f32]) {
        let Some(li) = self.moe_layers.iter().position(|&l| l == layer) else { return };
        let mut d = self.shared.borrow_mut();
        for &e in experts {
            if let Some(c) = d.counts.get_mut(li).and_then(|c| c.get_mut(e)) {
                *c += 1;
            }
        }
        if let Some(l) = d.last.get_mut(li) {
            l.clear();
            l.extend_from_slice(experts);
        }
        // prompt progress, from the first MoE layer, a few times a second
        if li == 0 && d.prefill_total > 0 {
            let due = d.last_report.is_none_or(|t| t.elapsed() > Duration::from_millis(100));
            if due {
                d.last_report = Some(Instant::now());
                let done = (pos + 1).saturating_sub(d.prefill_base).min(d.prefill_total);
                let _ = self.ui.send(Event::Engine(EngineEvent::Prefill { done, total: d.prefill_total }));
            }
        }
    }
}

pub struct Worker {
    pub tx: Sender<Cmd>,
    pub cancel: Arc<AtomicBool>,
    handle: Option<JoinHandle<Option<Loaded>>>,
}

impl Worker {
    /// Start the worker: it loads the engine with `load` (so the workbench draws at once, while
    /// a big model maps), then serves commands; events go to `ui`.
    pub fn start(load: Loader, settings: ChatSettings, ui: Sender<Event>) -> Worker {
        let (tx, rx) = crossbeam_channel::unbounded::<Cmd>();
        let cancel = Arc::new(AtomicBool::new(false));
        let c = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("moescope-engine".into())
            .spawn(move || {
                crate::trace::recorder::set_thread_name("engine");
                match load() {
                    Ok(mut loaded) => {
                        run(&mut loaded, settings, rx, ui, &c);
                        Some(loaded)
                    }
                    Err(e) => {
                        let _ = ui.send(Event::Engine(EngineEvent::LoadFailed(e)));
                        None
                    }
                }
            })
            .unwrap_or_else(|e| panic!("cannot start the engine thread: {e}"));
        Worker { tx, cancel, handle: Some(handle) }
    }

    /// Stop the worker and get the engine back (for writing its routing log, say).
    pub fn stop(mut self) -> Option<Loaded> {
        self.cancel.store(true, Ordering::SeqCst);
        let _ = self.tx.send(Cmd::Quit);
        self.handle.take().and_then(|h| h.join().ok()).flatten()
    }
}

pub(crate) fn knobs(engine: &Engine) -> Knobs {
    knobs_of(engine.streamed().map(|e| e.as_ref()))
}

/// The knobs of a pool (all off without one).
pub(crate) fn knobs_of(experts: Option<&Experts>) -> Knobs {
    match experts {
        Some(ex) => Knobs {
            streaming: true,
            prefetch: ex.cache.prefetch_on(),
            budget_bytes: ex.cache.budget_bytes(),
            policy: ex.cache.policy().name().into(),
        },
        None => Knobs { streaming: false, prefetch: false, budget_bytes: 0, policy: "-".into() },
    }
}

pub fn model_info(engine: &Engine) -> ModelInfo {
    let pkg = engine.package();
    let m = &pkg.meta;
    ModelInfo {
        name: m.display_name(),
        arch: m.model.arch.name().into(),
        quant: m.quant.mode.clone(),
        moe_layers: m.model.moe_layers().len(),
        num_experts: m.model.num_experts,
        top_k: m.model.num_experts_per_tok,
        expert_groups: m.model.features.sigmoid_router.filter(|r| r.n_group > 1).map(|r| (r.n_group, r.topk_group)),
        shared_expert: m.model.shared_expert_width() > 0,
        blob_bytes: pkg.sizes().blob,
        experts_bytes: pkg.sizes().experts,
        expected_memory: engine.memory_plan().total,
        threads: engine.threads(),
        ctx: engine.ctx_size(),
        kv: {
            let kv = engine.kv_types();
            let bytes = crate::model::KvCache::bytes_at_capacity(&m.model, engine.ctx_size(), kv);
            format!("KV {kv} {} at {}", crate::tui::panes::bytes(bytes), engine.ctx_size())
        },
        isa: engine.isa().name().into(),
        io: engine.streamed().map_or("mapped".into(), |e| e.io.name().into()),
        has_template: engine.template().is_some(),
        warnings: engine.warnings().to_vec(),
        sizing: engine.sizing().map(str::to_string),
        knobs: knobs(engine),
        steering: match (engine.model().route_replay(), engine.model().cache_aware_routing()) {
            (Some(r), _) => {
                let file = std::path::Path::new(r.name()).file_name().map(|f| f.to_string_lossy().into_owned());
                Some(format!("routes from {}", file.unwrap_or_else(|| r.name().into())))
            }
            (None, Some(tol)) => Some(format!("cache-aware routing {tol}")),
            (None, None) => None,
        },
    }
}

fn run(loaded: &mut Loaded, mut settings: ChatSettings, rx: Receiver<Cmd>, ui: Sender<Event>, cancel: &AtomicBool) {
    let Loaded { engine, routing_log } = loaded;
    let send = |e: EngineEvent| {
        let _ = ui.send(Event::Engine(e));
    };
    let (mut tap, data) = tap(engine, &ui);
    let mut obs = Tee(routing_log, &mut tap);
    send(EngineEvent::Ready(Box::new(model_info(engine))));
    // the pool as loading left it, before any message
    send(EngineEvent::Step(Box::new(step(&data, engine.streamed().map(|e| e.as_ref()), 0, 0.0, true))));
    let mut session = ChatSession::new(settings.system.clone(), settings.template_args.clone());
    let mut sampler = Sampler::new(settings.sampler);
    let mut last_user: Option<String> = None;
    while let Ok(cmd) = rx.recv() {
        match cmd {
            Cmd::Quit => break,
            Cmd::Reset => {
                session.reset();
                engine.reset();
                last_user = None;
                send(EngineEvent::Notice("conversation cleared".into()));
            }
            Cmd::SetPrefetch(on) => {
                if let Some(ex) = engine.streamed() {
                    ex.cache.set_prefetch(on);
                }
                send(EngineEvent::Knobs(knobs(engine)));
            }
            Cmd::SetBudget(b) => {
                if let Some(ex) = engine.streamed() {
                    ex.cache.set_budget(b);
                }
                send(EngineEvent::Knobs(knobs(engine)));
            }
            Cmd::SetPolicy(p) => {
                if let Some(ex) = engine.streamed() {
                    ex.cache.set_policy(p);
                }
                send(EngineEvent::Knobs(knobs(engine)));
            }
            Cmd::Set(k, v) => match apply_setting(&mut settings, &k, &v) {
                Ok(msg) => {
                    sampler = Sampler::new(settings.sampler);
                    session.args = settings.template_args.clone();
                    send(EngineEvent::Notice(msg));
                }
                Err(e) => send(EngineEvent::Error(e)),
            },
            Cmd::Regen => match last_user.clone() {
                Some(u) => {
                    // the last turn, if it was recorded (a prompt that failed before generating
                    // was not)
                    if session.last_user() == Some(u.as_str()) {
                        session.pop_turn();
                    }
                    let mut ctx = Reply { engine, session: &mut session, sampler: &mut sampler, data: &data };
                    ctx.reply(&settings, &u, &mut obs, &send, cancel);
                }
                None => send(EngineEvent::Error("nothing to regenerate yet".into())),
            },
            Cmd::Chat(text) => {
                last_user = Some(text.clone());
                let mut ctx = Reply { engine, session: &mut session, sampler: &mut sampler, data: &data };
                ctx.reply(&settings, &text, &mut obs, &send, cancel);
                if let Some(n) = engine.resize_auto_pool() {
                    send(EngineEvent::Notice(n));
                    send(EngineEvent::Knobs(knobs(engine)));
                }
            }
        }
    }
}

/// The routing tap for `engine`'s MoE layers, and the data it shares with the token callback.
pub(crate) fn tap(engine: &Engine, ui: &Sender<Event>) -> (Tap, Rc<RefCell<TapData>>) {
    let moe_layers = engine.config().moe_layers();
    let e_n = engine.config().num_experts;
    let data = Rc::new(RefCell::new(TapData {
        counts: vec![vec![0; e_n]; moe_layers.len()],
        last: vec![Vec::new(); moe_layers.len()],
        ..Default::default()
    }));
    (Tap { shared: data.clone(), ui: ui.clone(), moe_layers }, data)
}

fn apply_setting(s: &mut ChatSettings, k: &str, v: &str) -> Result<String, String> {
    let f = || v.parse::<f32>().map_err(|_| format!("/set {k}: '{v}' is not a number"));
    let u = || v.parse::<usize>().map_err(|_| format!("/set {k}: '{v}' is not a whole number"));
    match k {
        "temperature" => s.sampler.temperature = f()?,
        "top_p" => s.sampler.top_p = f()?,
        "top_k" => s.sampler.top_k = u()?,
        "min_p" => s.sampler.min_p = f()?,
        "repeat_penalty" => s.sampler.repeat_penalty = f()?,
        "seed" => s.sampler.seed = u()? as u64,
        "max_tokens" => s.max_tokens = u()?.max(1),
        "think" => {
            s.template_args.enable_thinking = match v {
                "on" => None,
                "off" => Some(false),
                _ => return Err("/set think: on or off".into()),
            }
        }
        "effort" => {
            s.template_args.reasoning_effort = Some(reasoning_effort(v).map_err(|e| format!("/set effort: {e}"))?)
        }
        _ => {
            return Err(format!(
                "/set: unknown setting '{k}' (temperature, top_p, top_k, min_p, repeat_penalty, seed, max_tokens, think, effort)"
            ));
        }
    }
    s.sampler.validate()?;
    Ok(format!("{k} = {v}"))
}

/// What one reply works with.
struct Reply<'a> {
    engine: &'a mut Engine,
    session: &'a mut ChatSession,
    sampler: &'a mut Sampler,
    data: &'a Rc<RefCell<TapData>>,
}

impl Reply<'_> {
    /// One reply through the chat turn, with events per token for the UI.
    fn reply(
        &mut self,
        settings: &ChatSettings,
        text: &str,
        obs: &mut dyn Observer,
        send: &dyn Fn(EngineEvent),
        cancel: &AtomicBool,
    ) {
        cancel.store(false, Ordering::SeqCst);
        let data = self.data;
        let experts = self.engine.streamed().cloned();
        let before = experts.as_ref().map(|e| e.cache.total_stats()).unwrap_or_default();
        let mut generated = 0;
        let mut last = Instant::now();
        let mut last_full: Option<Instant> = None;
        let (mut started, mut tail) = (false, None);
        // a reply that begins inside the prompt's open <think> block: its first piece shows
        // the tag, so the chat pane folds the reasoning as it does a block the model opened
        let mut opened = false;
        // gpt-oss: the channels shown the way the chat pane shows Qwen's thinking
        let mut harmony = self.engine.harmony().then(ThinkTags::default);
        let req =
            GenRequest { max_tokens: settings.max_tokens, stop_at_eos: !settings.ignore_eos, cancel, progress: None };
        let res = self.session.turn(self.engine, self.sampler, req, text, obs, &mut |ev| match ev {
            TurnEvent::Prompt { tokens, cached, in_reasoning } => {
                started = true;
                opened = in_reasoning;
                {
                    let mut d = data.borrow_mut();
                    d.prefill_total = tokens - cached;
                    d.prefill_base = cached;
                    d.last_report = None;
                }
                send(EngineEvent::Prefill { done: 0, total: tokens });
            }
            TurnEvent::Token { id, piece } => {
                let first = generated == 0;
                if first {
                    // the prompt is done: no more progress reports
                    data.borrow_mut().prefill_total = 0;
                }
                generated += 1;
                let piece = match (harmony.as_mut(), piece) {
                    (Some(h), Some(p)) => Some(h.push(p)),
                    (_, Some(p)) if opened => {
                        opened = false;
                        Some(format!("<think>{p}"))
                    }
                    (_, p) => p.map(str::to_string),
                };
                send(EngineEvent::Token { id, piece });
                let step_ms = if first { 0.0 } else { last.elapsed().as_secs_f64() * 1000.0 };
                last = Instant::now();
                // the pool's full picture (grid, per-layer counters, latency percentiles) only as
                // often as the panes take it; every token carries the totals the per-token
                // figures need
                let full = last_full.is_none_or(|t: Instant| t.elapsed() >= PANE_PERIOD);
                if full {
                    last_full = Some(Instant::now());
                }
                send(EngineEvent::Step(Box::new(step(data, experts.as_deref(), generated, step_ms, full))));
            }
            TurnEvent::Tail(p) => tail = Some(p.to_string()),
        });
        if let Some(mut h) = harmony {
            let rest = h.push(tail.as_deref().unwrap_or("")) + &h.finish();
            tail = (!rest.is_empty()).then_some(rest);
        }
        // the pool as the reply left it, then the text the decoder held back
        if started {
            send(EngineEvent::Step(Box::new(step(data, experts.as_deref(), generated, 0.0, true))));
        }
        if let Some(p) = tail {
            send(EngineEvent::Token { id: u32::MAX, piece: Some(p) });
        }
        data.borrow_mut().prefill_total = 0;
        match res {
            Ok(turn) => {
                let stats = turn.stats;
                let delta = experts.as_ref().map(|e| e.cache.total_stats().sub(&before)).unwrap_or_default();
                send(EngineEvent::Done(Box::new(DoneInfo {
                    prompt_tokens: stats.prompt_evaluated,
                    cached_tokens: stats.prompt_cached,
                    generated: stats.generated.len(),
                    ttft_ms: stats.ttft_ms,
                    prefill_tps: stats.prefill_tps(),
                    decode_tps: stats.decode_tps(),
                    stop: stats.stop.name().into(),
                    experts: delta,
                    speculation: stats.acceptance().map(|a| (a, stats.tokens_per_pass().unwrap_or(1.0))),
                })));
            }
            Err(e) => send(EngineEvent::Error(e.to_string())),
        }
    }
}

/// Drain the tap's counts and read the pool: its counters always, its whole picture (and the
/// predictor's accuracy) when `full`.
pub(crate) fn step(
    data: &Rc<RefCell<TapData>>,
    experts: Option<&Experts>,
    token: usize,
    step_ms: f64,
    full: bool,
) -> Step {
    let (counts, last) = {
        let mut d = data.borrow_mut();
        let counts = d.counts.clone();
        for c in d.counts.iter_mut() {
            c.iter_mut().for_each(|x| *x = 0);
        }
        (counts, d.last.clone())
    };
    let (totals, pool) = match experts {
        Some(ex) if full => {
            let snapshot = ex.cache.snapshot();
            let view = PoolView { predict: ex.predictor.stats(), snapshot };
            (view.snapshot.totals, Some(Box::new(view)))
        }
        Some(ex) => (ex.cache.totals(), None),
        None => (Default::default(), None),
    };
    Step { token, counts, last, totals, pool, step_ms }
}
