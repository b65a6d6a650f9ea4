//! What the panes show, built from what the engine sends (bottom's data store): the routing
//! heat, the pool's last picture, the I/O history and the recent per-token counters, published
//! to the panes at most every [`PANE_PERIOD`]. The UI's own state (focus, input, scroll) is in
//! app.rs.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::event::{PANE_PERIOD, PoolView, Step};
use crate::experts::stats::LayerStats;

/// Decayed routing counts: `share[l * E + e]` ~ the fraction of recent tokens whose layer l
/// picked expert e.
#[derive(Debug, Clone, Default)]
pub struct Heat {
    pub n_layers: usize,
    pub num_experts: usize,
    pub share: Vec<f32>,
    pub last: Vec<Vec<usize>>,
}

pub const HEAT_DECAY: f32 = 0.9;

impl Heat {
    pub(crate) fn fold(&mut self, counts: &[Vec<u32>], last: &[Vec<usize>]) {
        let (l, e) = (counts.len(), counts.first().map_or(0, |c| c.len()));
        if self.n_layers != l || self.num_experts != e {
            *self = Heat { n_layers: l, num_experts: e, share: vec![0.0; l * e], last: vec![Vec::new(); l] };
        }
        // a pass of many tokens (a prompt chunk) counts as one step of its average
        let tokens = counts.first().map_or(0, |c| c.iter().sum::<u32>()) as f32
            / last.first().map_or(1, |x| x.len().max(1)) as f32;
        if tokens == 0.0 {
            // a snapshot without a pass (the pool after a reply): nothing to decay
            self.last = last.to_vec();
            return;
        }
        let tokens = tokens.max(1.0);
        for (li, c) in counts.iter().enumerate() {
            for (x, &n) in c.iter().enumerate() {
                let s = &mut self.share[li * e + x];
                *s = HEAT_DECAY * *s + (1.0 - HEAT_DECAY) * (n as f32 / tokens);
            }
        }
        self.last = last.to_vec();
    }
}

/// The I/O history the sparkline draws: MB/s per sample.
#[derive(Debug, Clone, Default)]
pub struct IoHistory {
    pub mbps: VecDeque<u64>,
    pub reads_per_s: f64,
    pub max_mbps: u64,
    /// Share of the last closed window with a read in flight, percent.
    pub busy_pct: f64,
    /// Start of the open window: (when, bytes read, reads, disk busy ns) by then.
    last: Option<(Instant, u64, u64, u64)>,
    /// The newest step's (when, bytes read, reads, disk busy ns).
    latest: Option<(Instant, u64, u64, u64)>,
}

/// How long one point of the I/O history covers while steps come.
const IO_WINDOW: Duration = Duration::from_millis(250);

impl IoHistory {
    /// A step saw `bytes` read, `reads` and `busy` ns with a read in flight so far: close the
    /// window when it is long enough.
    fn step(&mut self, now: Instant, bytes: u64, reads: u64, busy: u64) {
        self.latest = Some((now, bytes, reads, busy));
        match self.last {
            Some((t, ..)) if now.duration_since(t) >= IO_WINDOW => self.close(now, bytes, reads, busy),
            None => self.last = Some((now, bytes, reads, busy)),
            _ => {}
        }
    }

    /// A reply ended: its last window becomes a point however short it is (a fast reply on a
    /// small model reads in bursts of 100 ms and would otherwise never show), and the idle time
    /// until the next reply is not averaged into its first point.
    fn reply_done(&mut self) {
        if let (Some((t, b, _, _)), Some((now, bytes, reads, busy))) = (self.last, self.latest)
            && bytes > b
            && now > t
        {
            self.close(now, bytes, reads, busy);
        }
        self.last = None;
    }

    fn close(&mut self, now: Instant, bytes: u64, reads: u64, busy: u64) {
        let Some((t, b, r, u)) = self.last else { return };
        let dt = now.duration_since(t).as_secs_f64();
        let mbps = (bytes.saturating_sub(b) as f64 / 1e6 / dt) as u64;
        self.reads_per_s = reads.saturating_sub(r) as f64 / dt;
        self.busy_pct = (100.0 * busy.saturating_sub(u) as f64 / 1e9 / dt).min(100.0);
        self.max_mbps = self.max_mbps.max(mbps);
        self.mbps.push_back(mbps);
        if self.mbps.len() > IO_SAMPLES {
            self.mbps.pop_front();
        }
        self.last = Some((now, bytes, reads, busy));
    }
}

pub const IO_SAMPLES: usize = 120;

/// One decode step's counters: what the pool did during it, and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct Recent {
    pub delta: LayerStats,
    pub ms: f64,
}

/// The recent window's counters, per token where it says so.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RecentSummary {
    pub hit_pct: f64,
    /// Time waiting for reads, ms per token.
    pub stall_ms: f64,
    /// Experts read again within a token of their eviction.
    pub reloads: u64,
    pub prefetch_useful: u64,
    pub prefetch_wasted: u64,
}

/// Steps kept in the recent window.
const RECENT_STEPS: usize = 32;

#[derive(Debug, Default)]
pub struct Store {
    /// The routing heat the panes show (published).
    pub heat: Heat,
    /// The newest published step (routing, the pool's counters, the token count).
    pub step: Option<Step>,
    /// The pool's last published picture (it comes with some steps, not all).
    pub pool: Option<PoolView>,
    pub io: IoHistory,
    /// Per-token counter deltas of the last steps.
    pub recent: VecDeque<Recent>,
    /// While set, the panes keep what they show (the store still takes every step).
    pub frozen: bool,
    heat_live: Heat,
    pending: Option<Step>,
    pool_live: Option<PoolView>,
    published_at: Option<Instant>,
    prev_totals: Option<LayerStats>,
}

impl Store {
    /// Fold in the engine's step `s`; published now if the panes are due.
    pub fn on_step(&mut self, mut s: Step) {
        if let Some(p) = s.pool.take() {
            self.pool_live = Some(*p);
        }
        let totals = s.totals.stats;
        // per-token deltas for the recent window (kept while frozen, so unfreezing is current)
        let delta = self.prev_totals.map_or(totals, |p| totals.sub(&p));
        self.prev_totals = Some(totals);
        if s.step_ms > 0.0 {
            self.recent.push_back(Recent { delta, ms: s.step_ms });
            if self.recent.len() > RECENT_STEPS {
                self.recent.pop_front();
            }
        }
        self.io.step(Instant::now(), totals.bytes_read(), s.totals.reads, s.totals.disk_busy_ns);
        self.heat_live.fold(&s.counts, &s.last);
        self.pending = Some(s);
        if self.due() {
            self.publish();
        }
    }

    /// A reply ended: its last I/O window becomes a point, and everything is shown.
    pub fn reply_done(&mut self) {
        self.io.reply_done();
        self.publish();
    }

    /// Called on every tick: publish what waits once the panes are due.
    pub fn tick(&mut self) {
        if self.pending.is_some() && self.due() {
            self.publish();
        }
    }

    fn due(&self) -> bool {
        self.published_at.is_none_or(|t| t.elapsed() >= PANE_PERIOD)
    }

    /// Show the latest routing and pool state in the panes. The grids change at most every
    /// `PANE_PERIOD` (the text of a reply streams at the full frame rate): redrawing every
    /// cell of a heatmap per token costs the terminal more than it tells the eye.
    pub fn publish(&mut self) {
        if self.frozen {
            return;
        }
        if let Some(s) = self.pending.take() {
            self.heat = self.heat_live.clone();
            self.step = Some(s);
            // the newest picture moves over; without one the last stays
            if let Some(p) = self.pool_live.take() {
                self.pool = Some(p);
            }
            self.published_at = Some(Instant::now());
        }
    }

    /// The recent window's hit rate, stall per token, reloads and prefetch use.
    pub fn recent_summary(&self) -> RecentSummary {
        let mut t = LayerStats::default();
        for r in &self.recent {
            t.add(&r.delta);
        }
        let n = self.recent.len().max(1) as f64;
        RecentSummary {
            hit_pct: t.hit_pct(),
            stall_ms: t.stall_ns as f64 / 1e6 / n,
            reloads: t.reloads_soon,
            prefetch_useful: t.prefetch_useful_bytes,
            prefetch_wasted: t.prefetch_wasted_bytes,
        }
    }

    /// Mean step time of the recent window, ms.
    pub fn recent_step_ms(&self) -> f64 {
        self.recent.iter().map(|r| r.ms).sum::<f64>() / self.recent.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::pool::{PoolSnapshot, PoolTotals, Residency};
    use crate::experts::stats::PredictStats;

    /// A step of one MoE layer of 4 experts after `hits` hits so far; with the pool's picture
    /// (its residency showing `resident` bytes) when given.
    fn step(hits: u64, resident: Option<u64>) -> Step {
        let totals = PoolTotals { stats: LayerStats { hits, ..Default::default() }, reads: 0, disk_busy_ns: 0 };
        let pool = resident.map(|b| {
            let residency =
                Residency { n_layers: 1, num_experts: 4, cells: vec![], resident_bytes: b, budget_bytes: b };
            let snapshot = PoolSnapshot {
                residency,
                totals,
                per_layer: vec![],
                queue: Default::default(),
                read_latency: Default::default(),
            };
            Box::new(PoolView { snapshot, predict: PredictStats::default() })
        });
        Step { token: 1, counts: vec![vec![1, 0, 0, 0]], last: vec![vec![0]], totals, pool, step_ms: 10.0 }
    }

    fn shown_bytes(s: &Store) -> Option<u64> {
        s.pool.as_ref().map(|p| p.snapshot.residency.resident_bytes)
    }

    #[test]
    fn a_step_without_a_picture_keeps_the_last_one() {
        let mut s = Store::default();
        s.on_step(step(1, Some(100)));
        assert_eq!(shown_bytes(&s), Some(100));
        s.on_step(step(2, None));
        s.publish();
        assert_eq!(shown_bytes(&s), Some(100), "the picture stays");
        assert_eq!(s.step.as_ref().map(|x| x.totals.stats.hits), Some(2), "the counters move on");
        s.on_step(step(3, Some(200)));
        s.publish();
        assert_eq!(shown_bytes(&s), Some(200));
    }

    #[test]
    fn a_frozen_store_shows_what_it_showed_and_catches_up_when_thawed() {
        let mut s = Store::default();
        s.on_step(step(1, Some(100)));
        s.frozen = true;
        s.on_step(step(5, Some(300)));
        s.publish();
        assert_eq!(shown_bytes(&s), Some(100));
        assert_eq!(s.recent.len(), 2, "the time series still grows");
        s.frozen = false;
        s.publish();
        assert_eq!(shown_bytes(&s), Some(300));
        assert_eq!(s.step.as_ref().map(|x| x.totals.stats.hits), Some(5));
    }

    #[test]
    fn the_recent_window_holds_per_token_deltas_of_the_last_steps() {
        let mut s = Store::default();
        for i in 0..40u64 {
            s.on_step(step(3 * i, None));
        }
        assert_eq!(s.recent.len(), RECENT_STEPS);
        // every step after the first added 3 hits
        assert!(s.recent.iter().all(|r| r.delta.hits == 3));
        assert_eq!(s.recent_step_ms(), 10.0);
    }

    #[test]
    fn io_windows_give_rate_and_disk_busy_share() {
        let mut h = IoHistory::default();
        let t0 = Instant::now();
        h.step(t0, 0, 0, 0);
        // 100 ms in: the window is still open
        h.step(t0 + Duration::from_millis(100), 10_000_000, 4, 40_000_000);
        assert!(h.mbps.is_empty());
        // 400 ms in: 40 MB, 8 reads and 200 ms with a read in flight over 0.4 s
        h.step(t0 + Duration::from_millis(400), 40_000_000, 8, 200_000_000);
        assert_eq!(h.mbps.back().copied(), Some(100));
        assert!((h.reads_per_s - 20.0).abs() < 1e-9 && (h.busy_pct - 50.0).abs() < 1e-9, "{h:?}");
        // busy time read a little after the step's clock can run past the window: capped at 100%
        h.step(t0 + Duration::from_millis(700), 40_000_000, 8, 200_000_000 + 900_000_000);
        assert_eq!(h.busy_pct, 100.0);
    }
}
