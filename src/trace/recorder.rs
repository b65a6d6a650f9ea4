//! The trace recorder: per-thread buffers of slices, counters, instants and flows, stamped in
//! nanoseconds from one monotonic clock.
//!
//! Off (the default), every entry point costs one relaxed atomic load and returns. On, an event
//! is one push into the calling thread's own buffer (a mutex only the exporter ever contends
//! for). A cap on the number of events keeps a long session loadable; what it drops is counted
//! and reported in the trace's metadata, never lost silently.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);
/// When recording started: (OS clock, ticks).
static START: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
static USE_TSC: OnceLock<bool> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();
static CAP: AtomicUsize = AtomicUsize::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);
/// At the cap, drop the oldest events (a thread its own) instead of the new ones.
static RING: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);
static REGISTRY: Mutex<Vec<Arc<Mutex<ThreadBuf>>>> = Mutex::new(Vec::new());

/// A value attached to a slice, counter or instant.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    I(i64),
    F(f64),
    S(String),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

impl From<usize> for Arg {
    fn from(v: usize) -> Arg {
        Arg::I(v as i64)
    }
}
impl From<u64> for Arg {
    fn from(v: u64) -> Arg {
        Arg::I(v as i64)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::I(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Arg {
        Arg::F(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F(v as f64)
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::S(v.to_string())
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Arg {
        Arg::S(v)
    }
}
impl From<&[usize]> for Arg {
    fn from(v: &[usize]) -> Arg {
        Arg::Ints(v.iter().map(|&x| x as i64).collect())
    }
}
impl From<&[f32]> for Arg {
    fn from(v: &[f32]) -> Arg {
        Arg::Floats(v.iter().map(|&x| x as f64).collect())
    }
}

pub type Args = Vec<(&'static str, Arg)>;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A complete slice: `[ts, ts + dur)` on this thread. (Ticks while recording, nanoseconds
    /// in a [`Recording`].)
    Slice { name: &'static str, ts: u64, dur: u64, args: Args },
    /// Counter values (one track per key).
    Counter { name: &'static str, ts: u64, values: Vec<(&'static str, f64)> },
    /// A thread-scoped instant.
    Instant { name: &'static str, ts: u64, args: Args },
    /// Start (`start = true`) or end of flow `id`, bound to the slice enclosing `ts` on this
    /// thread.
    Flow { id: u64, ts: u64, start: bool },
}

/// One thread's events.
#[derive(Debug, Clone)]
pub struct ThreadBuf {
    pub tid: u64,
    pub name: String,
    pub events: Vec<Event>,
    /// The last slice pushed by [`Span::merge_with`]: (merge key, index in `events`).
    merge: Option<(u64, usize)>,
}

thread_local! {
    static LOCAL: RefCell<Option<Arc<Mutex<ThreadBuf>>>> = const { RefCell::new(None) };
}

/// Whether recording is on.
#[inline]
/// Memory the event buffers take now, about: their capacity (a growing buffer holds up to
/// twice what it has recorded) plus the arguments' own allocations, estimated from each
/// thread's latest events so the recording threads are held up only briefly.
pub fn bytes_held() -> u64 {
    const SAMPLE: usize = 256;
    let reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let mut total = 0usize;
    for b in reg.iter() {
        let b = b.lock().unwrap_or_else(|p| p.into_inner());
        total += b.events.capacity() * std::mem::size_of::<Event>();
        let n = b.events.len();
        let tail = &b.events[n.saturating_sub(SAMPLE)..];
        if !tail.is_empty() {
            let heap: usize = tail.iter().map(heap_bytes).sum();
            total += heap * n / tail.len();
        }
    }
    total as u64
}

/// Heap bytes an event owns beyond its own size.
fn heap_bytes(e: &Event) -> usize {
    let args = |a: &Args| {
        a.capacity() * std::mem::size_of::<(&'static str, Arg)>()
            + a.iter()
                .map(|(_, v)| match v {
                    Arg::S(s) => s.capacity(),
                    Arg::Ints(x) => x.capacity() * 8,
                    Arg::Floats(x) => x.capacity() * 8,
                    _ => 0,
                })
                .sum::<usize>()
    };
    match e {
        Event::Slice { args: a, .. } | Event::Instant { args: a, .. } => args(a),
        Event::Counter { values, .. } => values.capacity() * std::mem::size_of::<(&'static str, f64)>(),
        Event::Flow { .. } => 0,
    }
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The trace clock. While recording, events are stamped in raw ticks: on x86-64 with an
/// invariant TSC (constant and non-stop, as Linux reports it) the time-stamp counter, read in a
/// few nanoseconds instead of the ~25 ns of the OS clock; elsewhere nanoseconds of the OS
/// monotonic clock. When recording stops, ticks are mapped linearly onto the OS monotonic
/// clock measured at start and stop, so exported timestamps are nanoseconds since `start`.
#[inline]
pub fn now_ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if *USE_TSC.get_or_init(invariant_tsc) {
        // SAFETY: rdtsc has no preconditions on x86-64.
        return unsafe { std::arch::x86_64::_rdtsc() };
    }
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn invariant_tsc() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines().find(|l| l.starts_with("flags")).is_some_and(|l| {
            l.split_whitespace().any(|f| f == "constant_tsc") && l.split_whitespace().any(|f| f == "nonstop_tsc")
        })
    })
}

/// Start recording (dropping anything recorded before), keeping at most `cap` events.
/// Start recording, keeping the newest `cap` events once there are more (the workbench: its
/// export should hold the latest tokens of a long session).
pub fn start_ring(cap: usize) {
    RING.store(true, Ordering::SeqCst);
    start_inner(cap);
}

/// Start recording; at `cap` events, later ones are dropped (and counted).
pub fn start(cap: usize) {
    RING.store(false, Ordering::SeqCst);
    start_inner(cap);
}

fn start_inner(cap: usize) {
    now_ticks();
    for b in REGISTRY.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
        b.events.clear();
        b.merge = None;
    }
    CAP.store(cap, Ordering::Relaxed);
    COUNT.store(0, Ordering::Relaxed);
    DROPPED.store(0, Ordering::Relaxed);
    *START.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), now_ticks()));
    ENABLED.store(true, Ordering::SeqCst);
}

/// What was recorded.
#[derive(Debug, Clone)]
pub struct Recording {
    pub threads: Vec<ThreadBuf>,
    pub cap: usize,
    /// Events not recorded (or, in ring mode, dropped as the oldest) because of the cap.
    pub dropped: usize,
    /// Ring mode: the recording holds the newest events.
    pub ring: bool,
    /// Which clock stamped the events: "tsc" or "os" (both exported as ns since `start`).
    pub clock: &'static str,
}

/// Stop recording and take every thread's events, timestamps in nanoseconds since `start`.
pub fn stop() -> Recording {
    ENABLED.store(false, Ordering::SeqCst);
    collect(true)
}

/// A copy of everything recorded so far, timestamps in nanoseconds since `start`, while
/// recording goes on (the workbench's "export the trace so far").
pub fn snapshot() -> Recording {
    collect(false)
}

/// Every thread's events, taken out of the buffers (`take`, which also ends the recording's
/// clock) or copied, with their ticks turned into nanoseconds since `start`.
fn collect(take: bool) -> Recording {
    let (t1, k1) = (Instant::now(), now_ticks());
    let start = {
        let mut s = START.lock().unwrap_or_else(|p| p.into_inner());
        if take { s.take() } else { *s }
    };
    let (t0, k0) = start.unwrap_or((t1, k1));
    let scale = if k1 > k0 { t1.duration_since(t0).as_nanos() as f64 / (k1 - k0) as f64 } else { 1.0 };
    let ns = |k: u64| (k.saturating_sub(k0) as f64 * scale) as u64;
    let mut threads: Vec<ThreadBuf> = REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|b| {
            let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
            let events = if take { std::mem::take(&mut b.events) } else { b.events.clone() };
            if take {
                b.merge = None;
            }
            ThreadBuf { tid: b.tid, name: b.name.clone(), events, merge: None }
        })
        .collect();
    for t in &mut threads {
        for e in &mut t.events {
            map_event(e, &ns);
        }
    }
    let clock = if cfg!(target_arch = "x86_64") && *USE_TSC.get_or_init(invariant_tsc) { "tsc" } else { "os" };
    Recording {
        threads,
        cap: CAP.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        ring: RING.load(Ordering::Relaxed),
        clock,
    }
}

fn map_event(e: &mut Event, ns: &dyn Fn(u64) -> u64) {
    match e {
        Event::Slice { ts, dur, .. } => {
            // end first, from the raw start, so a parent still contains its children
            let end = ns(*ts + *dur);
            *ts = ns(*ts);
            *dur = end - *ts;
        }
        Event::Counter { ts, .. } | Event::Instant { ts, .. } | Event::Flow { ts, .. } => *ts = ns(*ts),
    }
}

/// Name the calling thread's track (otherwise the OS thread name is used).
pub fn set_thread_name(name: &str) {
    with_buf(|b| b.name = name.to_string());
}

fn with_buf<R>(f: impl FnOnce(&mut ThreadBuf) -> R) -> R {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let buf = l.get_or_insert_with(|| {
            let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
            let name = std::thread::current().name().map(String::from).unwrap_or_else(|| format!("thread-{tid}"));
            // room for a few thousand tokens' worth of events before the first reallocation
            let events = Vec::with_capacity(1 << 14);
            let b = Arc::new(Mutex::new(ThreadBuf { tid, name, events, merge: None }));
            REGISTRY.lock().unwrap_or_else(|p| p.into_inner()).push(b.clone());
            b
        });
        let mut g = buf.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    })
}

/// Room for `n` more events in `b` under the cap? In ring mode, the thread makes room by
/// dropping its own oldest eighth (amortized: one move of the buffer per len/8 events).
fn admit(b: &mut ThreadBuf, n: usize) -> bool {
    if COUNT.fetch_add(n, Ordering::Relaxed) + n <= CAP.load(Ordering::Relaxed) {
        return true;
    }
    if RING.load(Ordering::Relaxed) && !b.events.is_empty() {
        let k = (b.events.len() / 8).max(n).min(b.events.len());
        b.events.drain(..k);
        // indices moved: the next chunk starts a slice of its own
        b.merge = None;
        COUNT.fetch_sub(k, Ordering::Relaxed);
        DROPPED.fetch_add(k, Ordering::Relaxed);
        return true;
    }
    if RING.load(Ordering::Relaxed) {
        // nothing of this thread's to drop: the count stays what is held
        COUNT.fetch_sub(n, Ordering::Relaxed);
    }
    DROPPED.fetch_add(n, Ordering::Relaxed);
    false
}

fn push(e: Event) {
    with_buf(|b| {
        if admit(b, 1) {
            b.merge = None;
            b.events.push(e)
        }
    });
}

/// A slice being timed; recorded when dropped. Spans on one thread must be dropped in reverse
/// order of creation (scoped guards do that), so slices nest.
#[must_use = "a span records when dropped; bind it to a variable"]
pub struct Span {
    open: Option<Open>,
}

struct Open {
    name: &'static str,
    start: u64,
    args: Args,
    merge: Option<u64>,
}

/// Start a slice named `name` on this thread.
#[inline]
pub fn span(name: &'static str) -> Span {
    if !enabled() {
        return Span { open: None };
    }
    Span { open: Some(Open { name, start: now_ticks(), args: Vec::new(), merge: None }) }
}

impl Span {
    /// Attach an argument (computed even when tracing is off: keep it cheap, or use
    /// [`Span::args_with`]).
    #[inline]
    pub fn arg(mut self, key: &'static str, v: impl Into<Arg>) -> Span {
        if let Some(o) = self.open.as_mut() {
            o.args.push((key, v.into()));
        }
        self
    }

    /// Attach arguments computed only when tracing is on.
    #[inline]
    pub fn args_with(mut self, f: impl FnOnce(&mut Args)) -> Span {
        if let Some(o) = self.open.as_mut() {
            f(&mut o.args);
        }
        self
    }

    /// Add an argument after the span started (a result known only at the end).
    #[inline]
    pub fn set(&mut self, key: &'static str, v: impl Into<Arg>) {
        if let Some(o) = self.open.as_mut() {
            o.args.push((key, v.into()));
        }
    }

    /// Merge this slice into the previous one on this thread when that one carried the same
    /// `key` and nothing was recorded in between (consecutive chunks of one parallel section
    /// become one slice per worker).
    #[inline]
    pub fn merge_with(mut self, key: u64) -> Span {
        if let Some(o) = self.open.as_mut() {
            o.merge = Some(key);
        }
        self
    }

    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }

    /// Start `n` flows from this slice (ids `base..base + n`); receivers end theirs with
    /// [`flow_end`] or [`flow_in`]. A flow nobody ends is dropped by the exporter.
    pub fn flows_out(&self, n: usize) -> Option<u64> {
        self.open.as_ref()?;
        let base = NEXT_ID.fetch_add(n as u64, Ordering::Relaxed);
        let ts = now_ticks();
        // all under the cap or none: a partial set would leave unmatched flows anyway
        with_buf(|b| {
            if admit(b, n) {
                b.merge = None;
                b.events.extend((base..base + n as u64).map(|id| Event::Flow { id, ts, start: true }));
            }
        });
        Some(base)
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(o) = self.open.take() else {
            return;
        };
        let end = now_ticks();
        if let Some(key) = o.merge {
            with_buf(|b| match b.merge {
                Some((k, i)) if k == key && i + 1 == b.events.len() => {
                    if let Some(Event::Slice { ts, dur, .. }) = b.events.get_mut(i) {
                        *dur = end - *ts;
                    }
                }
                _ => {
                    if admit(b, 1) {
                        b.events.push(Event::Slice { name: o.name, ts: o.start, dur: end - o.start, args: o.args });
                        b.merge = Some((key, b.events.len() - 1));
                    }
                }
            });
            return;
        }
        push(Event::Slice { name: o.name, ts: o.start, dur: end - o.start, args: o.args });
    }
}

/// End flow `id` here (call inside the slice that receives the work).
pub fn flow_end(id: Option<u64>) {
    if let Some(id) = id.filter(|_| enabled()) {
        push(Event::Flow { id, ts: now_ticks(), start: false });
    }
}

/// End flow `id` inside a chunk slice of the parallel section `key`, but only in the first
/// chunk this thread runs of that section (the later ones merge into its slice).
pub fn flow_in(id: Option<u64>, key: u64) {
    let Some(id) = id.filter(|_| enabled()) else {
        return;
    };
    let continuing = with_buf(|b| matches!(b.merge, Some((k, i)) if k == key && i + 1 == b.events.len()));
    if !continuing {
        push(Event::Flow { id, ts: now_ticks(), start: false });
    }
}

/// Record counter values now.
pub fn counter(name: &'static str, values: &[(&'static str, f64)]) {
    if enabled() {
        push(Event::Counter { name, ts: now_ticks(), values: values.to_vec() });
    }
}

/// Record an instant now.
pub fn instant(name: &'static str, args: Args) {
    if enabled() {
        push(Event::Instant { name, ts: now_ticks(), args });
    }
}

/// Named tracks that are not threads (the server's requests), each one buffer any thread may
/// add to.
static TRACKS: Mutex<Vec<(&'static str, SharedBuf)>> = Mutex::new(Vec::new());

/// A track's buffer, shared by the registry and whoever records on it.
type SharedBuf = Arc<Mutex<ThreadBuf>>;

/// Record a slice from `start` (a [`now_ticks`] reading) to now on the named track `track`
/// rather than the calling thread's. Slices of one track must not overlap (a track is drawn as
/// one row): one engine's requests, one after another.
pub fn track_slice(track: &'static str, name: &'static str, start: u64, args: Args) {
    if !enabled() {
        return;
    }
    let end = now_ticks();
    let buf = {
        let mut tracks = TRACKS.lock().unwrap_or_else(|p| p.into_inner());
        match tracks.iter().find(|(n, _)| *n == track) {
            Some((_, b)) => b.clone(),
            None => {
                let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
                let b =
                    Arc::new(Mutex::new(ThreadBuf { tid, name: track.to_string(), events: Vec::new(), merge: None }));
                REGISTRY.lock().unwrap_or_else(|p| p.into_inner()).push(b.clone());
                tracks.push((track, b.clone()));
                b
            }
        }
    };
    let mut b = buf.lock().unwrap_or_else(|p| p.into_inner());
    if admit(&mut b, 1) {
        b.events.push(Event::Slice { name, ts: start.min(end), dur: end.saturating_sub(start), args });
    }
}

/// A fresh id for a parallel section (the merge key of its chunks).
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}
