//! The workbench loop's only input: one `Event` enum for keys, pastes, resizes, ticks and
//! what the engine worker reports.

use std::time::Duration;

use crossterm::event::KeyEvent;

use crate::experts::policy::PolicyKind;
use crate::experts::pool::{PoolSnapshot, PoolTotals};
use crate::experts::stats::{LayerStats, PredictStats};

/// The routing, cache and I/O panes take a new picture at most this often.
pub const PANE_PERIOD: Duration = Duration::from_millis(100);

/// What the UI asks of the engine worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Cmd {
    Chat(String),
    /// Generate the last reply again.
    Regen,
    Reset,
    SetPrefetch(bool),
    SetBudget(u64),
    SetPolicy(PolicyKind),
    /// `/set NAME VALUE` (temperature, top_p, top_k, min_p, repeat_penalty, max_tokens, seed,
    /// think).
    Set(String, String),
    Quit,
}

#[derive(Debug, Clone)]
pub enum Event {
    Key(KeyEvent),
    Paste(String),
    Resize(u16, u16),
    Tick,
    Engine(EngineEvent),
    /// What the process holds now (read off the UI thread).
    Machine(Machine),
}

/// The process's footprint, sampled a few times a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    /// Resident set size, bytes.
    pub rss: u64,
    /// Bytes the trace recorder holds.
    pub trace_bytes: u64,
}

/// What the engine worker tells the UI.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    Ready(Box<ModelInfo>),
    /// The model could not be loaded; the workbench shows why and waits for quit.
    LoadFailed(String),
    /// Prompt tokens evaluated so far.
    Prefill {
        done: usize,
        total: usize,
    },
    /// A generated token and the text it completes (None while a character is incomplete).
    Token {
        id: u32,
        piece: Option<String>,
    },
    /// Engine state after a decode step (or the prompt).
    Step(Box<Step>),
    Done(Box<DoneInfo>),
    Error(String),
    Notice(String),
    /// Knob values after a change.
    Knobs(Knobs),
    /// `serve --workbench`: what happens to the server's requests.
    Request(RequestEvent),
}

/// The server's requests, for the requests pane.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// A request joined the queue; `waiting` now wait.
    Queued {
        waiting: usize,
    },
    Started {
        id: String,
        slot: usize,
        prompt_tokens: usize,
        cached: usize,
        waiting: usize,
    },
    /// The request in `slot` sampled a token.
    Token {
        slot: usize,
    },
    /// A step: one forward pass over the running requests.
    Step(crate::serve::StepReport),
    /// `outcome`: stop, length, cancelled, or an error's text.
    Finished {
        id: String,
        slot: usize,
        outcome: String,
        tokens: usize,
        ttft_ms: f64,
        decode_tps: f64,
        waiting: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    /// The architecture, as HF's `model_type` names it (`qwen3_moe`, `qwen3_5_moe`, ...).
    pub arch: String,
    pub quant: String,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    /// The router's expert groups and how many it keeps a token (DeepSeek-V3: 8 and 4), where
    /// it has more than one.
    pub expert_groups: Option<(usize, usize)>,
    /// A shared expert every token runs besides its routed ones.
    pub shared_expert: bool,
    pub blob_bytes: u64,
    pub experts_bytes: u64,
    pub expected_memory: u64,
    pub threads: usize,
    pub ctx: usize,
    /// The KV cache's types and its bytes at `ctx` (`bf16, 12.6 MB at 4096`).
    pub kv: String,
    pub isa: String,
    pub io: String,
    pub has_template: bool,
    /// What the engine warned about at load.
    pub warnings: Vec<String>,
    /// How `auto` sized the pool and context, in one line (None when it did not).
    pub sizing: Option<String>,
    pub knobs: Knobs,
    /// How routing is steered when it is not the model's own (a replayed trace, cache-aware
    /// routing), for the status line.
    pub steering: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Knobs {
    pub streaming: bool,
    pub prefetch: bool,
    pub budget_bytes: u64,
    pub policy: String,
}

/// Routing and the pool's counters after one forward pass (or a reply).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Generated tokens so far in this reply (0: the prompt).
    pub token: usize,
    /// Per MoE layer: how many times each expert was picked in this pass (a prompt chunk
    /// counts every token), and the last token's picks (highlighted).
    pub counts: Vec<Vec<u32>>,
    pub last: Vec<Vec<usize>>,
    /// The pool's counters so far (all zero without a pool): every step has them, for the
    /// per-token figures.
    pub totals: PoolTotals,
    /// The pool's whole picture, as often as the panes take one (None between, and without a
    /// pool): the store keeps the last.
    pub pool: Option<Box<PoolView>>,
    /// This step's latency (forward + sample), ms; 0 for the prompt.
    pub step_ms: f64,
}

/// What the cache and I/O panes draw: the pool's snapshot and the predictor's accuracy.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    pub snapshot: PoolSnapshot,
    pub predict: PredictStats,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DoneInfo {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated: usize,
    pub ttft_ms: f64,
    pub prefill_tps: f64,
    pub decode_tps: f64,
    pub stop: String,
    /// Expert counters over the reply.
    pub experts: LayerStats,
    /// `--spec`: drafts confirmed per draft verified, and tokens per decode pass (None: no
    /// drafts).
    pub speculation: Option<(f64, f64)>,
}
