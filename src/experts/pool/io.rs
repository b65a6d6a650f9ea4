//! The pool's threads: I/O workers that read expert blobs into slots, and the filler that
//! allocates buffers ahead of their first read.

use std::time::{Duration, Instant};

use super::Shared;
use super::slots::{Origin, State};
use crate::experts::store::{AlignedBuf, ReadError};
use crate::trace;

/// Speculative and prefetch reads go in pieces of this many bytes; between two, a read stands
/// aside while a demand read is queued or in flight (a disk gives two concurrent reads about
/// half its bandwidth each, so a demand read beside a whole blob's prefetch would take twice as
/// long).
const PIECE: usize = 512 * 1024;

/// An I/O worker: demand reads first, then the most confident prefetch. With several workers,
/// the first reads only on demand, so a demanded expert never waits behind predictions.
pub(super) fn io_worker(sh: &Shared, demand_only: bool) {
    trace::recorder::set_thread_name(std::thread::current().name().unwrap_or("moescope-io"));
    let blob_len = sh.dims.blob_len;
    loop {
        let mut st = sh.lock();
        let si = loop {
            if st.shutdown {
                return;
            }
            if let Some(si) = st.next_read(demand_only) {
                break si;
            }
            st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        let Some(mut job) = st.start_read(si) else { continue };
        drop(st);

        let blob = sh.store.slot_of(job.key.0, job.key.1);
        let mut span = trace::span("read")
            .arg("layer", job.key.0)
            .arg("expert", job.key.1)
            .arg("bytes", sh.store.len_of(blob))
            .arg("origin", if job.origin == Origin::Demand { "demand" } else { "prefetch" })
            .arg("queue_wait_us", job.waited.as_micros() as u64);
        trace::flow_end(job.flow_issue);
        let mut b = job.buf.take().unwrap_or_else(|| AlignedBuf::new(blob_len));
        let t_read = Instant::now();
        let mut paused = Duration::ZERO;
        let res = if job.origin == Origin::Prefetch && sh.n_workers > 1 {
            let r = read_standing_aside(sh, si, blob, &mut b);
            if let Ok(p) = &r {
                paused = *p;
                span.set("paused_us", p.as_micros() as u64);
            }
            r.map(|_| ())
        } else {
            sh.store.read(blob, &mut b)
        };
        // the disk's time for this read: time spent standing aside is the demand reads'
        let read_ns = t_read.elapsed().saturating_sub(paused).as_nanos() as u64;
        let flow_use = span.flows_out(1);
        if let Err(e) = &res {
            span.set("error", e.to_string());
        }
        drop(span);

        let mut st = sh.lock();
        if st.finish_read(&job, b, res.map_err(|e| e.to_string()), read_ns, flow_use) {
            // the disk is the prefetches' again (queued ones, and a paused one)
            sh.work.notify_all();
        }
        drop(st);
        sh.ready.notify_all();
    }
}

/// Read a prefetched blob piece by piece into `b`, standing aside before each piece while a
/// demand read is queued or in flight (unless this blob is now demanded itself); the time spent
/// aside.
fn read_standing_aside(sh: &Shared, si: usize, blob: usize, b: &mut AlignedBuf) -> Result<Duration, ReadError> {
    let blob_len = sh.store.len_of(blob);
    let mut paused = Duration::ZERO;
    let mut from = 0;
    while from < blob_len {
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
        let to = (from + PIECE).min(blob_len);
        sh.store.read_part(blob, b, from, to)?;
        from = to;
    }
    sh.store.check(blob, b)?;
    Ok(paused)
}

/// Allocate the pool's buffers ahead of their first read, as spares, until the budget has all
/// its buffers. A fresh buffer's pages are allocated and zeroed by whoever first writes them;
/// left to the first read into it, that is the I/O thread, on the read's critical path (an
/// emptied pool that kept its buffers decoded faster cold). This thread runs only when a core
/// would otherwise idle (SCHED_IDLE: while the engine waits for reads, say), so it takes no
/// time from compute.
pub(super) fn fill_spares(sh: &Shared) {
    trace::recorder::set_thread_name("moescope-pool-fill");
    crate::sysinfo::idle_scheduling();
    let room = |st: &State| !st.shutdown && st.spare.len() + st.used_slots() < st.capacity;
    loop {
        if !room(&sh.lock()) {
            return;
        }
        let mut b = AlignedBuf::new(sh.dims.blob_len);
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
