//! The engine: a model bound to a package, its KV cache, threads, tokenizer and chat template,
//! and the generation loop. It knows nothing of terminals or files; callers get tokens and
//! logits through a callback.

pub mod batch;
pub mod call_syntax;
pub mod chat_template;
mod counters;
pub mod draft;
pub mod harmony;
mod memory;
pub mod outcome;
pub mod prefix_cache;
pub mod sampler;
pub mod session;
pub mod sizing;
mod slot;
mod speculate;
pub mod tokenizer;
mod view;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use moescope_kernels::Isa;

use crate::exec::Exec;
use crate::experts::{Experts, StreamConfig};
use crate::model::{
    Decoder, ExpertSource, KvCache, KvTypes, Logits, ModelError, Observer, Resident, RunState, Runtime,
};
use crate::package::{OpenOptions, Package, PackageError};
use crate::trace;
use chat_template::ChatTemplate;
use draft::{Drafter, Speculation};
use sampler::Sampler;
use tokenizer::Tok;

pub use memory::MemoryPlan;
pub use outcome::{GenStats, Reuse, Stop};
pub use slot::Slot;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0}")]
    Tokenizer(String),
    #[error("{0}")]
    Template(String),
    #[error("prompt has {n} tokens; the context holds {ctx} (raise --ctx-size)")]
    PromptTooLong { n: usize, ctx: usize },
    #[error("{0}")]
    Setup(String),
    #[error(
        "the logits at position {pos} are not finite (NaN or infinity): a weight or scale of the package is (its checksums cannot tell a damaged file made with matching ones)"
    )]
    NonFinite { pos: usize },
}

#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    pub threads: usize,
    /// KV cache length; None = the smaller of the model's maximum and 8192.
    pub ctx_size: Option<usize>,
    pub isa: Isa,
    /// Stream experts through a pool (None: read them through the package's mapping, all
    /// resident once touched).
    pub stream: Option<StreamConfig>,
    /// Put the resident matrices with long rows in panel-major order when the AVX-512 kernels
    /// run (`package::resident`; the same results either way, faster decode).
    pub panels: bool,
    /// The KV cache's element types (`-ctk` / `-ctv`; bf16 by default, f32 in the tests that
    /// compare against transformers).
    pub kv: KvTypes,
}

/// Prompts are evaluated in chunks of this many tokens (bounds the activation buffers). 512, as
/// llama.cpp's micro-batch: each routed expert's products see twice the tokens of 256 (16 at the
/// mean on 128 experts top-8), +8% pp512 on the Qwen3-30B-A3B shape and +11% on Qwen3.5-35B-A3B's
/// 256 experts, for 50 MB more buffers on the first; 1024 gained 0-4% more.
pub const PREFILL_CHUNK: usize = 512;

pub struct Engine {
    model: Decoder,
    /// Streamed experts (None: every expert through the package), for their counters and knobs.
    experts: Option<Arc<Experts>>,
    /// Said once at load (an O_DIRECT fallback, say).
    warnings: Vec<String>,
    /// How `auto` sized the pool (and the context), in one line; None when it did not.
    sizing: Option<String>,
    /// The pool is auto-sized: [`Engine::resize_auto_pool`] re-checks it between replies.
    auto_pool: bool,
    /// Resident bytes of everything but weights and buffers, measured at load.
    runtime_bytes: u64,
    exec: Exec,
    /// The sequence `run`, `chat` and the workbench extend (a server runs its own slots).
    seq: Slot,
    /// A server's slots and prefix cache as the memory plan fitted them (one slot, no cache
    /// otherwise).
    seqs: sizing::Sequences,
    /// The forward pass's buffers, sized at load for a prompt chunk.
    state: RunState,
    /// Every position's logits of an evaluation of several chunks (tests, perplexity).
    all_logits: Vec<f32>,
    tok: Option<Arc<Tok>>,
    template: Option<Arc<ChatTemplate>>,
    /// Experts read through the mapping: the thread checking their checksums ahead of their
    /// first use, and its stop flag.
    verifier: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// `--spec` and `--draft`: where [`Engine::generate`]'s drafts come from.
    spec: Speculation,
}

impl Engine {
    /// Wait until the background check of the mapped experts' checksums has finished (at once
    /// when there is none). It shares the cores with decode until then: `bench` waits for it
    /// before its first test, so no repetition measures that one-time work (hashing every
    /// expert takes a core a good part of a second per few GB).
    pub fn wait_experts_verified(&mut self) -> Duration {
        let t0 = Instant::now();
        if let Some((_, h)) = self.verifier.take() {
            let _ = h.join();
        }
        t0.elapsed()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.verifier.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

/// What happens after each sampled token.
pub struct GenRequest<'a> {
    pub max_tokens: usize,
    pub stop_at_eos: bool,
    /// Checked between prompt chunks and after every token: set, generation stops (a prompt cut
    /// short leaves its evaluated chunks in the cache, where a later prompt can reuse them).
    pub cancel: &'a AtomicBool,
    /// Told the number of prompt tokens each prompt chunk evaluated, as it finishes (a server's
    /// counters).
    pub progress: Option<&'a (dyn Fn(usize) + Sync)>,
}

impl Engine {
    pub fn load(path: &Path, opts: EngineOptions) -> Result<Engine, EngineError> {
        Engine::load_serving(path, opts, None)
    }

    /// [`Engine::load`] for a server: `serving` gives its slots and prefix cache (as asked, or
    /// its defaults: `Sequences::server`), which the memory plan counts, refusing what does not
    /// fit; the fitted ones are [`Engine::sequences`].
    pub fn load_serving(
        path: &Path,
        opts: EngineOptions,
        serving: Option<(Option<usize>, Option<u64>)>,
    ) -> Result<Engine, EngineError> {
        let _load = trace::span("load").arg("package", path.display().to_string());
        crate::aligned_buf::reset_peak();
        // verified after the resident copy is made, so the file's pages are never mapped (they
        // would count in the RSS beside the copy)
        let mut pkg = Package::open_with(path, OpenOptions { verify_dense: false })?;
        let mut warnings = Vec::new();
        // before any size is planned or allocated from it (a context of 2^32 tokens sized a
        // 2 TiB KV cache and aborted); positions past the trained ones have no meaning anyway
        let (max_pos, limit) = (pkg.meta.model.max_position_embeddings, sizing::context_limit(&pkg.meta.model));
        match opts.ctx_size {
            Some(0) => return Err(EngineError::Setup("--ctx-size must be positive".into())),
            Some(c) if c > limit && limit > max_pos => {
                return Err(EngineError::Setup(format!(
                    "a context of {c} positions: the model reaches {limit} (YaRN: rope_scaling's original_max_position_embeddings x factor)"
                )));
            }
            Some(c) if c > limit => {
                return Err(EngineError::Setup(format!(
                    "a context of {c} positions: the model has {max_pos} (max_position_embeddings)"
                )));
            }
            _ => {}
        }
        // A default pool would hold every expert when the package fits in half the memory: then
        // there is no pool and experts are read through the mapping (nothing would ever be
        // evicted, and the first tokens would wait on O_DIRECT reads), unless the package asks
        // for a pool of its own (the demo).
        let allowance = sizing::allowance();
        let fits = pkg.file_size() <= allowance.bytes / 2;
        let mut opts = opts;
        let mut seqs = match serving {
            Some((slots, cache)) => sizing::Sequences::server(slots, cache, &allowance),
            None => sizing::Sequences::default(),
        };
        let (sizing_line, auto_pool) =
            sizing::plan_memory(&pkg, &mut opts, &mut seqs, &allowance, fits, &mut warnings)?;
        // the experts served from memory, copied with the dense weights (not with --no-stream,
        // which reads them through the mapping)
        let mut experts_in_memory = false;
        if let Some(sc) = &opts.stream
            && sc.budget_bytes.is_none()
            && pkg.meta.default_pool_fraction.is_none()
            && fits
        {
            opts.stream = None;
            experts_in_memory = true;
        }
        // the dense weights, which every decode token reads, in huge pages (and the experts);
        // long rows panel-major where the AVX-512 kernels will read them
        let panels = opts.panels && opts.isa >= Isa::Avx512;
        if let Err(e) = pkg.make_resident(experts_in_memory, opts.stream.is_some(), panels) {
            warnings.push(format!("weights stay memory-mapped from the file (no resident copy: {e})"));
        }
        pkg.verify_dense()?;
        let pkg = Arc::new(pkg);
        let model = Decoder::load(pkg.clone())?;
        let cfg = &model.cfg;
        let ctx = opts.ctx_size.unwrap_or(cfg.max_position_embeddings.min(8192));
        let tok = match &pkg.meta.tokenizer.tokenizer_json {
            Some(j) => Some(Arc::new(
                Tok::from_json(j).map_err(|e| EngineError::Tokenizer(format!("{}: tokenizer: {e}", path.display())))?,
            )),
            None => None,
        };
        let template = match &pkg.meta.tokenizer.chat_template {
            Some(t) => Some(Arc::new(
                ChatTemplate::new(t, pkg.meta.tokenizer.bos_token.clone(), pkg.meta.tokenizer.eos_token.clone())
                    .map_err(|e| EngineError::Template(format!("{}: {e}", path.display())))?,
            )),
            None => None,
        };
        let exec = Exec::new(opts.threads, opts.isa).map_err(EngineError::Setup)?;
        KvCache::check_types(cfg, opts.kv).map_err(|e| EngineError::Setup(format!("{}: {e}", path.display())))?;
        let seq = Slot::new(cfg, ctx, opts.kv);
        let experts = match (opts.stream, pkg.meta.experts.is_some()) {
            (Some(sc), true) => {
                let (ex, w) = Experts::start(pkg.clone(), model.routers(), sc, opts.isa)?;
                warnings.extend(w);
                Some(Arc::new(ex))
            }
            _ => None,
        };
        // what the process holds besides the weights' copy (counted as dense and experts) and
        // the pool's buffers the allocator thread has made so far (counted as the pool)
        let pooled = experts.as_ref().map_or(0, |e| e.cache.allocated_bytes());
        let runtime_bytes = crate::sysinfo::current_rss_bytes()
            .saturating_sub(pkg.resident_bytes().max(pkg.sizes().dense))
            .saturating_sub(pooled);
        // experts through the mapping: checked ahead of their first use (the store checks each
        // read of streamed ones), when the package fits in memory (a larger one, mapped with
        // --no-stream, would be read whole from disk and churn the page cache); if the thread
        // cannot start, or the package is larger, each is checked at its first use
        let verifier = match (&experts, pkg.meta.experts.is_some() && fits) {
            (None, true) => {
                let (stop, p) = (Arc::new(AtomicBool::new(false)), pkg.clone());
                let flag = stop.clone();
                std::thread::Builder::new()
                    .name("moescope-verify".into())
                    .spawn(move || {
                        trace::recorder::set_thread_name("verify");
                        let _s = trace::span("verify_experts");
                        p.verify_experts(&flag);
                    })
                    .ok()
                    .map(|h| (stop, h))
            }
            _ => None,
        };
        let state = RunState::new(&model.cfg, PREFILL_CHUNK);
        Ok(Engine {
            model,
            experts,
            warnings,
            sizing: sizing_line,
            auto_pool,
            runtime_bytes,
            exec,
            seq,
            seqs,
            state,
            all_logits: Vec::new(),
            tok,
            template,
            verifier,
            spec: Speculation::default(),
        })
    }

    /// Run on `threads` compute threads from now on.
    pub fn set_threads(&mut self, threads: usize) -> Result<(), EngineError> {
        if threads != self.exec.threads() {
            self.exec = Exec::new(threads, self.exec.isa).map_err(EngineError::Setup)?;
        }
        Ok(())
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.model.cfg.eos_token_ids
    }

    /// Forget the cache.
    pub fn reset(&mut self) {
        self.seq.clear();
    }

    /// How much of `ids` [`Engine::reuse_prefix`] would take from the cache ([`Slot::reusable`]).
    pub fn cached_prefix_len(&self, ids: &[u32]) -> usize {
        self.seq.reusable(ids)
    }

    /// Keep the longest cached prefix of `ids` that can be kept (leaving at least one token of
    /// `ids` to evaluate, whose logits are needed); returns its length.
    pub fn reuse_prefix(&mut self, ids: &[u32]) -> usize {
        self.seq.reuse(ids).0
    }

    /// Evaluate `ids` after what is cached: the logits asked for (`Logits::All`: every
    /// position's, `[n, vocab]`; else the last chunk's), valid until the next evaluation.
    pub fn eval(&mut self, ids: &[u32], want: Logits, obs: &mut dyn Observer) -> Result<&[f32], EngineError> {
        if self.seq.kv.len() + ids.len() > self.seq.kv.capacity() {
            return Err(EngineError::PromptTooLong { n: self.seq.kv.len() + ids.len(), ctx: self.seq.kv.capacity() });
        }
        self.all_logits.clear();
        let chunks = ids.chunks(PREFILL_CHUNK).count();
        for (i, chunk) in ids.chunks(PREFILL_CHUNK).enumerate() {
            let w = match (want, i + 1 == chunks) {
                (Logits::All, _) => Logits::All,
                (w, true) => w,
                (_, false) => Logits::None,
            };
            let resident = Resident(self.model.package());
            let experts: &dyn ExpertSource = match &self.experts {
                Some(ex) => &**ex,
                None => &resident,
            };
            let rt = Runtime { exec: &self.exec, experts };
            let l = self.model.forward(rt, &mut self.state, &mut self.seq.kv, chunk, w, obs)?;
            // a NaN or infinity anywhere in the weights ends here; sampling would pick a token
            // from it silently. The cache holds the same poison: cleared, so the next request
            // starts clean. (A scan of the vocabulary per token: small beside the token's pass.)
            if let Some(i) = first_non_finite(l) {
                // the rows are the chunk's last ones (one for Logits::Last)
                let vocab = self.model.cfg.vocab_size.max(1);
                let pos = self.seq.kv.len() - l.len() / vocab + i / vocab;
                self.reset();
                return Err(EngineError::NonFinite { pos });
            }
            if want == Logits::All && chunks > 1 {
                self.all_logits.extend_from_slice(l);
            }
            self.seq.cached.extend_from_slice(chunk);
        }
        // one chunk (every decode step): its logits where the pass left them, not copied (the
        // vocabulary's 600 KB a token for Qwen3)
        Ok(if want == Logits::All && chunks > 1 { &self.all_logits } else { self.state.logits() })
    }

    /// Evaluate a prompt's uncached part chunk by chunk, telling `req.progress` after each and
    /// stopping between chunks when `req.cancel` is set (false then); the last chunk's logits
    /// into `logits`.
    fn prefill(
        &mut self,
        ids: &[u32],
        req: &GenRequest<'_>,
        obs: &mut dyn Observer,
        logits: &mut Vec<f32>,
    ) -> Result<bool, EngineError> {
        for (i, chunk) in ids.chunks(PREFILL_CHUNK).enumerate() {
            if req.cancel.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let last = (i + 1) * PREFILL_CHUNK >= ids.len();
            let l = self.eval(chunk, if last { Logits::Last } else { Logits::None }, obs)?;
            if last {
                logits.clear();
                logits.extend_from_slice(l);
            }
            // where a hybrid model's later prompt that shares this much can resume: every
            // chunk's end, the prompt's end among them (a turn boundary, where a prompt that
            // rewrites this turn's reply, an old <think> dropped by the template, goes back to)
            self.seq.kv.checkpoint();
            if let Some(p) = req.progress {
                p(chunk.len());
            }
        }
        Ok(true)
    }

    /// Generate after `prompt` (reusing the cached prefix). `on_token(id, logits)` sees each
    /// sampled id with the raw logits that chose it, and returns false to stop. Drafts come
    /// from the engine's [`Speculation`] (`--spec`; none when off).
    ///
    /// Timings: prefill = evaluating the uncached part of the prompt; TTFT = prefill plus the
    /// first sample; each decode step = one forward pass (of the previous token, and the drafts
    /// when speculating) plus sampling what it chose (its latency, shared by the tokens it gave,
    /// goes into `token_ms`). `obs` sees every forward pass (a routing log, the workbench's tap,
    /// or both through a [`Tee`](crate::model::Tee)).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        req: GenRequest<'_>,
        obs: &mut dyn Observer,
        on_token: &mut dyn FnMut(u32, &[f32]) -> bool,
    ) -> Result<GenStats, EngineError> {
        let mut drafter = self.spec.drafter();
        let max_draft = self.spec.draft;
        let d = drafter.as_deref_mut().map(|d| (d as &mut dyn Drafter, max_draft));
        self.generate_drafted(prompt, sampler, req, obs, on_token, d)
    }

    /// [`Engine::generate`] with drafts from `drafter` (up to its count a pass; None: no
    /// speculation), whatever `--spec` says: tests give draft sources of their own.
    pub fn generate_drafted(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        req: GenRequest<'_>,
        obs: &mut dyn Observer,
        on_token: &mut dyn FnMut(u32, &[f32]) -> bool,
        mut drafter: Option<(&mut dyn Drafter, usize)>,
    ) -> Result<GenStats, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::Setup("empty prompt".into()));
        }
        if prompt.len() >= self.seq.kv.capacity() {
            return Err(EngineError::PromptTooLong { n: prompt.len(), ctx: self.seq.kv.capacity() });
        }
        let t0 = Instant::now();
        // the logits that chose the latest token, one row of the vocabulary
        let mut logits = Vec::with_capacity(self.model.cfg.vocab_size);
        let (cached, reuse, done) = {
            let mut span = trace::span("prefill").arg("prompt_tokens", prompt.len());
            let (cached, reuse) = self.seq.reuse(prompt);
            span.set("cached_tokens", cached);
            span.set("reuse", reuse.name());
            let done = self.prefill(&prompt[cached..], &req, obs, &mut logits)?;
            (cached, reuse, done)
        };
        let mut stats = GenStats::new(prompt.len() - cached, cached, reuse, ms(t0));
        if !done {
            stats.stop = Stop::Cancelled;
            return Ok(stats);
        }
        if req.max_tokens == 0 {
            return Ok(stats);
        }
        let mut history: Vec<u32> = prompt.to_vec();
        let mut expert_prev = self.expert_counters();
        let mut id = {
            let _s = trace::span("sample");
            sampler.sample(&logits, &history)
        };
        stats.ttft_ms = ms(t0);
        let eos = self.eos_ids().to_vec();
        let stop_at = |t: u32| req.stop_at_eos && eos.contains(&t);
        // the latest verify pass, and its next token to hand out (`queued` < its tokens' count)
        let mut spec = speculate::Verified::default();
        let mut drafts = Vec::new();
        let mut queued = 0;
        loop {
            stats.generated.push(id);
            history.push(id);
            let go_on = on_token(id, &logits);
            let stop = if stop_at(id) {
                Some(Stop::Eos)
            } else if stats.generated.len() >= req.max_tokens {
                Some(Stop::Length)
            } else if !go_on || req.cancel.load(Ordering::Relaxed) {
                Some(Stop::Cancelled)
            } else if queued == spec.tokens.len() && self.seq.kv.len() + 1 > self.seq.kv.capacity() {
                Some(Stop::ContextFull)
            } else {
                None
            };
            if let Some(stop) = stop {
                stats.stop = stop;
                // a verify pass's tokens not handed out leave the cache too
                if queued < spec.tokens.len() {
                    self.keep_evaluated(spec.base + queued, &spec, obs)?;
                }
                break;
            }
            if queued < spec.tokens.len() {
                id = spec.tokens[queued];
                logits.clear();
                logits.extend_from_slice(spec.row(queued, self.model.cfg.vocab_size));
                queued += 1;
                continue;
            }
            // drafts: as many as the reply and the context have room for after this pass
            drafts.clear();
            if let Some((d, max)) = drafter.as_mut() {
                let room = (req.max_tokens - stats.generated.len()).min(self.seq.kv.capacity() - self.seq.kv.len());
                d.draft(&history, (*max).min(room.saturating_sub(1)), &mut drafts);
            }
            let step = Instant::now();
            let n = {
                let _d = trace::span("decode").arg("token", stats.generated.len()).arg("pos", self.seq.kv.len());
                if drafts.is_empty() {
                    let l = self.eval(&[id], Logits::Last, obs)?;
                    logits.clear();
                    logits.extend_from_slice(l);
                    let _s = trace::span("sample");
                    id = sampler.sample(&logits, &history);
                    spec.tokens.clear();
                    queued = 0;
                    1
                } else {
                    self.verify(&drafts, sampler, &mut history, &stop_at, obs, &mut spec)?;
                    stats.drafted += drafts.len();
                    stats.accepted += spec.accepted;
                    id = spec.tokens[0];
                    logits.clear();
                    logits.extend_from_slice(spec.row(0, self.model.cfg.vocab_size));
                    queued = 1;
                    spec.tokens.len()
                }
            };
            let step_ms = ms(step);
            stats.passes += 1;
            stats.decode_steps += n;
            stats.decode_ms += step_ms;
            stats.token_ms.extend(std::iter::repeat_n(step_ms / n as f64, n));
            self.trace_step_counters("decode", n, step_ms, &mut expert_prev);
        }
        Ok(stats)
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// The first NaN or infinity in `xs`: blocks checked whole (vector code), the one that has it
/// scanned.
fn first_non_finite(xs: &[f32]) -> Option<usize> {
    const BLOCK: usize = 1024;
    let b = xs.chunks(BLOCK).position(|c| c.iter().fold(false, |bad, x| bad | !x.is_finite()))?;
    xs[b * BLOCK..].iter().position(|x| !x.is_finite()).map(|i| b * BLOCK + i)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_non_finite_value_is_found_in_any_block() {
        for len in [0, 1, 1023, 1024, 1025, 5000] {
            assert_eq!(super::first_non_finite(&vec![1.0; len]), None);
            for at in [0, 1, 1022, 1023, 1024, 2047, 4999].into_iter().filter(|&i| i < len) {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut xs = vec![1.0f32; len];
                    xs[at] = bad;
                    // a later one too: the first is the answer
                    if at + 3 < len {
                        xs[at + 3] = f32::NAN;
                    }
                    assert_eq!(super::first_non_finite(&xs), Some(at), "len {len}, at {at}");
                }
            }
        }
    }
}
