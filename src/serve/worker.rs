//! The engine thread: takes requests one at a time from the queue and streams each reply back
//! as events. A request is a sequence of token ids with its own sampler and stop rules, so
//! that a batch of them (continuous batching) can come later without touching the HTTP layer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::Watch;
use super::api::GenParams;
use super::metrics::Metrics;
use super::text::StopText;
use crate::engine::GenStats;
use crate::engine::sampler::Sampler;
use crate::engine::tokenizer::{StreamDecoder, Tok};
use crate::engine::{Engine, GenRequest, Stop};
use crate::trace;

/// One request for the engine.
pub struct Job {
    /// For the trace and the workbench (`chatcmpl-...`).
    pub id: String,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: UnboundedSender<Event>,
    /// Set when the client goes away (the response's guard fires it when dropped).
    pub cancel: Arc<AtomicBool>,
    pub queued_at: Instant,
}

/// A token's log-probability and its most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End of sequence or a stop string.
    Stop,
    /// The token limit or a full context.
    Length,
}

impl Finish {
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub prompt_ms: f64,
    pub predicted_ms: f64,
    pub decode_steps: usize,
}

/// What the engine sends back about a request, in this order: `Started`, `Text`*, then `Done`
/// or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// Text that no stop string can claim any more, with the log-probabilities of the tokens
    /// it came from (when asked).
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish: Finish,
        usage: Usage,
    },
    Error {
        message: String,
    },
}

/// Run one request to its end. Its events go to `job.events`; a client that went away (the
/// channel closed, or the cancel flag) stops it within a prompt chunk or a token.
pub fn run_job(engine: &mut Engine, job: Job, metrics: &Metrics, watch: &mut dyn Watch, waiting: &dyn Fn() -> usize) {
    let start = trace::recorder::now_ticks();
    let queued_ms = job.queued_at.elapsed().as_secs_f64() * 1000.0;
    let cached = engine.cached_prefix_len(&job.prompt);
    watch.started(&job.id, job.prompt.len(), cached, waiting());
    let (outcome, stats) = run(engine, &job, cached, metrics, watch);
    watch.finished(&job.id, &outcome, stats.as_ref(), waiting());
    // the requests' own track: one slice per request, as the engine ran it
    trace::recorder::track_slice("requests", "request", start, {
        let mut a: trace::recorder::Args = vec![
            ("id", job.id.as_str().into()),
            ("prompt_tokens", job.prompt.len().into()),
            ("cached_tokens", cached.into()),
            ("queued_ms", queued_ms.into()),
            ("outcome", outcome.as_str().into()),
        ];
        if let Some(s) = &stats {
            a.push(("completion_tokens", s.generated.len().into()));
            a.push(("decode_tok_s", s.decode_tps().into()));
        }
        a
    });
}

/// The request through the engine; its outcome in a word (or the error's text) and its stats.
fn run(
    engine: &mut Engine,
    job: &Job,
    cached: usize,
    metrics: &Metrics,
    watch: &mut dyn Watch,
) -> (String, Option<GenStats>) {
    let _span = trace::span("request").arg("id", job.id.as_str()).arg("prompt_tokens", job.prompt.len());
    let Some(tok) = engine.tokenizer().cloned() else {
        let message = "this model has no tokenizer".to_string();
        let _ = job.events.send(Event::Error { message: message.clone() });
        return (message, None);
    };
    if job.events.send(Event::Started { prompt_tokens: job.prompt.len(), cached_tokens: cached }).is_err() {
        Metrics::add(&metrics.cancelled, 1);
        return ("cancelled".into(), None);
    }
    let mut sampler = Sampler::new(job.params.sampler).with_adjustments(job.params.adjust.clone());
    let mut reply = Reply::new(&tok, job, engine.eos_ids().to_vec(), engine.harmony());
    let left = engine.ctx_size().saturating_sub(job.prompt.len());
    let progress = |n: usize| {
        Metrics::add(&metrics.prompt_tokens, n as u64);
        Metrics::add(&metrics.decodes, 1);
    };
    let req = GenRequest {
        max_tokens: job.params.max_tokens.unwrap_or(left).min(left),
        stop_at_eos: !job.params.ignore_eos,
        cancel: &job.cancel,
        progress: Some(&progress),
    };
    let (obs, on_token) = watch.passes();
    let res = engine.generate(&job.prompt, &mut sampler, req, obs, &mut |id, logits| {
        Metrics::add(&metrics.predicted_tokens, 1);
        on_token(id);
        reply.token(id, logits) && !job.cancel.load(Ordering::Relaxed)
    });
    let stats = match res {
        Ok(s) => s,
        Err(e) => {
            // the cache's state is unknown after a failed pass
            engine.reset();
            Metrics::add(&metrics.errors, 1);
            let message = e.to_string();
            let _ = job.events.send(Event::Error { message: message.clone() });
            return (message, None);
        }
    };
    // decode steps after the first token (which came with the prompt's last pass)
    Metrics::add(&metrics.decodes, stats.decode_steps as u64);
    Metrics::add(&metrics.prompt_us, (stats.prefill_ms * 1e3) as u64);
    Metrics::add(&metrics.predicted_us, (stats.decode_ms * 1e3) as u64);
    Metrics::add(&metrics.cached_tokens, stats.prompt_cached as u64);
    metrics.tokens_max.fetch_max((job.prompt.len() + stats.generated.len()) as u64, Ordering::Relaxed);
    let finish = match (reply.stopped, stats.stop) {
        (true, _) | (false, Stop::Eos) => Finish::Stop,
        (false, Stop::Length | Stop::ContextFull) => Finish::Length,
        (false, Stop::Cancelled) => {
            Metrics::add(&metrics.cancelled, 1);
            return ("cancelled".into(), Some(stats));
        }
    };
    reply.finish();
    let usage = Usage {
        prompt_tokens: job.prompt.len(),
        completion_tokens: stats.generated.len(),
        cached_tokens: stats.prompt_cached,
        prompt_ms: stats.prefill_ms,
        predicted_ms: stats.decode_ms,
        decode_steps: stats.decode_steps,
    };
    let _ = job.events.send(Event::Done { finish, usage });
    (finish.name().into(), Some(stats))
}

/// A reply as it is decoded: text through the stop strings, log-probabilities kept until the
/// text they belong to is sent.
struct Reply<'a> {
    tok: &'a Tok,
    dec: StreamDecoder<'a>,
    stops: StopText,
    eos: Vec<u32>,
    stop_at_eos: bool,
    top_logprobs: Option<usize>,
    logprobs: Vec<TokenLogprob>,
    events: &'a UnboundedSender<Event>,
    /// A stop string ended the reply.
    stopped: bool,
    /// The client is gone.
    closed: bool,
}

impl<'a> Reply<'a> {
    /// `harmony`: the model answers in gpt-oss's channels, whose markup is special tokens the
    /// text keeps (reply.rs splits it).
    fn new(tok: &'a Tok, job: &'a Job, eos: Vec<u32>, harmony: bool) -> Reply<'a> {
        Reply {
            tok,
            dec: StreamDecoder::new(tok, !harmony),
            stops: StopText::new(job.params.stop.clone()),
            eos,
            stop_at_eos: !job.params.ignore_eos,
            top_logprobs: job.params.logprobs,
            logprobs: Vec::new(),
            events: &job.events,
            stopped: false,
            closed: false,
        }
    }

    /// A sampled token; false to stop.
    fn token(&mut self, id: u32, logits: &[f32]) -> bool {
        if self.stop_at_eos && self.eos.contains(&id) {
            return true;
        }
        if let Some(n) = self.top_logprobs {
            self.logprobs.push(logprob(self.tok, id, logits, n));
        }
        match self.dec.push(id) {
            Ok(Some(piece)) => self.text(&piece),
            _ => !self.closed,
        }
    }

    fn text(&mut self, piece: &str) -> bool {
        let r = self.stops.push(piece);
        self.send(r.text);
        self.stopped |= r.stopped;
        !(self.stopped || self.closed)
    }

    /// At the end: what the decoder and the stop strings held back.
    fn finish(&mut self) {
        if !self.stopped
            && let Ok(Some(p)) = self.dec.flush()
        {
            self.text(&p);
        }
        if !self.stopped {
            let rest = self.stops.finish();
            self.send(rest);
        }
        if !self.logprobs.is_empty() {
            self.send_always(String::new());
        }
    }

    fn send(&mut self, text: String) {
        if !text.is_empty() {
            self.send_always(text);
        }
    }

    fn send_always(&mut self, text: String) {
        let logprobs = std::mem::take(&mut self.logprobs);
        if self.events.send(Event::Text { text, logprobs }).is_err() {
            self.closed = true;
        }
    }
}

/// log softmax of the raw logits at `id` and the `n` most likely tokens (the model's own
/// distribution: before temperature, penalties and bias).
fn logprob(tok: &Tok, id: u32, logits: &[f32], n: usize) -> TokenLogprob {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + logits.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
    let lp = |i: u32| (logits.get(i as usize).map_or(f64::NEG_INFINITY, |&l| l as f64) - lse) as f32;
    let piece = |i: u32| tok.decode(&[i], false).unwrap_or_default();
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(order.len());
    if n > 0 {
        // highest first, ties to the lower id
        let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        order.select_nth_unstable_by(n - 1, cmp);
        order.truncate(n);
        order.sort_unstable_by(cmp);
    }
    TokenLogprob { token: piece(id), logprob: lp(id), top: order.iter().take(n).map(|&i| (piece(i), lp(i))).collect() }
}
