//! Next-layer prediction: while MoE layer l computes, a thread of its own applies the router of
//! the next MoE layer to layer l's MoE input and queues prefetches for the experts it picks
//! (mollm's cross-layer predictor). The next layer still computes its exact route; a prediction
//! only decides what to read early.
//!
//! Accuracy is tracked per rank of the predicted top-k; once a rank has 128 samples and is
//! right less than 80% of the time, it and the ranks after it are no longer issued (but never
//! fewer than half of top-k).

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use moescope_kernels::Isa;
use moescope_kernels::ops::{softmax_inplace, top_k};

use super::pool::{ExpertCache, Issued};
use super::stats::PredictStats;
use crate::model::moe::Pick;
use crate::package::{Package, TensorId};
use crate::trace;

pub const MIN_SAMPLES: u64 = 128;
pub const MIN_ACCURACY: f64 = 0.8;

/// Whether prefetch pays, from the share of would-be reads (predicted experts not resident when
/// predicted) that their layer then routed, decayed over about the last 100 predictions and
/// scored whether or not the reads were made, so prefetch can come back when it would pay
/// again. A wasted read takes disk time from the demand reads that follow it, a useful one
/// only moves a read earlier (and one not routed at once may still be used later, which this
/// share does not count); a read is worth making when its layer routes it more often than
/// not. Measured under a 1.62 GB cap on the 8-layer benchmark package with a 180 MiB pool:
/// random weights' routing scores 14% and prefetch cost 10-35% of decode speed there; a
/// trained model's routing (replayed) scores 72% and prefetch gained up to 15%.
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
    pass: u64,
    li: usize,
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

pub struct Predictor {
    tx: Option<SyncSender<Task>>,
    handle: Option<JoinHandle<()>>,
    state: Arc<Mutex<PredState>>,
    n_layers: usize,
    top_k: usize,
}

impl Predictor {
    /// `routers[li]`: index of MoE layer li's router (f32 `[E, H]`) in the package.
    pub fn start(pkg: Arc<Package>, routers: Vec<TensorId>, cache: Arc<ExpertCache>, isa: Isa) -> Predictor {
        let c = pkg.meta.model.clone();
        let (k, n_layers) = (c.num_experts_per_tok, routers.len());
        let state = Arc::new(Mutex::new(PredState {
            stats: PredictStats::new(SPEC_RANKS * k, k),
            pending: HashMap::new(),
            keep: k,
            payoff: Payoff::new(),
            odds: ReadOdds::new(n_layers, SPEC_RANKS * k),
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
        Predictor { tx: Some(tx), handle: Some(handle), state, n_layers, top_k: k }
    }

    /// MoE layer `li` of pass `pass` has input `x` (`[H]`): predict the next MoE layer (the
    /// first layer of the next pass after the last one), from `given` candidates (most probable
    /// first) where a replayed trace supplies them, else with that layer's router. Never
    /// blocks; a full queue drops it.
    pub fn submit(&self, pass: u64, li: usize, x: &[f32], given: Option<&[usize]>) {
        let (pass, li) = if li + 1 < self.n_layers { (pass, li + 1) } else { (pass + 1, 0) };
        if let Some(tx) = &self.tx {
            // counted before it is sent, so `wait_idle` never misses a task in the channel
            self.state.lock().unwrap_or_else(|p| p.into_inner()).submitted += 1;
            if let Err(TrySendError::Full(_)) =
                tx.try_send(Task { pass, li, x: x.to_vec(), given: given.map(<[usize]>::to_vec) })
            {
                self.state.lock().unwrap_or_else(|p| p.into_inner()).submitted -= 1;
                trace::instant("predict_dropped", vec![("layer", li.into())]);
            }
        }
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
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let k = self.top_k;
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
        for (j, &Pick { expert: e, weight: w }) in ranked.iter().enumerate() {
            let hit = top.contains(&e);
            if j < s.slot_routed.len() {
                s.slot_routed[j] += 1;
                s.slot_predicted[j] += u64::from(hit);
            }
            s.gate_mass += f64::from(w);
            if hit {
                s.gate_mass_predicted += f64::from(w);
            }
        }
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
        s.routed += ranked.len() as u64;
        s.routed_predicted += ranked.iter().filter(|p| top.contains(&p.expert)).count() as u64;
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
    routers: Vec<TensorId>,
    cache: Arc<ExpertCache>,
    st: Arc<Mutex<PredState>>,
    isa: Isa,
) {
    trace::recorder::set_thread_name("moescope-predict");
    let c = &pkg.meta.model;
    let (e_n, h, k) = (c.num_experts, c.hidden_size, c.num_experts_per_tok);
    let mut probs = vec![0f32; e_n];
    let mut order: Vec<usize> = Vec::with_capacity(e_n);
    while let Ok(t) = rx.recv() {
        let mut span = trace::span("predict").arg("layer", t.li).arg("pass", t.pass);
        let mut ranks = (SPEC_RANKS * k).min(e_n);
        let top: Vec<usize> = match t.given {
            Some(mut given) => {
                given.truncate(ranks);
                ranks = given.len();
                given
            }
            None => {
                let w = pkg.f32_by_index(routers[t.li]);
                for (e, p) in probs.iter_mut().enumerate() {
                    *p = moescope_kernels::dot::dot_f32(isa, &w[e * h..(e + 1) * h], &t.x);
                }
                softmax_inplace(&mut probs);
                // the most probable first, ties to the lower id
                top_k(&probs, ranks, &mut order);
                order.clone()
            }
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
        s.done += 1;
    }
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
