//! `serve --workbench`: the panes watching the serving engine. The engine thread's side is a
//! [`serve::Watch`](crate::serve::Watch) that reports routing, the pool, each request and each
//! step (the batch, the experts it read, the prefix cache) as the chat worker does; the UI's side
//! keeps the slots' requests (running, done) for the requests pane, which takes the chat's
//! place.

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
use crate::serve::{StepReport, Watch, WatchStart};

/// Requests the pane keeps after they end.
const KEEP: usize = 64;

/// A running request as the UI sees it.
#[derive(Debug, Clone)]
pub struct Active {
    pub id: String,
    pub slot: usize,
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
    /// The running requests, by slot.
    pub active: Vec<Active>,
    /// The latest step.
    pub step: Option<crate::serve::StepReport>,
    /// Newest first.
    pub done: VecDeque<Done>,
    pub served: usize,
    pub cancelled: usize,
    pub failed: usize,
}

impl Serving {
    pub fn new(addr: String) -> Serving {
        Serving {
            addr,
            waiting: 0,
            active: Vec::new(),
            step: None,
            done: VecDeque::new(),
            served: 0,
            cancelled: 0,
            failed: 0,
        }
    }

    pub fn on(&mut self, r: RequestEvent) {
        match r {
            RequestEvent::Queued { waiting } => self.waiting = waiting,
            RequestEvent::Started { id, slot, prompt_tokens, cached, waiting } => {
                self.waiting = waiting;
                self.active.retain(|a| a.slot != slot);
                let a =
                    Active { id, slot, prompt_tokens, cached, tokens: 0, started: Instant::now(), first_token: None };
                self.active.push(a);
                self.active.sort_by_key(|a| a.slot);
            }
            RequestEvent::Token { slot } => {
                if let Some(a) = self.active.iter_mut().find(|a| a.slot == slot) {
                    a.tokens += 1;
                    a.first_token.get_or_insert_with(Instant::now);
                }
            }
            RequestEvent::Step(s) => self.step = Some(s),
            RequestEvent::Finished { id, slot, outcome, tokens, ttft_ms, decode_tps, waiting } => {
                self.waiting = waiting;
                self.active.retain(|a| a.slot != slot);
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
        Box::new(ServeWatch {
            tap,
            data,
            ui: ui.clone(),
            cmds: Rc::new(cmds),
            experts: engine.streamed().cloned(),
            tokens: 0,
            last_full: None,
        })
    })
}

struct ServeWatch {
    tap: Tap,
    data: Rc<RefCell<TapData>>,
    ui: Sender<Event>,
    cmds: Rc<Receiver<Cmd>>,
    experts: Option<Arc<Experts>>,
    /// Tokens sampled since the server started, and when the panes last had a full report.
    tokens: usize,
    last_full: Option<Instant>,
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
    fn passes(&mut self) -> &mut dyn Observer {
        &mut self.tap
    }

    fn started(&mut self, id: &str, slot: usize, prompt_tokens: usize, cached: usize, waiting: usize) {
        {
            let mut d = self.data.borrow_mut();
            d.prefill_total = prompt_tokens - cached;
            d.prefill_base = cached;
            d.last_report = None;
        }
        let send = |e: EngineEvent| {
            let _ = self.ui.send(Event::Engine(e));
        };
        send(EngineEvent::Request(RequestEvent::Started { id: id.into(), slot, prompt_tokens, cached, waiting }));
        send(EngineEvent::Prefill { done: 0, total: prompt_tokens });
    }

    fn token(&mut self, slot: usize, id: u32) {
        // a prompt is done once its first token is out: no more progress reports
        self.data.borrow_mut().prefill_total = 0;
        self.tokens += 1;
        let _ = self.ui.send(Event::Engine(EngineEvent::Request(RequestEvent::Token { slot })));
        let _ = self.ui.send(Event::Engine(EngineEvent::Token { id, piece: None }));
    }

    fn step(&mut self, report: &StepReport) {
        let full = self.last_full.is_none_or(|t| t.elapsed() >= PANE_PERIOD);
        if full {
            self.last_full = Some(Instant::now());
        }
        let s = step(&self.data, self.experts.as_deref(), self.tokens, report.step_ms, full);
        let _ = self.ui.send(Event::Engine(EngineEvent::Step(Box::new(s))));
        let _ = self.ui.send(Event::Engine(EngineEvent::Request(RequestEvent::Step(*report))));
        apply(&self.cmds, self.experts.as_deref(), &self.ui);
    }

    fn finished(&mut self, id: &str, slot: usize, outcome: &str, stats: Option<&GenStats>, waiting: usize) {
        self.data.borrow_mut().prefill_total = 0;
        let s = step(&self.data, self.experts.as_deref(), self.tokens, 0.0, true);
        let _ = self.ui.send(Event::Engine(EngineEvent::Step(Box::new(s))));
        let r = RequestEvent::Finished {
            id: id.into(),
            slot,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::StepReport;

    #[test]
    fn slots_run_side_by_side_and_each_counts_its_tokens() {
        let mut sv = Serving::new("127.0.0.1:1".into());
        let started =
            |id: &str, slot| RequestEvent::Started { id: id.into(), slot, prompt_tokens: 10, cached: 2, waiting: 0 };
        sv.on(started("b", 1));
        sv.on(started("a", 0));
        for slot in [0, 1, 1] {
            sv.on(RequestEvent::Token { slot });
        }
        let step =
            StepReport { sequences: 2, tokens: 2, experts_read: 12, expert_choices: 16, ..StepReport::default() };
        sv.on(RequestEvent::Step(step));
        assert_eq!(
            sv.active.iter().map(|a| (a.id.as_str(), a.slot, a.tokens)).collect::<Vec<_>>(),
            [("a", 0, 1), ("b", 1, 2)]
        );
        assert_eq!(sv.step, Some(step));
        let finished = RequestEvent::Finished {
            id: "b".into(),
            slot: 1,
            outcome: "stop".into(),
            tokens: 2,
            ttft_ms: 1.0,
            decode_tps: 1.0,
            waiting: 0,
        };
        sv.on(finished);
        assert_eq!((sv.active.len(), sv.active[0].id.as_str(), sv.served), (1, "a", 1));
    }
}
