//! The key map: every action, its keys, and where it works. The help overlay (`?`) is drawn from
//! this table, and command mode maps keys to actions through it, so the help always says what
//! the keys really do.

use crossterm::event::KeyCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// While typing in the input box.
    Input,
    /// Outside the input box (after Esc).
    Commands,
    /// Anywhere.
    Anywhere,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send,
    Newline,
    HistoryPrev,
    HistoryNext,
    ScrollUp,
    ScrollDown,
    StopOrLeave,
    Interrupt,
    EnterInput,
    TogglePrefetch,
    BudgetDown,
    BudgetUp,
    CyclePolicy,
    Freeze,
    Expand,
    CycleFocus,
    ExportTrace,
    FoldThinking,
    Help,
    Quit,
}

pub struct Binding {
    /// The keys as the help shows them.
    pub keys: &'static str,
    /// The keys command mode maps to the action (empty where the input box or a modifier
    /// handles them).
    pub codes: &'static [KeyCode],
    pub action: Action,
    pub place: Where,
    pub what: &'static str,
}

pub const KEYMAP: &[Binding] = &[
    Binding {
        keys: "Enter",
        codes: &[],
        action: Action::Send,
        place: Where::Input,
        what: "send the message (/help for commands)",
    },
    Binding {
        keys: "Alt+Enter, Ctrl+J, Shift+Enter",
        codes: &[],
        action: Action::Newline,
        place: Where::Input,
        what: "new line in the message",
    },
    Binding {
        keys: "Up / Down",
        codes: &[],
        action: Action::HistoryPrev,
        place: Where::Input,
        what: "earlier / later messages",
    },
    Binding {
        keys: "PgUp / PgDn",
        codes: &[],
        action: Action::ScrollUp,
        place: Where::Anywhere,
        what: "scroll the conversation",
    },
    Binding {
        keys: "Esc",
        codes: &[],
        action: Action::StopOrLeave,
        place: Where::Anywhere,
        what: "stop the reply; leave the input for commands",
    },
    Binding {
        keys: "Ctrl+C",
        codes: &[],
        action: Action::Interrupt,
        place: Where::Anywhere,
        what: "stop the reply; twice when idle: quit",
    },
    Binding {
        keys: "i, Enter",
        codes: &[KeyCode::Char('i'), KeyCode::Enter],
        action: Action::EnterInput,
        place: Where::Commands,
        what: "back to the input",
    },
    Binding {
        keys: "p",
        codes: &[KeyCode::Char('p')],
        action: Action::TogglePrefetch,
        place: Where::Commands,
        what: "prefetch on / off",
    },
    Binding {
        keys: "[",
        codes: &[KeyCode::Char('[')],
        action: Action::BudgetDown,
        place: Where::Commands,
        what: "expert pool 10% of the experts smaller",
    },
    Binding {
        keys: "]",
        codes: &[KeyCode::Char(']')],
        action: Action::BudgetUp,
        place: Where::Commands,
        what: "expert pool 10% of the experts larger",
    },
    Binding {
        keys: "P",
        codes: &[KeyCode::Char('P')],
        action: Action::CyclePolicy,
        place: Where::Commands,
        what: "next cache policy (foresight, least-stale, lru)",
    },
    Binding {
        keys: "f",
        codes: &[KeyCode::Char('f')],
        action: Action::Freeze,
        place: Where::Commands,
        what: "freeze / unfreeze the panes",
    },
    Binding {
        keys: "e",
        codes: &[KeyCode::Char('e')],
        action: Action::Expand,
        place: Where::Commands,
        what: "focused pane full screen / back",
    },
    Binding {
        keys: "Tab",
        codes: &[KeyCode::Tab],
        action: Action::CycleFocus,
        place: Where::Commands,
        what: "focus the next pane",
    },
    Binding {
        keys: "t",
        codes: &[KeyCode::Char('t')],
        action: Action::ExportTrace,
        place: Where::Commands,
        what: "export the session's trace to ./traces/",
    },
    Binding {
        keys: "z",
        codes: &[KeyCode::Char('z')],
        action: Action::FoldThinking,
        place: Where::Commands,
        what: "fold / unfold <think> blocks",
    },
    Binding {
        keys: "?",
        codes: &[KeyCode::Char('?')],
        action: Action::Help,
        place: Where::Commands,
        what: "this help (any key closes it)",
    },
    Binding { keys: "q", codes: &[KeyCode::Char('q')], action: Action::Quit, place: Where::Commands, what: "quit" },
];

pub const COMMANDS: &[(&str, &str)] = &[
    ("/reset", "forget the conversation"),
    ("/regen", "generate the last reply again"),
    ("/save FILE", "write the conversation as Markdown"),
    (
        "/set NAME VALUE",
        "temperature, top_p, top_k, min_p, repeat_penalty, seed, max_tokens, think on|off, effort low|medium|high",
    ),
    ("/quit", "quit"),
];

/// The action command mode runs for `code`, from the table.
pub fn command_action(code: KeyCode) -> Option<Action> {
    KEYMAP.iter().find(|b| b.place == Where::Commands && b.codes.contains(&code)).map(|b| b.action)
}
