//! The workbench's panes, drawn into ratatui's TestBackend from engine events, at 80x24 and
//! 200x60: a real reply recorded from the engine worker on the demo model, and synthetic event
//! streams for what a small model will not show (binning, warnings). Every expected value is
//! computed here from the events, not read back from the app's own arithmetic.

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use moescope::engine::sampler::SamplerParams;
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::pool::{Cell, PoolSnapshot, PoolTotals, QueueDepth, Residency};
use moescope::experts::stats::{LayerStats, PredictStats};
use moescope::tui::app::{App, Outcome, Pane};
use moescope::tui::event::{Cmd, EngineEvent, Event, Knobs, Machine, ModelInfo, PoolView, Step};
use moescope::tui::theme::{Depth, Theme};
use moescope::tui::ui;
use moescope::tui::worker::{ChatSettings, Loaded, Worker};
use moescope_kernels::Isa;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Color;

const FULL: Theme = Theme { depth: Depth::Full };
const MONO: Theme = Theme { depth: Depth::Mono };
const SIZES: [(u16, u16); 2] = [(80, 24), (200, 60)];

/// One greedy reply of the demo model, streamed through the real worker, as the UI got it.
fn recorded() -> &'static Vec<Event> {
    static EVENTS: OnceLock<Vec<Event>> = OnceLock::new();
    EVENTS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let (pkg, _) = moescope::demo::ensure_package(dir.path()).expect("demo package");
        let (tx, rx) = crossbeam_channel::unbounded();
        let load = Box::new(move || {
            Engine::load(
                &pkg,
                EngineOptions {
                    threads: 2,
                    ctx_size: Some(512),
                    isa: Isa::detect(),
                    stream: Some(Default::default()),
                    panels: true,
                    kv: moescope::model::KvTypes::F32,
                },
            )
            .map(Loaded::from)
            .map_err(|e| e.to_string())
        });
        let settings = ChatSettings {
            sampler: SamplerParams { temperature: 0.0, ..Default::default() },
            max_tokens: 40,
            ignore_eos: true,
            system: None,
            template_args: Default::default(),
        };
        let w = Worker::start(load, settings, tx);
        w.tx.send(Cmd::Chat(PROMPT.into())).unwrap();
        let mut evs = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let ev = rx.recv_timeout(Duration::from_secs(30)).expect("engine events");
            let done =
                matches!(ev, Event::Engine(EngineEvent::Done(_) | EngineEvent::Error(_) | EngineEvent::LoadFailed(_)));
            evs.push(ev);
            if done {
                break;
            }
        }
        w.stop();
        drop(dir);
        evs
    })
}

const PROMPT: &str = "How do lifetimes work?";

/// An app that got the recorded events, with the prompt typed in as a user would once the
/// model was ready.
fn app_from(evs: &[Event]) -> App {
    let mut app = App::new();
    for (i, e) in evs.iter().enumerate() {
        app.on_event(e.clone());
        if i == 0 {
            let mut out = Vec::new();
            for c in PROMPT.chars() {
                out.extend(app.on_event(Event::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))));
            }
            out.extend(app.on_event(Event::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE))));
            assert_eq!(out, vec![Outcome::Send(Cmd::Chat(PROMPT.into()))]);
        }
    }
    app
}

fn render(app: &App, th: &Theme, (w, h): (u16, u16)) -> Buffer {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| ui::draw(f, app, th)).unwrap();
    t.backend().buffer().clone()
}

fn rows(b: &Buffer) -> Vec<String> {
    (0..b.area.height).map(|y| (0..b.area.width).map(|x| b[(x, y)].symbol().to_string()).collect()).collect()
}

fn screen(b: &Buffer) -> String {
    rows(b).join("\n")
}

/// Where a pane's frame is: (x of its left border, y of its title row, y of its bottom border).
fn pane_box(b: &Buffer, title: &str) -> (u16, u16, u16) {
    let rs = rows(b);
    for (y, r) in rs.iter().enumerate() {
        if let Some(i) = r.find(&format!("┌ {title}")) {
            let x = r[..i].chars().count() as u16;
            let bottom = (y + 1..rs.len()).find(|&yy| b[(x, yy as u16)].symbol() == "└").expect("bottom border");
            return (x, y as u16, bottom as u16);
        }
    }
    panic!("no pane titled {title}:\n{}", rs.join("\n"));
}

/// The grid rows of a pane: y of the row labelled `L{layer}` (one layer per row).
fn label_row(b: &Buffer, (x, top, bottom): (u16, u16, u16), layer: usize) -> Option<u16> {
    let want = format!("L{layer:<3}");
    (top + 1..bottom).find(|&y| (x + 1..x + 5).map(|xx| b[(xx, y)].symbol().to_string()).collect::<String>() == want)
}

fn last_step(evs: &[Event]) -> &Step {
    evs.iter()
        .rev()
        .find_map(|e| match e {
            Event::Engine(EngineEvent::Step(s)) => Some(&**s),
            _ => None,
        })
        .expect("a step")
}

fn info(evs: &[Event]) -> &ModelInfo {
    evs.iter()
        .find_map(|e| match e {
            Event::Engine(EngineEvent::Ready(i)) => Some(&**i),
            _ => None,
        })
        .expect("ready")
}

fn show(app: &mut App, pane: Pane) {
    app.mode = moescope::tui::app::Mode::Commands;
    app.focus = pane;
}

#[test]
fn the_recorded_reply_draws_in_every_pane_at_both_sizes() {
    let evs = recorded();
    assert!(matches!(evs.last(), Some(Event::Engine(EngineEvent::Done(_)))), "the reply finished: {:?}", evs.last());
    let inf = info(evs);
    let step = last_step(evs);
    let tokens =
        evs.iter().filter(|e| matches!(e, Event::Engine(EngineEvent::Token { id, .. }) if *id != u32::MAX)).count();
    assert_eq!(tokens, 40);
    let t = &step.totals.stats;
    let hits = format!("hits {:.1}% all", 100.0 * t.hits as f64 / (t.hits + t.misses) as f64);
    let pool = &step.pool.as_ref().expect("streaming: the pool's picture").snapshot;
    let res = &pool.residency;
    let resident = res.cells.iter().filter(|c| **c == Cell::Resident).count();
    for size in SIZES {
        let mut app = app_from(evs);
        let rich = size.0 >= 100;
        // chat: the stats line counts the tokens that streamed
        let s = screen(&render(&app, &FULL, size));
        assert!(s.contains(&format!("{tokens} tokens · TTFT")), "{size:?}:\n{s}");
        if rich {
            assert!(s.contains("› How do lifetimes work?"), "{size:?}:\n{s}");
        }
        assert!(s.contains("idle"), "{size:?}: status:\n{s}");
        if !rich {
            assert!(s.contains(" Chat │ Routing │ Cache │ SSD I/O"), "tabs at {size:?}:\n{s}");
        }
        // routing: legend and this token's picks, expert by expert
        show(&mut app, Pane::Routing);
        let b = render(&app, &FULL, size);
        let s = screen(&b);
        assert!(s.contains("cell = 1 layer × 1 expert"), "{size:?}:\n{s}");
        assert!(s.contains("recent picks (decay 0.9/tok)"), "{size:?}:\n{s}");
        let bx = pane_box(&b, "Routing");
        for (l, picks) in step.last.iter().enumerate() {
            let y = label_row(&b, bx, l).unwrap_or_else(|| panic!("{size:?}: no row for layer {l}:\n{s}"));
            let gx = bx.0 + 5;
            let drawn: Vec<u16> =
                (gx..b.area.width).filter(|&x| b[(x, y)].symbol() != " " && b[(x, y)].symbol() != "│").collect();
            // wide cells: expert e is drawn at gx + e*cw over cw-1 columns, then a gap
            let last_x = *drawn.last().unwrap();
            let cw = (last_x - gx + 2) as usize / inf.num_experts;
            assert!(cw >= 2, "{size:?}: 32 experts get wide cells");
            let lit: BTreeSet<usize> = drawn
                .iter()
                .filter(|&&x| b[(x, y)].fg == Color::Indexed(231))
                .map(|&x| (x - gx) as usize / cw)
                .collect();
            let want: BTreeSet<usize> = picks.iter().copied().collect();
            assert_eq!(lit, want, "{size:?}: layer {l} highlights its picks");
        }
        // cache: occupancy, counts and the hit rate from the counters
        show(&mut app, Pane::Cache);
        let s = screen(&render(&app, &FULL, size));
        assert!(s.contains(&format!("· {resident} experts")), "{size:?}: {resident} resident:\n{s}");
        assert!(s.contains(&hits), "{size:?}: {hits}:\n{s}");
        for state in ["resident", "reading", "predicted/in flight", "evicted", "free"] {
            assert!(s.contains(state), "{size:?}: legend {state}");
        }
        // I/O: bytes by cause, latency over the reads that happened
        show(&mut app, Pane::Io);
        let s = screen(&render(&app, &FULL, size));
        let lat = &pool.read_latency;
        if lat.count > 0 {
            assert!(s.contains(&format!("{} reads", lat.count)), "{size:?}:\n{s}");
        }
        assert!(
            s.contains(&format!(
                "read: demand {:.1} MB · prefetch {:.1} MB",
                t.bytes_demand as f64 / 1e6,
                t.bytes_prefetch as f64 / 1e6
            )),
            "{size:?}:\n{s}"
        );
        assert!(s.contains("queue: "), "{size:?}:\n{s}");
        if rich {
            // all panes at once
            for p in ["Chat", "Routing", "Cache", "SSD I/O"] {
                assert!(s.contains(&format!(" {p} ")), "{size:?}: pane {p}:\n{s}");
            }
        }
    }
}

#[test]
fn without_colour_picks_are_marked_by_a_character() {
    let evs = recorded();
    let step = last_step(evs);
    let mut app = app_from(evs);
    show(&mut app, Pane::Routing);
    let b = render(&app, &MONO, (200, 60));
    let bx = pane_box(&b, "Routing");
    for (l, picks) in step.last.iter().enumerate() {
        let y = label_row(&b, bx, l).expect("row");
        let n = (bx.0 + 5..b.area.width).filter(|&x| b[(x, y)].symbol() == "◆").count();
        // wide cells: cw-1 marks per expert
        assert!(n >= picks.len() && n % picks.len() == 0, "layer {l}: {n} marks for {} picks", picks.len());
    }
}

/// A model shaped like Qwen3-30B-A3B (48 layers x 128 experts, top-8) for synthetic events.
fn big_info(expected_memory: u64) -> ModelInfo {
    ModelInfo {
        name: "synthetic".into(),
        arch: "qwen3_moe".into(),
        quant: "q4".into(),
        moe_layers: 48,
        num_experts: 128,
        top_k: 8,
        expert_groups: None,
        shared_expert: false,
        blob_bytes: 1 << 20,
        experts_bytes: (48 * 128) << 20,
        expected_memory,
        threads: 2,
        ctx: 4096,
        kv: "KV bf16 384 MiB at 4096".into(),
        isa: "avx2".into(),
        io: "direct".into(),
        has_template: true,
        warnings: vec![],
        sizing: None,
        knobs: Knobs { streaming: true, prefetch: true, budget_bytes: (48 * 64) << 20, policy: "foresight".into() },
        steering: None,
    }
}

fn synthetic_step(token: usize, totals: LayerStats, last: Vec<Vec<usize>>) -> Step {
    let (l, e) = (48, 128);
    let mut counts = vec![vec![0u32; e]; l];
    for (li, p) in last.iter().enumerate() {
        for &x in p {
            counts[li][x] += 1;
        }
    }
    let totals = PoolTotals { stats: totals, reads: 0, disk_busy_ns: 0 };
    let snapshot = PoolSnapshot {
        residency: Residency {
            n_layers: l,
            num_experts: e,
            cells: vec![Cell::Resident; l * e],
            resident_bytes: 1 << 30,
            budget_bytes: 2 << 30,
        },
        totals,
        per_layer: vec![LayerStats::default(); l],
        queue: QueueDepth { demand: 1, prefetch: 2, in_flight: 3 },
        read_latency: Default::default(),
    };
    Step {
        token,
        counts,
        last,
        totals,
        pool: Some(Box::new(PoolView { snapshot, predict: PredictStats::default() })),
        step_ms: if token == 0 { 0.0 } else { 60.0 },
    }
}

#[test]
fn binned_heatmap_draws_what_its_legend_says() {
    let mut app = App::new();
    app.on_event(Event::Engine(EngineEvent::Ready(Box::new(big_info(u64::MAX)))));
    // layer l picks experts (l*3 + 5j) % 128
    let last: Vec<Vec<usize>> = (0..48).map(|l| (0..8).map(|j| (l * 3 + 5 * j) % 128).collect()).collect();
    app.on_event(Event::Engine(EngineEvent::Step(Box::new(synthetic_step(1, LayerStats::default(), last.clone())))));
    show(&mut app, Pane::Routing);
    for size in SIZES {
        let b = render(&app, &FULL, size);
        let s = screen(&b);
        // "cell = A layers × B experts" (or "1 layer", "1 expert")
        let legend =
            s.lines().find_map(|l| l.split("cell = ").nth(1)).unwrap_or_else(|| panic!("{size:?}: legend:\n{s}"));
        let num = |w: &str| -> usize { w.split_whitespace().next().unwrap().parse().unwrap() };
        let mut parts = legend.split(" × ");
        let (lb, eb) = (num(parts.next().unwrap()), num(parts.next().unwrap()));
        let half = legend.contains("2 per row");
        assert!(half, "{size:?}: 48 layers need half blocks: {legend}");
        let want: BTreeSet<(usize, usize)> =
            last.iter().enumerate().flat_map(|(l, p)| p.iter().map(move |&e| (l / lb, e / eb))).collect();
        let bx = pane_box(&b, "Routing");
        let gx = bx.0 + 5;
        let mut lit = BTreeSet::new();
        for y in bx.1 + 1..bx.2 {
            let label: String = (bx.0 + 1..bx.0 + 5).map(|x| b[(x, y)].symbol().to_string()).collect();
            let Some(first) = label.strip_prefix('L').and_then(|n| n.trim().parse::<usize>().ok()) else { continue };
            let slot = first / lb;
            // cells are one column each when experts are binned, else the gap tells the width
            let cw = if eb > 1 {
                1
            } else {
                ((bx.0..b.area.width).filter(|&x| b[(x, y)].symbol() == "▀").max().unwrap() - gx + 2) as usize / 128
            };
            for x in gx..b.area.width {
                let c = &b[(x, y)];
                if c.symbol() != "▀" {
                    continue;
                }
                let col = (x - gx) as usize / cw;
                if c.fg == Color::Indexed(231) {
                    lit.insert((slot, col));
                }
                if c.bg == Color::Indexed(231) {
                    lit.insert((slot + 1, col));
                }
            }
        }
        assert_eq!(lit, want, "{size:?}: {legend}");
    }
}

#[test]
fn warnings_say_what_is_wrong_in_words() {
    for size in SIZES {
        let mut app = App::new();
        // a plan of 1 byte: the process's RSS is over it
        app.on_event(Event::Engine(EngineEvent::Ready(Box::new(big_info(1)))));
        let picks: Vec<Vec<usize>> = (0..48).map(|_| (0..8).collect()).collect();
        let mut t = LayerStats::default();
        for tok in 0..10 {
            // 50 ms of every 60 ms step waiting for reads; prefetches all wasted
            t.stall_ns += 50_000_000;
            t.stalls += 8;
            t.misses += 8;
            t.hits += 2;
            t.bytes_prefetch += 4 << 20;
            t.prefetch_wasted_bytes += 4 << 20;
            t.evictions += 8;
            t.reloads_soon += 4;
            app.on_event(Event::Engine(EngineEvent::Step(Box::new(synthetic_step(tok, t, picks.clone())))));
        }
        // the footprint as the workbench's sampler reads it
        let machine = Machine { rss: moescope::sysinfo::current_rss_bytes(), trace_bytes: 0 };
        app.on_event(Event::Machine(machine));
        app.on_event(Event::Tick);
        let s = screen(&render(&app, &FULL, size));
        let status = s.lines().last().unwrap();
        for w in ["SSD-bound", "cache thrashing", "prefetch wasted", "memory over budget"] {
            assert!(status.contains(w), "{size:?}: '{w}' in the status line: {status}");
        }
        // and a healthy run warns of nothing
        let mut calm = App::new();
        calm.on_event(Event::Engine(EngineEvent::Ready(Box::new(big_info(u64::MAX)))));
        let mut t = LayerStats::default();
        for tok in 0..10 {
            t.hits += 8;
            t.prefetch_useful_bytes += 1 << 20;
            calm.on_event(Event::Engine(EngineEvent::Step(Box::new(synthetic_step(tok, t, picks.clone())))));
        }
        calm.on_event(Event::Machine(machine));
        calm.on_event(Event::Tick);
        let s = screen(&render(&calm, &FULL, size));
        let status = s.lines().last().unwrap();
        for w in ["SSD-bound", "cache thrashing", "prefetch wasted", "memory over budget"] {
            assert!(!status.contains(w), "{size:?}: no '{w}': {status}");
        }
    }
}

#[test]
fn drawing_wraps_only_what_is_on_screen() {
    let mut app = App::new();
    app.on_event(Event::Engine(EngineEvent::Ready(Box::new(big_info(u64::MAX)))));
    for i in 0..2000 {
        app.messages.push(moescope::tui::app::Msg::new(moescope::tui::app::Role::User, format!("message {i}")));
    }
    render(&app, &FULL, (200, 60));
    let wrapped = app.messages.iter().filter(|m| m.wrapped.borrow().is_some()).count();
    assert!(wrapped < 60, "{wrapped} of 2000 messages wrapped for a 60-row screen");
    assert!(app.messages[0].wrapped.borrow().is_none());
    // a streamed token re-wraps only the reply it extends
    app.on_event(Event::Engine(EngineEvent::Token { id: 1, piece: Some("hello".into()) }));
    render(&app, &FULL, (200, 60));
    let before: Vec<bool> = app.messages.iter().map(|m| m.wrapped.borrow().is_some()).collect();
    app.on_event(Event::Engine(EngineEvent::Token { id: 2, piece: Some(" world".into()) }));
    let n = app.messages.len();
    assert!(app.messages[n - 1].wrapped.borrow().is_none(), "the reply's wrap is stale");
    assert!(app.messages[n - 2].wrapped.borrow().is_some(), "earlier messages keep theirs");
    assert_eq!(
        before[..n - 1],
        app.messages[..n - 1].iter().map(|m| m.wrapped.borrow().is_some()).collect::<Vec<_>>()[..]
    );
}

#[test]
fn help_lists_every_key_of_the_live_map() {
    let mut app = App::new();
    app.on_event(Event::Key(KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE)));
    app.on_event(Event::Key(KeyEvent::new(KeyCode::Char('?'), KeyModifiers::NONE)));
    for size in SIZES {
        let s = screen(&render(&app, &FULL, size));
        for b in moescope::tui::keys::KEYMAP {
            assert!(s.contains(b.keys), "{size:?}: help shows {}:\n{s}", b.keys);
            if size.0 >= 100 {
                assert!(s.contains(b.what), "{size:?}: help says what {} does:\n{s}", b.keys);
            }
        }
        for (c, _) in moescope::tui::keys::COMMANDS {
            assert!(s.contains(c), "{size:?}: help shows {c}:\n{s}");
        }
    }
    // every command-mode key in the help does something: it maps to its action
    for b in moescope::tui::keys::KEYMAP.iter().filter(|b| b.place == moescope::tui::keys::Where::Commands) {
        let first = b.keys.split([',', ' ']).next().unwrap();
        let code = match first {
            "Tab" => KeyCode::Tab,
            "Enter" => KeyCode::Enter,
            k => KeyCode::Char(k.chars().next().unwrap()),
        };
        let got = App::command_action(&KeyEvent::new(code, KeyModifiers::NONE));
        assert_eq!(got, Some(b.action), "key {first}");
    }
}

#[test]
fn a_reply_shorter_than_a_sample_window_still_shows_its_reads() {
    // a fast reply on a small model: two steps ~30 ms apart, 5 MB read, then done; the I/O
    // history must get a point for it (it used to wait for 250 ms of steps that never came)
    let mut app = App::new();
    app.on_event(Event::Engine(EngineEvent::Ready(Box::new(big_info(u64::MAX)))));
    let t0 = Instant::now();
    app.on_event(Event::Engine(EngineEvent::Step(Box::new(synthetic_step(0, LayerStats::default(), vec![])))));
    std::thread::sleep(Duration::from_millis(30));
    let read = LayerStats { bytes_demand: 4_000_000, bytes_prefetch: 1_000_000, ..Default::default() };
    let mut s = synthetic_step(1, read, vec![]);
    s.totals.reads = 2;
    app.on_event(Event::Engine(EngineEvent::Step(Box::new(s))));
    let elapsed = t0.elapsed().as_secs_f64();
    let done = moescope::tui::event::DoneInfo {
        prompt_tokens: 1,
        cached_tokens: 0,
        generated: 1,
        ttft_ms: 1.0,
        prefill_tps: 1.0,
        decode_tps: 1.0,
        stop: "eos".into(),
        experts: read,
        speculation: None,
    };
    app.on_event(Event::Engine(EngineEvent::Done(Box::new(done))));
    assert_eq!(app.store.io.mbps.len(), 1, "one point for the reply");
    // 5 MB over the time between the two steps: at least 30 ms, at most what the test took
    let (lo, hi) = (5.0 / elapsed, 5.0f64 / 0.030);
    let got = app.store.io.mbps[0] as f64;
    assert!(got >= lo.floor() && got <= hi.ceil(), "{got} MB/s, expected {lo:.0}-{hi:.0}");
    assert_eq!(app.store.io.max_mbps, app.store.io.mbps[0]);
    assert!(app.store.io.reads_per_s > 0.0);
}

/// A router with expert groups (DeepSeek-V3's 8 groups, 4 kept) and a shared expert: the title
/// says both, and a ruler over the grid starts each group over the column holding its first
/// expert, at both sizes (binned or not).
#[test]
fn grouped_router_gets_a_ruler_at_each_groups_first_expert() {
    let mut app = App::new();
    let info = ModelInfo { expert_groups: Some((8, 4)), shared_expert: true, ..big_info(u64::MAX) };
    app.on_event(Event::Engine(EngineEvent::Ready(Box::new(info))));
    let last: Vec<Vec<usize>> = (0..48).map(|l| (0..8).map(|j| (l + 16 * j) % 128).collect()).collect();
    app.on_event(Event::Engine(EngineEvent::Step(Box::new(synthetic_step(1, LayerStats::default(), last)))));
    show(&mut app, Pane::Routing);
    for size in SIZES {
        let b = render(&app, &FULL, size);
        let s = screen(&b);
        assert!(s.contains("top-8 of 4 in 8 groups + shared expert"), "{size:?}: title:\n{s}");
        let legend = s.lines().find_map(|l| l.split("cell = ").nth(1)).expect("legend");
        let per_cell: usize =
            legend.split(" × ").nth(1).and_then(|e| e.split_whitespace().next()).unwrap().parse().unwrap();
        let bx = pane_box(&b, "Routing");
        let (gx, y) = (bx.0 + 5, bx.1 + 1);
        // the grid's first row is under the ruler; its cells' width from the first row's marks
        let first_row = (bx.1 + 1..bx.2).find(|&yy| b[(bx.0 + 1, yy)].symbol() == "L").expect("grid row");
        assert_eq!(first_row, y + 1, "{size:?}: the ruler is the row over the grid:\n{s}");
        let right = (gx..b.area.width).find(|&x| b[(x, bx.1)].symbol() == "┐").expect("right border");
        let marks = (gx..right).filter(|&x| matches!(b[(x, y)].symbol(), "G" | "│")).collect::<Vec<_>>();
        assert_eq!(marks.len(), 8, "{size:?}: one mark per group:\n{s}");
        // wide cells (one expert a cell): the ruler's width over 128 experts
        let cw = if per_cell > 1 { 1 } else { (marks[1] - marks[0]) as usize / 16 };
        for (g, &x) in marks.iter().enumerate() {
            let col = (x - gx) as usize / cw;
            let first = g * 16;
            assert!(col * per_cell <= first && first < (col + 1) * per_cell, "{size:?}: group {g} at column {col}");
        }
    }
}

#[test]
fn the_status_line_shows_a_speculative_replys_acceptance() {
    let evs = recorded();
    let mut app = app_from(evs);
    let wide = SIZES.iter().copied().max_by_key(|s| s.0).expect("sizes");
    assert!(!screen(&render(&app, &FULL, wide)).contains("accepted"), "no drafts: nothing said");
    app.last_done.as_mut().expect("the reply finished").speculation = Some((0.8, 2.4));
    let s = screen(&render(&app, &FULL, wide));
    assert!(s.contains("drafts 80% accepted, 2.40 tok/pass"), "{s}");
}
