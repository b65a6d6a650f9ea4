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
    /// Tokens generated after the first sample (one a forward pass without speculation).
    pub decode_steps: usize,
    /// Latency of each of those tokens (its forward pass + sample, shared by the tokens a
    /// verify pass gave), ms.
    pub token_ms: Vec<f64>,
    pub stop: Stop,
    /// Decode forward passes (verify passes included).
    pub passes: usize,
    /// Draft tokens verified, and those the model's own choice confirmed (`--spec`).
    pub drafted: usize,
    pub accepted: usize,
}

impl GenStats {
    /// Before the first token: the prompt's `evaluated` and `cached` tokens, how the cache was
    /// reused, and the prefill's time.
    pub fn new(evaluated: usize, cached: usize, reuse: Reuse, prefill_ms: f64) -> GenStats {
        GenStats {
            prompt_evaluated: evaluated,
            prompt_cached: cached,
            reuse,
            generated: Vec::new(),
            prefill_ms,
            decode_ms: 0.0,
            ttft_ms: 0.0,
            decode_steps: 0,
            token_ms: Vec::new(),
            stop: Stop::Length,
            passes: 0,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Drafts confirmed per draft verified (None: no drafts).
    pub fn acceptance(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// Tokens per decode forward pass (1 without speculation; None before the first).
    pub fn tokens_per_pass(&self) -> Option<f64> {
        (self.passes > 0).then(|| self.decode_steps as f64 / self.passes as f64)
    }

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
