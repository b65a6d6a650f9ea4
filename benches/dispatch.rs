//! What one parallel section costs: the engine's own pool (`src/model/pool.rs`) against rayon,
//! at 1 and 2 threads, for sections of `tasks` tiny tasks (the hand-over, not the work) and of
//! work the size of one decode product chunk. Decode issues a few hundred sections per token,
//! so microseconds here are a few percent of a token. `cargo bench --bench dispatch`.
//!
//! rayon runs each section with `install` + `par_iter` over the tasks, the way the engine
//! used it before its own pool.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use moescope::exec::pool::Pool;
use rayon::prelude::*;

/// A task: `work` rounds of cheap arithmetic (0: the hand-over alone).
fn task(i: usize, work: u64, sink: &AtomicU64) {
    let mut x = i as u64;
    for _ in 0..work {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    }
    sink.fetch_add(black_box(x) & 1, Ordering::Relaxed);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median µs per section over 9 rounds of `n` sections.
fn per_section_us(n: usize, mut section: impl FnMut()) -> f64 {
    let mut rounds = vec![];
    for _ in 0..9 {
        let t = Instant::now();
        for _ in 0..n {
            section();
        }
        rounds.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    median(rounds)
}

fn main() {
    let sink = AtomicU64::new(0);
    for threads in [1usize, 2] {
        let pool = Pool::new(threads).expect("pool");
        let ray = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("rayon");
        // 8 tasks (the engine splits a product into 4 chunks per thread); work 0 = the
        // hand-over alone, 20000 rounds ~ a chunk of an expert product (~10-20 µs)
        for (tasks, work) in [(8usize, 0u64), (8, 20_000)] {
            let n = if work == 0 { 20_000 } else { 2_000 };
            let ours = per_section_us(n, || pool.run(tasks, &|i, _| task(i, work, &sink)));
            let theirs =
                per_section_us(n, || ray.install(|| (0..tasks).into_par_iter().for_each(|i| task(i, work, &sink))));
            println!(
                "{threads} thread(s), {tasks} tasks of {work:>5} rounds: moescope pool {ours:7.2} µs/section, rayon {theirs:7.2} µs/section"
            );
        }
    }
    black_box(sink.load(Ordering::Relaxed));
}
