//! Cost of the trace recorder per event: off (the default: one relaxed atomic load) and on
//! (a push into the thread's own buffer). `cargo bench --bench trace_overhead`.
//! The whole-engine cost is measured with `moescope bench` runs with and without `--trace`.

use std::hint::black_box;
use std::time::Instant;

use moescope::trace::{self, recorder};

/// Best of 7 rounds of `n` calls; a round starts with empty (but allocated) buffers, like a
/// trace in steady state.
fn per_call_ns(n: u64, f: impl Fn(u64)) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        if trace::enabled() {
            recorder::start(usize::MAX);
        }
        let t = Instant::now();
        for i in 0..n {
            f(black_box(i));
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

fn main() {
    let n = 200_000;
    let off_span = per_call_ns(n, |i| {
        let _s = trace::span("x").arg("i", i);
    });
    let off_counter = per_call_ns(n, |i| trace::counter("c", &[("v", i as f64)]));
    recorder::start(usize::MAX);
    let on_span = per_call_ns(n, |i| {
        let _s = trace::span("x").arg("i", i);
    });
    let on_merged = per_call_ns(n, |i| {
        let _s = trace::span("x").merge_with(7);
        black_box(i);
    });
    let rec = recorder::stop();
    let events: usize = rec.threads.iter().map(|t| t.events.len()).sum();
    println!("trace off: span + arg {off_span:.1} ns, counter {off_counter:.1} ns");
    println!(
        "trace on:  span + arg {on_span:.1} ns, merged chunk span {on_merged:.1} ns ({events} events in the last round)"
    );
}
