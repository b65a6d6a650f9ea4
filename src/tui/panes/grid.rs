//! The layers x experts grid both the routing heatmap and the cache residency pane draw: with
//! colour, one cell is a half block, so a text row holds two layers (upper and lower half);
//! without colour, a row is one layer and a shade character. Too many layers or experts for the
//! rectangle are binned: a cell then covers `layers` x `experts` of them.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};

/// Width of the layer labels left of the grid (`L47 `).
pub const LABEL: u16 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binning {
    /// Layers per cell, experts per cell.
    pub layers: usize,
    pub experts: usize,
    /// Cells across, and layer slots down (two per text row with half blocks).
    pub cols: usize,
    pub slots: usize,
    pub half: bool,
    /// Characters per cell across (wide cells when there are few experts).
    pub cw: usize,
}

impl Binning {
    /// The finest binning of `n_layers` x `n_experts` that fits `w` x `h` cells of text.
    /// `colour`: half blocks may put two layers in a row (only when one per row does not fit).
    pub fn fit(n_layers: usize, n_experts: usize, w: u16, h: u16, colour: bool) -> Binning {
        let w = (w.saturating_sub(LABEL) as usize).max(1);
        let half = colour && n_layers > h as usize;
        let per_row = if half { 2 } else { 1 };
        let h = (h as usize * per_row).max(1);
        let experts = n_experts.div_ceil(w).max(1);
        let layers = n_layers.div_ceil(h).max(1);
        let cw = if experts == 1 { (w / n_experts.max(1)).clamp(1, 3) } else { 1 };
        Binning { layers, experts, cols: n_experts.div_ceil(experts), slots: n_layers.div_ceil(layers), half, cw }
    }

    /// Text rows the grid takes.
    pub fn rows(&self) -> usize {
        if self.half { self.slots.div_ceil(2) } else { self.slots }
    }

    /// What one cell covers, in words.
    pub fn legend(&self) -> String {
        let l = if self.layers == 1 { "1 layer".to_string() } else { format!("{} layers", self.layers) };
        let e = if self.experts == 1 { "1 expert".to_string() } else { format!("{} experts", self.experts) };
        let rows = if self.half { " · 2 per row (upper/lower half)" } else { "" };
        format!("cell = {l} × {e}{rows}")
    }

    /// Screen position of layer slot `s`, column `c` in a grid drawn at `area`: (x, y, upper
    /// half?).
    pub fn pos(&self, area: Rect, s: usize, c: usize) -> (u16, u16, bool) {
        let x = area.x + LABEL + (c * self.cw) as u16;
        if self.half { (x, area.y + (s / 2) as u16, s.is_multiple_of(2)) } else { (x, area.y + s as u16, true) }
    }
}

/// What one grid cell shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mark {
    Colour(Color),
    /// Monochrome: a character.
    Char(&'static str),
}

/// Draw the grid: `cell(slot, col)` says what each binned cell shows; rows are labelled with
/// their first layer every few rows.
pub fn draw(
    buf: &mut Buffer,
    area: Rect,
    b: &Binning,
    label_of: &dyn Fn(usize) -> usize,
    cell: &dyn Fn(usize, usize) -> Mark,
) {
    let rows = b.rows().min(area.height as usize);
    for r in 0..rows {
        let y = area.y + r as u16;
        let slot = if b.half { r * 2 } else { r };
        buf.set_stringn(area.x, y, format!("L{:<3}", label_of(slot)), LABEL as usize, Style::default());
    }
    let width = area.width.saturating_sub(LABEL) as usize;
    for s in 0..b.slots {
        for c in 0..b.cols.min(width / b.cw) {
            let (x0, y, upper) = b.pos(area, s, c);
            if y >= area.y + area.height {
                continue;
            }
            let mark = cell(s, c);
            for x in x0..x0 + b.cw as u16 {
                let Some(cl) = buf.cell_mut((x, y)) else { continue };
                match mark {
                    Mark::Char(ch) => {
                        cl.set_symbol(ch);
                    }
                    Mark::Colour(col) if !b.half => {
                        cl.set_symbol("█").set_fg(col);
                    }
                    Mark::Colour(col) => {
                        // the upper half is the glyph (fg), the lower half the background
                        if upper {
                            cl.set_symbol("▀").set_fg(col);
                            if s + 1 >= b.slots {
                                cl.set_bg(Color::Reset);
                            }
                        } else {
                            cl.set_symbol("▀").set_bg(col);
                        }
                    }
                }
            }
            // a gap after each wide cell keeps neighbours apart
            if b.cw > 1
                && let Some(cl) = buf.cell_mut((x0 + b.cw as u16 - 1, y))
            {
                cl.set_symbol(" ").set_fg(Color::Reset).set_bg(Color::Reset);
            }
        }
    }
}

/// The layers and experts one binned cell covers.
pub fn span(
    b: &Binning,
    s: usize,
    c: usize,
    n_layers: usize,
    n_experts: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let l0 = s * b.layers;
    let e0 = c * b.experts;
    (l0..(l0 + b.layers).min(n_layers), e0..(e0 + b.experts).min(n_experts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binning_covers_every_expert_and_layer_and_fits() {
        for &(l, e, w, h) in &[
            (4, 16, 80, 10),
            (48, 128, 90, 20),
            (60, 512, 90, 20),
            (94, 512, 60, 12),
            (94, 512, 200, 40),
            (8, 128, 40, 4),
        ] {
            for half in [true, false] {
                let b = Binning::fit(l, e, w, h, half);
                assert!(b.cols * b.cw <= (w - LABEL) as usize, "{l}x{e} in {w}x{h}: {b:?}");
                assert!(b.rows() <= h as usize, "{l}x{e} in {w}x{h}: {b:?}");
                assert!(b.cols * b.experts >= e && b.slots * b.layers >= l);
                // finest: one fewer expert per cell would not fit
                if b.experts > 1 {
                    assert!(e.div_ceil(b.experts - 1) > (w - LABEL) as usize);
                }
            }
        }
        let b = Binning::fit(48, 128, 200, 60, true);
        assert_eq!((b.layers, b.experts, b.half), (1, 1, false));
        assert_eq!(b.legend(), "cell = 1 layer × 1 expert");
        let b = Binning::fit(48, 128, 200, 20, true);
        assert_eq!((b.layers, b.experts, b.half), (2, 1, true));
        let b = Binning::fit(94, 512, 80, 10, true);
        assert_eq!((b.layers, b.experts), (5, 7));
        assert_eq!(b.legend(), "cell = 5 layers × 7 experts · 2 per row (upper/lower half)");
    }
}
