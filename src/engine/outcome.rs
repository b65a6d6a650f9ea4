//! What a generation call reports: why it stopped, how the prompt reused the cache, and its
//! timings.

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Eos,
    Length,
    Cancelled,
    ContextFull,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Eos => "eos",
            Stop::Length => "length",
            Stop::Cancelled => "cancelled",
            Stop::ContextFull => "context_full",
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenStats {
    /// Prompt tokens actually evaluated (the rest came from the cache).
    pub prompt_evaluated: usize,
    pub prompt_cached: usize,
    /// How the cached part was reused.
    pub reuse: Reuse,
    pub generated: Vec<u32>,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub ttft_ms: f64,
    /// Forward passes of one token after the first sample.
    pub decode_steps: usize,
    /// Latency of each decode step (forward + sample), ms.
    pub token_ms: Vec<f64>,
    pub stop: Stop,
}

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prompt_evaluated, self.prefill_ms)
    }
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_steps, self.decode_ms)
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 { n as f64 / (ms / 1000.0) } else { 0.0 }
}

/// How a prompt reused what the cache held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Nothing in common with the cache.
    None,
    /// The whole common prefix (a KV cache goes back anywhere; a hybrid's state when the prompt
    /// extends the cache exactly).
    Prefix,
    /// A hybrid model's state went back to a checkpoint (a prompt chunk's or a prompt's end).
    Snapshot,
    /// The prompt shared tokens with the cache, but a hybrid model's recurrent state cannot go
    /// back that far: everything was computed again.
    Recomputed,
    /// A server's prefix cache held it (copied into the request's slot).
    PrefixCache,
}

impl Reuse {
    pub fn name(self) -> &'static str {
        match self {
            Reuse::None => "none",
            Reuse::Prefix => "prefix",
            Reuse::Snapshot => "snapshot",
            Reuse::Recomputed => "recomputed",
            Reuse::PrefixCache => "prefix_cache",
        }
    }
}
