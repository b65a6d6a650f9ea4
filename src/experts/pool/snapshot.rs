//! What the pool shows the workbench and the trace, each taken under one lock: its full picture
//! ([`PoolSnapshot`]) and the running totals every token needs ([`PoolTotals`]).

use super::super::stats::LayerStats;
use super::slots::{Origin, SlotState, State};
use crate::trace::hist::LatencySummary;

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

/// What the pool holds ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    pub experts: usize,
    /// Bytes of their buffers.
    pub bytes: u64,
}

/// Reads waiting in the pool's queues, and being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    /// Demand reads queued.
    pub demand: usize,
    /// Prefetch reads queued, speculative candidates included.
    pub prefetch: usize,
    /// Reads an I/O worker is doing now.
    pub in_flight: usize,
}

/// The pool's counters so far.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PoolTotals {
    /// All MoE layers' counters added.
    pub stats: LayerStats,
    /// Completed reads.
    pub reads: u64,
    /// Nanoseconds with at least one read in flight (the disk busy, as the pool sees it).
    pub disk_busy_ns: u64,
}

/// The pool's whole picture at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSnapshot {
    pub residency: Residency,
    pub totals: PoolTotals,
    pub per_layer: Vec<LayerStats>,
    pub queue: QueueDepth,
    /// Latency of the reads so far (pread and checksum of one blob).
    pub read_latency: LatencySummary,
}

impl State {
    pub(super) fn totals(&self) -> PoolTotals {
        let mut stats = LayerStats::default();
        for s in &self.stats {
            stats.add(s);
        }
        let open = self.busy_since.map_or(0, |t| t.elapsed().as_nanos() as u64);
        PoolTotals { stats, reads: self.reads, disk_busy_ns: self.busy_ns + open }
    }

    pub(super) fn queue(&self) -> QueueDepth {
        QueueDepth {
            demand: self.demand_q.len(),
            prefetch: self.prefetch_q.len() + self.spec_q.len(),
            in_flight: self.in_flight,
        }
    }

    pub(super) fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            residency: self.residency(),
            totals: self.totals(),
            per_layer: self.stats.clone(),
            queue: self.queue(),
            read_latency: self.read_latency.summary(),
        }
    }

    /// What every (layer, expert) is doing now.
    pub(super) fn residency(&self) -> Residency {
        let d = self.dims;
        let mut cells = vec![Cell::Free; d.n_layers * d.num_experts];
        for (&(l, e), &t) in &self.evicted_at {
            if t + 2 > self.token {
                cells[l * d.num_experts + e] = Cell::Evicted;
            }
        }
        let mut resident = 0u64;
        for s in self.slots.iter().flatten() {
            let c = match (&s.state, s.origin) {
                (SlotState::Ready, Origin::Prefetch) if !s.used => Cell::Predicted,
                (SlotState::Ready, _) => Cell::Resident,
                (SlotState::Queued | SlotState::Reading, Origin::Prefetch) => Cell::Predicted,
                (SlotState::Queued | SlotState::Reading, Origin::Demand) => Cell::Reading,
                (SlotState::Failed(_), _) => Cell::Free,
            };
            if s.state == SlotState::Ready {
                resident += d.blob_len as u64;
            }
            cells[s.key.0 * d.num_experts + s.key.1] = c;
        }
        Residency {
            n_layers: d.n_layers,
            num_experts: d.num_experts,
            cells,
            resident_bytes: resident,
            budget_bytes: self.capacity as u64 * d.blob_len as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::slots::Origin;
    use super::super::slots::tests::{load, state};
    use super::*;
    use crate::experts::policy::PolicyKind;

    #[test]
    fn cells_show_what_each_expert_is_doing() {
        let mut st = state(4, PolicyKind::Lru);
        load(&mut st, (0, 0));
        st.reserve((0, 1), Origin::Demand, None).unwrap();
        st.reserve((1, 3), Origin::Prefetch, Some(0.7)).unwrap();
        let r = st.residency();
        assert_eq!(r.cells[0], Cell::Resident);
        assert_eq!(r.cells[1], Cell::Reading);
        assert_eq!(r.cells[4 + 3], Cell::Predicted);
        assert_eq!(r.cells.iter().filter(|c| **c == Cell::Free).count(), 8 - 3);
        assert_eq!((r.resident_bytes, r.budget_bytes), (4096, 4 * 4096));
    }

    #[test]
    fn a_snapshot_adds_the_layers_and_counts_the_queues() {
        let mut st = state(4, PolicyKind::Lru);
        load(&mut st, (0, 0));
        load(&mut st, (1, 1));
        st.stats[0].hits = 3;
        st.stats[1].hits = 4;
        let d = st.reserve((0, 2), Origin::Demand, None).unwrap();
        st.demand_q.push_back(d);
        let p = st.reserve((1, 3), Origin::Prefetch, Some(0.5)).unwrap();
        st.prefetch_q.push((p, 0.5));
        let s = st.snapshot();
        assert_eq!(s.totals.stats.hits, 7);
        assert_eq!(s.totals.reads, 2, "two reads completed");
        assert_eq!(s.totals.stats.bytes_demand, 2 * 4096);
        assert_eq!(s.queue, QueueDepth { demand: 1, prefetch: 1, in_flight: 0 });
        assert_eq!(s.per_layer.len(), 2);
        assert_eq!(s.read_latency.count, 2);
    }
}
