//! Next-layer prediction: while MoE layer l computes, a thread of its own applies the router of
//! the next MoE layer to layer l's MoE input and queues prefetches for the experts it picks
//! (mollm's cross-layer predictor). The next layer still computes its exact route; a prediction
//! only decides what to read early.
//!
//! Accuracy is tracked per rank of the predicted top-k; once a rank has 128 samples and is
//! right less than 80% of the time, it and the ranks after it are no longer issued (but never
//! fewer than half of top-k).
//!
//! The same thread also guesses two layers ahead: the router of the layer after next applied to
//! the same input (with replayed routing, which has no hidden state, the co-activation table of
//! `coactivation.rs`). Its reads are speculative (made while the disk idles, a layer earlier
//! than the next layer's own prediction, which replaces them), and each is made only when its
//! chance of use, learnt per layer and rank like the next layer's, pays for the disk time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use moescope_kernels::Isa;
use moescope_kernels::ops::top_k;

use super::coactivation::CoActivation;
use super::pool::{ExpertCache, Issued};
use super::stats::PredictStats;
use crate::model::{Pick, Router};
use crate::package::Package;
use crate::trace;

pub const MIN_SAMPLES: u64 = 128;
pub const MIN_ACCURACY: f64 = 0.8;

/// Whether prefetch pays, from the share of would-be reads (predicted experts not resident when
/// predicted) that their layer then routed, decayed over about the last 100 predictions and
/// scored whether or not the reads were made, so prefetch can come back when it would pay
/// again. A wasted read takes disk time from the demand reads that follow it, a useful one
/// only moves a read earlier (and one not routed at once may still be used later, which this
/// share does not count); a read is worth making when its layer routes it more often than
/// not. Random weights' routing scores far below that and prefetch costs decode speed there; a
/// trained model's scores far above it and prefetch pays (the figures: CHANGELOG).
#[derive(Debug, Clone, Copy)]
pub struct Payoff {
    reads: f64,
    useful: f64,
}

/// Share of would-be reads that must be routed for prefetch to be issued.
pub const MIN_USEFUL: f64 = 0.5;
/// Would-be reads scored before the share is trusted (prefetch runs until then).
const PAYOFF_WARMUP: f64 = 32.0;
const PAYOFF_DECAY: f64 = 0.99;

impl Payoff {
    fn new() -> Payoff {
        Payoff { reads: 0.0, useful: 0.0 }
    }

    /// A prediction was scored: `reads` would-be reads, `useful` of them routed.
    fn score(&mut self, reads: usize, useful: usize) {
        self.reads = PAYOFF_DECAY * self.reads + reads as f64;
        self.useful = PAYOFF_DECAY * self.useful + useful as f64;
    }

    pub fn pays(&self) -> bool {
        self.reads < PAYOFF_WARMUP || self.useful >= MIN_USEFUL * self.reads
    }
}

/// The chance that a predicted expert not in the pool is routed, by MoE layer and rank: what
/// a read of it is worth. Not the rank's accuracy over all predictions: the resident experts a
/// prediction names are the often-used ones, routed more often than those it would read, and a
/// layer predicted across tokens (the first, from the last layer's input) is right less often
/// than the others (measured on replayed trained routing: its reads were mostly wasted while
/// the other layers' were mostly used). Counts decay (about the last 100 predictions of the
/// layer); until a cell has evidence its estimate is the rank's accuracy (8 pseudo-samples).
struct ReadOdds {
    /// `[layer][rank]`: (would-be reads scored, of those routed).
    cells: Vec<Vec<(f64, f64)>>,
}

const ODDS_DECAY: f64 = 0.99;
const ODDS_PRIOR: f64 = 8.0;

impl ReadOdds {
    fn new(n_layers: usize, ranks: usize) -> ReadOdds {
        ReadOdds { cells: vec![vec![(0.0, 0.0); ranks]; n_layers] }
    }

    /// The chance for rank `r` of layer `li`, shrunk towards `rank_accuracy`.
    fn chance(&self, li: usize, r: usize, rank_accuracy: f64) -> f64 {
        let (n, hits) = self.cells.get(li).and_then(|c| c.get(r)).copied().unwrap_or((0.0, 0.0));
        (hits + ODDS_PRIOR * rank_accuracy) / (n + ODDS_PRIOR)
    }

    /// Layer `li` was routed: score its would-be reads (rank, routed).
    fn score(&mut self, li: usize, reads: impl Iterator<Item = (usize, bool)>) {
        let Some(cells) = self.cells.get_mut(li) else { return };
        for c in cells.iter_mut() {
            c.0 *= ODDS_DECAY;
            c.1 *= ODDS_DECAY;
        }
        for (r, routed) in reads {
            if let Some(c) = cells.get_mut(r) {
                c.0 += 1.0;
                c.1 += f64::from(u8::from(routed));
            }
        }
    }
}

/// Ranks predicted, in multiples of top-k: those past the issued ones (trimmed ranks, and
/// ranks k..2k) go to the pool as speculative reads, made only while the disk would idle.
/// Their accuracy is tracked like the others'.
pub const SPEC_RANKS: usize = 2;

struct Task {
    /// The MoE layer whose input `x` is, and its pass.
    from: (u64, usize),
    /// The next MoE layer and its pass (what is predicted), and the one after (what is guessed
    /// two ahead; None with fewer than 3 MoE layers).
    pass: u64,
    li: usize,
    two: Option<(u64, usize)>,
    x: Vec<f32>,
    /// Candidates given (replayed routing), most probable first: used instead of the router.
    given: Option<Vec<usize>>,
}

struct PredState {
    stats: PredictStats,
    /// For each MoE layer: the prediction waiting for its layer's real route
    pending: HashMap<usize, Pending>,
    keep: usize,
    payoff: Payoff,
    odds: ReadOdds,
    /// For each MoE layer: the guess made two layers ahead, waiting for its layer's route.
    pending_two: HashMap<usize, Guess>,
    /// The chance of use of a guess two ahead, by layer and rank.
    odds_two: ReadOdds,
    /// Learnt from the routes once routing is replayed (the guess two ahead then).
    coact: Option<CoActivation>,
    /// Tasks taken in and tasks done (queued prefetches included), for `wait_idle`.
    submitted: u64,
    done: u64,
}

struct Pending {
    pass: u64,
    /// predicted experts by rank
    experts: Vec<usize>,
    /// how many were issued as prefetches
    issued: usize,
    /// the issued predicted experts that were not resident when predicted
    would_read: Vec<usize>,
    /// every predicted expert not resident when predicted, with its rank
    unread: Vec<(usize, usize)>,
    /// when its prefetches were queued
    at: Instant,
}

/// A guess two layers ahead: its experts by rank, those read, and every one not resident when
/// guessed with its rank.
struct Guess {
    pass: u64,
    experts: Vec<usize>,
    read: Vec<usize>,
    unread: Vec<(usize, usize)>,
}

pub struct Predictor {
    tx: Option<SyncSender<Task>>,
    handle: Option<JoinHandle<()>>,
    state: Arc<Mutex<PredState>>,
    n_layers: usize,
    num_experts: usize,
    top_k: usize,
    /// Submissions wait for room instead of being dropped (see [`Predictor::set_lossless`]).
    lossless: AtomicBool,
}

impl Predictor {
    /// `routers[li]`: MoE layer li's router.
    pub fn start(pkg: Arc<Package>, routers: Vec<Router>, cache: Arc<ExpertCache>, isa: Isa) -> Predictor {
        let c = pkg.meta.model.clone();
        let (k, n_layers) = (c.num_experts_per_tok, routers.len());
        let state = Arc::new(Mutex::new(PredState {
            stats: PredictStats::new(SPEC_RANKS * k, k),
            pending: HashMap::new(),
            keep: k,
            payoff: Payoff::new(),
            odds: ReadOdds::new(n_layers, SPEC_RANKS * k),
            pending_two: HashMap::new(),
            odds_two: ReadOdds::new(n_layers, k),
            coact: None,
            submitted: 0,
            done: 0,
        }));
        // two tasks at most: an older one still waiting is stale by the time a new one comes
        let (tx, rx) = sync_channel::<Task>(2);
        let st = state.clone();
        let handle = std::thread::Builder::new()
            .name("moescope-predict".into())
            .spawn(move || worker(rx, pkg, routers, cache, st, isa))
            .unwrap_or_else(|e| panic!("cannot start the predictor thread: {e}"));
        Predictor {
            tx: Some(tx),
            handle: Some(handle),
            state,
            n_layers,
            num_experts: c.num_experts,
            top_k: k,
            lossless: AtomicBool::new(false),
        }
    }

    /// The MoE layer after `li` of pass `pass` (the first of the next pass after the last).
    fn after(&self, pass: u64, li: usize) -> (u64, usize) {
        if li + 1 < self.n_layers { (pass, li + 1) } else { (pass + 1, 0) }
    }

    /// MoE layer `li` of pass `pass` has input `x` (`[H]`): predict the next MoE layer (the
    /// first layer of the next pass after the last one), from `given` candidates (most probable
    /// first) where a replayed trace supplies them, else with that layer's router; and guess
    /// the layer after it. Never blocks; a full queue drops it.
    pub fn submit(&self, pass: u64, li: usize, x: Vec<f32>, given: Option<&[usize]>) {
        let from = (pass, li);
        let (pass, li) = self.after(pass, li);
        let two = (self.n_layers >= 3).then(|| self.after(pass, li));
        if let Some(tx) = &self.tx {
            // counted before it is sent, so `wait_idle` never misses a task in the channel
            {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.submitted += 1;
                if given.is_some() && st.coact.is_none() {
                    st.coact = CoActivation::new(self.n_layers, self.num_experts);
                }
            }
            let task = Task { from, pass, li, two, x, given: given.map(<[usize]>::to_vec) };
            if self.lossless.load(Ordering::Relaxed) {
                // the worker only stops once the sender is dropped, so this waits, never fails
                let _ = tx.send(task);
            } else if let Err(TrySendError::Full(_)) = tx.try_send(task) {
                self.state.lock().unwrap_or_else(|p| p.into_inner()).submitted -= 1;
                trace::instant("predict_dropped", vec![("layer", li.into())]);
            }
        }
    }

    /// With `on`, a prediction is never dropped or late: `submit` waits for the predictor to
    /// take it and `observe` for it to be made, so every layer is predicted and scored whatever
    /// the load on the cores. Decode must not
    /// wait for the predictor (off by default); this is for tests and measurements that score
    /// the predictor against a reference.
    pub fn set_lossless(&self, on: bool) {
        self.lossless.store(on, Ordering::Relaxed);
    }

    /// Wait (up to `timeout`) until every submitted prediction has been made and its prefetches
    /// queued; true if so. Decode never waits for the predictor: this is for tests and
    /// measurements that need its work done at a known point.
    pub fn wait_idle(&self, timeout: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        loop {
            {
                let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if s.done >= s.submitted {
                    return true;
                }
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The real route of MoE layer `li` in pass `pass` (one token's experts in rank order,
    /// with their gate weights): score the prediction made for it.
    pub fn observe(&self, pass: u64, li: usize, ranked: &[Pick]) {
        if self.lossless.load(Ordering::Relaxed) {
            // every prediction made before its layer is scored
            self.wait_idle(std::time::Duration::from_secs(60));
        }
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let k = self.top_k;
        observe_two_ahead(&mut st, pass, li, ranked);
        let Some(Pending { pass: p, experts: pred, issued, would_read, unread, at }) = st.pending.remove(&li) else {
            return;
        };
        if p != pass {
            return;
        }
        let routed = |e: &usize| ranked.iter().any(|p| p.expert == *e);
        st.odds.score(li, unread.iter().map(|&(r, e)| (r, routed(&e))));
        let useful = would_read.iter().filter(|e| routed(e)).count();
        st.payoff.score(would_read.len(), useful);
        let s = &mut st.stats;
        s.would_read += would_read.len() as u64;
        s.would_read_routed += useful as u64;
        let top = &pred[..k.min(pred.len())];
        s.next.score(top, ranked);
        s.lead_ns += now.saturating_duration_since(at).as_nanos() as u64;
        s.lead_n += 1;
        for (r, e) in pred.iter().enumerate() {
            s.samples[r] += 1;
            if routed(e) {
                s.hits[r] += 1;
            }
        }
        // recall and precision are the top-k prediction's (the speculative ranks beyond have
        // their per-rank accuracy)
        s.issued += issued as u64;
        s.issued_routed += pred.iter().take(issued).filter(|e| routed(e)).count() as u64;
        // trim ranks that do not pay
        let floor = k.div_ceil(2);
        let mut keep = k;
        for r in floor..k {
            if s.samples[r] >= MIN_SAMPLES && (s.hits[r] as f64) < MIN_ACCURACY * s.samples[r] as f64 {
                keep = r;
                break;
            }
        }
        st.keep = keep;
    }

    pub fn stats(&self) -> PredictStats {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).stats.clone()
    }

    /// Ranks currently issued.
    pub fn issued_ranks(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).keep
    }
}

impl Drop for Predictor {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn worker(
    rx: Receiver<Task>,
    pkg: Arc<Package>,
    routers: Vec<Router>,
    cache: Arc<ExpertCache>,
    st: Arc<Mutex<PredState>>,
    isa: Isa,
) {
    trace::recorder::set_thread_name("moescope-predict");
    let c = &pkg.meta.model;
    let (e_n, k) = (c.num_experts, c.num_experts_per_tok);
    let mut router = Routers { probs: vec![0f32; e_n], order: Vec::with_capacity(e_n), pkg: pkg.clone(), routers, isa };
    while let Ok(t) = rx.recv() {
        let mut span = trace::span("predict").arg("layer", t.li).arg("pass", t.pass);
        let mut ranks = (SPEC_RANKS * k).min(e_n);
        let top: Vec<usize> = match &t.given {
            Some(given) => {
                ranks = given.len().min(ranks);
                given[..ranks].to_vec()
            }
            None => router.top(t.li, &t.x, ranks),
        };
        // chance of use of each rank's expert if it is read (see ReadOdds): what the pool weighs
        // against the time the read takes and what it would evict. The rank's accuracy so far
        // (8 pseudo-samples at one half for the top-k, one eighth beyond) is its prior.
        let resident = cache.resident_among(t.li, &top);
        let (keep, conf, pays): (usize, Vec<f32>, bool) = {
            let s = st.lock().unwrap_or_else(|p| p.into_inner());
            let c = (0..ranks)
                .map(|r| {
                    let prior = if r < k { 4.0 } else { 1.0 };
                    let acc = (s.stats.hits[r] as f64 + prior) / (s.stats.samples[r] as f64 + 8.0);
                    s.odds.chance(t.li, r, acc) as f32
                })
                .collect();
            (s.keep, c, s.payoff.pays())
        };
        let ask: Vec<(usize, f32)> = top.iter().take(keep).enumerate().map(|(r, &e)| (e, conf[r])).collect();
        let spec: Vec<(usize, f32)> = top.iter().enumerate().skip(keep).map(|(r, &e)| (e, conf[r])).collect();
        let unread: Vec<(usize, usize)> =
            top.iter().enumerate().filter(|&(r, _)| !resident[r]).map(|(r, &e)| (r, e)).collect();
        let would_read: Vec<usize> = unread.iter().filter(|&&(r, _)| r < keep).map(|&(_, e)| e).collect();
        let reads = if pays {
            let flow = span.flows_out(1);
            let i = cache.prefetch(t.pass, t.li, &ask, flow);
            cache.speculate(t.pass, t.li, &cache.worth_reading(t.li, i.queued, &spec));
            i
        } else {
            Issued::default()
        };
        let queued = reads.queued;
        span.set("predicted", top.as_slice());
        span.set("queued", queued);
        span.set("capped", reads.capped);
        span.set("withheld", u64::from(!pays));
        let mut s = st.lock().unwrap_or_else(|p| p.into_inner());
        s.stats.made += 1;
        s.stats.capped += reads.capped as u64;
        if !pays {
            s.stats.withheld += 1;
        } else if queued == 0 && cache.pass() > t.pass {
            s.stats.late += 1;
        }
        let issued = if pays { keep } else { 0 };
        s.pending.insert(t.li, Pending { pass: t.pass, experts: top, issued, would_read, unread, at: Instant::now() });
        drop(s);
        // while prefetch does not pay, the guess (a router product) is not even made
        if let Some(two) = t.two.filter(|_| pays) {
            let read = guess_two_ahead(&t, two, &mut router, &cache, &st);
            span.set("two_ahead_reads", read);
        }
        st.lock().unwrap_or_else(|p| p.into_inner()).done += 1;
    }
}

/// The MoE layers' routers, applied on the predictor's thread.
struct Routers {
    pkg: Arc<Package>,
    /// `[li]`: MoE layer li's router.
    routers: Vec<Router>,
    isa: Isa,
    probs: Vec<f32>,
    order: Vec<usize>,
}

impl Routers {
    /// The `n` experts MoE layer `li`'s router ranks highest for input `x` (`[H]`), the most
    /// probable first, ties to the lower id.
    fn top(&mut self, li: usize, x: &[f32], n: usize) -> Vec<usize> {
        let h = x.len();
        let router = &self.routers[li];
        let w = self.pkg.f32_by_index(router.weight);
        for (e, p) in self.probs.iter_mut().enumerate() {
            *p = moescope_kernels::dot::dot_f32(self.isa, &w[e * h..(e + 1) * h], x);
        }
        router.rank_scores(&self.pkg, &mut self.probs);
        top_k(&self.probs, n, &mut self.order);
        self.order.clone()
    }
}

/// Guess MoE layer `l2` of pass `p2` (two after the task's input layer): its router on the same
/// input, or with replayed routing the co-activation table; queue speculative reads of the
/// guessed experts not resident whose chance pays, and keep the guess to be scored. Returns
/// the reads queued.
fn guess_two_ahead(
    t: &Task,
    (p2, l2): (u64, usize),
    router: &mut Routers,
    cache: &ExpertCache,
    st: &Mutex<PredState>,
) -> usize {
    let k = router.pkg.meta.model.num_experts_per_tok;
    let experts = match &t.given {
        None => router.top(l2, &t.x, k),
        Some(_) => {
            let s = st.lock().unwrap_or_else(|p| p.into_inner());
            s.coact.as_ref().map(|c| c.predict(t.from.0, t.from.1, k)).unwrap_or_default()
        }
    };
    if experts.is_empty() {
        return 0;
    }
    let resident = cache.resident_among(l2, &experts);
    let unread: Vec<(usize, usize)> =
        experts.iter().enumerate().filter(|&(r, _)| !resident[r]).map(|(r, &e)| (r, e)).collect();
    let cands: Vec<(usize, f32)> = {
        let s = st.lock().unwrap_or_else(|p| p.into_inner());
        // prior: the guesses' recall so far, starting from chance (k / E, 8 pseudo-samples):
        // a guess two ahead is not read on before it has been seen to be right (an optimistic
        // start reads many wrong guesses on routing that cannot be guessed)
        let r = &s.stats.two_ahead;
        let chance = k as f64 / router.probs.len().max(1) as f64;
        let acc = (r.routed_predicted as f64 + 8.0 * chance) / (r.routed as f64 + 8.0);
        unread.iter().map(|&(rank, e)| (e, s.odds_two.chance(l2, rank, acc) as f32)).collect()
    };
    let read: Vec<(usize, f32)> = if cache.prefetch_on() { cache.worth_reading_early(l2, &cands) } else { Vec::new() };
    if !read.is_empty() {
        cache.speculate(p2, l2, &read);
    }
    let n = read.len();
    let guess = Guess { pass: p2, experts, read: read.into_iter().map(|(e, _)| e).collect(), unread };
    st.lock().unwrap_or_else(|p| p.into_inner()).pending_two.insert(l2, guess);
    n
}

/// Score the guess made two layers ahead for MoE layer `li` of pass `pass` against its route
/// (experts by gate weight), after the co-activation table (when routing is replayed) has
/// learnt the route.
fn observe_two_ahead(st: &mut PredState, pass: u64, li: usize, ranked: &[Pick]) {
    let route: Vec<usize> = ranked.iter().map(|p| p.expert).collect();
    if let Some(c) = st.coact.as_mut() {
        c.observe(pass, li, &route);
    }
    let Some(g) = st.pending_two.remove(&li) else { return };
    if g.pass != pass {
        return;
    }
    st.odds_two.score(li, g.unread.iter().map(|&(r, e)| (r, route.contains(&e))));
    let s = &mut st.stats;
    s.two_ahead.score(&g.experts, ranked);
    s.two_ahead_reads += g.read.len() as u64;
    s.two_ahead_reads_routed += g.read.iter().filter(|e| route.contains(e)).count() as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_backs_off_while_its_reads_go_unused_and_comes_back_when_they_are_used() {
        let mut p = Payoff::new();
        // until 32 would-be reads are scored (decayed: 8 predictions of 4 make 30.9), prefetch runs
        for _ in 0..8 {
            p.score(4, 0);
            assert!(p.pays());
        }
        p.score(4, 0);
        assert!(!p.pays(), "nothing used: withheld");
        // predictions of experts already resident would read nothing and change nothing
        p.score(0, 0);
        assert!(!p.pays());
        // reads that would be used 3 times in 4 bring it back
        let mut n = 0;
        while !p.pays() {
            p.score(4, 3);
            n += 1;
            assert!(n < 200, "never came back");
        }
        // and used 1 time in 4 sends it away again
        for _ in 0..200 {
            p.score(4, 1);
        }
        assert!(!p.pays());
    }

    #[test]
    fn read_odds_start_at_the_rank_accuracy_and_learn_each_layer_and_rank_apart() {
        let mut o = ReadOdds::new(2, 4);
        assert!((o.chance(0, 0, 0.8) - 0.8).abs() < 1e-12, "no evidence: the rank's accuracy");
        // layer 0's rank-0 reads never routed, layer 1's always: each layer learns its own
        for _ in 0..200 {
            o.score(0, [(0, false), (1, true)].into_iter());
            o.score(1, [(0, true)].into_iter());
        }
        assert!(o.chance(0, 0, 0.8) < 0.1, "{}", o.chance(0, 0, 0.8));
        assert!(o.chance(0, 1, 0.5) > 0.9, "{}", o.chance(0, 1, 0.5));
        assert!(o.chance(1, 0, 0.2) > 0.9, "{}", o.chance(1, 0, 0.2));
        // a rank never read keeps its prior; a layer or rank out of range is the prior too
        assert!((o.chance(1, 3, 0.3) - 0.3).abs() < 1e-12);
        assert!((o.chance(5, 0, 0.3) - 0.3).abs() < 1e-12);
        // the counts decay: after 200 predictions the other way, layer 0's rank 0 has turned
        for _ in 0..200 {
            o.score(0, [(0, true)].into_iter());
        }
        assert!(o.chance(0, 0, 0.8) > 0.8, "{}", o.chance(0, 0, 0.8));
    }
}
