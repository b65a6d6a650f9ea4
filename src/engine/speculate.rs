//! Speculative decoding's verify pass: the latest token and the drafts evaluated in one forward
//! pass (`[1 + k]` rows), each row's token chosen in order as decoding one token at a time would
//! choose it (greedy: the row's own choice; sampling: [`Sampler::sample_draft`], whose output
//! has the row's distribution), until a draft differs from its row's choice; the cache then
//! keeps the latest token and the accepted drafts. A pass's rows equal those of the same tokens
//! decoded one by one, bit for bit (every product gives a row the same bits in any batch, and
//! attention and the recurrences run per position: tests/speculate.rs), so greedy output is
//! `--spec off`'s whatever the drafts.
//!
//! A hybrid model's recurrent states cannot be cut back: they are set aside before the pass
//! ([`KvCache::mark`](crate::model::KvCache::mark)) and, when a draft was wrong, restored and the
//! accepted tokens evaluated again (an extra pass of those tokens: the rejection's price).

use super::draft::Speculation;
use super::sampler::Sampler;
use super::{Engine, EngineError};
use crate::model::{Logits, Observer};

/// One verify pass: what it evaluated and what it chose.
#[derive(Default)]
pub(super) struct Verified {
    /// the cache's length before the pass
    pub base: usize,
    /// the latest token and the drafts, as evaluated
    pub batch: Vec<u32>,
    /// the tokens chosen: the accepted drafts, then the first row's choice that was no draft
    /// (or the stop token, or the choice after the last draft)
    pub tokens: Vec<u32>,
    /// the logits that chose each of `tokens`, `[tokens.len(), vocab]` (and the unused rows)
    pub rows: Vec<f32>,
    /// drafts equal to their row's choice
    pub accepted: usize,
}

impl Verified {
    /// The logits that chose `tokens[i]` (`vocab` wide).
    pub fn row(&self, i: usize, vocab: usize) -> &[f32] {
        &self.rows[i * vocab..(i + 1) * vocab]
    }
}

impl Engine {
    /// Where [`Engine::generate`]'s drafts come from from now on (`--spec`, `--draft`).
    pub fn set_speculation(&mut self, spec: Speculation) {
        self.spec = spec;
    }

    pub fn speculation(&self) -> Speculation {
        self.spec
    }

    /// Evaluate the latest token (last in `history`, not in the cache yet) and `drafts` in one pass
    /// and choose each row's token into `out`; a token `stop` says ends the reply ends the
    /// chain there. The cache ends holding the latest token and the accepted drafts.
    pub(super) fn verify(
        &mut self,
        drafts: &[u32],
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        stop: &dyn Fn(u32) -> bool,
        obs: &mut dyn Observer,
        out: &mut Verified,
    ) -> Result<(), EngineError> {
        out.base = self.seq.kv.len();
        self.seq.kv.mark();
        out.batch.clear();
        out.batch.extend(history.last());
        out.batch.extend_from_slice(drafts);
        let v = self.model.cfg.vocab_size;
        let rows = self.eval(&out.batch, Logits::All, obs)?;
        out.rows.clear();
        out.rows.extend_from_slice(rows);
        out.tokens.clear();
        out.accepted = 0;
        let h0 = history.len();
        for (i, row) in out.rows.chunks_exact(v).enumerate() {
            let next = match drafts.get(i) {
                Some(&d) => sampler.sample_draft(row, history, d),
                None => sampler.sample(row, history),
            };
            out.tokens.push(next);
            let hit = drafts.get(i) == Some(&next);
            out.accepted += usize::from(hit);
            if !hit || stop(next) {
                break;
            }
            history.push(next);
        }
        history.truncate(h0);
        let keep = out.base + out.tokens.len();
        self.keep_evaluated(keep, out, obs)
    }

    /// Cut the sequence back to its first `n` positions after the verify pass `v` (whose mark
    /// a hybrid's states go back to, its accepted tokens then evaluated again).
    pub(super) fn keep_evaluated(&mut self, n: usize, v: &Verified, obs: &mut dyn Observer) -> Result<(), EngineError> {
        if n >= self.seq.kv.len() {
            return Ok(());
        }
        if !self.seq.kv.hybrid() {
            self.seq.kv.rewind(n);
            self.seq.cached.truncate(n);
            return Ok(());
        }
        let Some(base) = self.seq.kv.back_to_mark().filter(|&b| b == v.base) else {
            return Err(EngineError::Setup(format!("speculation: no saved state at position {}", v.base)));
        };
        self.seq.cached.truncate(base);
        self.eval(&v.batch[..n - base], Logits::None, obs)?;
        Ok(())
    }
}
