//! Panics of third-party code on input it should have refused, turned into errors: the
//! `tokenizers` crate panics inside its own deserializer on some malformed tokenizer.json files
//! (a decoder holding a string with a control character, found by the replay harness), where
//! moescope owes the user one clear line.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Set while [`contained`] runs on this thread: its panics are the caller's to report.
    static CONTAINING: Cell<bool> = const { Cell::new(false) };
}

/// `f()`, with a panic inside it returned as `Err("{what}: {message}")` and not printed by the
/// panic hook (the hook in place before stays for every other panic).
pub fn contained<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINING.with(Cell::get) {
                prev(info);
            }
        }));
    });
    let was = CONTAINING.with(|c| c.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(was));
    r.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        Err(format!("{what}: {msg}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_and_results_pass_through() {
        assert_eq!(contained("x", || Ok::<_, String>(3)), Ok(3));
        assert_eq!(contained("x", || Err::<u8, _>("no".to_string())), Err("no".to_string()));
        let e = contained::<u8>("loading", || panic!("boom {}", 7)).unwrap_err();
        assert_eq!(e, "loading: boom 7");
    }
}
