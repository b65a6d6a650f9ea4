//! The expert pool: one byte-bounded set of slots shared by all MoE layers, filled by I/O worker
//! threads from the package, emptied by a pluggable policy.
//!
//! - slots.rs: the slot table, its queues and eviction (plain data, tested alone);
//! - request.rs: one layer's demand, handed out as reads land, pins given back;
//! - io.rs: the I/O workers and the buffer filler;
//! - snapshot.rs: what the workbench is shown;
//! - window.rs: which predicted reads are worth making before a layer's request.
//!
//! Demand reads go before prefetch reads; a prefetch the layer then demands is promoted.
//! Budget, policy and prefetch can change between tokens. Everything is behind one mutex: the
//! per-layer traffic is a few dozen operations, small next to the reads and the expert math they
//! stand for.

mod io;
mod request;
mod slots;
mod snapshot;
mod window;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

pub use request::{ExpertBuf, Request};
pub use slots::{Key, Origin};
pub use snapshot::{Cell, PoolSnapshot, PoolTotals, QueueDepth, Residency, Resident};

use super::policy::PolicyKind;
use super::stats::LayerStats;
use super::store::ExpertStore;
use request::Demand;
use slots::{Dims, State, ahead};

pub(crate) struct Shared {
    pub store: ExpertStore,
    st: Mutex<State>,
    /// A read finished or failed, or a slot was released.
    ready: Condvar,
    /// A read was queued, or shutdown.
    work: Condvar,
    dims: Dims,
    /// I/O worker threads: with more than one, the first serves only demand reads, and the
    /// others' speculative reads stand aside for them piece by piece.
    n_workers: usize,
}

/// Most speculative candidates kept; older ones give way.
const SPEC_MAX: usize = 64;

/// What [`ExpertCache::prefetch`] did with a prediction.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Issued {
    /// Reads queued.
    pub queued: usize,
    /// Candidates not resident left to demand reads: not worth reading ahead in the time
    /// before the layer's request (see window.rs).
    pub capped: usize,
}

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

impl ExpertCache {
    pub fn new(store: ExpertStore, n_layers: usize, num_experts: usize, top_k: usize, cfg: CacheConfig) -> ExpertCache {
        let dims = Dims { n_layers, num_experts, top_k, blob_len: store.blob_len() };
        let n_workers = cfg.io_workers.max(1);
        let capacity = dims.slots_for(cfg.budget_bytes);
        let layer_bytes = (0..n_layers).map(|li| store.len_of(store.slot_of(li, 0)) as u64).collect();
        let shared = Arc::new(Shared {
            store,
            st: Mutex::new(State { layer_bytes, ..State::new(dims, capacity, cfg.policy, cfg.prefetch) }),
            ready: Condvar::new(),
            work: Condvar::new(),
            dims,
            n_workers,
        });
        let mut workers = (0..n_workers)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("moescope-io-{i}"))
                    .spawn(move || io::io_worker(&s, i == 0 && n_workers > 1))
                    .unwrap_or_else(|e| panic!("cannot start an I/O thread: {e}"))
            })
            .collect::<Vec<_>>();
        let s = shared.clone();
        if let Ok(h) = std::thread::Builder::new().name("moescope-pool-fill".into()).spawn(move || io::fill_spares(&s))
        {
            workers.push(h);
        }
        ExpertCache { shared, workers }
    }

    pub fn blob_len(&self) -> usize {
        self.shared.dims.blob_len
    }

    /// Threads reading blobs (each may hold one buffer being read, beyond the budget's).
    pub fn io_workers(&self) -> usize {
        self.shared.n_workers
    }

    pub fn capacity_slots(&self) -> usize {
        self.shared.lock().capacity
    }

    pub fn budget_bytes(&self) -> u64 {
        self.capacity_slots() as u64 * self.blob_len() as u64
    }

    /// Resident (ready) experts and the bytes their buffers hold.
    pub fn resident(&self) -> Resident {
        let st = self.shared.lock();
        let experts = st.slots.iter().flatten().filter(|s| s.state == slots::SlotState::Ready).count();
        Resident { experts, bytes: experts as u64 * self.blob_len() as u64 }
    }

    /// Buffers the pool has allocated (holding experts, or spare), in bytes.
    pub fn allocated_bytes(&self) -> u64 {
        let st = self.shared.lock();
        let held = st.slots.iter().flatten().filter(|s| s.buf.is_some()).count();
        (held + st.spare.len()) as u64 * self.blob_len() as u64
    }

    /// Wait, at most `limit`, until the filler has allocated every buffer the budget holds
    /// (spare or in use); how long it waited. The filler runs on idle cores only, and a disk
    /// probe's threads (mostly waiting on the disk) leave it cores, so a probe beside it reads
    /// less than the disk gives.
    pub fn wait_filled(&self, limit: std::time::Duration) -> std::time::Duration {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < limit {
            let st = self.shared.lock();
            if st.shutdown || st.spare.len() + st.used_slots() >= st.capacity {
                break;
            }
            drop(st);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        t0.elapsed()
    }

    pub fn stats(&self) -> Vec<LayerStats> {
        self.shared.lock().stats.clone()
    }

    pub fn total_stats(&self) -> LayerStats {
        self.totals().stats
    }

    /// The counters so far, under one lock.
    pub fn totals(&self) -> PoolTotals {
        self.shared.lock().totals()
    }

    /// The whole picture (residency, counters, queues, read latency), under one lock.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.shared.lock().snapshot()
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
            st.drop_queued_prefetches(|_| true);
            st.spec_q.clear();
        }
    }

    /// Change the pool's size. Shrinking evicts what it can now; slots still pinned or being
    /// read go when released.
    pub fn set_budget(&self, bytes: u64) {
        let mut st = self.shared.lock();
        st.capacity = self.shared.dims.slots_for(bytes);
        while st.used_slots() > st.capacity {
            if st.evict_one(false).is_none() {
                break;
            }
        }
        let keep = st.capacity.saturating_sub(st.used_slots());
        st.spare.truncate(keep);
    }

    /// Empty the pool (cold-start measurements): everything not pinned or being read goes,
    /// and the package's pages leave the page cache. The pool's memory stays allocated.
    pub fn clear(&self) {
        let mut st = self.shared.lock();
        st.drop_queued_prefetches(|_| true);
        st.spec_q.clear();
        while st.evict_one(false).is_some() {}
        // the emptied slots' buffers stay as spares (up to the budget): a fresh buffer's pages
        // are allocated and zeroed by the first read into it, on the I/O thread, and every cold
        // repetition's reads would pay that again
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
        let (demand, wake) = Demand::open(&mut st, li, experts);
        if wake {
            sh.work.notify_all();
        }
        Request { shared: sh.clone(), demand }
    }

    /// Predicted experts for MoE layer `li` of pass `pass`, most confident first, with their
    /// chance of use: queue reads for those not resident that are worth making in the time
    /// before the layer's request (see window.rs), behind any demand read, evicting only
    /// entries this pass does not need (stale ones, or those of layers it has finished).
    pub fn prefetch(&self, pass: u64, li: usize, experts: &[(usize, f32)], flow: Option<u64>) -> Issued {
        let sh = &self.shared;
        let mut st = sh.lock();
        let mut out = Issued::default();
        if !st.prefetch_on || !ahead(pass, li, st.token, st.active_layer) || li >= sh.dims.n_layers {
            return out;
        }
        // the route and its prediction need room together
        if st.capacity < 2 * sh.dims.top_k {
            return out;
        }
        let mut flow = flow;
        for &(e, conf) in experts {
            let key = (li, e);
            if st.map.contains_key(&key) {
                continue;
            }
            if !st.window.worth_reading(li, out.queued, conf) {
                out.capped += 1;
                continue;
            }
            let Some(si) = st.reserve(key, Origin::Prefetch, Some(conf)) else {
                break;
            };
            if let Some(s) = st.slots[si].as_mut() {
                s.predicted = Some(conf);
                // one flow, to the first read it queues
                s.flow_issue = flow.take();
            }
            st.prefetch_q.push((si, conf));
            out.queued += 1;
        }
        if out.queued > 0 {
            sh.work.notify_all();
        }
        out
    }

    /// Of `candidates` for MoE layer `li` (most likely first, with their chance of use), those
    /// not in the pool that are worth reading ahead after `issued` reads for the layer (see
    /// window.rs).
    pub fn worth_reading(&self, li: usize, issued: usize, candidates: &[(usize, f32)]) -> Vec<(usize, f32)> {
        let st = self.shared.lock();
        let mut i = issued;
        let mut out = Vec::new();
        for &(e, p) in candidates {
            if !st.map.contains_key(&(li, e)) && st.window.worth_reading(li, i, p) {
                out.push((e, p));
                i += 1;
            }
        }
        out
    }

    /// Of `candidates` (expert, chance of use) guessed for MoE layer `li` two layers ahead,
    /// those not in the pool and worth a read (see `ReadWindow::worth_reading_early`).
    pub fn worth_reading_early(&self, li: usize, candidates: &[(usize, f32)]) -> Vec<(usize, f32)> {
        let st = self.shared.lock();
        candidates
            .iter()
            .copied()
            .filter(|&(e, p)| !st.map.contains_key(&(li, e)) && st.window.worth_reading_early(p))
            .collect()
    }

    /// Experts that may be used by MoE layer `li` of pass `pass` (below the prediction's
    /// confidence: its lower ranks), with their chance of use: read only while the disk has
    /// nothing else to do, taking a free slot or evicting only an entry the policy values below
    /// the candidate, so a cold pool fills during compute and a full one changes only for the
    /// better. They replace earlier candidates for the same layer.
    pub fn speculate(&self, pass: u64, li: usize, experts: &[(usize, f32)]) {
        let sh = &self.shared;
        let mut st = sh.lock();
        if !st.prefetch_on || li >= sh.dims.n_layers || st.capacity < 2 * sh.dims.top_k {
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
        experts.iter().map(|&e| st.ready_slot((li, e)).is_some()).collect()
    }

    /// What every (layer, expert) is doing now.
    pub fn residency(&self) -> Residency {
        self.shared.lock().residency()
    }

    /// Nanoseconds so far with at least one expert read in flight: the disk's busy time as the
    /// pool sees it (over a run's wall time: how little the disk idled).
    pub fn disk_busy_ns(&self) -> u64 {
        self.totals().disk_busy_ns
    }

    /// Queued reads, demand and prefetch (speculative candidates included), and reads in flight.
    pub fn queue_depth(&self) -> QueueDepth {
        self.shared.lock().queue()
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
