//! `serve --workbench`: the panes watching the serving engine. The engine thread's side is a
//! [`serve::Watch`](crate::serve::Watch) that reports routing, the pool and each request as
//! the chat worker does; the UI's side keeps the requests (waiting, running, done) for the
//! requests pane, which takes the chat's place.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::event::{Cmd, EngineEvent, Event, PANE_PERIOD, RequestEvent};
use super::worker::{Tap, TapData, knobs_of, model_info, step, tap};
use crate::engine::{Engine, GenStats};
use crate::experts::Experts;
use crate::model::Observer;
use crate::serve::{Watch, WatchStart};

/// Requests the pane keeps after they end.
const KEEP: usize = 64;

/// The running request as the UI sees it.
#[derive(Debug, Clone)]
pub struct Active {
    pub id: String,
    pub prompt_tokens: usize,
    pub cached: usize,
    pub tokens: usize,
    pub started: Instant,
    pub first_token: Option<Instant>,
}

impl Active {
    /// Decode speed so far: tokens after the first over the time since it.
    pub fn tok_s(&self) -> f64 {
        match self.first_token {
            Some(t) if self.tokens > 1 => (self.tokens - 1) as f64 / t.elapsed().as_secs_f64().max(1e-6),
            _ => 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    pub id: String,
    pub outcome: String,
    pub tokens: usize,
    pub ttft_ms: f64,
    pub decode_tps: f64,
}

#[derive(Debug, Clone)]
pub struct Serving {
    pub addr: String,
    pub waiting: usize,
    pub active: Option<Active>,
    /// Newest first.
    pub done: VecDeque<Done>,
    pub served: usize,
    pub cancelled: usize,
    pub failed: usize,
}

impl Serving {
    pub fn new(addr: String) -> Serving {
        Serving { addr, waiting: 0, active: None, done: VecDeque::new(), served: 0, cancelled: 0, failed: 0 }
    }

    pub fn on(&mut self, r: RequestEvent) {
        match r {
            RequestEvent::Queued { waiting } => self.waiting = waiting,
            RequestEvent::Started { id, prompt_tokens, cached, waiting } => {
                self.waiting = waiting;
                self.active =
                    Some(Active { id, prompt_tokens, cached, tokens: 0, started: Instant::now(), first_token: None });
            }
            RequestEvent::Finished { id, outcome, tokens, ttft_ms, decode_tps, waiting } => {
                self.waiting = waiting;
                self.active = None;
                match outcome.as_str() {
                    "stop" | "length" => self.served += 1,
                    "cancelled" => self.cancelled += 1,
                    _ => self.failed += 1,
                }
                self.done.push_front(Done { id, outcome, tokens, ttft_ms, decode_tps });
                self.done.truncate(KEEP);
            }
        }
    }

    pub fn token(&mut self) {
        if let Some(a) = &mut self.active {
            a.tokens += 1;
            a.first_token.get_or_insert_with(Instant::now);
        }
    }
}

/// The engine thread's watch, sending what the panes need to `ui` and applying the knobs the
/// user turns (`cmds`) between tokens and requests.
pub fn watch(ui: Sender<Event>, cmds: Receiver<Cmd>) -> WatchStart {
    Box::new(move |engine: &Engine| {
        let send = |e: EngineEvent| {
            let _ = ui.send(Event::Engine(e));
        };
        let (tap, data) = tap(engine, &ui);
        send(EngineEvent::Ready(Box::new(model_info(engine))));
        send(EngineEvent::Step(Box::new(step(&data, engine.streamed().map(|e| e.as_ref()), 0, 0.0, true))));
        let sink = Box::new(|_: u32| {});
        Box::new(ServeWatch {
            tap,
            data,
            ui: ui.clone(),
            cmds: Rc::new(cmds),
            experts: engine.streamed().cloned(),
            sink,
        })
    })
}

struct ServeWatch {
    tap: Tap,
    data: Rc<RefCell<TapData>>,
    ui: Sender<Event>,
    cmds: Rc<Receiver<Cmd>>,
    experts: Option<Arc<Experts>>,
    /// The running request's token callback.
    sink: Box<dyn FnMut(u32)>,
}

/// Apply the knob commands waiting in `cmds` to the pool; the chat's commands do not apply.
fn apply(cmds: &Receiver<Cmd>, experts: Option<&Experts>, ui: &Sender<Event>) {
    for c in cmds.try_iter() {
        let ev = match (c, experts) {
            (Cmd::SetPrefetch(on), Some(ex)) => {
                ex.cache.set_prefetch(on);
                EngineEvent::Knobs(knobs_of(Some(ex)))
            }
            (Cmd::SetBudget(b), Some(ex)) => {
                ex.cache.set_budget(b);
                EngineEvent::Knobs(knobs_of(Some(ex)))
            }
            (Cmd::SetPolicy(p), Some(ex)) => {
                ex.cache.set_policy(p);
                EngineEvent::Knobs(knobs_of(Some(ex)))
            }
            _ => EngineEvent::Notice("serving: requests come over HTTP".into()),
        };
        let _ = ui.send(Event::Engine(ev));
    }
}

impl Watch for ServeWatch {
    fn passes(&mut self) -> (&mut dyn Observer, &mut dyn FnMut(u32)) {
        (&mut self.tap, &mut *self.sink)
    }

    fn started(&mut self, id: &str, prompt_tokens: usize, cached: usize, waiting: usize) {
        {
            let mut d = self.data.borrow_mut();
            d.prefill_total = prompt_tokens - cached;
            d.prefill_base = cached;
            d.last_report = None;
        }
        let send = |e: EngineEvent| {
            let _ = self.ui.send(Event::Engine(e));
        };
        send(EngineEvent::Request(RequestEvent::Started { id: id.into(), prompt_tokens, cached, waiting }));
        send(EngineEvent::Prefill { done: 0, total: prompt_tokens });
        let (data, ui, experts, cmds) = (self.data.clone(), self.ui.clone(), self.experts.clone(), self.cmds.clone());
        let (mut generated, mut last, mut last_full) = (0usize, Instant::now(), None::<Instant>);
        self.sink = Box::new(move |id| {
            if generated == 0 {
                // the prompt is done: no more progress reports
                data.borrow_mut().prefill_total = 0;
            }
            generated += 1;
            let _ = ui.send(Event::Engine(EngineEvent::Token { id, piece: None }));
            let step_ms = if generated == 1 { 0.0 } else { last.elapsed().as_secs_f64() * 1000.0 };
            last = Instant::now();
            let full = last_full.is_none_or(|t| t.elapsed() >= PANE_PERIOD);
            if full {
                last_full = Some(Instant::now());
            }
            let s = step(&data, experts.as_deref(), generated, step_ms, full);
            let _ = ui.send(Event::Engine(EngineEvent::Step(Box::new(s))));
            apply(&cmds, experts.as_deref(), &ui);
        });
    }

    fn finished(&mut self, id: &str, outcome: &str, stats: Option<&GenStats>, waiting: usize) {
        self.data.borrow_mut().prefill_total = 0;
        self.sink = Box::new(|_| {});
        let s = step(&self.data, self.experts.as_deref(), stats.map_or(0, |s| s.generated.len()), 0.0, true);
        let _ = self.ui.send(Event::Engine(EngineEvent::Step(Box::new(s))));
        let r = RequestEvent::Finished {
            id: id.into(),
            outcome: outcome.into(),
            tokens: stats.map_or(0, |s| s.generated.len()),
            ttft_ms: stats.map_or(0.0, |s| s.ttft_ms),
            decode_tps: stats.map_or(0.0, GenStats::decode_tps),
            waiting,
        };
        let _ = self.ui.send(Event::Engine(EngineEvent::Request(r)));
    }

    fn between(&mut self, _engine: &mut Engine) {
        apply(&self.cmds, self.experts.as_deref(), &self.ui);
    }
}
