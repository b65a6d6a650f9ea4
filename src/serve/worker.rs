//! A request as the engine thread sees it (a `Job`: token ids, parameters, an event channel, a
//! cancel flag), and its reply as it is decoded: text through the stop strings into `Event`s,
//! with log-probabilities when asked. `slots.rs` runs the jobs, several at a time.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::api::GenParams;
use super::text::StopText;
use crate::engine::tokenizer::{StreamDecoder, Tok};

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
    /// The prompt's evaluation so far (sent when the request asked for `return_progress`):
    /// `processed` of its `total` tokens are in the cache, `cache` of them found there.
    Progress {
        total: usize,
        cache: usize,
        processed: usize,
        time_ms: u64,
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

/// A reply as it is decoded: text through the stop strings, log-probabilities kept until the
/// text they belong to is sent.
pub struct Reply<'a> {
    tok: &'a Tok,
    dec: StreamDecoder<'a>,
    stops: StopText,
    eos: Vec<u32>,
    stop_at_eos: bool,
    top_logprobs: Option<usize>,
    logprobs: Vec<TokenLogprob>,
    events: UnboundedSender<Event>,
    /// A stop string ended the reply.
    pub stopped: bool,
    /// The client is gone.
    closed: bool,
}

impl<'a> Reply<'a> {
    /// `kept`: the special tokens the text keeps, a tool call's markers (None: all of them, as
    /// gpt-oss's channels need); reply.rs splits them out.
    pub fn new(tok: &'a Tok, job: &Job, eos: Vec<u32>, kept: Option<Vec<u32>>) -> Reply<'a> {
        Reply {
            tok,
            dec: match kept {
                Some(ids) => StreamDecoder::keeping(tok, ids),
                None => StreamDecoder::new(tok, false),
            },
            stops: StopText::new(job.params.stop.clone()),
            eos,
            stop_at_eos: !job.params.ignore_eos,
            top_logprobs: job.params.logprobs,
            logprobs: Vec::new(),
            events: job.events.clone(),
            stopped: false,
            closed: false,
        }
    }

    /// A sampled token; false to stop.
    pub fn token(&mut self, id: u32, logits: &[f32]) -> bool {
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
    pub fn finish(&mut self) {
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
