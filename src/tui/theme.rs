//! Colours: 256-colour gradients where the terminal has them, 16 colours otherwise, none at
//! all with `NO_COLOR` (then shading characters carry the values).

use ratatui::style::{Color, Modifier, Style};

use crate::experts::pool::Cell;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    Mono,
    Sixteen,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub depth: Depth,
}

impl Theme {
    /// From the environment: NO_COLOR (any value) wins; 256 colours when TERM or COLORTERM
    /// says so.
    pub fn detect() -> Theme {
        if std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()) {
            return Theme { depth: Depth::Mono };
        }
        let term = std::env::var("TERM").unwrap_or_default();
        let ct = std::env::var("COLORTERM").unwrap_or_default();
        let full = term.contains("256") || ct.contains("truecolor") || ct.contains("24bit");
        Theme { depth: if full { Depth::Full } else { Depth::Sixteen } }
    }

    pub fn mono(&self) -> bool {
        self.depth == Depth::Mono
    }

    fn fg(&self, c: Color) -> Style {
        if self.mono() { Style::default() } else { Style::default().fg(c) }
    }

    pub fn dim(&self) -> Style {
        Style::default().add_modifier(Modifier::DIM)
    }

    pub fn title(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn user(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn info(&self) -> Style {
        self.fg(Color::DarkGray)
    }

    pub fn error(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    pub fn warn(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD | Modifier::REVERSED)
    }

    pub fn spark(&self) -> Style {
        self.fg(Color::Yellow)
    }

    pub fn focus_border(&self) -> Style {
        self.fg(Color::Yellow)
    }

    /// A heat value in [0, 1] (0: never picked lately).
    pub fn heat(&self, v: f32) -> Color {
        let v = v.clamp(0.0, 1.0);
        match self.depth {
            Depth::Mono => Color::Reset,
            Depth::Sixteen => match (v * 5.0) as u32 {
                0 if v <= 0.0 => Color::Black,
                0 => Color::Blue,
                1 => Color::Cyan,
                2 => Color::Green,
                3 => Color::Yellow,
                _ => Color::Red,
            },
            // the 256-colour ramp from dark blue through green and yellow to red
            Depth::Full => {
                const RAMP: [u8; 10] = [234, 17, 19, 25, 31, 36, 71, 148, 214, 196];
                if v <= 0.0 { Color::Indexed(RAMP[0]) } else { Color::Indexed(RAMP[1 + ((v * 8.99) as usize).min(8)]) }
            }
        }
    }

    /// The colour marking this token's picks.
    pub fn pick(&self) -> Color {
        if self.depth == Depth::Full { Color::Indexed(231) } else { Color::White }
    }

    /// Colour of a pool cell state.
    pub fn cell(&self, c: Cell) -> Color {
        let full = self.depth == Depth::Full;
        match c {
            Cell::Free => {
                if full {
                    Color::Indexed(235)
                } else {
                    Color::Black
                }
            }
            Cell::Resident => {
                if full {
                    Color::Indexed(34)
                } else {
                    Color::Green
                }
            }
            Cell::Reading => {
                if full {
                    Color::Indexed(220)
                } else {
                    Color::Yellow
                }
            }
            Cell::Predicted => {
                if full {
                    Color::Indexed(45)
                } else {
                    Color::Cyan
                }
            }
            Cell::Evicted => {
                if full {
                    Color::Indexed(124)
                } else {
                    Color::Red
                }
            }
        }
    }

    /// Shading character for a value in [0, 1] (mono terminals).
    pub fn shade(v: f32) -> &'static str {
        match (v.clamp(0.0, 1.0) * 4.0).round() as u32 {
            0 => " ",
            1 => "░",
            2 => "▒",
            3 => "▓",
            _ => "█",
        }
    }

    /// Shading character for a pool cell state (mono terminals).
    pub fn cell_char(c: Cell) -> &'static str {
        match c {
            Cell::Free => "·",
            Cell::Resident => "█",
            Cell::Reading => "R",
            Cell::Predicted => "p",
            Cell::Evicted => "x",
        }
    }
}
