//! The workbench: a terminal app that chats with the model while panes show routing, the
//! expert pool and SSD I/O, live.
//!
//! Threads: the engine runs on the worker (`worker.rs`) and reports `EngineEvent`s; an input
//! thread turns terminal input into `Event`s; the UI thread owns `App` (state) and only
//! renders. Everything reaches the UI thread through one channel of `Event`s; a burst of events
//! is applied before one redraw, and redraws are at least `1/fps` apart, whatever the token rate.

pub mod app;
pub mod event;
pub mod export;
pub mod input;
pub mod keys;
pub mod panes;
pub mod serving;
pub mod store;
pub mod term;
pub mod theme;
pub mod ui;
pub mod worker;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use app::{App, Outcome, Role};
use event::{Cmd, Event, Machine};
use theme::Theme;
use worker::{ChatSettings, Loaded, Loader, Worker};

/// Redraws a second at most, by default.
pub const DEFAULT_FPS: u32 = 30;
/// Clock ticks (RSS, expiring notes) this often when nothing else happens.
pub const TICK: Duration = Duration::from_millis(250);

pub struct Options {
    pub theme: Theme,
    /// Where `t` writes traces (`./traces`).
    pub trace_dir: PathBuf,
    /// Model and settings for the trace's metadata.
    pub trace_meta: serde_json::Value,
    /// What is being loaded, for the title while it loads.
    pub model_label: String,
    pub mouse: bool,
    /// Redraws a second at most.
    pub fps: u32,
}

/// Run the workbench until the user quits. Returns the engine (None if it never loaded).
pub fn run(load: Loader, settings: ChatSettings, opts: Options) -> std::io::Result<Option<Loaded>> {
    let (tx, rx) = crossbeam_channel::unbounded::<Event>();
    let mut guard = term::enter(opts.mouse)?;
    spawn_input(tx.clone());
    spawn_machine(tx.clone());
    // before the worker starts, so the engine and its compute threads inherit it (main()
    // sets it for every command; a library caller gets it here)
    crate::sysinfo::batch_scheduling();
    let worker = Worker::start(load, settings, tx);
    let mut app = App::new();
    app.model_label = opts.model_label.clone();
    event_loop(&mut guard, &rx, &mut app, &opts, &mut |o| match o {
        Outcome::Send(c) => {
            let _ = worker.tx.send(c);
        }
        Outcome::Cancel => worker.cancel.store(true, Ordering::SeqCst),
        _ => {}
    })?;
    drop(guard);
    if app.phase == app::Phase::Loading {
        // do not wait for a load to finish just to quit
        return Ok(None);
    }
    Ok(worker.stop())
}

/// The workbench watching a server (`serve --workbench`) listening on `addr`: the engine's
/// events come on `rx` (from [`serving::watch`]), the knobs the user turns go out on `cmds`.
/// Returns when the user quits.
pub fn run_serving(
    opts: Options,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    cmds: Sender<Cmd>,
    addr: String,
) -> std::io::Result<()> {
    let mut guard = term::enter(opts.mouse)?;
    spawn_input(tx.clone());
    spawn_machine(tx);
    let mut app = App::serving(addr);
    app.model_label = opts.model_label.clone();
    event_loop(&mut guard, &rx, &mut app, &opts, &mut |o| {
        if let Outcome::Send(c) = o {
            let _ = cmds.send(c);
        }
    })
}

/// Draw and apply events until the user quits; what the loop cannot do itself (commands for
/// the engine, cancelling) goes to `outside`.
fn event_loop(
    guard: &mut term::Guard,
    rx: &Receiver<Event>,
    app: &mut App,
    opts: &Options,
    outside: &mut dyn FnMut(Outcome),
) -> std::io::Result<()> {
    let frame = Duration::from_secs_f64(1.0 / opts.fps.clamp(1, 120) as f64);
    let mut last_draw: Option<Instant> = None;
    let mut last_tick = Instant::now();
    let mut dirty = true;
    loop {
        if dirty && last_draw.is_none_or(|t| t.elapsed() >= frame) {
            guard.term.draw(|f| ui::draw(f, app, &opts.theme))?;
            last_draw = Some(Instant::now());
            dirty = false;
        }
        let wait = match (dirty, last_draw) {
            (true, Some(t)) => frame.saturating_sub(t.elapsed()),
            _ => TICK.saturating_sub(last_tick.elapsed()),
        };
        if app.busy() {
            // while the engine computes, wake once a frame and take what has piled up, rather
            // than once per event: every wake-up can push a compute thread off its core
            std::thread::sleep(frame.saturating_sub(last_draw.map_or(frame, |t| t.elapsed())));
        }
        let first = match rx.recv_timeout(if app.busy() { Duration::ZERO } else { wait }) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut outcomes = Vec::new();
        for ev in first.into_iter().chain(rx.try_iter()) {
            outcomes.extend(app.on_event(ev));
            dirty = true;
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            outcomes.extend(app.on_event(Event::Tick));
            dirty = true;
        }
        for o in outcomes {
            match o {
                Outcome::ExportTrace => match export::trace(&opts.trace_dir, opts.trace_meta.clone()) {
                    Ok(msg) => app.report(Role::Info, msg),
                    Err(e) => app.report(Role::Error, format!("trace export failed: {e}")),
                },
                Outcome::Save(p) => match std::fs::write(&p, app.markdown()) {
                    Ok(()) => app.report(Role::Info, format!("conversation saved to {}", p.display())),
                    Err(e) => app.report(Role::Error, format!("/save {}: {e}", p.display())),
                },
                Outcome::Quit => app.quit = true,
                other => outside(other),
            }
        }
        if app.quit {
            break;
        }
    }
    Ok(())
}

/// How often the process's footprint is read.
const MACHINE_PERIOD: Duration = Duration::from_millis(500);

/// The process's footprint as events, on a thread of its own (reading /proc is a system call
/// or two the UI thread need not wait for); it ends with the workbench.
fn spawn_machine(tx: Sender<Event>) {
    let _ = std::thread::Builder::new().name("moescope-machine".into()).spawn(move || {
        loop {
            let m =
                Machine { rss: crate::sysinfo::current_rss_bytes(), trace_bytes: crate::trace::recorder::bytes_held() };
            if tx.send(Event::Machine(m)).is_err() {
                return;
            }
            std::thread::sleep(MACHINE_PERIOD);
        }
    });
}

/// Terminal input to events, on a thread of its own (reading blocks).
fn spawn_input(tx: Sender<Event>) {
    let _ = std::thread::Builder::new().name("moescope-input".into()).spawn(move || {
        crate::sysinfo::batch_scheduling();
        use crossterm::event::Event as CE;
        loop {
            let ev = match crossterm::event::read() {
                Ok(CE::Key(k)) => Event::Key(k),
                Ok(CE::Paste(s)) => Event::Paste(s),
                Ok(CE::Resize(w, h)) => Event::Resize(w, h),
                Ok(_) => continue,
                Err(_) => break,
            };
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
}
