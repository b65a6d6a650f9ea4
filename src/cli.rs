//! Command-line arguments as clap parses them (the low level); `cmd::*` validates them into
//! the configuration a command runs with.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "moescope",
    version,
    about = "Run Mixture-of-Experts LLMs bigger than RAM, and watch how",
    long_about = "Run Mixture-of-Experts LLMs bigger than RAM, and watch how.\n\nWith no command: the workbench (`moescope chat`) on the built-in demo model; the line REPL\nwhen stdin or stdout is not a terminal."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text: one prompt, or a chat REPL when no prompt is given.
    Run(RunArgs),
    /// The workbench: chat while panes show routing, the expert cache and SSD I/O, live.
    Chat(ChatArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, SSE streaming, metrics).
    Serve(ServeArgs),
    /// Convert a HuggingFace checkpoint directory into a .moe package.
    Convert(ConvertArgs),
    /// Write a package of a real model's shape with seeded random weights (no download): its
    /// text is noise, its size, reads and memory are the real model's.
    #[command(after_help = synth_shapes_help())]
    Synth(SynthArgs),
    /// Expected prefill and decode speed on this machine within a memory budget, and what binds
    /// them (disk, memory bandwidth, compute), before downloading a model.
    Plan(PlanArgs),
    /// Print a package's configuration, quantization and layout.
    Inspect(InspectArgs),
    /// Measure prompt processing and generation speed (llama-bench's conventions).
    Bench(BenchArgs),
    /// Replay a routing trace (--routing-out) against cache policies and Belady's optimum.
    Sim(SimArgs),
    /// Perplexity of a model on a text file (windows of --window tokens, each from an empty
    /// context).
    Perplexity(PerplexityArgs),
    /// Print the memory read bandwidth in GB/s (what `bench --roofline` runs in a child process,
    /// so the probe's buffer stays out of the bench's peak RSS).
    #[command(hide = true)]
    ReadBandwidth {
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long, default_value_t = 2048)]
        mib: usize,
        /// Fill the buffer once, then probe once per line of standard input (a thread count),
        /// one result line each, until end of input.
        #[arg(long)]
        serve: bool,
    },
    /// Print the tiers' multiply-adds a second (int8 VNNI, int8 AMX where granted, f32 FMA) with
    /// every thread of each count running at once: the compute peak a prefill's rate is a share of.
    #[command(hide = true)]
    ComputePeak {
        /// Thread counts, comma-separated.
        #[arg(short = 't', long, default_value = "1")]
        threads: String,
        /// Milliseconds each probe runs.
        #[arg(long, default_value_t = 300)]
        ms: u64,
    },
}

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// A .moe package, or a HuggingFace directory (converted once into the cache directory).
    /// Default: the built-in demo model.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Plain text (UTF-8), tokenized whole.
    pub file: PathBuf,
    /// Tokens per window; every token of a window but the first is predicted.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Compute threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Quantization when the model is a HuggingFace directory (bf16, q8, q4, q4g32, mxfp4, q4_k,
    /// q2_k, iq4_xs; default q4, mxfp4 for a checkpoint released in MXFP4) or a GGUF file
    /// (default: each tensor as the file holds it; a mode given requantizes).
    #[arg(long)]
    pub quant: Option<String>,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    pub json: bool,
    /// Compare with a base model (a package or HuggingFace directory, usually the bf16 package of
    /// the same checkpoint): mean KL(base || model) of the next-token distributions, top-1
    /// agreement, and the base's perplexity, on the same windows.
    #[arg(long, value_name = "BASE")]
    pub against: Option<PathBuf>,
    /// Use only the text's first N tokens.
    #[arg(long, value_name = "N")]
    pub tokens: Option<usize>,
    /// Score as llama-perplexity does: whole windows only, each window's second half predicted
    /// (its first half is context), for side-by-side numbers.
    #[arg(long)]
    pub second_half: bool,
    /// Stream the model's experts through a pool of this many MiB, or `auto` (default: as for
    /// `run`).
    #[arg(long, value_name = "MiB|auto")]
    pub cache_mb: Option<String>,
    /// Run a --cache-mb whose memory plan exceeds what the process may use (else refused).
    #[arg(long)]
    pub force: bool,
    /// Eviction policy of the pool: foresight, least-stale, lru.
    #[arg(long, default_value = "foresight")]
    pub policy: String,
    /// Prefetch predicted experts: on or off.
    #[arg(long, default_value = "on")]
    pub prefetch: String,
    #[command(flatten)]
    pub aware: CacheAwareArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The line REPL instead of the workbench (for pipes and dumb terminals; also chosen when
    /// stdin or stdout is not a terminal).
    #[arg(long)]
    pub plain: bool,
    /// Capture the mouse (off by default, so the terminal's selection and copy work).
    #[arg(long)]
    pub mouse: bool,
    /// Redraws a second at most (the panes move at this rate whatever the token rate).
    #[arg(long, default_value_t = moescope::tui::DEFAULT_FPS, value_name = "N")]
    pub fps: u32,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: a free one, printed as `listening on HOST:PORT`).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// The model's name in /v1/models and responses (default: the package's name).
    #[arg(long, value_name = "NAME")]
    pub alias: Option<String>,
    /// Requests that may wait behind the running ones; more get 503 with Retry-After.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub queue: usize,
    /// Requests run at once (llama-server's `-np`): each in a slot with its own KV cache at the
    /// full context, all of them in one forward pass a step (each routed expert read once for
    /// all). Default: 4, or as many as the memory plan allows.
    #[arg(long, visible_alias = "np", value_name = "N")]
    pub parallel: Option<usize>,
    /// MiB of RAM for finished sequences' caches (KV, and a hybrid's checkpointed states), which
    /// later requests that share a prefix start from (llama-server's `--cache-ram`; 0: none).
    /// Default: an eighth of the memory the process may use, at most 1024, or what fits.
    #[arg(long, value_name = "MIB")]
    pub cache_ram: Option<u64>,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long)]
    pub metrics: bool,
    /// Largest request body in bytes (larger: 413).
    #[arg(long, default_value_t = 8 << 20, value_name = "BYTES")]
    pub max_body_bytes: usize,
    /// Watch the serving engine in the workbench: routing, cache, SSD I/O and a requests pane
    /// (queue, running request, tok/s); `t` exports the trace with the requests on a track of
    /// their own, `q` stops the server.
    #[arg(long)]
    pub workbench: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A .moe package, or a HuggingFace directory (converted once into the cache directory).
    /// Default: the built-in demo model.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(short = 'p', long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids (for packages without a tokenizer).
    #[arg(long, value_name = "ID,ID,...")]
    pub prompt_ids: Option<String>,
    /// Tokens to generate at most (default 256; `serve`: a request's default, else the context
    /// left).
    #[arg(short = 'n', long = "n-predict")]
    pub n_predict: Option<usize>,
    /// Do not stop at an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 20)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalize tokens seen in the last --repeat-last-n tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (default: from the clock; printed so a run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Apply the model's chat template to --prompt.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat and the REPL.
    #[arg(long)]
    pub system: Option<String>,
    /// Ask the template to skip thinking (`enable_thinking=false`, Qwen3).
    #[arg(long)]
    pub no_think: bool,
    /// gpt-oss's reasoning effort: low, medium or high (the template's `reasoning_effort`; a
    /// system message saying `Reasoning: high` sets it too).
    #[arg(long, value_name = "LEVEL")]
    pub reasoning_effort: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// KV cache length in tokens (default: the smaller of the model's maximum and 8192).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    /// Print one JSON object (ids, text, timings) on stdout; progress goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// Speculative decoding: off, or ngram (drafts looked up in the prompt and the reply so far,
    /// verified in one forward pass). Greedy output is the same token for token; sampled
    /// output keeps its distribution.
    #[arg(long, default_value = "off", value_name = "off|ngram")]
    pub spec: String,
    /// The most draft tokens one verify pass takes (--spec).
    #[arg(long, default_value_t = moescope::engine::draft::DEFAULT_DRAFT)]
    pub draft: usize,
    /// Write the raw logits that chose each generated token as float32 [N, vocab] .npy.
    #[arg(long, value_name = "FILE.npy")]
    pub logits_out: Option<PathBuf>,
    /// Quantization when the model is a HuggingFace directory (bf16, q8, q4, q4g32, mxfp4, q4_k,
    /// q2_k, iq4_xs; default q4, mxfp4 for a checkpoint released in MXFP4) or a GGUF file
    /// (default: each tensor as the file holds it; a mode given requantizes).
    #[arg(long)]
    pub quant: Option<String>,
    /// Size of the expert pool in MiB, or `auto`: the memory the process may use (its cgroup's
    /// limit, else MemAvailable) less the dense weights, KV cache, buffers and headroom, with a
    /// shorter context when the default leaves no useful pool; re-checked between replies.
    /// Default: no pool when the package fits in half of that memory (experts copied with the
    /// dense weights), else auto. A size whose memory plan does not fit is refused (--force).
    #[arg(long, value_name = "MiB|auto")]
    pub cache_mb: Option<String>,
    /// Prefetch predicted experts: on or off.
    #[arg(long, default_value = "on")]
    pub prefetch: String,
    #[command(flatten)]
    pub experts: ExpertArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

/// The KV cache's element types (llama.cpp's `-ctk` / `-ctv`, also accepted).
#[derive(Args, Debug, Clone, Copy)]
pub struct KvArgs {
    /// Element type of the cached keys: bf16 (half of f32's bytes, 8 significant bits), f16
    /// (11 bits, llama.cpp's default), q8_0 (llama.cpp's 8-bit blocks: 32 values, one scale;
    /// about a quarter of f32's bytes) or f32 (exact).
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "bf16", value_name = "TYPE")]
    pub k: moescope::model::KvType,
    /// Element type of the cached values: bf16, f16, q8_0 or f32.
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "bf16", value_name = "TYPE")]
    pub v: moescope::model::KvType,
}

impl KvArgs {
    pub fn types(&self) -> moescope::model::KvTypes {
        moescope::model::KvTypes { k: self.k, v: self.v }
    }
}

/// How routed experts are streamed from the package.
#[derive(Args, Debug, Clone)]
pub struct ExpertArgs {
    /// How experts are read: direct (O_DIRECT, bypassing the page cache) or buffered
    /// (default: direct when the pool is smaller than the experts).
    #[arg(long, value_name = "direct|buffered")]
    pub io: Option<String>,
    /// I/O threads reading experts.
    #[arg(long, default_value_t = moescope::experts::DEFAULT_IO_WORKERS)]
    pub io_workers: usize,
    /// Eviction policy of the expert pool: foresight (ours), least-stale, lru.
    #[arg(long, default_value = "foresight")]
    pub policy: String,
    /// Do not verify each expert read against its checksum.
    #[arg(long)]
    pub no_verify_experts: bool,
    /// Run a --cache-mb whose memory plan exceeds what the process may use, with a warning
    /// (else it is refused before loading, naming the largest pool that fits).
    #[arg(long)]
    pub force: bool,
    /// Do not stream: read experts through the package's memory mapping (all of them resident
    /// once touched, as a model that fits in RAM; for comparisons).
    #[arg(long)]
    pub no_stream: bool,
    /// Record every routing decision (token, layer, experts, weights) as JSON lines, for
    /// `moescope sim`.
    #[arg(long, value_name = "FILE")]
    pub routing_out: Option<PathBuf>,
    /// Follow a routing trace (`--routing-out`, or traces/*.jsonl.gz) instead of the model's
    /// own routers: each token takes the trace's experts and weights (MoE layers map in order,
    /// wrapping; tokens run through the trace and wrap), and the predictor its candidates
    /// where the trace has them. The routers still run; the output text is not the model's.
    #[arg(long, value_name = "TRACE")]
    pub route_from: Option<PathBuf>,
    #[command(flatten)]
    pub aware: CacheAwareArgs,
}

#[derive(Args, Debug, Clone)]
pub struct CacheAwareArgs {
    /// Cache-aware routing (opt-in, not the exact model): a routed expert that is not in the
    /// pool gives way to a pooled one among the next top-k candidates whose router probability
    /// is within TOL of its own (an absolute gap, e.g. 0.02). Deterministic for a given pool
    /// with prefetch off; substitutions are counted.
    #[arg(long, value_name = "TOL")]
    pub cache_aware_routing: Option<f32>,
}

#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Write a Chrome Trace / Perfetto timeline (JSON; FILE.gz: gzip) of the whole run.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Most events a trace keeps; what the cap drops is reported in the trace's metadata.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub trace_max_events: usize,
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// HuggingFace model directory (config.json, *.safetensors, tokenizer files), or a GGUF file
    /// (the first part of a split one).
    pub hf_dir: PathBuf,
    /// Output package.
    #[arg(short = 'o', long)]
    pub output: PathBuf,
    /// bf16, q8, q4 (int4, group 128), q4g32 (int4, group 32), mxfp4 (the routed experts in
    /// MXFP4, the rest q8), or q4_k, q2_k, iq4_xs (attention, dense MLP and experts as GGUF blocks
    /// of that type, 4.5 / 2.625 / 4.25 bits a weight, with the quantization's error reported);
    /// default q4 for a HuggingFace directory (mxfp4 for one released in MXFP4: its experts kept
    /// as they are), and for a GGUF file each tensor as the file holds it (a mode given
    /// requantizes).
    #[arg(long)]
    pub quant: Option<String>,
}

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// The model whose shape to take (listed below).
    #[arg(long)]
    pub shape: String,
    /// Output package.
    #[arg(short = 'o', long)]
    pub output: std::path::PathBuf,
    /// Keep the first N layers only (hybrids keep their 3:1 pattern).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Experts per MoE layer instead of the shape's.
    #[arg(long)]
    pub experts: Option<usize>,
    /// Vocabulary rows instead of the shape's (below the tokenizer's size the package takes
    /// --prompt-ids only).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// q4 (int4, group 128), q4g32 (int4, group 32: llama.cpp's Q4_0 values), q8, bf16 or mxfp4
    /// (the experts in MXFP4, the rest q8); default: as the model is released (mxfp4 for
    /// gpt-oss, q4g32 for the others).
    #[arg(long)]
    pub quant: Option<String>,
    /// Seed of the weights: the same seed gives the same file.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn synth_shapes_help() -> String {
    let mut s = String::from("Shapes (weights: N(0, 0.02) matrices, unit norms, routers as peaked as trained ones):\n");
    for sh in moescope::synth::SHAPES {
        let c = sh.config();
        s.push_str(&format!(
            "  {:<20} {}: {} layers, hidden {}, {} experts top-{} of width {}, vocab {}{}\n",
            sh.name,
            sh.model,
            c.num_hidden_layers,
            c.hidden_size,
            c.num_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size,
            c.vocab_size,
            if c.hybrid.is_some() { " (Gated DeltaNet + gated attention 3:1, shared expert)" } else { "" }
        ));
    }
    s
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A .moe package.
    #[arg(short = 'm', long, conflicts_with_all = ["shape", "config"])]
    pub model: Option<std::path::PathBuf>,
    /// A model shape by name (as `synth` lists them).
    #[arg(long, conflicts_with = "config")]
    pub shape: Option<String>,
    /// A HuggingFace config.json (or the folder holding it): what a user has before downloading.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Quantization of --shape / --config: q4, q4g32, q8, bf16, q4_k, q2_k, iq4_xs.
    #[arg(long, default_value = "q4")]
    pub quant: String,
    /// Memory the run may use (8G, 512M; default: this process's cgroup limit, else
    /// MemAvailable).
    #[arg(long)]
    pub mem: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context length (default: as `run` chooses it).
    #[arg(short = 'c', long)]
    pub ctx_size: Option<usize>,
    #[command(flatten)]
    pub kv: KvArgs,
    /// A routing trace (`--routing-out`, traces/*.jsonl.gz) for the cache's hit rate (default:
    /// uniform random routing, the worst case).
    #[arg(long, value_name = "TRACE")]
    pub trace: Option<std::path::PathBuf>,
    /// Use the last probe's figures (saved in the cache folder) instead of probing again.
    #[arg(long)]
    pub reuse_probes: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    pub file: PathBuf,
    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// A .moe package or a HuggingFace directory (default: the built-in demo).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt lengths to measure (comma list; 0 = none): test ppN.
    #[arg(short = 'p', long = "n-prompt", default_value = "512")]
    pub n_prompt: String,
    /// Generation lengths to measure (comma list; 0 = none): test tgN.
    #[arg(short = 'n', long = "n-gen", default_value = "128")]
    pub n_gen: String,
    /// Context depths (comma list): each test runs after this many tokens already fill the
    /// KV cache (evaluated untimed before every repetition): test "tgN @ dD", as llama-bench.
    #[arg(short = 'd', long = "n-depth", default_value = "0")]
    pub n_depth: String,
    /// Timed repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Untimed runs before the repetitions.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Thread counts (comma list).
    #[arg(short = 't', long, default_value_t = default_threads())]
    pub threads: String,
    /// Output: md (a table), json (only JSON on stdout), csv.
    #[arg(short = 'o', long, default_value = "md")]
    pub output: String,
    /// Quantization when the model is a HuggingFace directory (bf16, q8, q4, q4g32, mxfp4, q4_k,
    /// q2_k, iq4_xs; default q4, mxfp4 for a checkpoint released in MXFP4) or a GGUF file
    /// (default: each tensor as the file holds it; a mode given requantizes).
    #[arg(long)]
    pub quant: Option<String>,
    /// Expert pool sizes in MiB or `auto` (comma list; default as for `run`).
    #[arg(long, value_name = "MiB,...")]
    pub cache_mb: Option<String>,
    /// Prefetch settings to measure (comma list of on/off).
    #[arg(long, default_value = "on")]
    pub prefetch: String,
    /// Empty the expert pool and drop the package from the page cache before each repetition.
    #[arg(long, conflicts_with = "warm")]
    pub cold: bool,
    /// Probe the memory read bandwidth at each thread count (a 2 GiB buffer, or a quarter of
    /// the available memory if less) and give each decode test's share of that roofline.
    #[arg(long)]
    pub roofline: bool,
    /// Keep the pool (and page cache) between repetitions (the default).
    #[arg(long)]
    pub warm: bool,
    /// KV cache key types to measure (comma list of bf16, f16, f32): llama-bench's `-ctk`.
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "bf16", value_name = "TYPE,...")]
    pub cache_type_k: String,
    /// KV cache value types to measure (comma list): llama-bench's `-ctv`.
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "bf16", value_name = "TYPE,...")]
    pub cache_type_v: String,
    #[command(flatten)]
    pub experts: ExpertArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
}

fn default_threads() -> String {
    moescope::sysinfo::physical_cores().to_string()
}

#[derive(Args, Debug)]
pub struct SimArgs {
    /// A routing trace written by --routing-out (or by --synthetic).
    #[arg(required_unless_present = "synthetic")]
    pub file: Option<PathBuf>,
    /// Pool sizes in MiB (comma list).
    #[arg(long, value_name = "MiB,...", conflicts_with = "cache_pct")]
    pub cache_mb: Option<String>,
    /// Pool sizes as percentages of all experts (comma list; default 25,50,75).
    #[arg(long, value_name = "PCT,...")]
    pub cache_pct: Option<String>,
    /// Policies to replay (comma list): lru, least-stale, foresight, belady.
    #[arg(long, default_value = "lru,least-stale,foresight,belady")]
    pub policy: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Replay only the passes of one token (decode), dropping prompt passes: a prompt's many
    /// tokens share experts within one pass, which flatters every policy.
    #[arg(long)]
    pub decode_only: bool,
    /// Write a synthetic routing trace with locality to this file instead (see --zipf, --repeat).
    #[arg(long, value_name = "OUT")]
    pub synthetic: Option<PathBuf>,
    #[arg(long, default_value_t = 48)]
    pub layers: usize,
    #[arg(long, default_value_t = 128)]
    pub experts: usize,
    #[arg(long, default_value_t = 8)]
    pub top_k: usize,
    #[arg(long, default_value_t = 500)]
    pub tokens: usize,
    /// Zipf exponent of expert popularity per layer (0 = uniform).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Probability that a token keeps each of the previous token's experts in a layer.
    #[arg(long, default_value_t = 0.4)]
    pub repeat: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Bytes per expert recorded in a synthetic trace (default: a Qwen3-30B-A3B q4 expert).
    #[arg(long, default_value_t = 2_547_712)]
    pub bytes_per_expert: u64,
}
