//! The workbench's state: the conversation, the input, per-pane view state and the snapshots the
//! engine sends; `on_event` is the only way it changes. Drawing reads it and never writes.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::text::Line;

use super::event::{Cmd, DoneInfo, EngineEvent, Event, Knobs, ModelInfo, RequestEvent};
use super::input::Input;
use super::keys::Action;
use super::serving::Serving;
use super::store::Store;
use crate::experts::policy::PolicyKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Chat,
    Routing,
    Cache,
    Io,
}

pub const PANES: [Pane; 4] = [Pane::Chat, Pane::Routing, Pane::Cache, Pane::Io];

impl Pane {
    pub fn title(self) -> &'static str {
        match self {
            Pane::Chat => "Chat",
            Pane::Routing => "Routing",
            Pane::Cache => "Cache",
            Pane::Io => "SSD I/O",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Input,
    Commands,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    Loading,
    /// The model did not load: only quitting makes sense.
    Failed,
    Idle,
    Prefill {
        done: usize,
        total: usize,
    },
    Decoding {
        tokens: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    Info,
    Error,
}

/// One message, with its wrapped lines cached for the width they were wrapped at.
#[derive(Debug)]
pub struct Msg {
    pub role: Role,
    pub text: String,
    pub wrapped: RefCell<Option<(u16, bool, Vec<Line<'static>>)>>,
}

impl Msg {
    pub fn new(role: Role, text: impl Into<String>) -> Msg {
        Msg { role, text: text.into(), wrapped: RefCell::new(None) }
    }
}

/// What the UI asks the loop to do after an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Send(Cmd),
    Cancel,
    ExportTrace,
    Save(PathBuf),
    Quit,
}

pub struct App {
    pub info: Option<ModelInfo>,
    pub knobs: Option<Knobs>,
    pub messages: Vec<Msg>,
    /// Lines scrolled up from the bottom of the conversation (0: follow the reply).
    pub scroll: usize,
    pub fold_thinking: bool,
    pub input: Input,
    pub mode: Mode,
    pub focus: Pane,
    pub expanded: bool,
    pub help: bool,
    pub phase: Phase,
    /// What the panes show, built from the engine's steps.
    pub store: Store,
    pub last_done: Option<DoneInfo>,
    pub status_note: Option<(String, Instant)>,
    pub rss: u64,
    /// What the trace recorder holds (it is on for the whole session, for `t`).
    pub trace_bytes: u64,
    quit_armed: bool,
    pub quit: bool,
    /// What is loading (shown until the model is ready).
    pub model_label: String,
    /// The most the conversation can scroll up, as the last draw found it.
    pub scroll_max: std::cell::Cell<usize>,
    /// `serve --workbench`: the server's requests, shown in place of the chat.
    pub serving: Option<Serving>,
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

impl App {
    pub fn new() -> App {
        App {
            info: None,
            knobs: None,
            messages: Vec::new(),
            scroll: 0,
            fold_thinking: false,
            input: Input::default(),
            mode: Mode::Input,
            focus: Pane::Chat,
            expanded: false,
            help: false,
            phase: Phase::Loading,
            store: Store::default(),
            last_done: None,
            status_note: None,
            rss: 0,
            trace_bytes: 0,
            quit_armed: false,
            quit: false,
            model_label: String::new(),
            scroll_max: std::cell::Cell::new(usize::MAX),
            serving: None,
        }
    }

    /// The workbench watching a server listening on `addr`: no chat, a requests pane.
    pub fn serving(addr: String) -> App {
        App { serving: Some(Serving::new(addr)), mode: Mode::Commands, ..App::new() }
    }

    pub fn busy(&self) -> bool {
        matches!(self.phase, Phase::Prefill { .. } | Phase::Decoding { .. })
    }

    fn note(&mut self, s: impl Into<String>) {
        self.status_note = Some((s.into(), Instant::now()));
    }

    fn push(&mut self, role: Role, text: impl Into<String>) {
        self.messages.push(Msg::new(role, text));
    }

    /// A line for the user from the loop (exports, saves): in the conversation and the status.
    pub fn report(&mut self, role: Role, text: impl Into<String>) {
        let t = text.into();
        self.note(t.clone());
        self.push(role, t);
    }

    /// The one entry point: apply `ev`, return what the loop must do.
    pub fn on_event(&mut self, ev: Event) -> Vec<Outcome> {
        match ev {
            Event::Key(k) => self.on_key(k),
            Event::Paste(_) if self.serving.is_some() => vec![],
            Event::Paste(s) => {
                self.mode = Mode::Input;
                self.input.insert(&s);
                vec![]
            }
            Event::Resize(..) => vec![],
            Event::Machine(m) => {
                self.rss = m.rss;
                self.trace_bytes = m.trace_bytes;
                vec![]
            }
            Event::Tick => {
                self.store.tick();
                if self.status_note.as_ref().is_some_and(|(_, t)| t.elapsed() > Duration::from_secs(8)) {
                    self.status_note = None;
                }
                vec![]
            }
            Event::Engine(e) => {
                self.on_engine(e);
                vec![]
            }
        }
    }

    fn on_engine(&mut self, e: EngineEvent) {
        match e {
            EngineEvent::Ready(info) => {
                self.knobs = Some(info.knobs.clone());
                if let Some(s) = &info.sizing {
                    self.push(Role::Info, format!("memory: {s}"));
                }
                for w in &info.warnings {
                    self.push(Role::Info, format!("warning: {w}"));
                }
                self.info = Some(*info);
                self.phase = Phase::Idle;
            }
            EngineEvent::LoadFailed(msg) => {
                self.push(Role::Error, format!("cannot load the model: {msg}"));
                self.phase = Phase::Failed;
            }
            EngineEvent::Prefill { done, total } => self.phase = Phase::Prefill { done, total },
            EngineEvent::Request(r) => self.on_request(r),
            EngineEvent::Token { piece, .. } => {
                if let Phase::Decoding { tokens } = &mut self.phase {
                    *tokens += 1;
                } else {
                    self.phase = Phase::Decoding { tokens: 1 };
                }
                if let Some(p) = piece.filter(|_| self.serving.is_none()) {
                    match self.messages.last_mut() {
                        Some(m) if m.role == Role::Assistant => {
                            m.text.push_str(&p);
                            m.wrapped.replace(None);
                        }
                        _ => self.push(Role::Assistant, p),
                    }
                }
            }
            EngineEvent::Step(s) => self.store.on_step(*s),
            EngineEvent::Done(d) => {
                let e = &d.experts;
                let mut line = format!(
                    "{} tokens · TTFT {:.0} ms · prefill {:.1} t/s{} · decode {:.1} t/s · stop: {}",
                    d.generated,
                    d.ttft_ms,
                    d.prefill_tps,
                    if d.cached_tokens > 0 { format!(" ({} cached)", d.cached_tokens) } else { String::new() },
                    d.decode_tps,
                    d.stop
                );
                if e.hits + e.misses > 0 {
                    line.push_str(&format!(" · hits {:.1}% · SSD {:.1} MB", e.hit_pct(), e.bytes_read() as f64 / 1e6));
                }
                self.push(Role::Info, line);
                self.store.reply_done();
                self.last_done = Some(*d);
                self.phase = Phase::Idle;
            }
            EngineEvent::Error(msg) => {
                self.push(Role::Error, msg);
                if self.busy() {
                    self.phase = Phase::Idle;
                }
            }
            EngineEvent::Notice(msg) => self.note(msg),
            EngineEvent::Knobs(k) => {
                self.note(format!(
                    "prefetch {} · pool {:.0} MiB · {}",
                    if k.prefetch { "on" } else { "off" },
                    k.budget_bytes as f64 / (1u64 << 20) as f64,
                    k.policy
                ));
                self.knobs = Some(k);
            }
        }
    }

    fn on_request(&mut self, r: RequestEvent) {
        let Some(sv) = &mut self.serving else { return };
        match &r {
            RequestEvent::Started { .. } => self.phase = Phase::Prefill { done: 0, total: 0 },
            RequestEvent::Finished { outcome, id, .. } => {
                self.store.reply_done();
                // idle once no slot runs a request (this one was still counted)
                if sv.active.len() <= 1 {
                    self.phase = Phase::Idle;
                }
                if !matches!(outcome.as_str(), "stop" | "length" | "cancelled") {
                    self.messages.push(Msg::new(Role::Error, format!("{id}: {outcome}")));
                }
            }
            RequestEvent::Queued { .. } | RequestEvent::Token { .. } | RequestEvent::Step(_) => {}
        }
        sv.on(r);
    }

    /// Problems in words, for the status line.
    pub fn warnings(&self) -> Vec<&'static str> {
        let mut w = Vec::new();
        let recent = &self.store.recent;
        if recent.len() >= 4 {
            let r = self.store.recent_summary();
            if r.stall_ms > 0.3 * self.store.recent_step_ms() {
                w.push("SSD-bound");
            }
            if r.reloads as f64 / recent.len() as f64 > 1.0
                || (r.hit_pct < 50.0 && recent.iter().any(|x| x.delta.evictions > 0))
            {
                w.push("cache thrashing");
            }
            if r.prefetch_wasted > r.prefetch_useful && r.prefetch_wasted > 0 {
                w.push("prefetch wasted");
            }
        }
        if let Some(i) = &self.info
            && self.rss > 0
            && self.rss as f64 > 1.1 * (i.expected_memory + self.trace_bytes) as f64
        {
            w.push("memory over budget");
        }
        w
    }

    fn on_key(&mut self, k: KeyEvent) -> Vec<Outcome> {
        if k.kind == KeyEventKind::Release {
            return vec![];
        }
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        let alt = k.modifiers.contains(KeyModifiers::ALT);
        let shift = k.modifiers.contains(KeyModifiers::SHIFT);
        if self.help {
            self.help = false;
            return vec![];
        }
        // anywhere
        if ctrl && k.code == KeyCode::Char('c') {
            if self.busy() && self.serving.is_none() {
                self.note("stopping the reply");
                return vec![Outcome::Cancel];
            }
            if !self.input.text.is_empty() {
                self.input.clear();
                return vec![];
            }
            if self.quit_armed {
                self.quit = true;
                return vec![Outcome::Quit];
            }
            self.quit_armed = true;
            self.note("Ctrl+C again to quit");
            return vec![];
        }
        self.quit_armed = false;
        match k.code {
            KeyCode::PageUp => {
                self.scroll = (self.scroll + 10).min(self.scroll_max.get());
                return vec![];
            }
            KeyCode::PageDown => {
                self.scroll = self.scroll.saturating_sub(10);
                return vec![];
            }
            KeyCode::Esc => {
                self.mode = Mode::Commands;
                if self.busy() && self.serving.is_none() {
                    self.note("stopping the reply");
                    return vec![Outcome::Cancel];
                }
                return vec![];
            }
            _ => {}
        }
        match self.mode {
            Mode::Input => self.on_input_key(k, ctrl, alt, shift),
            Mode::Commands => self.on_command_key(k),
        }
    }

    fn on_input_key(&mut self, k: KeyEvent, ctrl: bool, alt: bool, shift: bool) -> Vec<Outcome> {
        match k.code {
            KeyCode::Enter if alt || shift => self.input.insert("\n"),
            KeyCode::Char('j') if ctrl => self.input.insert("\n"),
            KeyCode::Char('u') if ctrl => self.input.clear(),
            KeyCode::Enter => return self.submit(),
            KeyCode::Char(c) if !ctrl && !alt => self.input.insert(c.encode_utf8(&mut [0; 4])),
            KeyCode::Backspace => self.input.backspace(),
            KeyCode::Delete => self.input.delete(),
            KeyCode::Left => self.input.left(),
            KeyCode::Right => self.input.right(),
            KeyCode::Home => self.input.home(),
            KeyCode::End => self.input.end(),
            KeyCode::Up if !self.input.is_multiline() => self.input.prev(),
            KeyCode::Down if !self.input.is_multiline() => self.input.next(),
            KeyCode::Tab => {
                self.mode = Mode::Commands;
                self.cycle_focus();
            }
            _ => {}
        }
        vec![]
    }

    fn cycle_focus(&mut self) {
        let i = PANES.iter().position(|p| *p == self.focus).unwrap_or(0);
        self.focus = PANES[(i + 1) % PANES.len()];
    }

    /// Which action a key is in command mode: looked up in the key map the help is drawn from.
    pub fn command_action(k: &KeyEvent) -> Option<Action> {
        super::keys::command_action(k.code)
    }

    fn on_command_key(&mut self, k: KeyEvent) -> Vec<Outcome> {
        let Some(a) = App::command_action(&k) else {
            return vec![];
        };
        match a {
            Action::EnterInput if self.serving.is_some() => self.note("serving: requests come over HTTP (q quits)"),
            Action::EnterInput => self.mode = Mode::Input,
            Action::TogglePrefetch => {
                if let Some(kn) = &self.knobs {
                    if !kn.streaming {
                        self.note("experts are not streamed (--no-stream): no prefetch");
                        return vec![];
                    }
                    return vec![Outcome::Send(Cmd::SetPrefetch(!kn.prefetch))];
                }
            }
            Action::BudgetDown | Action::BudgetUp => {
                if let (Some(kn), Some(i)) = (&self.knobs, &self.info)
                    && kn.streaming
                {
                    let step = (i.experts_bytes / 10).max(i.blob_bytes);
                    let b = if a == Action::BudgetUp {
                        (kn.budget_bytes + step).min(i.experts_bytes)
                    } else {
                        kn.budget_bytes.saturating_sub(step).max(i.blob_bytes * i.top_k as u64)
                    };
                    return vec![Outcome::Send(Cmd::SetBudget(b))];
                }
            }
            Action::CyclePolicy => {
                if let Some(kn) = &self.knobs {
                    let next = match kn.policy.as_str() {
                        "foresight" => PolicyKind::LeastStale,
                        "least-stale" => PolicyKind::Lru,
                        _ => PolicyKind::Foresight,
                    };
                    return vec![Outcome::Send(Cmd::SetPolicy(next))];
                }
            }
            Action::Freeze => {
                self.store.frozen = !self.store.frozen;
                if !self.store.frozen {
                    self.store.publish();
                }
                self.note(if self.store.frozen { "panes frozen (f to resume)" } else { "panes live" });
            }
            Action::Expand => self.expanded = !self.expanded,
            Action::CycleFocus => self.cycle_focus(),
            Action::ExportTrace => return vec![Outcome::ExportTrace],
            Action::FoldThinking => {
                self.fold_thinking = !self.fold_thinking;
                for m in &self.messages {
                    m.wrapped.replace(None);
                }
            }
            Action::Help => self.help = true,
            Action::Quit => {
                self.quit = true;
                return vec![Outcome::Quit];
            }
            _ => {}
        }
        vec![]
    }

    /// Enter in the input: a slash command or a message.
    fn submit(&mut self) -> Vec<Outcome> {
        let text = self.input.take();
        let t = text.trim();
        if t.is_empty() {
            return vec![];
        }
        if let Some(cmd) = t.strip_prefix('/') {
            let mut parts = cmd.split_whitespace();
            let name = parts.next().unwrap_or("");
            let rest: Vec<&str> = parts.collect();
            return match (name, rest.as_slice()) {
                ("reset", []) => {
                    self.messages.clear();
                    self.scroll = 0;
                    vec![Outcome::Send(Cmd::Reset)]
                }
                ("regen", []) if !self.busy() => {
                    if matches!(self.messages.iter().rev().find(|m| m.role != Role::Info), Some(m) if m.role == Role::Assistant)
                    {
                        while let Some(m) = self.messages.last() {
                            if m.role == Role::User {
                                break;
                            }
                            self.messages.pop();
                        }
                    }
                    vec![Outcome::Send(Cmd::Regen)]
                }
                ("save", [f]) => vec![Outcome::Save(PathBuf::from(f))],
                ("set", [k, v]) => vec![Outcome::Send(Cmd::Set(k.to_string(), v.to_string()))],
                ("quit" | "exit", []) => {
                    self.quit = true;
                    vec![Outcome::Quit]
                }
                ("help", []) => {
                    self.help = true;
                    vec![]
                }
                _ => {
                    self.push(Role::Error, format!("unknown command /{cmd} (try /help)"));
                    vec![]
                }
            };
        }
        if self.busy() {
            self.note("a reply is running: Esc stops it");
            self.input.text = text;
            self.input.end();
            return vec![];
        }
        if matches!(self.phase, Phase::Loading | Phase::Failed) {
            self.note(if self.phase == Phase::Loading {
                "the model is still loading"
            } else {
                "the model did not load: q quits"
            });
            self.input.text = text;
            self.input.end();
            return vec![];
        }
        self.push(Role::User, text.clone());
        self.scroll = 0;
        self.phase = Phase::Prefill { done: 0, total: 0 };
        vec![Outcome::Send(Cmd::Chat(text))]
    }

    /// The conversation as Markdown (`/save`).
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        for m in &self.messages {
            let who = match m.role {
                Role::User => "## User",
                Role::Assistant => "## Assistant",
                Role::Info | Role::Error => continue,
            };
            s.push_str(&format!("{who}\n\n{}\n\n", m.text.trim_end()));
        }
        s
    }
}
