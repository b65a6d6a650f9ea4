//! `serve --workbench`: the requests pane in the chat's place: where the server listens, how
//! many wait, the running request (prompt, cached tokens, tokens so far, tok/s) and the latest
//! finished ones.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use crate::tui::app::{App, Role};
use crate::tui::theme::Theme;

/// The pane's text lines (also what the tests read).
pub fn lines(app: &App) -> Vec<String> {
    let Some(sv) = &app.serving else { return Vec::new() };
    let mut v = vec![
        format!("listening on {}", sv.addr),
        format!(
            "queue {} waiting · {} served · {} cancelled · {} failed",
            sv.waiting, sv.served, sv.cancelled, sv.failed
        ),
        String::new(),
    ];
    match &sv.active {
        Some(a) => {
            v.push(format!("active {}", a.id));
            v.push(format!(
                "  prompt {} ({} cached) · {} tok · {:.1} tok/s · {:.1} s",
                a.prompt_tokens,
                a.cached,
                a.tokens,
                a.tok_s(),
                a.started.elapsed().as_secs_f64()
            ));
        }
        None => v.push("active: none".into()),
    }
    v.push(String::new());
    v.push(format!("{:<28} {:>6} {:>8} {:>8}  {}", "recent", "tok", "tok/s", "TTFT ms", "outcome"));
    for d in &sv.done {
        v.push(format!("{:<28} {:>6} {:>8.1} {:>8.0}  {}", d.id, d.tokens, d.decode_tps, d.ttft_ms, d.outcome));
    }
    v
}

pub fn draw(f: &mut Frame, area: Rect, app: &App, th: &Theme, focused: bool) {
    let title = match &app.serving {
        Some(sv) => format!(" Requests · {} · queue {} ", sv.addr, sv.waiting),
        None => " Requests ".into(),
    };
    let mut b = Block::bordered().title(Span::styled(title, th.title()));
    if focused {
        b = b.border_style(th.focus_border());
    }
    let mut out: Vec<Line> = lines(app).into_iter().map(Line::from).collect();
    // errors the engine reported stay visible under the table
    for m in app.messages.iter().rev().filter(|m| m.role == Role::Error).take(3) {
        out.push(Line::from(Span::styled(m.text.clone(), th.error())));
    }
    f.render_widget(Paragraph::new(out).block(b), area);
}
