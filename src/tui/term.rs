//! Taking the terminal over and giving it back: raw mode, the alternate screen, bracketed paste
//! and (where the terminal speaks it) the kitty keyboard protocol, so Shift+Enter is reported.
//! A guard restores everything on drop, and a panic hook restores it before the panic message
//! is printed, so a crash never leaves the user's shell in raw mode.

use std::io::{self, Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crossterm::event::{
    DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture, KeyboardEnhancementFlags,
    PopKeyboardEnhancementFlags, PushKeyboardEnhancementFlags,
};
use crossterm::execute;
use crossterm::terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static MOUSE: AtomicBool = AtomicBool::new(false);

pub type Term = Terminal<CrosstermBackend<Stdout>>;

/// Owns the terminal while the workbench runs.
pub struct Guard {
    pub term: Term,
}

/// Enter the workbench's terminal mode. `mouse`: capture the mouse (off by default, so the
/// terminal's own selection and copy keep working).
pub fn enter(mouse: bool) -> io::Result<Guard> {
    install_panic_hook();
    enable_raw_mode()?;
    ACTIVE.store(true, Ordering::SeqCst);
    MOUSE.store(mouse, Ordering::SeqCst);
    let mut out = io::stdout();
    let res = (|| {
        execute!(out, EnterAlternateScreen, EnableBracketedPaste)?;
        // terminals without the kitty protocol ignore this sequence; those with it then tell
        // Shift+Enter from Enter, and Esc from the start of an Alt chord
        execute!(out, PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES))?;
        if mouse {
            execute!(out, EnableMouseCapture)?;
        }
        Terminal::new(CrosstermBackend::new(io::stdout()))
    })();
    match res {
        // no `Terminal::clear`: it asks the terminal where the cursor is, and not every
        // terminal answers; the alternate screen starts blank and the first frame is whole
        Ok(term) => Ok(Guard { term }),
        Err(e) => {
            restore();
            Err(e)
        }
    }
}

/// Give the terminal back (idempotent: the guard and the panic hook may both call it).
pub fn restore() {
    if !ACTIVE.swap(false, Ordering::SeqCst) {
        return;
    }
    let mut out = io::stdout();
    if MOUSE.load(Ordering::SeqCst) {
        let _ = execute!(out, DisableMouseCapture);
    }
    let _ = execute!(
        out,
        PopKeyboardEnhancementFlags,
        DisableBracketedPaste,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
    let _ = disable_raw_mode();
    let _ = out.flush();
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            prev(info);
        }));
    });
}

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}
