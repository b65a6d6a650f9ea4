//! Cache residency: the same grid, one state per expert (resident, being read, predicted or in
//! flight, recently evicted, free), the pool's occupancy against its budget, hit rates and the
//! predictor's recall. Expanded, it lists the hit rate of every layer.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::grid::{self, Binning, Mark};
use crate::experts::pool::Cell;
use crate::tui::app::{App, Pane};
use crate::tui::theme::Theme;

/// Which state a binned cell shows when its experts differ: the most eventful one.
fn rank(c: Cell) -> u8 {
    match c {
        Cell::Reading => 4,
        Cell::Predicted => 3,
        Cell::Evicted => 2,
        Cell::Resident => 1,
        Cell::Free => 0,
    }
}

pub const STATES: [(Cell, &str); 5] = [
    (Cell::Resident, "resident"),
    (Cell::Reading, "reading"),
    (Cell::Predicted, "predicted/in flight"),
    (Cell::Evicted, "evicted"),
    (Cell::Free, "free"),
];

pub fn draw(f: &mut Frame, area: Rect, app: &App, th: &Theme, focused: bool, expanded: bool) {
    let view = app.store.pool.as_ref();
    let res = view.map(|v| &v.snapshot.residency);
    let knobs = app.knobs.as_ref();
    let extra = match knobs {
        Some(k) if k.streaming => format!("{} · prefetch {}", k.policy, if k.prefetch { "on" } else { "off" }),
        Some(_) => "experts mapped, not streamed".into(),
        None => String::new(),
    };
    let block = super::frame(Pane::Cache, extra, focused, th);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let mut text: Vec<Line> = Vec::new();
    // occupancy against the budget
    if let Some(r) = res {
        let frac = if r.budget_bytes > 0 { r.resident_bytes as f64 / r.budget_bytes as f64 } else { 0.0 };
        let bar_w = (inner.width as usize).saturating_sub(40).clamp(4, 30);
        let filled = ((frac.min(1.0)) * bar_w as f64).round() as usize;
        let n_res = r.cells.iter().filter(|c| **c == Cell::Resident).count();
        text.push(Line::from(vec![
            Span::raw("pool "),
            Span::styled("█".repeat(filled), Style::default().fg(th.cell(Cell::Resident))),
            Span::styled("░".repeat(bar_w - filled), th.info()),
            Span::raw(format!(
                " {} / {} ({:.0}%) · {n_res} experts",
                super::bytes(r.resident_bytes),
                super::bytes(r.budget_bytes),
                frac * 100.0
            )),
        ]));
    } else if knobs.is_some_and(|k| !k.streaming) {
        text.push(Line::from("experts are mapped from the package (--no-stream): the OS page cache holds them"));
    }
    if let Some(s) = &app.store.step {
        let recent = &app.store.recent;
        let mut l = format!("hits {:.1}% all", s.totals.stats.hit_pct());
        if !recent.is_empty() {
            l.push_str(&format!(" · {:.1}% last {} tok", app.store.recent_summary().hit_pct, recent.len()));
        }
        if let Some(p) = view.map(|v| &v.predict)
            && p.next.routed > 0
        {
            l.push_str(&format!(
                " · predictor recall {:.0}% precision {:.0}%",
                p.recall() * 100.0,
                p.precision() * 100.0
            ));
        }
        text.push(Line::from(l));
    }
    let text_h = text.len() as u16;
    let Some(r) = res else {
        if text.is_empty() {
            text.push(Line::styled("no pool state yet", th.info()));
        }
        f.render_widget(Paragraph::new(text), inner);
        return;
    };
    let per_layer_h = if expanded { (r.n_layers as u16).div_ceil(6).min(inner.height / 3) } else { 0 };
    let legend_h = 2u16;
    let grid_h = inner.height.saturating_sub(text_h + legend_h + per_layer_h);
    f.render_widget(Paragraph::new(text), Rect { height: text_h.min(inner.height), ..inner });
    let grid_area = Rect { y: inner.y + text_h, height: grid_h, ..inner };
    let b = Binning::fit(r.n_layers, r.num_experts, grid_area.width, grid_area.height, !th.mono());
    let cell = |s: usize, c: usize| -> Mark {
        let (ls, es) = grid::span(&b, s, c, r.n_layers, r.num_experts);
        let mut best = Cell::Free;
        for l in ls {
            for e in es.clone() {
                let x = r.cells[l * r.num_experts + e];
                if rank(x) > rank(best) {
                    best = x;
                }
            }
        }
        if th.mono() { Mark::Char(Theme::cell_char(best)) } else { Mark::Colour(th.cell(best)) }
    };
    grid::draw(f.buffer_mut(), grid_area, &b, &|s| s * b.layers, &cell);
    let mut legend = Vec::new();
    for (c, name) in STATES {
        if th.mono() {
            legend.push(Span::raw(format!("{} {name}  ", Theme::cell_char(c))));
        } else {
            legend.push(Span::styled("█", Style::default().fg(th.cell(c))));
            legend.push(Span::raw(format!(" {name}  ")));
        }
    }
    let legend_area = Rect {
        y: grid_area.y + grid_area.height,
        height: legend_h.min(inner.height.saturating_sub(text_h + grid_h)),
        ..inner
    };
    f.render_widget(Paragraph::new(vec![Line::from(legend), Line::styled(b.legend(), th.info())]), legend_area);
    if per_layer_h > 0
        && let Some(v) = view
    {
        let cells: Vec<String> =
            v.snapshot.per_layer.iter().enumerate().map(|(l, st)| format!("L{l:<3}{:>5.1}%", st.hit_pct())).collect();
        let lines: Vec<Line> = cells.chunks(6).map(|c| Line::from(c.join("  "))).collect();
        let a = Rect { y: legend_area.y + legend_area.height, height: per_layer_h, ..inner };
        f.render_widget(Paragraph::new(lines), a);
    }
}
