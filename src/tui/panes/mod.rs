//! One module per pane; each draws from `App` into a rectangle and changes nothing.

pub mod cache;
pub mod chat;
pub mod grid;
pub mod io;
pub mod requests;
pub mod routing;
pub mod status;

use ratatui::layout::Rect;
use ratatui::text::Span;
use ratatui::widgets::Block;

use super::app::Pane;
use super::theme::Theme;

/// A pane's frame: its title, yellow when it has the focus.
pub fn frame<'a>(pane: Pane, extra: String, focused: bool, th: &Theme) -> Block<'a> {
    let title = if extra.is_empty() { format!(" {} ", pane.title()) } else { format!(" {} · {extra} ", pane.title()) };
    let b = Block::bordered().title(Span::styled(title, th.title()));
    if focused { b.border_style(th.focus_border()) } else { b }
}

/// `n` bytes as MiB or GiB, whichever reads better.
pub fn bytes(n: u64) -> String {
    let mib = n as f64 / (1u64 << 20) as f64;
    if mib >= 10_240.0 { format!("{:.1} GiB", mib / 1024.0) } else { format!("{mib:.0} MiB") }
}

/// The part of `r` below its first `n` rows.
pub fn below(r: Rect, n: u16) -> Rect {
    let n = n.min(r.height);
    Rect { y: r.y + n, height: r.height - n, ..r }
}
