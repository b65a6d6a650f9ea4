//! The status line: model, quantization, state, speeds, TTFT, RSS against the plan, warnings in
//! words, and the latest note.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::tui::app::{App, Mode, Phase};
use crate::tui::theme::Theme;

/// The state in words.
pub fn state(app: &App) -> String {
    match app.phase {
        Phase::Loading => format!("loading {}…", app.model_label),
        Phase::Failed => "model not loaded".into(),
        Phase::Idle => "idle".into(),
        Phase::Prefill { done, total } if total > 0 => {
            format!("prefill {done}/{total} ({:.0}%)", 100.0 * done as f64 / total as f64)
        }
        Phase::Prefill { .. } => "prefill".into(),
        Phase::Decoding { tokens } => format!("decoding · {tokens} tok"),
    }
}

/// Decode speed over the recent steps, tokens/s.
pub fn live_decode_tps(app: &App) -> Option<f64> {
    if app.store.recent.is_empty() {
        return None;
    }
    let ms = app.store.recent_step_ms();
    (ms > 0.0).then(|| 1000.0 / ms)
}

pub fn line(app: &App, th: &Theme) -> Line<'static> {
    let mut s = vec![Span::styled(
        match app.mode {
            Mode::Input => " INPUT ",
            Mode::Commands => " CMD ",
        },
        th.title().add_modifier(ratatui::style::Modifier::REVERSED),
    )];
    // most telling first: narrow terminals cut the end
    let mut parts = vec![state(app)];
    // a fresh note answers what the user just did: it goes before the figures
    if let Some((n, _)) = &app.status_note {
        s.push(Span::raw(format!(" {} ·", parts.remove(0))));
        s.push(Span::styled(format!(" {n} "), th.title()));
        parts.push(String::new());
    }
    if app.busy() {
        if let Some(t) = live_decode_tps(app) {
            parts.push(format!("decode {t:.1} t/s"));
        }
    } else if let Some(d) = &app.last_done {
        parts.push(format!(
            "prefill {:.1} t/s · decode {:.1} t/s · TTFT {:.0} ms",
            d.prefill_tps, d.decode_tps, d.ttft_ms
        ));
        if let Some((accepted, per_pass)) = d.speculation {
            parts.push(format!("drafts {:.0}% accepted, {per_pass:.2} tok/pass", accepted * 100.0));
        }
    }
    if app.store.frozen {
        parts.push("FROZEN".into());
    }
    let figures: Vec<String> = parts.into_iter().filter(|p| !p.is_empty()).collect();
    if !figures.is_empty() {
        s.push(Span::raw(format!(" {} ", figures.join(" · "))));
    }
    for w in app.warnings() {
        s.push(Span::styled(format!(" {w} "), th.warn()));
        s.push(Span::raw(" "));
    }
    let mut tail = Vec::new();
    if let Some(i) = &app.info {
        if app.rss > 0 {
            let trace = if app.trace_bytes >= 1 << 20 {
                format!(" + trace {}", super::bytes(app.trace_bytes))
            } else {
                String::new()
            };
            tail.push(format!("RSS {} / plan {}{trace}", super::bytes(app.rss), super::bytes(i.expected_memory)));
        }
        tail.push(format!("{} ({}) {}", i.name, i.arch, i.quant));
        tail.push(i.kv.clone());
        if let Some(st) = &i.steering {
            tail.push(st.clone());
        }
    }
    if !tail.is_empty() {
        s.push(Span::raw(format!("· {} ", tail.join(" · "))));
    }
    if app.status_note.is_none() {
        s.push(Span::styled(" ? keys", th.info()));
    }
    Line::from(s)
}

pub fn draw(f: &mut Frame, area: Rect, app: &App, th: &Theme) {
    f.render_widget(Paragraph::new(line(app, th)), area);
}
