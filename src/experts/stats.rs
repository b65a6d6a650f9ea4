//! What the expert cache and the predictor count. Counters only grow; a token's or a run's
//! numbers are differences of two snapshots.

use serde::Serialize;

use crate::model::Pick;

/// Counters of one MoE layer (or the sum over layers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LayerStats {
    /// Demanded experts found resident.
    pub hits: u64,
    /// Of the hits (and in-flight reads), those a prediction loaded or started.
    pub prefetch_hits: u64,
    /// Demanded experts that had to be read (no prefetch had started them).
    pub misses: u64,
    /// Times the layer waited for a read, and for how long.
    pub stalls: u64,
    pub stall_ns: u64,
    /// Bytes read because the layer asked (misses), and because a prediction asked.
    pub bytes_demand: u64,
    pub bytes_prefetch: u64,
    /// Prefetched bytes later used, and prefetched bytes evicted or dropped unused.
    pub prefetch_useful_bytes: u64,
    pub prefetch_wasted_bytes: u64,
    /// Experts read again within one token of being evicted (thrashing).
    pub reloads_soon: u64,
    pub evictions: u64,
}

impl LayerStats {
    pub fn add(&mut self, o: &LayerStats) {
        self.hits += o.hits;
        self.prefetch_hits += o.prefetch_hits;
        self.misses += o.misses;
        self.stalls += o.stalls;
        self.stall_ns += o.stall_ns;
        self.bytes_demand += o.bytes_demand;
        self.bytes_prefetch += o.bytes_prefetch;
        self.prefetch_useful_bytes += o.prefetch_useful_bytes;
        self.prefetch_wasted_bytes += o.prefetch_wasted_bytes;
        self.reloads_soon += o.reloads_soon;
        self.evictions += o.evictions;
    }

    pub fn sub(&self, o: &LayerStats) -> LayerStats {
        LayerStats {
            hits: self.hits - o.hits,
            prefetch_hits: self.prefetch_hits - o.prefetch_hits,
            misses: self.misses - o.misses,
            stalls: self.stalls - o.stalls,
            stall_ns: self.stall_ns - o.stall_ns,
            bytes_demand: self.bytes_demand - o.bytes_demand,
            bytes_prefetch: self.bytes_prefetch - o.bytes_prefetch,
            prefetch_useful_bytes: self.prefetch_useful_bytes - o.prefetch_useful_bytes,
            prefetch_wasted_bytes: self.prefetch_wasted_bytes - o.prefetch_wasted_bytes,
            reloads_soon: self.reloads_soon - o.reloads_soon,
            evictions: self.evictions - o.evictions,
        }
    }

    /// Hits over demanded experts, in percent (a read started by a prediction and still in
    /// flight counts as a hit: no demand read was issued).
    pub fn hit_pct(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 { 0.0 } else { 100.0 * self.hits as f64 / n as f64 }
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_demand + self.bytes_prefetch
    }
}

/// Predictor accuracy, per rank of the predicted top-k.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PredictStats {
    /// Predictions compared with the real route, per rank.
    pub samples: Vec<u64>,
    /// Of those, the predicted expert was in the real route.
    pub hits: Vec<u64>,
    /// Predicted experts that were issued as prefetches, and of those, how many were routed.
    pub issued: u64,
    pub issued_routed: u64,
    /// How much of each route the top-k prediction (one layer ahead) named.
    pub next: Recall,
    /// The same for the prediction two layers ahead, and its speculative reads: made, and of
    /// those, how many their layer routed.
    pub two_ahead: Recall,
    pub two_ahead_reads: u64,
    pub two_ahead_reads_routed: u64,
    /// Predictions that arrived after their layer had started (too late to help).
    pub late: u64,
    /// Time from a prediction's prefetches being queued to its layer's request, summed over
    /// the predictions scored.
    pub lead_ns: u64,
    pub lead_n: u64,
    /// Predictions whose reads were withheld because prefetch was not paying (see
    /// `predict::Payoff`), of all predictions made.
    pub withheld: u64,
    pub made: u64,
    /// Predicted experts that were not resident when predicted (what prefetch reads), and of
    /// those, how many were routed: scored whether or not they were read.
    pub would_read: u64,
    pub would_read_routed: u64,
    /// Would-be reads left to demand: not worth reading ahead in the time before their
    /// layer's request (see `pool::window`).
    pub capped: u64,
}

impl PredictStats {
    /// `ranks` predicted ranks; routes of `k` experts.
    pub fn new(ranks: usize, k: usize) -> PredictStats {
        PredictStats {
            samples: vec![0; ranks],
            hits: vec![0; ranks],
            next: Recall::new(k),
            two_ahead: Recall::new(k),
            ..Default::default()
        }
    }

    /// Recall of each routed rank, one layer ahead (see [`Recall::slot_recall`]).
    pub fn slot_recall(&self) -> Vec<f64> {
        self.next.slot_recall()
    }

    /// Share of the routed gate weight predicted one layer ahead.
    pub fn gate_mass_recall(&self) -> f64 {
        self.next.gate_mass_recall()
    }

    /// Share of the speculative reads made two layers ahead that their layer routed.
    pub fn two_ahead_precision(&self) -> f64 {
        ratio(self.two_ahead_reads_routed, self.two_ahead_reads)
    }

    /// Mean time a prediction was ready before its layer asked, in milliseconds.
    pub fn lead_ms(&self) -> f64 {
        if self.lead_n == 0 { 0.0 } else { self.lead_ns as f64 / self.lead_n as f64 / 1e6 }
    }

    /// Share of would-be prefetch reads that their layer routed.
    pub fn read_usefulness(&self) -> f64 {
        if self.would_read == 0 { 0.0 } else { self.would_read_routed as f64 / self.would_read as f64 }
    }

    /// Share of predictions whose reads were withheld.
    pub fn withheld_share(&self) -> f64 {
        if self.made == 0 { 0.0 } else { self.withheld as f64 / self.made as f64 }
    }

    /// Fraction of routed experts predicted one layer ahead.
    pub fn recall(&self) -> f64 {
        self.next.recall()
    }

    /// Fraction of issued prefetches that were routed.
    pub fn precision(&self) -> f64 {
        if self.issued == 0 { 0.0 } else { self.issued_routed as f64 / self.issued as f64 }
    }

    pub fn rank_accuracy(&self) -> Vec<f64> {
        self.samples.iter().zip(&self.hits).map(|(&s, &h)| if s == 0 { 0.0 } else { h as f64 / s as f64 }).collect()
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// How much of the real routes a prediction named: by routed rank, by gate weight, in all.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Recall {
    /// Per routed rank (the route's j-th expert by gate weight): times scored, and times its
    /// expert was in the prediction.
    pub slot_routed: Vec<u64>,
    pub slot_predicted: Vec<u64>,
    /// Gate weight of the routed experts, and of those predicted.
    pub gate_mass: f64,
    pub gate_mass_predicted: f64,
    /// Routed experts, and of those, how many had been predicted.
    pub routed: u64,
    pub routed_predicted: u64,
}

impl Recall {
    /// Routes of `k` experts.
    pub fn new(k: usize) -> Recall {
        Recall { slot_routed: vec![0; k], slot_predicted: vec![0; k], ..Default::default() }
    }

    /// Score `predicted` against one real route, its experts by gate weight, largest first.
    pub fn score(&mut self, predicted: &[usize], ranked: &[Pick]) {
        for (j, &Pick { expert: e, weight: w }) in ranked.iter().enumerate() {
            let hit = predicted.contains(&e);
            if j < self.slot_routed.len() {
                self.slot_routed[j] += 1;
                self.slot_predicted[j] += u64::from(hit);
            }
            self.gate_mass += f64::from(w);
            self.routed += 1;
            if hit {
                self.gate_mass_predicted += f64::from(w);
                self.routed_predicted += 1;
            }
        }
    }

    /// Recall of each routed rank (the expert with the j-th largest gate weight).
    pub fn slot_recall(&self) -> Vec<f64> {
        self.slot_routed.iter().zip(&self.slot_predicted).map(|(&n, &p)| ratio(p, n)).collect()
    }

    /// Share of the routed gate weight whose experts had been predicted.
    pub fn gate_mass_recall(&self) -> f64 {
        if self.gate_mass <= 0.0 { 0.0 } else { self.gate_mass_predicted / self.gate_mass }
    }

    /// Fraction of routed experts that had been predicted.
    pub fn recall(&self) -> f64 {
        ratio(self.routed_predicted, self.routed)
    }
}
