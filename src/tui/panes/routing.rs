//! The routing heatmap: layers down, experts across; colour = the decayed share of recent
//! tokens that picked the expert, the current token's picks in white.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::grid::{self, Binning, Mark};
use crate::tui::app::{App, Pane};
use crate::tui::store::HEAT_DECAY;
use crate::tui::theme::Theme;

pub fn draw(f: &mut Frame, area: Rect, app: &App, th: &Theme, focused: bool) {
    let heat = &app.store.heat;
    let extra = app
        .info
        .as_ref()
        .map_or(String::new(), |i| format!("{} MoE layers × {} experts, top-{}", i.moe_layers, i.num_experts, i.top_k));
    let block = super::frame(Pane::Routing, extra, focused, th);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if heat.n_layers == 0 || heat.num_experts == 0 {
        f.render_widget(Paragraph::new("no routing yet: send a message").style(th.info()), inner);
        return;
    }
    // two legend lines under the grid
    let legend_h = 2u16.min(inner.height.saturating_sub(1));
    let grid_area = Rect { height: inner.height - legend_h, ..inner };
    let b = Binning::fit(heat.n_layers, heat.num_experts, grid_area.width, grid_area.height, !th.mono());
    let (n_l, n_e) = (heat.n_layers, heat.num_experts);
    // the busiest expert sets the top of the colour scale
    let top = heat.share.iter().copied().fold(0.0f32, f32::max).max(1e-6);
    let picked = |l: usize, e: usize| heat.last.get(l).is_some_and(|p| p.contains(&e));
    let cell = |s: usize, c: usize| -> Mark {
        let (ls, es) = grid::span(&b, s, c, n_l, n_e);
        let mut v = 0.0f32;
        let mut pick = false;
        for l in ls {
            for e in es.clone() {
                v = v.max(heat.share[l * n_e + e]);
                pick |= picked(l, e);
            }
        }
        if th.mono() {
            Mark::Char(if pick { "◆" } else { Theme::shade(v / top) })
        } else if pick {
            Mark::Colour(th.pick())
        } else {
            Mark::Colour(th.heat(v / top))
        }
    };
    grid::draw(f.buffer_mut(), grid_area, &b, &|s| s * b.layers, &cell);
    let legend_area = Rect { y: grid_area.y + grid_area.height, height: legend_h, ..inner };
    let mut ramp = vec![Span::raw("colour: ")];
    if th.mono() {
        ramp.push(Span::raw(" ░▒▓█ "));
    } else {
        for i in 0..8 {
            ramp.push(Span::styled("█", Style::default().fg(th.heat((i as f32 + 0.5) / 8.0))));
        }
    }
    ramp.push(Span::raw(format!(
        " recent picks (decay {HEAT_DECAY}/tok), top {:.0}% · {} this token",
        top * 100.0,
        if th.mono() { "◆" } else { "white:" }
    )));
    if !th.mono() {
        ramp.push(Span::styled("█", Style::default().fg(th.pick())));
    }
    let lines = vec![Line::from(format!("{} · busiest in the cell", b.legend())), Line::from(ramp)];
    f.render_widget(Paragraph::new(lines).style(th.info()), legend_area);
}
