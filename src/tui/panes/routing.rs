//! The routing heatmap: layers down, experts across; colour = the decayed share of recent
//! tokens that picked the expert, the current token's picks in white. A router that picks
//! within groups of experts (DeepSeek-V3: 8 groups of 32, 4 kept a token) gets a ruler over the
//! grid marking where each group starts; the title says so, and names a shared expert.

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
    let info = app.info.as_ref();
    let groups = info.and_then(|i| i.expert_groups).filter(|&(g, _)| g > 1 && heat.num_experts.is_multiple_of(g));
    let extra = info.map_or(String::new(), |i| {
        let mut s = format!("{} MoE layers × {} experts, top-{}", i.moe_layers, i.num_experts, i.top_k);
        if let Some((g, keep)) = groups {
            s += &format!(" of {keep} in {g} groups");
        }
        if i.shared_expert {
            s += " + shared expert";
        }
        s
    });
    let block = super::frame(Pane::Routing, extra, focused, th);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if heat.n_layers == 0 || heat.num_experts == 0 {
        f.render_widget(Paragraph::new("no routing yet: send a message").style(th.info()), inner);
        return;
    }
    // two legend lines under the grid, and a ruler of the router's groups over it
    let legend_h = 2u16.min(inner.height.saturating_sub(1));
    let ruler_h = u16::from(groups.is_some() && inner.height > legend_h + 2);
    let grid_area = Rect { y: inner.y + ruler_h, height: inner.height - legend_h - ruler_h, ..inner };
    let b = Binning::fit(heat.n_layers, heat.num_experts, grid_area.width, grid_area.height, !th.mono());
    if let (Some((g, _)), 1) = (groups, ruler_h) {
        let ruler = group_ruler(&b, heat.num_experts / g, heat.num_experts, grid_area.width);
        f.render_widget(Paragraph::new(ruler).style(th.info()), Rect { height: 1, ..inner });
    }
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

/// The line over the grid marking where each group of `per` experts starts (`G0`, `G1`, ...
/// where the cell under it begins the group, `│` where the label does not fit), `─` elsewhere.
fn group_ruler(b: &Binning, per: usize, n_experts: usize, width: u16) -> String {
    let cols = b.cols.min((width.saturating_sub(grid::LABEL) as usize) / b.cw);
    let mut line: Vec<char> = vec![' '; grid::LABEL as usize];
    line.extend(std::iter::repeat_n('─', cols * b.cw));
    // the column whose experts include a group's first expert
    for (gi, first) in (0..n_experts).step_by(per.max(1)).enumerate() {
        let c = first / b.experts;
        if c >= cols {
            break;
        }
        let at = grid::LABEL as usize + c * b.cw;
        let label: Vec<char> = format!("G{gi}").chars().collect();
        // the label while it ends before the next group's column
        let next = ((first + per) / b.experts).min(cols);
        let room = (next - c) * b.cw;
        if label.len() < room {
            line[at..at + label.len()].copy_from_slice(&label);
        } else {
            line[at] = '│';
        }
    }
    line.into_iter().collect()
}
