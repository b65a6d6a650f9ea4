//! Several sequences in one forward pass (a server's slots): each slot's next tokens, a decode
//! token or a prompt chunk, run together through [`Decoder::forward_batch`], so the dense
//! weights and each routed expert are read once for all of them. Each sequence's logits are
//! the bits it gets alone (tests/batch.rs).
//!
//! [`Decoder::forward_batch`]: crate::model::Decoder::forward_batch

use super::{Engine, EngineError, PREFILL_CHUNK, Slot};
use crate::model::{ExpertSource, Logits, Observer, Resident, RunState, Runtime, Seq};

/// One slot's part of a step.
pub struct Step<'a> {
    pub slot: &'a mut Slot,
    pub tokens: &'a [u32],
    /// Its last token's logits wanted (a decode step, a prompt's last chunk).
    pub logits: bool,
}

impl Engine {
    /// An empty sequence of the engine's context size.
    pub fn new_slot(&self) -> Slot {
        Slot::new(&self.model.cfg, self.ctx_size(), self.seq.kv.types())
    }

    /// Most tokens one [`Engine::step`] may hold.
    pub fn step_rows(&self) -> usize {
        self.state.chunk()
    }

    /// Let one step hold a prompt chunk beside `slots` sequences' decode tokens.
    pub fn fit_slots(&mut self, slots: usize) {
        let rows = PREFILL_CHUNK + slots.saturating_sub(1);
        if self.state.chunk() < rows {
            self.state = RunState::new(&self.model.cfg, rows);
        }
    }

    /// One forward pass over the slots' next tokens, appended to their caches; the logits of
    /// those that want them, in order (`[rows, vocab]`). On an error the slots' caches are in an
    /// unknown state: the caller clears them.
    pub fn step(&mut self, steps: &mut [Step<'_>], obs: &mut dyn Observer) -> Result<&[f32], EngineError> {
        let resident = Resident(self.model.package());
        let experts: &dyn ExpertSource = match &self.experts {
            Some(ex) => &**ex,
            None => &resident,
        };
        let rt = Runtime { exec: &self.exec, experts };
        let mut seqs: Vec<Seq<'_>> = steps
            .iter_mut()
            .map(|s| Seq {
                kv: &mut s.slot.kv,
                tokens: s.tokens,
                want: if s.logits { Logits::Last } else { Logits::None },
            })
            .collect();
        let l = self.model.forward_batch(rt, &mut self.state, &mut seqs, obs)?;
        drop(seqs);
        // a NaN or infinity anywhere in the weights ends here (as `eval` does)
        if let Some(i) = super::first_non_finite(l) {
            let vocab = self.model.cfg.vocab_size.max(1);
            let s = steps.iter().filter(|s| s.logits).nth(i / vocab);
            return Err(EngineError::NonFinite { pos: s.map_or(0, |s| s.slot.kv.len().saturating_sub(1)) });
        }
        for s in steps.iter_mut() {
            s.slot.cached.extend_from_slice(s.tokens);
        }
        Ok(self.state.logits())
    }

    /// The last step's logits, as [`Engine::step`] returned them (one row per step that
    /// wanted them, in the steps' order), through a shared borrow.
    pub fn step_logits(&self) -> &[f32] {
        self.state.logits()
    }
}
