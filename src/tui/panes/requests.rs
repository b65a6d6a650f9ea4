//! `serve --workbench`: the requests pane in the chat's place: where the server listens, how
//! many wait, the latest step (its batch, the routed experts it read and how many tokens each
//! served, the prefix cache's hits), each slot's running request (prompt, cached tokens,
//! tokens so far, tok/s) and the latest finished ones.

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
    match &sv.step {
        Some(st) => v.push(format!(
            "step: {} seq · {} tok · experts read {} ({:.1} tok each) · {:.0} ms · prefix cache {} hits ({} tok)",
            st.sequences,
            st.tokens,
            st.experts_read,
            st.expert_choices as f64 / st.experts_read.max(1) as f64,
            st.step_ms,
            st.prefix_hits,
            st.prefix_tokens
        )),
        None => v.push("step: none yet".into()),
    }
    if sv.active.is_empty() {
        v.push("active: none".into());
    }
    for a in &sv.active {
        v.push(format!("slot {} {}", a.slot, a.id));
        v.push(format!(
            "  prompt {} ({} cached) · {} tok · {:.1} tok/s · {:.1} s",
            a.prompt_tokens,
            a.cached,
            a.tokens,
            a.tok_s(),
            a.started.elapsed().as_secs_f64()
        ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::StepReport;
    use crate::tui::event::RequestEvent;

    #[test]
    fn the_pane_lists_the_slots_and_the_latest_step() {
        let mut app = App::serving("127.0.0.1:1".into());
        let sv = app.serving.as_mut().unwrap();
        for (id, slot) in [("cmpl-a", 0), ("cmpl-b", 2)] {
            sv.on(RequestEvent::Started { id: id.into(), slot, prompt_tokens: 30, cached: 12, waiting: 1 });
        }
        let st = StepReport {
            sequences: 2,
            tokens: 2,
            experts_read: 12,
            expert_choices: 18,
            step_ms: 40.0,
            prefix_hits: 1,
            prefix_tokens: 12,
        };
        sv.on(RequestEvent::Step(st));
        let text = lines(&app).join("\n");
        assert!(
            text.contains(
                "step: 2 seq · 2 tok · experts read 12 (1.5 tok each) · 40 ms · prefix cache 1 hits (12 tok)"
            ),
            "{text}"
        );
        assert!(text.contains("slot 0 cmpl-a\n  prompt 30 (12 cached)") && text.contains("slot 2 cmpl-b"), "{text}");
    }
}
