//! The key map: every action, its keys, and where it works. The help overlay (`?`) is drawn from
//! this table, so it always says what the keys really do.

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
    pub keys: &'static str,
    pub action: Action,
    pub place: Where,
    pub what: &'static str,
}

pub const KEYMAP: &[Binding] = &[
    Binding { keys: "Enter", action: Action::Send, place: Where::Input, what: "send the message (/help for commands)" },
    Binding {
        keys: "Alt+Enter, Ctrl+J, Shift+Enter",
        action: Action::Newline,
        place: Where::Input,
        what: "new line in the message",
    },
    Binding { keys: "Up / Down", action: Action::HistoryPrev, place: Where::Input, what: "earlier / later messages" },
    Binding { keys: "PgUp / PgDn", action: Action::ScrollUp, place: Where::Anywhere, what: "scroll the conversation" },
    Binding {
        keys: "Esc",
        action: Action::StopOrLeave,
        place: Where::Anywhere,
        what: "stop the reply; leave the input for commands",
    },
    Binding {
        keys: "Ctrl+C",
        action: Action::Interrupt,
        place: Where::Anywhere,
        what: "stop the reply; twice when idle: quit",
    },
    Binding { keys: "i, Enter", action: Action::EnterInput, place: Where::Commands, what: "back to the input" },
    Binding { keys: "p", action: Action::TogglePrefetch, place: Where::Commands, what: "prefetch on / off" },
    Binding {
        keys: "[ / ]",
        action: Action::BudgetDown,
        place: Where::Commands,
        what: "expert pool -10% / +10% of the experts",
    },
    Binding {
        keys: "P",
        action: Action::CyclePolicy,
        place: Where::Commands,
        what: "next cache policy (foresight, least-stale, lru)",
    },
    Binding { keys: "f", action: Action::Freeze, place: Where::Commands, what: "freeze / unfreeze the panes" },
    Binding { keys: "e", action: Action::Expand, place: Where::Commands, what: "focused pane full screen / back" },
    Binding { keys: "Tab", action: Action::CycleFocus, place: Where::Commands, what: "focus the next pane" },
    Binding {
        keys: "t",
        action: Action::ExportTrace,
        place: Where::Commands,
        what: "export the session's trace to ./traces/",
    },
    Binding { keys: "z", action: Action::FoldThinking, place: Where::Commands, what: "fold / unfold <think> blocks" },
    Binding { keys: "?", action: Action::Help, place: Where::Commands, what: "this help (any key closes it)" },
    Binding { keys: "q", action: Action::Quit, place: Where::Commands, what: "quit" },
];

pub const COMMANDS: &[(&str, &str)] = &[
    ("/reset", "forget the conversation"),
    ("/regen", "generate the last reply again"),
    ("/save FILE", "write the conversation as Markdown"),
    ("/set NAME VALUE", "temperature, top_p, top_k, min_p, repeat_penalty, seed, max_tokens, think on|off"),
    ("/quit", "quit"),
];
