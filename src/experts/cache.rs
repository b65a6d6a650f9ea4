//! The expert pool: one byte-bounded set of slots shared by all MoE layers, filled by I/O worker
//! threads from the package, emptied by a pluggable policy.
//!
//! A slot holds one expert blob. Its life: reserved for a read (queued, demand or prefetch) ->
//! being read by an I/O worker -> ready (or failed). A slot the forward pass has asked for is
//! pinned until the layer is done with it; pinned slots and slots being read are never evicted.
//! Demand reads go before prefetch reads; a prefetch the layer then demands is promoted.
//! Budget, policy and prefetch can change between tokens.
//!
//! Everything below is behind one mutex: the per-layer traffic is a few dozen operations, small
//! next to the reads and the expert math they stand for.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::policy::{Ctx, Entry, PolicyKind, RouteModel, Scores};
use super::stats::LayerStats;
use super::store::{AlignedBuf, ExpertStore, ReadError};
use crate::package::PackageError;
use crate::trace;
use crate::trace::hist::{Latency, LatencySummary};

/// (MoE layer index in forward order, expert id)
pub type Key = (usize, usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Demand,
    Prefetch,
}

#[derive(Debug, Clone, PartialEq)]
enum SlotState {
    Queued,
    Reading,
    Ready,
    Failed(String),
}

struct Slot {
    key: Key,
    state: SlotState,
    buf: Option<Arc<AlignedBuf>>,
    pins: u32,
    origin: Origin,
    /// Used by the forward pass since it was loaded.
    used: bool,
    last_use: u64,
    last_token: u64,
    /// The prediction's confidence, while a prefetched entry is unused.
    predicted: Option<f32>,
    queued_at: Instant,
    /// Trace flow from the prefetch that queued it to the read, and from the read to its use.
    flow_issue: Option<u64>,
    flow_use: Option<u64>,
}

struct State {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    map: HashMap<Key, usize>,
    spare: Vec<AlignedBuf>,
    capacity: usize,
    policy: PolicyKind,
    prefetch_on: bool,
    demand_q: VecDeque<usize>,
    prefetch_q: Vec<(usize, f32)>,
    /// Speculative reads: (pass, key, chance of use), no slot reserved. Read only when the
    /// disk would otherwise idle, and admitted only into a free slot or over an entry the
    /// policy values less (see [`ExpertCache::speculate`]).
    spec_q: Vec<(u64, Key, f32)>,
    tick: u64,
    token: u64,
    active_layer: usize,
    scores: Scores,
    routes: RouteModel,
    evicted_at: HashMap<Key, u64>,
    stats: Vec<LayerStats>,
    in_flight: usize,
    /// Demand reads being read now: prefetches wait for them (two concurrent reads share the
    /// disk, so a prefetch started beside a demand read doubles that read's stall).
    demand_in_flight: usize,
    shutdown: bool,
    /// Latency of each completed read (pread + checksum), and how many.
    read_latency: Latency,
    reads: u64,
    /// Time with at least one read in flight (the disk busy), closed intervals, and the start
    /// of the open one.
    busy_ns: u64,
    busy_since: Option<Instant>,
}

/// What one (layer, expert) of the pool is doing, for the workbench's residency grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    Free,
    Resident,
    /// A demand read queued or in flight.
    Reading,
    /// Queued, in flight or loaded by a prediction and not used yet.
    Predicted,
    /// Evicted within the last two tokens.
    Evicted,
}

/// The pool's state, `cells[layer * num_experts + expert]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Residency {
    pub n_layers: usize,
    pub num_experts: usize,
    pub cells: Vec<Cell>,
    pub resident_bytes: u64,
    pub budget_bytes: u64,
}

pub(crate) struct Shared {
    pub store: ExpertStore,
    st: Mutex<State>,
    /// A read finished or failed, or a slot was released.
    ready: Condvar,
    /// A read was queued, or shutdown.
    work: Condvar,
    pub n_layers: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub blob_len: usize,
    /// I/O worker threads: with more than one, the first serves only demand reads, and the
    /// others' speculative reads stand aside for them piece by piece.
    n_workers: usize,
}

/// Speculative and prefetch reads go in pieces of this many bytes; between two, a read stands
/// aside while a demand read is queued or in flight (this disk gives two concurrent reads half
/// its bandwidth each, so a demand read beside a whole blob's prefetch would take twice as long).
const PIECE: usize = 512 * 1024;

/// Most speculative candidates kept; older ones give way.
const SPEC_MAX: usize = 64;

/// Settings of the pool.
#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    pub budget_bytes: u64,
    pub policy: PolicyKind,
    pub prefetch: bool,
    pub io_workers: usize,
}

pub struct ExpertCache {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Slots a budget buys: at least one layer's top-k (the smallest pool that still computes a
/// token without re-reading), at most every expert.
fn slots_for(budget: u64, blob: usize, top_k: usize, all: usize) -> usize {
    ((budget / blob.max(1) as u64) as usize).min(all).max(top_k).max(1)
}

impl ExpertCache {
    pub fn new(store: ExpertStore, n_layers: usize, num_experts: usize, top_k: usize, cfg: CacheConfig) -> ExpertCache {
        let blob_len = store.blob_len();
        let n_workers = cfg.io_workers.max(1);
        let capacity = slots_for(cfg.budget_bytes, blob_len, top_k, n_layers * num_experts);
        let shared = Arc::new(Shared {
            store,
            st: Mutex::new(State {
                slots: Vec::new(),
                free: Vec::new(),
                map: HashMap::new(),
                spare: Vec::new(),
                capacity,
                policy: cfg.policy,
                prefetch_on: cfg.prefetch,
                demand_q: VecDeque::new(),
                prefetch_q: Vec::new(),
                spec_q: Vec::new(),
                tick: 0,
                token: 0,
                active_layer: 0,
                scores: Scores::default(),
                routes: RouteModel::new(n_layers, top_k, num_experts),
                evicted_at: HashMap::new(),
                stats: vec![LayerStats::default(); n_layers],
                in_flight: 0,
                demand_in_flight: 0,
                shutdown: false,
                read_latency: Latency::new(),
                reads: 0,
                busy_ns: 0,
                busy_since: None,
            }),
            ready: Condvar::new(),
            work: Condvar::new(),
            n_layers,
            num_experts,
            top_k,
            blob_len,
            n_workers,
        });
        let workers = (0..n_workers)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("moescope-io-{i}"))
                    .spawn(move || io_worker(&s, i == 0 && n_workers > 1))
                    .unwrap_or_else(|e| panic!("cannot start an I/O thread: {e}"))
            })
            .collect::<Vec<_>>();
        let mut workers = workers;
        let s = shared.clone();
        if let Ok(h) = std::thread::Builder::new().name("moescope-pool-fill".into()).spawn(move || fill_spares(&s)) {
            workers.push(h);
        }
        ExpertCache { shared, workers }
    }

    pub fn blob_len(&self) -> usize {
        self.shared.blob_len
    }

    pub fn capacity_slots(&self) -> usize {
        self.shared.lock().capacity
    }

    pub fn budget_bytes(&self) -> u64 {
        self.capacity_slots() as u64 * self.shared.blob_len as u64
    }

    /// Resident (ready) experts and the bytes their buffers hold.
    pub fn resident(&self) -> (usize, u64) {
        let st = self.shared.lock();
        let n = st.slots.iter().flatten().filter(|s| s.state == SlotState::Ready).count();
        (n, n as u64 * self.shared.blob_len as u64)
    }

    /// Buffers the pool has allocated (holding experts, or spare), in bytes.
    pub fn allocated_bytes(&self) -> u64 {
        let st = self.shared.lock();
        let held = st.slots.iter().flatten().filter(|s| s.buf.is_some()).count();
        (held + st.spare.len()) as u64 * self.shared.blob_len as u64
    }

    pub fn stats(&self) -> Vec<LayerStats> {
        self.shared.lock().stats.clone()
    }

    pub fn total_stats(&self) -> LayerStats {
        let mut t = LayerStats::default();
        for s in self.shared.lock().stats.iter() {
            t.add(s);
        }
        t
    }

    pub fn policy(&self) -> PolicyKind {
        self.shared.lock().policy
    }

    pub fn set_policy(&self, p: PolicyKind) {
        self.shared.lock().policy = p;
    }

    pub fn prefetch_on(&self) -> bool {
        self.shared.lock().prefetch_on
    }

    pub fn set_prefetch(&self, on: bool) {
        let mut st = self.shared.lock();
        st.prefetch_on = on;
        if !on {
            drop_queued_prefetches(&mut st, &self.shared, |_| true);
            st.spec_q.clear();
        }
    }

    /// Change the pool's size. Shrinking evicts what it can now; slots still pinned or being
    /// read go when released.
    pub fn set_budget(&self, bytes: u64) {
        let mut st = self.shared.lock();
        st.capacity =
            slots_for(bytes, self.shared.blob_len, self.shared.top_k, self.shared.n_layers * self.shared.num_experts);
        while used_slots(&st) > st.capacity {
            if evict_one(&mut st, &self.shared, false).is_none() {
                break;
            }
        }
        let keep = st.capacity.saturating_sub(used_slots(&st));
        st.spare.truncate(keep);
    }

    /// Empty the pool (cold-start measurements): everything not pinned or being read goes,
    /// and the package's pages leave the page cache. The pool's memory stays allocated.
    pub fn clear(&self) {
        let mut st = self.shared.lock();
        drop_queued_prefetches(&mut st, &self.shared, |_| true);
        st.spec_q.clear();
        while evict_one(&mut st, &self.shared, false).is_some() {}
        // the emptied slots' buffers stay as spares (up to the budget): a fresh buffer's pages
        // are allocated and zeroed by the first read into it, on the I/O thread, and that made
        // every cold repetition's reads pay it again (bench8 cold tg32 2T: 23.3/24.9 -> 27.9/30.5
        // t/s, stall 19.0/16.9 -> 14.3/12.7 ms a token)
        st.evicted_at.clear();
        drop(st);
        self.shared.store.evict_page_cache();
    }

    /// A new forward pass (a token, or a batch of prompt tokens) begins.
    pub fn begin_pass(&self) {
        let mut st = self.shared.lock();
        st.token += 1;
        st.active_layer = 0;
        // predictions for layers of an earlier pass are useless now
        let tok = st.token;
        st.evicted_at.retain(|_, t| *t + 1 >= tok);
    }

    /// Current pass number (for the predictor).
    pub fn pass(&self) -> u64 {
        self.shared.lock().token
    }

    /// Ask for experts `experts` (in compute order, no duplicates) of MoE layer `li`. Hits are
    /// pinned, misses queued as demand reads (promoting queued prefetches), and the returned
    /// request hands them out as they become ready.
    pub fn request(&self, li: usize, experts: &[usize]) -> Request {
        let sh = &self.shared;
        let mut st = sh.lock();
        st.active_layer = li;
        let token = st.token;
        {
            let State { routes, scores, .. } = &mut *st;
            routes.observe(li, experts, token, |e| scores.popularity((li, e), token));
        }
        for &e in experts {
            st.scores.bump((li, e), token);
        }
        // queued predictions for this layer that the route does not want: drop them unread;
        // those already read lose their confidence (the route refuted them)
        let wanted: HashSet<usize> = experts.iter().copied().collect();
        drop_queued_prefetches(&mut st, sh, |k| k.0 == li && !wanted.contains(&k.1));
        for s in st.slots.iter_mut().flatten() {
            if s.key.0 == li && !wanted.contains(&s.key.1) {
                s.predicted = None;
            }
        }
        let mut req = Request { shared: sh.clone(), li, items: Vec::with_capacity(experts.len()), done: 0 };
        for &e in experts {
            let key = (li, e);
            // a read that failed earlier is tried again
            if let Some(si) = st.map.get(&key).copied() {
                let failed_unpinned =
                    st.slots[si].as_ref().is_some_and(|s| matches!(s.state, SlotState::Failed(_)) && s.pins == 0);
                if failed_unpinned {
                    free_slot(&mut st, si, key);
                }
            }
            let status = match st.map.get(&key).copied() {
                Some(si) => {
                    let tick = next_tick(&mut st);
                    let slot = st.slots[si].as_mut().map(|s| {
                        s.pins += 1;
                        s.last_use = tick;
                        s.last_token = token;
                        (s.state.clone(), s.origin, s.used)
                    });
                    match slot {
                        Some((state, origin, used)) => {
                            let prefetched = origin == Origin::Prefetch && !used;
                            let stats = &mut st.stats[li];
                            stats.hits += 1;
                            if prefetched {
                                stats.prefetch_hits += 1;
                            }
                            if state == SlotState::Queued {
                                promote(&mut st, si);
                            }
                            if matches!(state, SlotState::Queued | SlotState::Reading) {
                                // a promoted read for an idle worker, or a paused
                                // speculative read that is now demanded: it goes on at once
                                sh.work.notify_all();
                            }
                            Item::Slot(si)
                        }
                        None => Item::Pending,
                    }
                }
                None => Item::Pending,
            };
            req.items.push((e, status));
        }
        // reserve and queue what is missing, as far as slots allow
        fill_pending(&mut st, sh, &mut req);
        req
    }

    /// Predicted experts for MoE layer `li` of pass `pass`, most confident first: queue reads
    /// for those not resident, behind any demand read, evicting only entries this pass does
    /// not need (stale ones, or those of layers it has finished). Returns how many were queued.
    pub fn prefetch(&self, pass: u64, li: usize, experts: &[(usize, f32)], flow: Option<u64>) -> usize {
        let sh = &self.shared;
        let mut st = sh.lock();
        if !st.prefetch_on || !ahead(pass, li, st.token, st.active_layer) || li >= sh.n_layers {
            return 0;
        }
        // the route and its prediction need room together
        if st.capacity < 2 * sh.top_k {
            return 0;
        }
        let mut queued = 0;
        let mut flow = flow;
        for &(e, conf) in experts {
            let key = (li, e);
            if st.map.contains_key(&key) {
                continue;
            }
            let Some(si) = reserve(&mut st, sh, key, Origin::Prefetch, Some(conf)) else {
                break;
            };
            if let Some(s) = st.slots[si].as_mut() {
                s.predicted = Some(conf);
                // one flow, to the first read it queues
                s.flow_issue = flow.take();
            }
            st.prefetch_q.push((si, conf));
            queued += 1;
        }
        if queued > 0 {
            sh.work.notify_all();
        }
        queued
    }

    /// Experts that may be used by MoE layer `li` of pass `pass` (below the prediction's
    /// confidence: its lower ranks), with their chance of use: read only while the disk has
    /// nothing else to do, taking a free slot or evicting only an entry the policy values below
    /// the candidate, so a cold pool fills during compute and a full one changes only for the
    /// better. They replace earlier candidates for the same layer.
    pub fn speculate(&self, pass: u64, li: usize, experts: &[(usize, f32)]) {
        let sh = &self.shared;
        let mut st = sh.lock();
        if !st.prefetch_on || li >= sh.n_layers || st.capacity < 2 * sh.top_k {
            return;
        }
        let (token, active) = (st.token, st.active_layer);
        st.spec_q.retain(|&(p, k, _)| ahead(p, k.0, token, active) && !(p == pass && k.0 == li));
        for &(e, conf) in experts {
            if !st.map.contains_key(&(li, e)) {
                st.spec_q.push((pass, (li, e), conf));
            }
        }
        if st.spec_q.len() > SPEC_MAX {
            let extra = st.spec_q.len() - SPEC_MAX;
            st.spec_q.drain(..extra);
        }
        sh.work.notify_all();
    }

    /// Which of `experts` of MoE layer `li` are ready in the pool now, in their order.
    pub fn resident_among(&self, li: usize, experts: &[usize]) -> Vec<bool> {
        let st = self.shared.lock();
        experts
            .iter()
            .map(|&e| {
                st.map.get(&(li, e)).and_then(|&si| st.slots[si].as_ref()).is_some_and(|s| s.state == SlotState::Ready)
            })
            .collect()
    }

    /// What every (layer, expert) is doing now.
    pub fn residency(&self) -> Residency {
        let sh = &self.shared;
        let st = sh.lock();
        let mut cells = vec![Cell::Free; sh.n_layers * sh.num_experts];
        for (&(l, e), &t) in &st.evicted_at {
            if t + 2 > st.token {
                cells[l * sh.num_experts + e] = Cell::Evicted;
            }
        }
        let mut resident = 0u64;
        for s in st.slots.iter().flatten() {
            let c = match (&s.state, s.origin) {
                (SlotState::Ready, Origin::Prefetch) if !s.used => Cell::Predicted,
                (SlotState::Ready, _) => Cell::Resident,
                (SlotState::Queued | SlotState::Reading, Origin::Prefetch) => Cell::Predicted,
                (SlotState::Queued | SlotState::Reading, Origin::Demand) => Cell::Reading,
                (SlotState::Failed(_), _) => Cell::Free,
            };
            if s.state == SlotState::Ready {
                resident += sh.blob_len as u64;
            }
            cells[s.key.0 * sh.num_experts + s.key.1] = c;
        }
        Residency {
            n_layers: sh.n_layers,
            num_experts: sh.num_experts,
            cells,
            resident_bytes: resident,
            budget_bytes: st.capacity as u64 * sh.blob_len as u64,
        }
    }

    /// Read latency so far (pread and checksum of one blob), and the number of reads.
    /// Nanoseconds so far with at least one expert read in flight: the disk's busy time as the
    /// pool sees it (over a run's wall time: how little the disk idled).
    pub fn disk_busy_ns(&self) -> u64 {
        let st = self.shared.lock();
        st.busy_ns + st.busy_since.map_or(0, |t| t.elapsed().as_nanos() as u64)
    }

    pub fn read_latency(&self) -> (LatencySummary, u64) {
        let st = self.shared.lock();
        (st.read_latency.summary(), st.reads)
    }

    /// Queued reads, demand and prefetch (speculative candidates included).
    pub fn queue_depth(&self) -> (usize, usize, usize) {
        let st = self.shared.lock();
        (st.demand_q.len(), st.prefetch_q.len() + st.spec_q.len(), st.in_flight)
    }
}

impl Drop for ExpertCache {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Item {
    /// Pinned slot (ready or on its way).
    Slot(usize),
    /// Waiting for a slot.
    Pending,
    /// Handed out.
    Done,
}

/// One layer's demand: hands out its experts as they become ready.
pub struct Request {
    shared: Arc<Shared>,
    li: usize,
    items: Vec<(usize, Item)>,
    done: usize,
}

/// A ready expert, pinned until given back with [`Request::release`].
pub struct ExpertBuf {
    pub expert: usize,
    slot: usize,
    buf: Arc<AlignedBuf>,
    pub flow: Option<u64>,
}

impl ExpertBuf {
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }
}

impl Request {
    /// The next ready expert (any order), waiting for reads as needed; None when all were
    /// handed out. A failed read is an error naming the expert; the request's other pins are
    /// released when it is dropped.
    pub fn next_ready(&mut self) -> Result<Option<ExpertBuf>, ReadError> {
        if self.done == self.items.len() {
            return Ok(None);
        }
        let sh = self.shared.clone();
        let mut st = sh.lock();
        let mut waited: Option<(Instant, trace::Span)> = None;
        loop {
            fill_pending(&mut st, &sh, self);
            if let Some(got) = self.take_ready(&mut st, &sh) {
                if let (Ok(_), Some((t0, span))) = (&got, waited.take()) {
                    let s = &mut st.stats[self.li];
                    s.stalls += 1;
                    s.stall_ns += t0.elapsed().as_nanos() as u64;
                    drop(span);
                }
                return got.map(Some);
            }
            if waited.is_none() {
                waited = Some((Instant::now(), trace::span("wait_read").arg("layer", self.li)));
            }
            st = sh.ready.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Every expert ready now, waiting for reads only when none is (empty when all were handed
    /// out): what a layer can compute together. Errors as [`next_ready`](Self::next_ready).
    pub fn ready_batch(&mut self) -> Result<Vec<ExpertBuf>, ReadError> {
        let Some(first) = self.next_ready()? else { return Ok(Vec::new()) };
        let mut batch = vec![first];
        let sh = self.shared.clone();
        let mut st = sh.lock();
        fill_pending(&mut st, &sh, self);
        while self.done < self.items.len() {
            match self.take_ready(&mut st, &sh) {
                Some(Ok(b)) => batch.push(b),
                Some(Err(e)) => {
                    drop(st);
                    for b in batch {
                        self.release(b);
                    }
                    return Err(e);
                }
                None => break,
            }
        }
        Ok(batch)
    }

    /// The first of this request's experts whose read has landed (pinned, counted as used), or
    /// its read's error; None while every remaining one is still being read.
    fn take_ready(&mut self, st: &mut State, sh: &Shared) -> Option<Result<ExpertBuf, ReadError>> {
        for i in 0..self.items.len() {
            let (e, item) = self.items[i];
            let Item::Slot(si) = item else { continue };
            let Some(slot) = st.slots[si].as_mut() else { continue };
            match &slot.state {
                SlotState::Ready => {
                    let Some(buf) = slot.buf.clone() else {
                        return Some(Err(PackageError::Meta {
                            path: sh.store.path().to_path_buf(),
                            msg: "a ready expert slot has no buffer".into(),
                        }));
                    };
                    let first_use = !slot.used;
                    slot.used = true;
                    let was_prefetch = slot.origin == Origin::Prefetch && first_use;
                    slot.predicted = None;
                    let flow = slot.flow_use.take();
                    if was_prefetch {
                        st.stats[self.li].prefetch_useful_bytes += sh.blob_len as u64;
                    }
                    self.items[i].1 = Item::Done;
                    self.done += 1;
                    return Some(Ok(ExpertBuf { expert: e, slot: si, buf, flow }));
                }
                SlotState::Failed(_) => {
                    let key = slot.key;
                    let err = match std::mem::replace(&mut slot.state, SlotState::Queued) {
                        SlotState::Failed(m) => m,
                        _ => String::new(),
                    };
                    slot.pins = slot.pins.saturating_sub(1);
                    self.items[i].1 = Item::Done;
                    self.done += 1;
                    // forget the slot so a later request reads it again
                    free_slot(st, si, key);
                    sh.ready.notify_all();
                    return Some(Err(PackageError::ExpertRead(err)));
                }
                _ => {}
            }
        }
        None
    }

    /// Give an expert back (unpin it).
    pub fn release(&mut self, b: ExpertBuf) {
        let mut st = self.shared.lock();
        if let Some(s) = st.slots[b.slot].as_mut() {
            s.pins = s.pins.saturating_sub(1);
        }
        drop(b);
        self.shared.ready.notify_all();
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        for (_, item) in &self.items {
            if let Item::Slot(si) = *item {
                let failed = match st.slots[si].as_mut() {
                    Some(s) => {
                        s.pins = s.pins.saturating_sub(1);
                        (matches!(s.state, SlotState::Failed(_)) && s.pins == 0).then_some(s.key)
                    }
                    None => None,
                };
                // a failed read nobody waits for any more: forget it, so it is tried again
                if let Some(key) = failed {
                    free_slot(&mut st, si, key);
                }
            }
        }
        self.shared.ready.notify_all();
    }
}

/// Index of the highest confidence (the first of equals), 0 for none.
fn most_confident(confs: impl Iterator<Item = f32>) -> usize {
    confs.enumerate().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0))).map_or(0, |(i, _)| i)
}

/// Whether MoE layer `li` of pass `pass` is still to come, the pool being at `token`, `active`.
fn ahead(pass: u64, li: usize, token: u64, active: usize) -> bool {
    pass > token || (pass == token && li > active)
}

/// The most likely speculative candidate still to come and not resident that the pool admits:
/// a slot reserved for it, or None (candidates that can no longer help are dropped).
fn take_speculative(st: &mut State, sh: &Shared) -> Option<usize> {
    while !st.spec_q.is_empty() {
        let best = most_confident(st.spec_q.iter().map(|q| q.2));
        let (pass, key, conf) = st.spec_q.swap_remove(best);
        if !ahead(pass, key.0, st.token, st.active_layer) || st.map.contains_key(&key) {
            continue;
        }
        if let Some(si) = reserve(st, sh, key, Origin::Prefetch, Some(conf)) {
            if let Some(s) = st.slots[si].as_mut() {
                s.predicted = Some(conf);
            }
            return Some(si);
        }
    }
    None
}

fn next_tick(st: &mut State) -> u64 {
    st.tick += 1;
    st.tick
}

fn used_slots(st: &State) -> usize {
    st.slots.len() - st.free.len()
}

fn free_slot(st: &mut State, si: usize, key: Key) {
    st.map.remove(&key);
    if let Some(mut s) = st.slots[si].take() {
        if let Some(b) = s.buf.take() {
            if let Ok(b) = Arc::try_unwrap(b) {
                if st.spare.len() + used_slots(st) <= st.capacity {
                    st.spare.push(b);
                }
            }
        }
    }
    st.free.push(si);
}

/// Reserve a slot for `key`, evicting if the pool is full. Demand may evict any evictable
/// entry; a prefetch only entries this pass no longer needs.
fn reserve(st: &mut State, sh: &Shared, key: Key, origin: Origin, conf: Option<f32>) -> Option<usize> {
    if used_slots(st) >= st.capacity {
        let newcomer = conf.map(|c| Entry {
            layer: key.0,
            expert: key.1,
            last_use: st.tick + 1,
            last_token: st.token,
            in_last_route: false,
            predicted: Some(c),
            score: st.scores.get(key, st.token),
            popularity: st.scores.popularity(key, st.token),
            repeat_rate: st.routes.rate(key.0),
            p_next: c,
        });
        evict_for(st, sh, origin == Origin::Prefetch, newcomer.as_ref())?;
        if used_slots(st) >= st.capacity {
            return None;
        }
    }
    let tick = next_tick(st);
    let token = st.token;
    if st.evicted_at.remove(&key).is_some_and(|t| t + 1 >= token) {
        st.stats[key.0].reloads_soon += 1;
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
    let si = match st.free.pop() {
        Some(i) => {
            st.slots[i] = Some(slot);
            i
        }
        None => {
            st.slots.push(Some(slot));
            st.slots.len() - 1
        }
    };
    st.map.insert(key, si);
    Some(si)
}

/// Evict one entry chosen by the policy; `for_prefetch` limits the choice to entries not
/// touched this pass or belonging to layers the pass has finished.
fn evict_one(st: &mut State, sh: &Shared, for_prefetch: bool) -> Option<usize> {
    evict_for(st, sh, for_prefetch, None)
}

/// The policy's view of resident entry `s` now.
fn entry_of(st: &State, s: &Slot) -> Entry {
    let (token, active) = (st.token, st.active_layer);
    let pop = st.scores.popularity(s.key, token);
    Entry {
        layer: s.key.0,
        expert: s.key.1,
        last_use: s.last_use,
        last_token: s.last_token,
        in_last_route: st.routes.last_route(s.key.0).contains(&s.key.1),
        predicted: if s.used { None } else { s.predicted },
        score: st.scores.get(s.key, token),
        popularity: pop,
        repeat_rate: st.routes.rate(s.key.0),
        p_next: st.routes.p_next(s.key.0, s.key.1, token, active, pop),
    }
}

/// Evict one entry (see [`evict_one`]); with `newcomer`, only if the policy values the victim
/// below it (a prediction must not push out something worth more than itself).
fn evict_for(st: &mut State, sh: &Shared, for_prefetch: bool, newcomer: Option<&Entry>) -> Option<usize> {
    let token = st.token;
    let active = st.active_layer;
    let mut idx = Vec::new();
    let mut cands = Vec::new();
    for (si, s) in st.slots.iter().enumerate() {
        let Some(s) = s else { continue };
        if s.pins > 0 || s.state != SlotState::Ready {
            continue;
        }
        if for_prefetch && s.last_token == token && s.key.0 >= active {
            continue;
        }
        idx.push(si);
        cands.push(entry_of(st, s));
    }
    let ctx = Ctx {
        token,
        active_layer: active,
        n_layers: sh.n_layers,
        top_k: sh.top_k,
        num_experts: sh.num_experts,
        capacity: st.capacity,
    };
    if let Some(n) = newcomer {
        cands.push(*n);
    }
    let keys = st.policy.eviction_keys(&cands, &ctx);
    let v = (0..idx.len()).min_by(|&a, &b| keys[a].cmp(&keys[b]))?;
    if newcomer.is_some() && keys[v] >= keys[idx.len()] {
        return None;
    }
    let si = idx[v];
    let (key, wasted) = match st.slots[si].as_ref() {
        Some(s) => (s.key, s.origin == Origin::Prefetch && !s.used),
        None => return None,
    };
    let stats = &mut st.stats[key.0];
    stats.evictions += 1;
    if wasted {
        stats.prefetch_wasted_bytes += sh.blob_len as u64;
    }
    st.evicted_at.insert(key, token);
    free_slot(st, si, key);
    Some(si)
}

/// Reserve slots and queue demand reads for the request's pending experts, in order, while
/// slots can be had.
fn fill_pending(st: &mut State, sh: &Shared, req: &mut Request) {
    let mut queued = false;
    for i in 0..req.items.len() {
        if req.items[i].1 != Item::Pending {
            continue;
        }
        let key = (req.li, req.items[i].0);
        // another request (or a prefetch) may have loaded it meanwhile
        if let Some(&si) = st.map.get(&key) {
            if let Some(s) = st.slots[si].as_mut() {
                s.pins += 1;
            }
            req.items[i].1 = Item::Slot(si);
            continue;
        }
        let Some(si) = reserve(st, sh, key, Origin::Demand, None) else {
            break;
        };
        if let Some(s) = st.slots[si].as_mut() {
            s.pins = 1;
        }
        st.stats[req.li].misses += 1;
        st.demand_q.push_back(si);
        req.items[i].1 = Item::Slot(si);
        queued = true;
    }
    if queued {
        sh.work.notify_all();
    }
}

/// A demanded expert whose prefetch is still queued: move it to the demand queue.
fn promote(st: &mut State, si: usize) {
    if let Some(p) = st.prefetch_q.iter().position(|&(s, _)| s == si) {
        st.prefetch_q.remove(p);
        st.demand_q.push_back(si);
    }
}

/// Drop queued (not yet read) prefetches whose key matches `which`; their slots are freed.
fn drop_queued_prefetches(st: &mut State, _sh: &Shared, which: impl Fn(Key) -> bool) {
    let mut keep = Vec::with_capacity(st.prefetch_q.len());
    let q = std::mem::take(&mut st.prefetch_q);
    for (si, c) in q {
        let key = st.slots[si].as_ref().map(|s| (s.key, s.pins));
        match key {
            Some((k, 0)) if which(k) => free_slot(st, si, k),
            _ => keep.push((si, c)),
        }
    }
    st.prefetch_q = keep;
}

/// An I/O worker: demand reads first, then the most confident prefetch. With several workers,
/// the first reads only on demand, so a demanded expert never waits behind predictions.
fn io_worker(sh: &Shared, demand_only: bool) {
    crate::trace::recorder::set_thread_name(&std::thread::current().name().unwrap_or("moescope-io").to_string());
    loop {
        let mut st = sh.lock();
        let si = loop {
            if st.shutdown {
                return;
            }
            if let Some(si) = st.demand_q.pop_front() {
                break si;
            }
            if !demand_only && st.demand_in_flight == 0 {
                if !st.prefetch_q.is_empty() {
                    let best = most_confident(st.prefetch_q.iter().map(|q| q.1));
                    break st.prefetch_q.remove(best).0;
                }
                if let Some(si) = take_speculative(&mut st, sh) {
                    break si;
                }
            }
            st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        let Some(slot) = st.slots[si].as_mut() else { continue };
        slot.state = SlotState::Reading;
        let (key, origin, waited, flow_issue) =
            (slot.key, slot.origin, slot.queued_at.elapsed(), slot.flow_issue.take());
        let mut buf = st.spare.pop();
        if st.in_flight == 0 {
            st.busy_since = Some(Instant::now());
        }
        st.in_flight += 1;
        st.demand_in_flight += usize::from(origin == Origin::Demand);
        drop(st);

        let mut span = trace::span("read")
            .arg("layer", key.0)
            .arg("expert", key.1)
            .arg("bytes", sh.blob_len)
            .arg("origin", if origin == Origin::Demand { "demand" } else { "prefetch" })
            .arg("queue_wait_us", waited.as_micros() as u64);
        trace::flow_end(flow_issue);
        let mut b = buf.take().unwrap_or_else(|| AlignedBuf::new(sh.blob_len));
        let t_read = Instant::now();
        let blob = sh.store.slot_of(key.0, key.1);
        let res = if origin == Origin::Prefetch && sh.n_workers > 1 {
            let r = read_standing_aside(sh, si, blob, &mut b);
            if let Ok(paused) = &r {
                span.set("paused_us", paused.as_micros() as u64);
            }
            r.map(|_| ())
        } else {
            sh.store.read(blob, &mut b)
        };
        let read_ns = t_read.elapsed().as_nanos() as u64;
        let flow_use = span.flows_out(1);
        if let Err(e) = &res {
            span.set("error", e.to_string());
        }
        drop(span);

        let mut st = sh.lock();
        st.in_flight -= 1;
        if st.in_flight == 0 {
            if let Some(t) = st.busy_since.take() {
                st.busy_ns += t.elapsed().as_nanos() as u64;
            }
        }
        if origin == Origin::Demand {
            st.demand_in_flight -= 1;
            if st.demand_in_flight == 0 {
                // the disk is the prefetches' again (queued ones, and a paused one)
                sh.work.notify_all();
            }
        }
        if res.is_ok() {
            st.read_latency.record_ns(read_ns);
            st.reads += 1;
        }
        match st.slots[si].as_mut() {
            Some(s) if s.key == key => match res {
                Ok(()) => {
                    s.buf = Some(Arc::new(b));
                    s.state = SlotState::Ready;
                    s.flow_use = flow_use;
                    let stats = &mut st.stats[key.0];
                    match origin {
                        Origin::Demand => stats.bytes_demand += sh.blob_len as u64,
                        Origin::Prefetch => stats.bytes_prefetch += sh.blob_len as u64,
                    }
                }
                Err(e) => {
                    st.spare.push(b);
                    match st.slots[si].as_mut() {
                        // a prefetch nobody asked for yet: drop it, a demand will retry
                        Some(s) if s.pins == 0 => {
                            let key = s.key;
                            free_slot(&mut st, si, key);
                        }
                        Some(s) => s.state = SlotState::Failed(e.to_string()),
                        None => {}
                    }
                }
            },
            _ => st.spare.push(b),
        }
        drop(st);
        sh.ready.notify_all();
    }
}

/// Read a prefetched blob piece by piece into `b`, standing aside before each piece while a
/// demand read is queued or in flight (unless this blob is now demanded itself); the time spent
/// aside.
fn read_standing_aside(sh: &Shared, si: usize, blob: usize, b: &mut AlignedBuf) -> Result<Duration, ReadError> {
    let mut paused = Duration::ZERO;
    let mut from = 0;
    while from < sh.blob_len {
        if from > 0 {
            let mut st = sh.lock();
            let t0 = Instant::now();
            loop {
                let demanded = st.slots[si].as_ref().is_some_and(|s| s.pins > 0);
                if st.shutdown || demanded || (st.demand_q.is_empty() && st.demand_in_flight == 0) {
                    break;
                }
                st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            paused += t0.elapsed();
        }
        let to = (from + PIECE).min(sh.blob_len);
        sh.store.read_part(blob, b, from, to)?;
        from = to;
    }
    sh.store.check(blob, b)?;
    Ok(paused)
}

/// Allocate the pool's buffers ahead of their first read, as spares, until the budget has all
/// its buffers. A fresh buffer's pages are allocated and zeroed by whoever first writes them;
/// left to the first read into it, that is the I/O thread, on the read's critical path (an
/// emptied pool that kept its buffers decoded 20% faster cold). This thread runs only when a
/// core would otherwise idle (SCHED_IDLE: while the engine waits for reads, say), so it takes
/// no time from compute.
fn fill_spares(sh: &Shared) {
    crate::trace::recorder::set_thread_name("moescope-pool-fill");
    crate::sysinfo::idle_scheduling();
    let room = |st: &State| !st.shutdown && st.spare.len() + used_slots(st) < st.capacity;
    loop {
        if !room(&sh.lock()) {
            return;
        }
        let mut b = AlignedBuf::new(sh.blob_len);
        for page in b.as_mut_slice().chunks_mut(4096) {
            page[0] = 0;
        }
        let mut st = sh.lock();
        if !room(&st) {
            return;
        }
        st.spare.push(b);
    }
}
