//! The conversation and the input box. Each message keeps its wrapped lines for the width they
//! were wrapped at, so a new token re-wraps only the reply it extends, and drawing walks back
//! from the newest message only as far as the screen reaches: the cost of a frame does not grow
//! with the conversation.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use crate::tui::app::{App, Mode, Msg, Pane, Phase, Role};
use crate::tui::theme::Theme;

/// Greedy word wrap of one line of text to `width` columns (words longer than a line are cut).
pub fn wrap_line(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut cur_w = 0;
    for word in text.split_inclusive(' ') {
        let w = word.width();
        let trimmed_w = word.trim_end_matches(' ').width();
        if cur_w + trimmed_w > width && cur_w > 0 {
            out.push(std::mem::take(&mut cur).trim_end().to_string());
            cur_w = 0;
        }
        if trimmed_w > width {
            for ch in word.chars() {
                let cw = ch.width().unwrap_or(0);
                if cur_w + cw > width {
                    out.push(std::mem::take(&mut cur));
                    cur_w = 0;
                }
                cur.push(ch);
                cur_w += cw;
            }
        } else {
            cur.push_str(word);
            cur_w += w;
        }
    }
    out.push(cur.trim_end().to_string());
    out
}

/// Parts of a reply: (text, inside a think block?).
fn segments(text: &str) -> Vec<(&str, bool)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(a) = rest.find("<think>") {
        if a > 0 {
            out.push((&rest[..a], false));
        }
        let after = &rest[a + "<think>".len()..];
        match after.find("</think>") {
            Some(b) => {
                out.push((&after[..b], true));
                rest = &after[b + "</think>".len()..];
            }
            None => {
                out.push((after, true));
                rest = "";
            }
        }
    }
    if !rest.is_empty() {
        out.push((rest, false));
    }
    out
}

/// A message as screen lines at `width`.
pub fn wrap_message(m: &Msg, width: u16, fold: bool, th: &Theme) -> Vec<Line<'static>> {
    let width = width as usize;
    let mut lines = Vec::new();
    let text_lines = |t: &str, style: Style, prefix: &'static str, lines: &mut Vec<Line<'static>>| {
        for l in t.trim_matches('\n').split('\n') {
            for w in wrap_line(l, width.saturating_sub(prefix.width())) {
                lines.push(Line::from(vec![Span::styled(prefix, style), Span::styled(w, style)]));
            }
        }
    };
    match m.role {
        Role::User => text_lines(&m.text, th.user(), "› ", &mut lines),
        Role::Info => text_lines(&m.text, th.info(), "  ", &mut lines),
        Role::Error => text_lines(&m.text, th.error(), "! ", &mut lines),
        Role::Assistant => {
            for (t, think) in segments(&m.text) {
                if think {
                    if fold {
                        let n = t.trim().lines().count();
                        lines.push(Line::styled(format!("  ▸ thinking · {n} lines folded (z unfolds)"), th.dim()));
                    } else {
                        lines.push(Line::styled("  ┌ thinking (z folds)", th.dim()));
                        text_lines(t, th.dim(), "  │ ", &mut lines);
                    }
                } else if !t.trim().is_empty() {
                    text_lines(t, Style::default(), "  ", &mut lines);
                }
            }
        }
    }
    lines.push(Line::raw(""));
    lines
}

/// The visible lines of the conversation: `height` lines ending `scroll` lines above the
/// bottom. Returns the lines and whether there is more above.
pub fn visible(app: &App, width: u16, height: usize, th: &Theme) -> (Vec<Line<'static>>, bool) {
    let need = height + app.scroll;
    let mut rev: Vec<Line<'static>> = Vec::new();
    let mut more_above = false;
    for (i, m) in app.messages.iter().enumerate().rev() {
        let mut cache = m.wrapped.borrow_mut();
        let fresh = matches!(&*cache, Some((w, f, _)) if *w == width && *f == app.fold_thinking);
        if !fresh {
            *cache = Some((width, app.fold_thinking, wrap_message(m, width, app.fold_thinking, th)));
        }
        if let Some((_, _, lines)) = &*cache {
            rev.extend(lines.iter().rev().cloned());
        }
        if rev.len() >= need {
            more_above = rev.len() > need || i > 0;
            break;
        }
    }
    // scrolled past the top: show the top
    let total = rev.len();
    let max_scroll = if more_above { usize::MAX } else { total.saturating_sub(height) };
    app.scroll_max.set(max_scroll);
    let skip = app.scroll.min(max_scroll);
    let lines: Vec<Line<'static>> =
        rev.into_iter().skip(skip).take(height).collect::<Vec<_>>().into_iter().rev().collect();
    (lines, more_above || skip + height < total)
}

pub fn draw(f: &mut Frame, area: Rect, app: &App, th: &Theme, focused: bool) {
    let extra = if app.scroll > 0 {
        format!("↑ {} lines up · PgDn", app.scroll.min(app.scroll_max.get()))
    } else {
        String::new()
    };
    let block = super::frame(Pane::Chat, extra, focused, th);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.messages.is_empty() {
        let hello = match app.phase {
            Phase::Loading => format!("loading {}…", app.model_label),
            _ => "Type a message and press Enter. Esc leaves the input for commands; ? lists every key.".into(),
        };
        f.render_widget(Paragraph::new(hello).style(th.info()), inner);
        return;
    }
    let (lines, _) = visible(app, inner.width, inner.height as usize, th);
    f.render_widget(Paragraph::new(lines), inner);
}

/// Rows the input box wants (its lines plus the frame), at most `max`.
pub fn input_height(app: &App, max: u16) -> u16 {
    (app.input.text.split('\n').count() as u16 + 2).clamp(3, max.max(3))
}

pub fn draw_input(f: &mut Frame, area: Rect, app: &App, th: &Theme) {
    let typing = app.mode == Mode::Input;
    let title = if typing {
        " Message · Enter sends · Alt+Enter/Ctrl+J new line · Esc commands "
    } else {
        " commands: i types · p prefetch · [ ] pool · P policy · t trace · ? keys "
    };
    let mut block = Block::bordered().title(Span::styled(title, th.title()));
    if typing {
        block = block.border_style(th.focus_border());
    }
    let inner = block.inner(area);
    f.render_widget(block, area);
    let (cl, cc) = app.input.cursor_pos();
    let all: Vec<&str> = app.input.text.split('\n').collect();
    let h = inner.height as usize;
    let first = (cl + 1).saturating_sub(h);
    // the cursor's display column, and a horizontal shift that keeps it inside the box
    let cur_line = all.get(cl).copied().unwrap_or("");
    let col: usize = cur_line.chars().take(cc).map(|c| c.width().unwrap_or(0)).sum();
    let shift = (col + 1).saturating_sub(inner.width as usize);
    let lines: Vec<Line> = all
        .iter()
        .skip(first)
        .take(h)
        .map(|l| {
            let mut skipped = 0;
            let s: String = l
                .chars()
                .skip_while(|c| {
                    let go = skipped < shift;
                    skipped += c.width().unwrap_or(0);
                    go
                })
                .collect();
            Line::raw(s)
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
    if typing {
        f.set_cursor_position((inner.x + (col - shift) as u16, inner.y + (cl - first) as u16));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_keeps_every_word_within_the_width() {
        let text = "the quick brown fox jumps over the lazy dog and a wordthatisfartoolongforoneline ends";
        for w in [5, 10, 17, 40] {
            let lines = wrap_line(text, w);
            assert!(lines.iter().all(|l| l.width() <= w), "{w}: {lines:?}");
            let joined: String = lines.concat().split_whitespace().collect();
            let orig: String = text.split_whitespace().collect();
            assert_eq!(joined, orig);
        }
        assert_eq!(wrap_line("ab cd", 2), vec!["ab", "cd"]);
        // wide characters count two columns
        assert_eq!(wrap_line("日本語テキスト", 6), vec!["日本語", "テキス", "ト"]);
    }

    #[test]
    fn think_blocks_split_out_even_while_open() {
        assert_eq!(segments("<think>hmm</think>Answer"), vec![("hmm", true), ("Answer", false)]);
        assert_eq!(segments("<think>still going"), vec![("still going", true)]);
        assert_eq!(segments("plain"), vec![("plain", false)]);
    }
}
