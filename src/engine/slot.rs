//! One sequence's state: its KV cache (and a hybrid's linear-attention states and checkpoints)
//! and the ids it holds. The engine keeps one for `run`, `chat` and the workbench; a server
//! keeps one per parallel slot, and its prefix cache holds finished ones.

use super::outcome::Reuse;
use crate::model::{KvCache, KvTypes, ModelConfig};

pub struct Slot {
    pub(super) kv: KvCache,
    /// The ids whose keys and values are in `kv`, in order.
    pub(super) cached: Vec<u32>,
}

impl Slot {
    /// An empty sequence of up to `ctx` positions, its keys and values in `types`.
    pub fn new(cfg: &ModelConfig, ctx: usize, types: KvTypes) -> Slot {
        Slot { kv: KvCache::typed(cfg, ctx, types), cached: Vec::new() }
    }

    /// The ids it holds.
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    pub fn capacity(&self) -> usize {
        self.kv.capacity()
    }

    /// Bytes its positions and checkpoints take.
    pub fn bytes_used(&self) -> u64 {
        self.kv.bytes_used()
    }

    /// Where a later prompt that shares this much can resume (a hybrid's linear states kept;
    /// nothing to do otherwise).
    pub fn checkpoint(&mut self) {
        self.kv.checkpoint();
    }

    /// Back to an empty sequence.
    pub fn clear(&mut self) {
        self.kv.clear();
        self.cached.clear();
    }

    /// How much of `ids` [`Slot::reuse`] would keep: the common prefix (leaving at least one
    /// token of `ids` to evaluate, whose logits are needed), for a hybrid model only as far
    /// back as its recurrent state can go (all of it when `ids` extends it, else the latest
    /// checkpoint within the common prefix, else nothing).
    pub fn reusable(&self, ids: &[u32]) -> usize {
        self.kv.reachable(self.common(ids))
    }

    fn common(&self, ids: &[u32]) -> usize {
        self.cached.iter().zip(ids).take_while(|(a, b)| a == b).count().min(ids.len().saturating_sub(1))
    }

    /// Keep the longest prefix of `ids` it can ([`Slot::reusable`]), forget the rest; its
    /// length and how.
    pub fn reuse(&mut self, ids: &[u32]) -> (usize, Reuse) {
        let common = self.common(ids);
        let n = self.kv.reachable(common);
        let reuse = match n {
            0 if common > 0 => Reuse::Recomputed,
            0 => Reuse::None,
            n if n < self.cached.len() && self.kv.has_checkpoint(n) => Reuse::Snapshot,
            _ => Reuse::Prefix,
        };
        let kept = self.kv.rewind(n);
        debug_assert_eq!(kept, n);
        self.cached.truncate(kept);
        (kept, reuse)
    }

    /// Become `src`'s first `len` ids (a length [`Slot::reusable`] gave for `src`); false when
    /// its cache cannot (a hybrid's state has no checkpoint there, or it does not fit).
    pub fn copy_prefix(&mut self, src: &Slot, len: usize) -> bool {
        if len > src.cached.len() || !self.kv.copy_prefix(&src.kv, len) {
            return false;
        }
        self.cached.clear();
        self.cached.extend_from_slice(&src.cached[..len]);
        true
    }

    /// A copy of its whole sequence in a cache of just that length (what a prefix cache keeps).
    pub fn compact(&self, cfg: &ModelConfig) -> Option<Slot> {
        let mut s = Slot::new(cfg, self.cached.len().max(1), self.kv.types());
        s.copy_prefix(self, self.cached.len()).then_some(s)
    }
}
