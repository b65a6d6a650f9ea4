//! Which predicted reads are worth making before a layer asks for its experts, from three
//! things measured online: the window (the engine's compute time between the previous layer's
//! last expert coming in and this layer's request: the disk has no demand read then), the time
//! one expert read takes, and how often layers wait for reads (how disk-bound the run is).
//!
//! The i-th read issued (0-based, most confident first) gets the part of the window left after
//! the reads before it: f = clamp(window / read - i, 0, 1) of it is done before the request. If
//! its layer routes it (chance p) that part is saved; if not, the whole read was wasted disk
//! time, which costs only when reads are what the engine waits for (share s of layers). So it is
//! issued when p * f > (1 - p) * s. A read beyond the window (f = 0) starts only once the layer
//! has asked, as a demand read would, so it never pays, and the wrong ones among such reads are
//! read all the same and evict what was resident. (Prefetch with no such cap decoded no faster
//! than no prefetch under a memory cap, the capped one faster: the figures are in CHANGELOG.)

use std::time::Instant;

/// Weight of the newest measurement in the running means (about the last 4 tokens' layers).
const NEW: f64 = 0.25;

#[derive(Debug, Clone)]
pub struct ReadWindow {
    /// Per MoE layer: the mean gap (ns) between the previous layer's last expert arriving and
    /// this layer's request; None until measured.
    gap_ns: Vec<Option<f64>>,
    /// Mean time of one expert read (ns); None until one finished.
    read_ns: Option<f64>,
    /// Share of layers that waited for a read (0 until measured).
    stall_share: f64,
    /// The layer being served waited for a read.
    stalled: bool,
    /// When the last layer's experts were all in (compute began), not yet matched to a request.
    ready_at: Option<Instant>,
}

fn mean(old: Option<f64>, x: f64) -> f64 {
    match old {
        Some(m) => m + NEW * (x - m),
        None => x,
    }
}

impl ReadWindow {
    pub fn new(n_layers: usize) -> ReadWindow {
        ReadWindow { gap_ns: vec![None; n_layers], read_ns: None, stall_share: 0.0, stalled: false, ready_at: None }
    }

    /// The layer being served waited for a read.
    pub fn stalled(&mut self) {
        self.stalled = true;
    }

    /// A layer's last expert was handed out: the engine computes until the next request.
    pub fn layer_ready(&mut self, now: Instant) {
        self.ready_at = Some(now);
        self.stall_share = mean(Some(self.stall_share), if self.stalled { 1.0 } else { 0.0 });
        self.stalled = false;
    }

    /// MoE layer `li` asks for its experts: the gap since the last layer was ready is measured.
    pub fn layer_request(&mut self, li: usize, now: Instant) {
        if let (Some(t), Some(g)) = (self.ready_at.take(), self.gap_ns.get_mut(li)) {
            *g = Some(mean(*g, now.saturating_duration_since(t).as_nanos() as f64));
        }
    }

    /// An expert read took `ns` of the disk's time.
    pub fn read_done(&mut self, ns: u64) {
        self.read_ns = Some(mean(self.read_ns, ns as f64));
    }

    /// Reads for layer `li` that fit before its request (fractional); unbounded until measured.
    fn reads_that_fit(&self, li: usize) -> f64 {
        match (self.gap_ns.get(li).copied().flatten(), self.read_ns) {
            (Some(gap), Some(read)) if read > 0.0 => gap / read,
            _ => f64::INFINITY,
        }
    }

    /// Whether the `i`-th read issued for layer `li` (0-based, most confident first), used with
    /// chance `p`, is worth making (see the module's note).
    pub fn worth_reading(&self, li: usize, i: usize, p: f32) -> bool {
        self.pays(p, (self.reads_that_fit(li) - i as f64).clamp(0.0, 1.0))
    }

    /// Whether a read asked a whole layer before its layer's request (a guess two layers
    /// ahead, read only while the disk idles and superseded by the next layer's own
    /// prediction), used with chance `p`, is worth making: if it is made at all it lands
    /// before the request (f = 1), so only its chance weighs against the disk time it takes.
    pub fn worth_reading_early(&self, p: f32) -> bool {
        self.pays(p, 1.0)
    }

    /// A read done `f` before the request and used with chance `p` saves p f of a read; unused
    /// it costs a read when reads are what the engine waits for.
    fn pays(&self, p: f32, f: f64) -> bool {
        let p = f64::from(p);
        p * f > (1.0 - p) * self.stall_share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A window of `gap_ms` before layer 0's request, reads of `read_ms`, every layer stalled
    /// (`stalls`) or none.
    fn window(gap_ms: u64, read_ms: u64, stalls: bool) -> ReadWindow {
        let mut w = ReadWindow::new(1);
        let t0 = Instant::now();
        w.read_done(read_ms * 1_000_000);
        for i in 0..40 {
            if stalls {
                w.stalled();
            }
            let t = t0 + Duration::from_millis(100 * i);
            w.layer_ready(t);
            w.layer_request(0, t + Duration::from_millis(gap_ms));
        }
        w
    }

    #[test]
    fn before_anything_is_measured_every_read_is_made() {
        let w = ReadWindow::new(2);
        assert!(w.worth_reading(0, 0, 0.01));
        assert!(w.worth_reading(1, 50, 0.01));
        assert!(w.worth_reading(9, 0, 0.01), "a layer out of range is not held back");
    }

    #[test]
    fn a_disk_bound_run_reads_only_what_fits_and_is_likely() {
        // a 3 ms window and 2 ms reads, every layer waiting: read 0 fits (f = 1: p > 1/2),
        // read 1 half fits (f = 1/2: p > 2/3), read 2 does not fit at all
        let w = window(3, 2, true);
        assert!(w.worth_reading(0, 0, 0.55));
        assert!(!w.worth_reading(0, 0, 0.45));
        assert!(w.worth_reading(0, 1, 0.7));
        assert!(!w.worth_reading(0, 1, 0.6));
        assert!(!w.worth_reading(0, 2, 0.99));
    }

    #[test]
    fn a_run_that_never_waits_for_reads_makes_every_read_that_fits() {
        // reads cost nothing the engine waits for: any chance pays while the window lasts
        let w = window(10, 2, false);
        assert!(w.stall_share < 1e-4);
        assert!(w.worth_reading(0, 4, 0.05));
        assert!(!w.worth_reading(0, 5, 0.99), "the sixth read starts after the request");
    }

    #[test]
    fn the_gap_is_measured_from_the_last_layer_ready_to_the_request() {
        let mut w = ReadWindow::new(2);
        let t0 = Instant::now();
        w.read_done(2_000_000);
        w.stalled();
        w.layer_ready(t0);
        w.layer_request(1, t0 + Duration::from_millis(4));
        // 2 reads fit before layer 1's request, the stall share is a quarter: read 1 (f = 1)
        // pays at p = 0.25 (0.25 > 0.75 * 0.25), read 2 (f = 0) never
        assert!(w.worth_reading(1, 1, 0.25));
        assert!(!w.worth_reading(1, 1, 0.15));
        assert!(!w.worth_reading(1, 2, 0.99));
        // a request with no layer ready before it measures nothing
        w.layer_request(1, t0 + Duration::from_millis(100));
        assert!(!w.worth_reading(1, 2, 0.99));
        // layer 0's window is unmeasured: any number of reads fit, each still weighed
        assert!(w.worth_reading(0, 7, 0.3));
        assert!(!w.worth_reading(0, 7, 0.1));
    }
}
