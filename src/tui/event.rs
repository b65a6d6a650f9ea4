//! The workbench loop's only input: one `Event` enum for keys, pastes, resizes, ticks and
//! what the engine worker reports.

use crossterm::event::KeyEvent;

use crate::experts::pool::Residency;
use crate::experts::stats::{LayerStats, PredictStats};
use crate::trace::hist::LatencySummary;

#[derive(Debug, Clone)]
pub enum Event {
    Key(KeyEvent),
    Paste(String),
    Resize(u16, u16),
    Tick,
    Engine(EngineEvent),
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub quant: String,
    pub moe_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub blob_bytes: u64,
    pub experts_bytes: u64,
    pub expected_memory: u64,
    pub threads: usize,
    pub ctx: usize,
    pub isa: String,
    pub io: String,
    pub has_template: bool,
    /// What the engine warned about at load.
    pub warnings: Vec<String>,
    pub knobs: Knobs,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Knobs {
    pub streaming: bool,
    pub prefetch: bool,
    pub budget_bytes: u64,
    pub policy: String,
}

/// The pool and routing after one forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Generated tokens so far in this reply (0: the prompt).
    pub token: usize,
    /// Per MoE layer: how many times each expert was picked in this pass (a prompt chunk
    /// counts every token), and the last token's picks (highlighted).
    pub counts: Vec<Vec<u32>>,
    pub last: Vec<Vec<usize>>,
    pub residency: Option<Residency>,
    pub totals: LayerStats,
    pub per_layer: Vec<LayerStats>,
    pub predict: PredictStats,
    /// (demand queued, prefetch queued, in flight)
    pub queue: (usize, usize, usize),
    pub read_latency: LatencySummary,
    pub reads: u64,
    /// Nanoseconds so far with an expert read in flight (the disk busy, as the pool sees it).
    pub disk_busy_ns: u64,
    /// This step's latency (forward + sample), ms; 0 for the prompt.
    pub step_ms: f64,
    /// Whether the pool's picture (residency, per-layer counters, predictor, queue, latency)
    /// was taken; a light step carries only routing and totals, and the panes keep the last
    /// picture.
    pub full: bool,
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
}
