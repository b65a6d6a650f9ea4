//! Layout: at 100x30 and up, the conversation on the left and routing, cache and I/O stacked on
//! the right; smaller, one pane at a time under a tab bar (Tab cycles). `e` gives the focused
//! pane the whole screen. The status line is always the last row; `?` draws the key map over
//! everything.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use super::app::{App, PANES, Pane};
use super::keys::{COMMANDS, KEYMAP, Where};
use super::panes::{cache, chat, io, requests, routing, status};
use super::theme::Theme;

/// The smallest screen that shows every pane at once.
pub const RICH: (u16, u16) = (100, 30);

pub fn rich(area: Rect) -> bool {
    area.width >= RICH.0 && area.height >= RICH.1
}

pub fn draw(f: &mut Frame, app: &App, th: &Theme) {
    let area = f.area();
    let [main, status_area] = Layout::vertical([Constraint::Min(1), Constraint::Length(1)]).areas(area);
    status::draw(f, status_area, app, th);
    if app.expanded {
        draw_pane(f, main, app, th, app.focus, true);
    } else if rich(area) {
        let [left, right] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(main);
        draw_pane(f, left, app, th, Pane::Chat, false);
        let [r, c, i] =
            Layout::vertical([Constraint::Percentage(42), Constraint::Percentage(36), Constraint::Percentage(22)])
                .areas(right);
        draw_pane(f, r, app, th, Pane::Routing, false);
        draw_pane(f, c, app, th, Pane::Cache, false);
        draw_pane(f, i, app, th, Pane::Io, false);
    } else {
        let [tabs, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(main);
        draw_tabs(f, tabs, app, th);
        draw_pane(f, body, app, th, app.focus, false);
    }
    if app.help {
        draw_help(f, area, th);
    }
}

/// A pane; the chat pane brings the input box with it, and in the small layouts every pane
/// keeps a one-row input box so typing never needs a tab switch.
fn draw_pane(f: &mut Frame, area: Rect, app: &App, th: &Theme, pane: Pane, expanded: bool) {
    let focused = app.focus == pane && app.mode == super::app::Mode::Commands;
    match pane {
        Pane::Chat if app.serving.is_some() => requests::draw(f, area, app, th, focused),
        Pane::Chat => {
            let ih = chat::input_height(app, area.height / 3);
            let [c, i] = Layout::vertical([Constraint::Min(1), Constraint::Length(ih)]).areas(area);
            chat::draw(f, c, app, th, focused);
            chat::draw_input(f, i, app, th);
        }
        other => {
            let small = !rich(f.area()) || expanded;
            let (body, input) = if small && area.height > 8 && app.serving.is_none() {
                let [b, i] = Layout::vertical([Constraint::Min(1), Constraint::Length(3)]).areas(area);
                (b, Some(i))
            } else {
                (area, None)
            };
            match other {
                Pane::Routing => routing::draw(f, body, app, th, focused),
                Pane::Cache => cache::draw(f, body, app, th, focused, expanded),
                _ => io::draw(f, body, app, th, focused),
            }
            if let Some(i) = input {
                chat::draw_input(f, i, app, th);
            }
        }
    }
}

fn draw_tabs(f: &mut Frame, area: Rect, app: &App, th: &Theme) {
    let mut spans = Vec::new();
    for p in PANES {
        let s = format!(" {} ", p.title());
        if p == app.focus {
            spans.push(Span::styled(s, th.title().add_modifier(Modifier::REVERSED)));
        } else {
            spans.push(Span::raw(s));
        }
        spans.push(Span::raw("│"));
    }
    spans.push(Span::styled(" Tab: next pane (Esc first when typing)", th.info()));
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// The help text, from the live key map; `compact` (short screens) lists the slash commands
/// on one line.
pub fn help_lines(compact: bool) -> Vec<String> {
    let w = KEYMAP.iter().map(|b| b.keys.chars().count()).max().unwrap_or(8) + 2;
    let mut v = Vec::new();
    for (place, name) in
        [(Where::Input, "typing"), (Where::Commands, "commands (after Esc)"), (Where::Anywhere, "anywhere")]
    {
        v.push(format!("{name}:"));
        for b in KEYMAP.iter().filter(|b| b.place == place) {
            v.push(format!("  {:<w$}{}", b.keys, b.what));
        }
    }
    if compact {
        let names: Vec<&str> = COMMANDS.iter().map(|(c, _)| *c).collect();
        v.push(format!("in the input: {}", names.join("  ")));
    } else {
        v.push("in the input:".into());
        for (c, what) in COMMANDS {
            v.push(format!("  {c:<w$}{what}"));
        }
    }
    v
}

fn draw_help(f: &mut Frame, area: Rect, th: &Theme) {
    let full = help_lines(false);
    let lines = if full.len() as u16 + 2 <= area.height { full } else { help_lines(true) };
    let w = (lines.iter().map(|l| l.chars().count()).max().unwrap_or(20) as u16 + 2).min(area.width);
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, r);
    let block = Block::bordered().title(Span::styled(" moescope keys · any key closes ", th.title()));
    f.render_widget(Paragraph::new(lines.into_iter().map(Line::from).collect::<Vec<_>>()).block(block), r);
}
