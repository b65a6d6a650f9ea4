//! A long prompt's evaluation, shown on a terminal as it goes (the REPL's and `run`'s
//! stderr): one line, rewritten after each prompt chunk, `prefill 1024/4096 tokens (412 t/s)`,
//! and cleared when the reply begins. Prompts of one chunk or less show nothing.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use moescope::engine::PREFILL_CHUNK;

/// The progress of one prompt's evaluation.
pub struct PrefillProgress {
    /// Tokens to evaluate (the prompt less its cached prefix), once known
    total: AtomicUsize,
    done: AtomicUsize,
    /// When it started, in nanoseconds from `base`
    started: AtomicU64,
    base: Instant,
    /// Whether a line is on screen
    shown: AtomicUsize,
}

impl Default for PrefillProgress {
    fn default() -> Self {
        PrefillProgress {
            total: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            base: Instant::now(),
            shown: AtomicUsize::new(0),
        }
    }
}

impl PrefillProgress {
    /// The prompt has `tokens` to evaluate: counting starts now.
    pub fn start(&self, tokens: usize) {
        self.total.store(tokens, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.started.store(self.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// `n` more tokens evaluated: the line to show, if any.
    pub fn chunk(&self, n: usize) -> Option<String> {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        let total = self.total.load(Ordering::Relaxed);
        if total <= PREFILL_CHUNK || done >= total {
            return None;
        }
        self.shown.store(1, Ordering::Relaxed);
        let ns = (self.base.elapsed().as_nanos() as u64).saturating_sub(self.started.load(Ordering::Relaxed));
        let secs = (ns as f64 / 1e9).max(1e-9);
        Some(line(done, total, done as f64 / secs))
    }

    /// What clears the line shown (empty when none is).
    pub fn clear(&self) -> &'static str {
        if self.shown.swap(0, Ordering::Relaxed) == 1 { "\r\x1b[K" } else { "" }
    }

    /// [`clear`](Self::clear) written to stderr.
    pub fn clear_line(&self) {
        let c = self.clear();
        if !c.is_empty() {
            eprint!("{c}");
        }
    }

    /// [`chunk`](Self::chunk)'s line written to stderr.
    pub fn report(&self, n: usize) {
        if let Some(l) = self.chunk(n) {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K{l}");
            let _ = e.flush();
        }
    }
}

fn line(done: usize, total: usize, tps: f64) -> String {
    format!("prefill {done}/{total} tokens ({tps:.0} t/s)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_shows_each_chunk_and_clears_and_a_short_one_shows_nothing() {
        let p = PrefillProgress::default();
        p.start(PREFILL_CHUNK);
        assert_eq!(p.chunk(PREFILL_CHUNK), None);
        assert_eq!(p.clear(), "");
        p.start(2 * PREFILL_CHUNK + 100);
        let l = p.chunk(PREFILL_CHUNK).expect("a line");
        assert!(l.starts_with(&format!("prefill {PREFILL_CHUNK}/{} tokens (", 2 * PREFILL_CHUNK + 100)), "{l}");
        assert!(p.chunk(PREFILL_CHUNK).expect("a line").starts_with(&format!("prefill {}/", 2 * PREFILL_CHUNK)));
        // the last chunk: the reply takes the line
        assert_eq!(p.chunk(100), None);
        assert_eq!(p.clear(), "\r\x1b[K");
        assert_eq!(p.clear(), "");
        assert_eq!(line(1024, 4096, 411.6), "prefill 1024/4096 tokens (412 t/s)");
    }
}
