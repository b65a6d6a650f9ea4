//! The compute threads: a fork-join pool made for decode, which issues hundreds of small
//! parallel sections per token (every matrix product, every attention). With rayon, each
//! section woke a sleeping worker and the caller slept until it finished: the hand-over took
//! most of a small expert product's time (seen in the trace). Here the caller works too (one thread: no hand-over at all), and workers
//! spin for a while after a section before they sleep, so the next one starts at once.
//!
//! With more threads than the CPUs the process may use, spinning would take the cores from the
//! threads with work: then workers sleep as soon as a section is over and the caller sleeps
//! until the last task of its section is done (`-t 3` on 2 cores: prefill 0.85x of `-t 2` with
//! spinning). While other threads take the cores (a worker sees itself preempted often:
//! [`CONTENDED_PER_S`]), the waiting threads give way at every turn of their spin instead of
//! every 64th: sleeping there cost decode at 16 threads, whose hundreds of sections per token
//! each woke the workers, and the engine's own threads preempt a worker now and then.
//!
//! A section is `tasks` calls of `f(task, participant)`. The job's generation, its task count
//! and the next unclaimed task live in one atomic word, so a claim sees all three at once and a
//! worker late for one section can never run a task of the next under the old section's count
//! (a late claim that lands in the next section runs that section's task).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type JobFn = dyn Fn(usize, usize) + Sync;

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// A worker preempted this often (involuntary context switches a second) is losing its core to
/// other work: the pool's waiting threads yield at every turn for [`CONTENDED_HOLD`]. Alone on its core a thread sees a
/// few a second (timer and kernel threads); sharing it, one every scheduler slice (3-6 ms).
const CONTENDED_PER_S: u64 = 100;
/// How often a worker reads its preemption count, and how long a contended reading holds.
const CONTENDED_CHECK: Duration = Duration::from_millis(50);
const CONTENDED_HOLD: Duration = Duration::from_secs(1);

/// Whether `switches` involuntary context switches in `elapsed` mean the thread is contended.
fn contended(switches: u64, elapsed: Duration) -> bool {
    switches * 1000 >= CONTENDED_PER_S * elapsed.as_millis().max(1) as u64
}

// state word: generation (24 bits) | task count (20 bits) | next task (20 bits)
const FIELD: u64 = 20;
const MASK: u64 = (1 << FIELD) - 1;
/// Most tasks one section may have.
pub const MAX_TASKS: usize = (1 << FIELD) as usize - 1024;

fn pack(gen_: u64, tasks: u64) -> u64 {
    (gen_ << (2 * FIELD)) | (tasks << FIELD)
}

fn unpack(v: u64) -> (u64, usize, usize) {
    (v >> (2 * FIELD), ((v >> FIELD) & MASK) as usize, (v & MASK) as usize)
}

struct Shared {
    state: AtomicU64,
    /// The running section's function, valid while one of its tasks is unfinished.
    job: UnsafeCell<Option<&'static JobFn>>,
    done: AtomicUsize,
    stop: AtomicBool,
    sleepers: Mutex<usize>,
    wake: Condvar,
    /// More participants than CPUs: nobody spins, the caller sleeps until its section's last
    /// task is done (see the module doc).
    passive: bool,
    /// Until when (ms since `epoch`) the waiting threads yield at every turn: a worker was
    /// contended.
    contended_until: AtomicU64,
    epoch: Instant,
    finished: Mutex<()>,
    finished_cv: Condvar,
    /// Workers that have begun running.
    started: AtomicUsize,
}

impl Shared {
    /// How often a spinning thread yields its core now: at every turn while contended lately,
    /// else every 64th (a worker preempted mid-task, or a predictor or I/O thread, may need it).
    fn yield_every(&self) -> u32 {
        let now = self.epoch.elapsed().as_millis() as u64;
        if now < self.contended_until.load(Ordering::Relaxed) { 1 } else { 64 }
    }
}

// SAFETY: `job` is written only by the caller of `run` while no section is running, and read by
// workers only after claiming a task of the running section (see `run`); everything else is
// atomics and a mutex.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    participants: usize,
    /// Serializes callers (one section at a time).
    running: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` participants: the caller of `run` and `threads - 1` workers named
    /// `moescope-compute-{i}`.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        Pool::with_options(threads, threads > crate::sysinfo::logical_cores(), &[])
    }

    /// [`new`](Self::new), sleeping between sections instead of spinning when `passive`, and
    /// with worker `i` pinned to CPU `pin[i % pin.len()]` (none pinned when `pin` is empty;
    /// the caller, participant 0, is never pinned: threads it starts later would inherit it).
    pub fn with_options(threads: usize, passive: bool, pin: &[usize]) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            done: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
            passive,
            contended_until: AtomicU64::new(0),
            epoch: Instant::now(),
            finished: Mutex::new(()),
            finished_cv: Condvar::new(),
            started: AtomicUsize::new(0),
        });
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let sh = shared.clone();
            let cpu = (!pin.is_empty()).then(|| pin[i % pin.len()]);
            let h = std::thread::Builder::new().name(format!("moescope-compute-{i}")).spawn(move || {
                if let Some(c) = cpu {
                    crate::sysinfo::pin_to(c);
                }
                worker(&sh, i)
            });
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    let p = Pool { shared, workers, participants: i, running: Mutex::new(()) };
                    drop(p);
                    return Err(e);
                }
            }
        }
        // ready when every worker runs: a thread's start (the runtime's own allocations, the
        // first scheduling on a loaded machine) then never lands in the first sections
        while shared.started.load(Ordering::Acquire) < workers.len() {
            std::thread::yield_now();
        }
        Ok(Pool { shared, workers, participants: threads.max(1), running: Mutex::new(()) })
    }

    pub fn threads(&self) -> usize {
        self.participants
    }

    /// Call `f(task, participant)` for every task in `0..tasks`, spread over the participants
    /// (the caller is participant 0); returns when all have returned.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if self.participants == 1 || tasks == 1 {
            for t in 0..tasks {
                f(t, 0);
            }
            return;
        }
        assert!(tasks <= MAX_TASKS, "a parallel section of {tasks} tasks (at most {MAX_TASKS})");
        let _one = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let sh = &*self.shared;
        // SAFETY: the lifetime is erased only for the duration of this call: workers touch the
        // function only after claiming one of this section's tasks, and this call returns after
        // all of them are done, so no worker can call it later.
        let erased: &'static JobFn =
            unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync + '_), &'static JobFn>(f) };
        let gen_ = (unpack(sh.state.load(Ordering::Relaxed)).0 + 1) & ((1 << (64 - 2 * FIELD)) - 1);
        // SAFETY: no section is running (the previous `run` returned after all its tasks were
        // done, and `running` keeps other callers out): nobody reads `job` now
        unsafe { *sh.job.get() = Some(erased) };
        sh.done.store(0, Ordering::Relaxed);
        sh.state.store(pack(gen_, tasks as u64), Ordering::Release);
        {
            let s = sh.sleepers.lock().unwrap_or_else(|p| p.into_inner());
            if *s > 0 {
                sh.wake.notify_all();
            }
        }
        // work alongside the workers
        claim_and_run(sh, 0);
        if sh.passive {
            let mut f = sh.finished.lock().unwrap_or_else(|p| p.into_inner());
            while sh.done.load(Ordering::Acquire) < tasks {
                f = sh.finished_cv.wait(f).unwrap_or_else(|p| p.into_inner());
            }
            return;
        }
        let (mut spins, every) = (0u32, sh.yield_every());
        while sh.done.load(Ordering::Acquire) < tasks {
            spins += 1;
            if spins.is_multiple_of(every) {
                // a worker preempted mid-task, or a predictor or I/O thread, may need this core
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }
}

/// Claim and run tasks until a claim finds none left; returns the generation of that claim.
/// A claim may land in a newer section than the one that woke us (the caller published it
/// meanwhile): the task claimed is then that section's and is run like any other, or it would
/// be lost.
fn claim_and_run(sh: &Shared, me: usize) -> u64 {
    loop {
        let v = sh.state.fetch_add(1, Ordering::AcqRel);
        let (g, tasks, i) = unpack(v);
        if i >= tasks {
            return g;
        }
        // SAFETY: task i of the running section is claimed and unfinished, so its caller is
        // still inside `run` and `job` holds its function
        let f = unsafe { (*sh.job.get()).expect("a running section has a function") };
        f(i, me);
        if sh.done.fetch_add(1, Ordering::Release) + 1 == tasks && sh.passive {
            // the caller may be asleep: taking the lock orders this after its last check
            let _f = sh.finished.lock().unwrap_or_else(|p| p.into_inner());
            sh.finished_cv.notify_one();
        }
    }
}

fn worker(sh: &Shared, me: usize) {
    crate::sysinfo::batch_scheduling();
    sh.started.fetch_add(1, Ordering::Release);
    let mut seen = unpack(sh.state.load(Ordering::Acquire)).0;
    let (mut checked, mut switches) = (Instant::now(), crate::sysinfo::involuntary_switches());
    loop {
        if checked.elapsed() >= CONTENDED_CHECK {
            let now = crate::sysinfo::involuntary_switches();
            if contended(now.saturating_sub(switches), checked.elapsed()) {
                let until = (sh.epoch.elapsed() + CONTENDED_HOLD).as_millis() as u64;
                sh.contended_until.fetch_max(until, Ordering::Relaxed);
            }
            (checked, switches) = (Instant::now(), now);
        }
        let (passive, every) = (sh.passive, sh.yield_every());
        // spin for the next section, then sleep
        let start = Instant::now();
        let mut n = 0u32;
        let gen_ = loop {
            let g = unpack(sh.state.load(Ordering::Acquire)).0;
            if g != seen {
                break Some(g);
            }
            if sh.stop.load(Ordering::Relaxed) {
                return;
            }
            n += 1;
            if n.is_multiple_of(every) || passive {
                if passive || start.elapsed() > SPIN {
                    break None;
                }
                // the engine's other threads (predictor, I/O workers) need a core now and then
                // between sections: with every core spinning they would wait for a timeslice
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        };
        let g = match gen_ {
            Some(g) => g,
            None => {
                let mut s = sh.sleepers.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    let g = unpack(sh.state.load(Ordering::Acquire)).0;
                    if g != seen || sh.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    *s += 1;
                    s = sh.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                    *s -= 1;
                }
                if sh.stop.load(Ordering::Relaxed) {
                    return;
                }
                unpack(sh.state.load(Ordering::Acquire)).0
            }
        };
        let _ = g;
        seen = claim_and_run(sh, me);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _s = self.shared.sleepers.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_per_section_whatever_the_timing() {
        // spinning, and sleeping as with more threads than CPUs
        for (threads, passive) in [1, 2, 3, 5].into_iter().flat_map(|t| [(t, false), (t, true)]) {
            let pool = Pool::with_options(threads, passive, &[]).unwrap();
            for round in 0..2000 {
                let tasks = 1 + round % 17;
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.run(tasks, &|t, p| {
                    assert!(p < threads);
                    hits[t].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{threads} threads, round {round}");
                if round % 500 == 0 {
                    // let the workers fall asleep, then wake them
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn pinned_workers_run_on_their_cpu_alone() {
        let cpus = crate::sysinfo::allowed_cpus();
        assert!(!cpus.is_empty(), "the affinity mask is readable");
        let threads = cpus.len() + 2;
        let pool = Pool::with_options(threads, true, &cpus).unwrap();
        let seen: Vec<Mutex<Vec<usize>>> = (0..threads).map(|_| Mutex::new(Vec::new())).collect();
        // enough tasks, slow enough, that every worker takes some
        for _ in 0..50 {
            pool.run(4 * threads, &|_, p| {
                std::thread::sleep(Duration::from_micros(200));
                *seen[p].lock().unwrap() = crate::sysinfo::allowed_cpus();
            });
        }
        for (p, s) in seen.iter().enumerate().skip(1) {
            let s = s.lock().unwrap();
            if !s.is_empty() {
                assert_eq!(*s, vec![cpus[p % cpus.len()]], "worker {p}");
            }
        }
        assert!(seen.iter().skip(1).filter(|s| !s.lock().unwrap().is_empty()).count() >= 1, "no worker ran a task");
        // the caller keeps its mask
        assert_eq!(*seen[0].lock().unwrap(), cpus);
    }

    #[test]
    fn preempted_often_means_contended() {
        let ms = Duration::from_millis;
        // one preemption per 3-6 ms slice: sharing the core
        assert!(contended(10, ms(50)) && contended(17, ms(50)));
        // a few a second: alone on it
        assert!(!contended(0, ms(50)) && !contended(4, ms(50)) && !contended(9, ms(100)));
        assert!(contended(5, ms(50)) && !contended(4, ms(50)), "100 a second is the line");
        assert!(contended(1, ms(0)), "no elapsed time: any switch counts");
        // the count is this thread's own (Linux): it reads and does not go backwards
        #[cfg(target_os = "linux")]
        {
            let a = crate::sysinfo::involuntary_switches();
            std::thread::yield_now();
            assert!(crate::sysinfo::involuntary_switches() >= a);
        }
    }

    #[test]
    fn sections_from_several_callers_do_not_mix() {
        let pool = Arc::new(Pool::new(3).unwrap());
        let hs: Vec<_> = (0..3)
            .map(|c| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..300 {
                        let sum = AtomicUsize::new(0);
                        pool.run(8, &|t, _| {
                            sum.fetch_add(t + c * 100, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 28 + 8 * c * 100);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}
