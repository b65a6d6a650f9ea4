//! Finished sequences kept in RAM for later requests that share a prefix with them (an agent
//! resending its system prompt and history every turn): llama-server's `--cache-ram`. Each
//! entry is a [`Slot`] copied at its own length (keys and values, and a hybrid model's
//! linear-attention states with their checkpoints), counted in bytes against a budget and
//! evicted least recently used first.

use super::Slot;
use crate::model::ModelConfig;

pub struct PrefixCache {
    budget: u64,
    entries: Vec<Entry>,
    clock: u64,
    /// Requests that started from an entry, and the tokens they took.
    pub hits: u64,
    pub hit_tokens: u64,
}

struct Entry {
    slot: Slot,
    bytes: u64,
    used: u64,
}

impl PrefixCache {
    /// A cache of at most `budget` bytes (0: none).
    pub fn new(budget: u64) -> PrefixCache {
        PrefixCache { budget, entries: Vec::new(), clock: 0, hits: 0, hit_tokens: 0 }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry that could give the longest prefix of `ids`, and how long.
    pub fn best(&self, ids: &[u32]) -> Option<(usize, usize)> {
        let lens = self.entries.iter().map(|e| e.slot.reusable(ids)).enumerate();
        lens.filter(|&(_, n)| n > 0).max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
    }

    /// Copy entry `i`'s first `len` ids into `slot` ([`PrefixCache::best`]'s answer); false when
    /// it cannot.
    pub fn take(&mut self, i: usize, len: usize, slot: &mut Slot) -> bool {
        self.clock += 1;
        let Some(e) = self.entries.get_mut(i) else { return false };
        e.used = self.clock;
        let ok = slot.copy_prefix(&e.slot, len);
        if ok {
            self.hits += 1;
            self.hit_tokens += len as u64;
        }
        ok
    }

    /// Keep a copy of `slot`'s sequence, evicting the least recently used entries to make room;
    /// false when it is larger than the whole budget (or holds nothing). An entry that is a
    /// prefix of it goes (this one holds all it did); when an entry holds it already, that one is
    /// only marked used.
    pub fn put(&mut self, cfg: &ModelConfig, slot: &Slot) -> bool {
        let ids = slot.cached();
        if ids.is_empty() || self.budget == 0 {
            return false;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.slot.cached().starts_with(ids)) {
            e.used = self.clock;
            return true;
        }
        let bytes = slot.bytes_used();
        if bytes > self.budget {
            return false;
        }
        self.entries.retain(|e| !ids.starts_with(e.slot.cached()));
        while self.bytes() + bytes > self.budget {
            let Some(lru) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else {
                break;
            };
            self.entries.swap_remove(lru);
        }
        let Some(copy) = slot.compact(cfg) else { return false };
        let bytes = copy.bytes_used();
        self.entries.push(Entry { slot: copy, bytes, used: self.clock });
        true
    }
}
