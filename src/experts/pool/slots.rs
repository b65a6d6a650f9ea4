//! The pool's slot table and eviction: which expert each slot holds, what it is doing, and
//! which entry goes when room is needed. Plain data behind the pool's one lock, with no threads
//! and no files, so its rules are tested here alone.
//!
//! A slot's life: reserved for a read (queued, demand or prefetch) -> being read by an I/O
//! worker -> ready (or failed). A slot the forward pass asked for is pinned until the layer is
//! done with it; pinned slots and slots being read are never evicted.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::policy::{Ctx, Entry, PolicyKind, RouteModel, Scores};
use super::super::stats::LayerStats;
use super::super::store::AlignedBuf;
use super::window::ReadWindow;
use crate::trace::hist::Latency;

/// (MoE layer index in forward order, expert id)
pub type Key = (usize, usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Demand,
    Prefetch,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum SlotState {
    Queued,
    Reading,
    Ready,
    Failed(String),
}

pub(super) struct Slot {
    pub key: Key,
    pub state: SlotState,
    pub buf: Option<Arc<AlignedBuf>>,
    pub pins: u32,
    pub origin: Origin,
    /// Used by the forward pass since it was loaded.
    pub used: bool,
    pub last_use: u64,
    pub last_token: u64,
    /// The prediction's confidence, while a prefetched entry is unused.
    pub predicted: Option<f32>,
    pub queued_at: Instant,
    /// Trace flow from the prefetch that queued it to the read, and from the read to its use.
    pub flow_issue: Option<u64>,
    pub flow_use: Option<u64>,
}

/// The pool's fixed shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub n_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    /// Bytes of one expert blob (one slot's buffer).
    pub blob_len: usize,
}

impl Dims {
    /// Slots a budget buys: at least one layer's top-k (the smallest pool that still computes a
    /// token without re-reading), at most every expert.
    pub fn slots_for(&self, budget: u64) -> usize {
        ((budget / self.blob_len.max(1) as u64) as usize).min(self.n_layers * self.num_experts).max(self.top_k).max(1)
    }
}

pub(super) struct State {
    pub dims: Dims,
    /// Bytes a read of an expert of each MoE layer reads (its blob length; at most a slot's).
    pub layer_bytes: Vec<u64>,
    pub slots: Vec<Option<Slot>>,
    pub free: Vec<usize>,
    pub map: HashMap<Key, usize>,
    pub spare: Vec<AlignedBuf>,
    pub capacity: usize,
    pub policy: PolicyKind,
    pub prefetch_on: bool,
    pub demand_q: VecDeque<usize>,
    pub prefetch_q: Vec<(usize, f32)>,
    /// Speculative reads: (pass, key, chance of use), no slot reserved. Read only when the
    /// disk would otherwise idle, and admitted only into a free slot or over an entry the
    /// policy values less (see `ExpertCache::speculate`).
    pub spec_q: Vec<(u64, Key, f32)>,
    pub tick: u64,
    pub token: u64,
    pub active_layer: usize,
    pub scores: Scores,
    pub routes: RouteModel,
    pub evicted_at: HashMap<Key, u64>,
    pub stats: Vec<LayerStats>,
    pub in_flight: usize,
    /// Demand reads being read now: prefetches wait for them (two concurrent reads share the
    /// disk, so a prefetch started beside a demand read doubles that read's stall).
    pub demand_in_flight: usize,
    pub shutdown: bool,
    /// Latency of each completed read (pread + checksum), and how many.
    pub read_latency: Latency,
    /// What a predicted read is worth before each layer's request (window, read time, stalls).
    pub window: ReadWindow,
    pub reads: u64,
    /// Time with at least one read in flight (the disk busy), closed intervals, and the start
    /// of the open one.
    pub busy_ns: u64,
    pub busy_since: Option<Instant>,
}

/// A read an I/O worker has taken from a queue.
pub(super) struct ReadJob {
    pub slot: usize,
    pub key: Key,
    pub origin: Origin,
    /// Time it waited in its queue.
    pub waited: Duration,
    pub flow_issue: Option<u64>,
    /// A spare buffer to read into, if the pool had one.
    pub buf: Option<AlignedBuf>,
}

/// Index of the highest confidence (the first of equals), 0 for none.
pub(super) fn most_confident(confs: impl Iterator<Item = f32>) -> usize {
    confs.enumerate().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0))).map_or(0, |(i, _)| i)
}

/// Whether MoE layer `li` of pass `pass` is still to come, the pool being at `token`, `active`.
pub(super) fn ahead(pass: u64, li: usize, token: u64, active: usize) -> bool {
    pass > token || (pass == token && li > active)
}

impl State {
    /// Bytes a read of an expert of MoE layer `li` reads.
    pub fn read_bytes(&self, li: usize) -> u64 {
        self.layer_bytes.get(li).copied().unwrap_or(self.dims.blob_len as u64)
    }

    pub fn new(dims: Dims, capacity: usize, policy: PolicyKind, prefetch_on: bool) -> State {
        State {
            dims,
            layer_bytes: vec![dims.blob_len as u64; dims.n_layers],
            slots: Vec::new(),
            free: Vec::new(),
            map: HashMap::new(),
            spare: Vec::new(),
            capacity,
            policy,
            prefetch_on,
            demand_q: VecDeque::new(),
            prefetch_q: Vec::new(),
            spec_q: Vec::new(),
            tick: 0,
            token: 0,
            active_layer: 0,
            scores: Scores::default(),
            routes: RouteModel::new(dims.n_layers, dims.top_k, dims.num_experts),
            evicted_at: HashMap::new(),
            stats: vec![LayerStats::default(); dims.n_layers],
            in_flight: 0,
            demand_in_flight: 0,
            shutdown: false,
            read_latency: Latency::new(),
            window: ReadWindow::new(dims.n_layers),
            reads: 0,
            busy_ns: 0,
            busy_since: None,
        }
    }

    pub fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    pub fn used_slots(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The slot of `key` when it is ready.
    pub fn ready_slot(&self, key: Key) -> Option<&Slot> {
        self.map.get(&key).and_then(|&si| self.slots[si].as_ref()).filter(|s| s.state == SlotState::Ready)
    }

    pub fn free_slot(&mut self, si: usize, key: Key) {
        self.map.remove(&key);
        if let Some(mut s) = self.slots[si].take()
            && let Some(b) = s.buf.take()
            && let Ok(b) = Arc::try_unwrap(b)
            && self.spare.len() + self.used_slots() <= self.capacity
        {
            self.spare.push(b);
        }
        self.free.push(si);
    }

    /// Reserve a slot for `key`, evicting if the pool is full. Demand may evict any evictable
    /// entry; a prefetch only entries this pass no longer needs.
    pub fn reserve(&mut self, key: Key, origin: Origin, conf: Option<f32>) -> Option<usize> {
        if self.used_slots() >= self.capacity {
            let newcomer = conf.map(|c| Entry {
                layer: key.0,
                expert: key.1,
                last_use: self.tick + 1,
                last_token: self.token,
                in_last_route: false,
                predicted: Some(c),
                score: self.scores.get(key, self.token),
                p_next: c,
            });
            self.evict_for(origin == Origin::Prefetch, newcomer.as_ref())?;
            if self.used_slots() >= self.capacity {
                return None;
            }
        }
        let tick = self.next_tick();
        self.routes.loaded();
        let token = self.token;
        if self.evicted_at.remove(&key).is_some_and(|t| t + 1 >= token) {
            self.stats[key.0].reloads_soon += 1;
        }
        let slot = Slot {
            key,
            state: SlotState::Queued,
            buf: None,
            pins: 0,
            origin,
            used: false,
            last_use: tick,
            last_token: token,
            predicted: None,
            queued_at: Instant::now(),
            flow_issue: None,
            flow_use: None,
        };
        let si = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.map.insert(key, si);
        Some(si)
    }

    /// Evict one entry chosen by the policy; `for_prefetch` limits the choice to entries not
    /// touched this pass or belonging to layers the pass has finished.
    pub fn evict_one(&mut self, for_prefetch: bool) -> Option<usize> {
        self.evict_for(for_prefetch, None)
    }

    /// The policy's view of resident entry `s` now.
    fn entry_of(&self, s: &Slot) -> Entry {
        let (token, active) = (self.token, self.active_layer);
        Entry {
            layer: s.key.0,
            expert: s.key.1,
            last_use: s.last_use,
            last_token: s.last_token,
            in_last_route: self.routes.last_route(s.key.0).contains(&s.key.1),
            predicted: if s.used { None } else { s.predicted },
            score: self.scores.get(s.key, token),
            p_next: if self.policy.reads_p_next() {
                self.routes.p_next(s.key.0, s.key.1, token, active, &self.scores, self.routes.horizon(self.capacity))
            } else {
                0.0
            },
        }
    }

    /// Evict one entry (see [`evict_one`](Self::evict_one)); with `newcomer`, only if the policy
    /// values the victim below it (a prediction must not push out something worth more than
    /// itself).
    pub fn evict_for(&mut self, for_prefetch: bool, newcomer: Option<&Entry>) -> Option<usize> {
        let (token, active) = (self.token, self.active_layer);
        let mut idx = Vec::new();
        let mut cands = Vec::new();
        for (si, s) in self.slots.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.pins > 0 || s.state != SlotState::Ready {
                continue;
            }
            if for_prefetch && s.last_token == token && s.key.0 >= active {
                continue;
            }
            idx.push(si);
            cands.push(self.entry_of(s));
        }
        let d = self.dims;
        let ctx = Ctx {
            token,
            active_layer: active,
            n_layers: d.n_layers,
            top_k: d.top_k,
            num_experts: d.num_experts,
            capacity: self.capacity,
        };
        if let Some(n) = newcomer {
            cands.push(*n);
        }
        let keys = self.policy.eviction_keys(&cands, &ctx);
        let v = (0..idx.len()).min_by(|&a, &b| keys[a].cmp(&keys[b]))?;
        if newcomer.is_some() && keys[v] >= keys[idx.len()] {
            return None;
        }
        let si = idx[v];
        let (key, wasted) = match self.slots[si].as_ref() {
            Some(s) => (s.key, s.origin == Origin::Prefetch && !s.used),
            None => return None,
        };
        let stats = &mut self.stats[key.0];
        stats.evictions += 1;
        if wasted {
            stats.prefetch_wasted_bytes += self.layer_bytes.get(key.0).copied().unwrap_or(d.blob_len as u64);
        }
        self.evicted_at.insert(key, token);
        self.free_slot(si, key);
        Some(si)
    }

    /// A demanded expert whose prefetch is still queued: move it to the demand queue.
    pub fn promote(&mut self, si: usize) {
        if let Some(p) = self.prefetch_q.iter().position(|&(s, _)| s == si) {
            self.prefetch_q.remove(p);
            self.demand_q.push_back(si);
        }
    }

    /// Drop queued (not yet read) prefetches whose key matches `which`; their slots are freed.
    pub fn drop_queued_prefetches(&mut self, which: impl Fn(Key) -> bool) {
        let mut keep = Vec::with_capacity(self.prefetch_q.len());
        let q = std::mem::take(&mut self.prefetch_q);
        for (si, c) in q {
            let key = self.slots[si].as_ref().map(|s| (s.key, s.pins));
            match key {
                Some((k, 0)) if which(k) => self.free_slot(si, k),
                _ => keep.push((si, c)),
            }
        }
        self.prefetch_q = keep;
    }

    /// The most likely speculative candidate still to come and not resident that the pool
    /// admits: a slot reserved for it, or None (candidates that can no longer help are dropped).
    pub fn take_speculative(&mut self) -> Option<usize> {
        while !self.spec_q.is_empty() {
            let best = most_confident(self.spec_q.iter().map(|q| q.2));
            let (pass, key, conf) = self.spec_q.swap_remove(best);
            if !ahead(pass, key.0, self.token, self.active_layer) || self.map.contains_key(&key) {
                continue;
            }
            if let Some(si) = self.reserve(key, Origin::Prefetch, Some(conf)) {
                if let Some(s) = self.slots[si].as_mut() {
                    s.predicted = Some(conf);
                }
                return Some(si);
            }
        }
        None
    }

    /// The next read for an I/O worker: demand reads first, then (unless `demand_only`, and
    /// while no demand read is in flight) the most confident prefetch, then a speculative
    /// candidate. None when there is nothing to read.
    pub fn next_read(&mut self, demand_only: bool) -> Option<usize> {
        if let Some(si) = self.demand_q.pop_front() {
            return Some(si);
        }
        if demand_only || self.demand_in_flight > 0 {
            return None;
        }
        if !self.prefetch_q.is_empty() {
            let best = most_confident(self.prefetch_q.iter().map(|q| q.1));
            return Some(self.prefetch_q.remove(best).0);
        }
        self.take_speculative()
    }

    /// Slot `si`'s read begins: it is marked as being read and counted in flight.
    pub fn start_read(&mut self, si: usize) -> Option<ReadJob> {
        let slot = self.slots[si].as_mut()?;
        slot.state = SlotState::Reading;
        let (key, origin, waited, flow_issue) =
            (slot.key, slot.origin, slot.queued_at.elapsed(), slot.flow_issue.take());
        let buf = self.spare.pop();
        if self.in_flight == 0 {
            self.busy_since = Some(Instant::now());
        }
        self.in_flight += 1;
        self.demand_in_flight += usize::from(origin == Origin::Demand);
        Some(ReadJob { slot: si, key, origin, waited, flow_issue, buf })
    }

    /// `job`'s read into `buf` ended with `res` after `read_ns`: the slot becomes ready (or
    /// failed, or is dropped if nobody asked for it), and the buffer goes to the slot or back
    /// to the spares. True when the last demand read in flight ended (the disk is the
    /// prefetches' again).
    pub fn finish_read(
        &mut self,
        job: &ReadJob,
        buf: AlignedBuf,
        res: Result<(), String>,
        read_ns: u64,
        flow_use: Option<u64>,
    ) -> bool {
        let blob = self.read_bytes(job.key.0);
        self.in_flight -= 1;
        if self.in_flight == 0
            && let Some(t) = self.busy_since.take()
        {
            self.busy_ns += t.elapsed().as_nanos() as u64;
        }
        let mut disk_free = false;
        if job.origin == Origin::Demand {
            self.demand_in_flight -= 1;
            disk_free = self.demand_in_flight == 0;
        }
        if res.is_ok() {
            self.read_latency.record_ns(read_ns);
            self.window.read_done(read_ns);
            self.reads += 1;
        }
        let si = job.slot;
        match self.slots[si].as_mut() {
            Some(s) if s.key == job.key => match res {
                Ok(()) => {
                    s.buf = Some(Arc::new(buf));
                    s.state = SlotState::Ready;
                    s.flow_use = flow_use;
                    let stats = &mut self.stats[job.key.0];
                    match job.origin {
                        Origin::Demand => stats.bytes_demand += blob,
                        Origin::Prefetch => stats.bytes_prefetch += blob,
                    }
                }
                Err(e) => {
                    self.spare.push(buf);
                    match self.slots[si].as_mut() {
                        // a prefetch nobody asked for yet: drop it, a demand will retry
                        Some(s) if s.pins == 0 => {
                            let key = s.key;
                            self.free_slot(si, key);
                        }
                        Some(s) => s.state = SlotState::Failed(e),
                        None => {}
                    }
                }
            },
            _ => self.spare.push(buf),
        }
        disk_free
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A pool of `capacity` slots over 2 layers of 4 experts, top-2, 4 KiB blobs.
    pub fn state(capacity: usize, policy: PolicyKind) -> State {
        let dims = Dims { n_layers: 2, num_experts: 4, top_k: 2, blob_len: 4096 };
        State::new(dims, capacity, policy, true)
    }

    /// Read slot `si` as an I/O worker would, successfully or not (taken from its queue first:
    /// tests read slots in any order).
    pub fn read(st: &mut State, si: usize, ok: bool) {
        st.demand_q.retain(|&s| s != si);
        st.prefetch_q.retain(|&(s, _)| s != si);
        let job = st.start_read(si).expect("a reserved slot");
        let buf = AlignedBuf::new(st.dims.blob_len);
        st.finish_read(&job, buf, if ok { Ok(()) } else { Err("disk on fire".into()) }, 1000, None);
    }

    /// `key` reserved on demand and read.
    pub fn load(st: &mut State, key: Key) -> usize {
        let si = st.reserve(key, Origin::Demand, None).expect("room");
        read(st, si, true);
        si
    }

    #[test]
    fn reserve_fills_the_capacity_then_evicts_an_idle_ready_entry() {
        let mut st = state(2, PolicyKind::Lru);
        let a = load(&mut st, (0, 0));
        load(&mut st, (0, 1));
        assert_eq!(st.used_slots(), 2);
        // the oldest use goes first under lru
        let c = st.reserve((1, 2), Origin::Demand, None).expect("room by eviction");
        assert_eq!(c, a, "the freed slot is reused");
        assert_eq!(st.used_slots(), 2);
        assert!(!st.map.contains_key(&(0, 0)) && st.map.contains_key(&(0, 1)));
        assert_eq!(st.stats[0].evictions, 1);
    }

    #[test]
    fn eviction_never_takes_a_pinned_entry() {
        let mut st = state(2, PolicyKind::Lru);
        let a = load(&mut st, (0, 0));
        let b = load(&mut st, (0, 1));
        // lru would take (0, 0): pinned, it must stay and (0, 1) go
        st.slots[a].as_mut().unwrap().pins = 1;
        st.reserve((1, 0), Origin::Demand, None).expect("room by evicting the unpinned one");
        assert!(st.map.contains_key(&(0, 0)), "the pinned entry stays");
        assert!(!st.map.contains_key(&(0, 1)));
        // every entry pinned (or not ready): no room, nothing evicted
        let c = st.map[&(1, 0)];
        st.slots[c].as_mut().unwrap().pins = 1;
        assert_eq!(st.reserve((1, 1), Origin::Demand, None), None);
        assert_eq!(st.evict_one(false), None);
        assert!(st.map.contains_key(&(0, 0)) && st.map.contains_key(&(1, 0)));
        let _ = b;
    }

    #[test]
    fn slots_being_read_or_queued_are_never_evicted() {
        let mut st = state(2, PolicyKind::Lru);
        let a = st.reserve((0, 0), Origin::Demand, None).unwrap();
        let b = st.reserve((0, 1), Origin::Demand, None).unwrap();
        st.start_read(b).unwrap();
        assert_eq!(st.reserve((1, 0), Origin::Demand, None), None, "a queued and a reading slot stay");
        assert!(st.slots[a].is_some() && st.slots[b].is_some());
    }

    #[test]
    fn a_prefetch_evicts_only_what_this_pass_no_longer_needs() {
        let mut st = state(2, PolicyKind::Lru);
        st.token = 1;
        st.active_layer = 0;
        load(&mut st, (1, 0)); // touched this pass, its layer still to come
        load(&mut st, (1, 1));
        assert_eq!(st.reserve((0, 3), Origin::Prefetch, None), None, "both are needed by this pass");
        // a new pass: the entries are from an earlier one
        st.token = 2;
        assert!(st.reserve((0, 3), Origin::Prefetch, None).is_some());
    }

    #[test]
    fn a_demanded_queued_prefetch_is_promoted_to_the_demand_queue() {
        let mut st = state(4, PolicyKind::Lru);
        let p = st.reserve((1, 0), Origin::Prefetch, Some(0.9)).unwrap();
        let q = st.reserve((1, 1), Origin::Prefetch, Some(0.5)).unwrap();
        st.prefetch_q.extend([(p, 0.9), (q, 0.5)]);
        let d = st.reserve((0, 0), Origin::Demand, None).unwrap();
        st.demand_q.push_back(d);
        st.promote(q);
        assert_eq!(st.demand_q, [d, q]);
        assert_eq!(st.prefetch_q, [(p, 0.9)]);
        // demand first, in order; then the most confident prefetch; none while a demand reads
        assert_eq!(st.next_read(false), Some(d));
        st.start_read(d);
        assert_eq!(st.next_read(false), Some(q));
        assert_eq!(st.next_read(false), None, "no prefetch beside a demand read in flight");
    }

    #[test]
    fn a_failed_read_nobody_waits_for_is_dropped() {
        let mut st = state(2, PolicyKind::Lru);
        let si = st.reserve((0, 0), Origin::Prefetch, Some(0.5)).unwrap();
        read(&mut st, si, false);
        assert!(!st.map.contains_key(&(0, 0)), "an unpinned failed prefetch is forgotten");
        let si = st.reserve((0, 1), Origin::Demand, None).unwrap();
        st.slots[si].as_mut().unwrap().pins = 1;
        read(&mut st, si, false);
        assert!(matches!(st.slots[si].as_ref().unwrap().state, SlotState::Failed(_)), "a pinned one keeps its error");
    }

    #[test]
    fn shrinking_spares_and_freed_buffers_stay_within_the_capacity() {
        let mut st = state(2, PolicyKind::Lru);
        let a = load(&mut st, (0, 0));
        st.free_slot(a, (0, 0));
        assert_eq!(st.spare.len(), 1, "a freed buffer is kept as a spare");
        assert_eq!(st.used_slots(), 0);
    }
}
