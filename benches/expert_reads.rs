//! O_DIRECT read bandwidth of expert blobs: random blobs of a package read by 1, 2 and 4
//! threads for a few seconds each, one `pread` per blob, as the expert store reads them.
//! The disk roofline of streamed decode is (this bandwidth / bytes read per token).
//!
//! `cargo bench --bench expert_reads -- PACKAGE.moe [SECONDS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moescope::engine::sampler::Rng;
use moescope::experts::store::{AlignedBuf, ExpertStore, IoMode};
use moescope::package::Package;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: cargo bench --bench expert_reads -- PACKAGE.moe [SECONDS]");
        return;
    };
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let pkg = match Package::open(std::path::Path::new(path)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let n_blobs = pkg.meta.experts.as_ref().map_or(0, |e| e.table.len());
    let (store, warn) = match ExpertStore::open(&pkg, IoMode::Direct, false) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    if let Some(w) = warn {
        eprintln!("warning: {w}");
    }
    let store = Arc::new(store);
    let blob = store.blob_len();
    println!("{path}: {n_blobs} expert blobs of {:.2} MB, O_DIRECT ({})", blob as f64 / 1e6, store.mode().name());
    for threads in [1usize, 2, 4] {
        let bytes = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let stop = Instant::now() + Duration::from_secs_f64(secs);
        let t0 = Instant::now();
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (store, bytes, reads) = (store.clone(), bytes.clone(), reads.clone());
                std::thread::spawn(move || {
                    let mut buf = AlignedBuf::new(blob);
                    let mut rng = Rng::new(i as u64 + 7);
                    while Instant::now() < stop {
                        let slot = (rng.next_u64() % n_blobs as u64) as usize;
                        if store.read(slot, &mut buf).is_ok() {
                            bytes.fetch_add(blob as u64, Ordering::Relaxed);
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            let _ = h.join();
        }
        let dt = t0.elapsed().as_secs_f64();
        let b = bytes.load(Ordering::Relaxed) as f64;
        let n = reads.load(Ordering::Relaxed) as f64;
        println!(
            "{threads} thread(s): {:.0} MB/s, {:.0} reads/s, {:.2} ms per read",
            b / dt / 1e6,
            n / dt,
            dt * 1000.0 * threads as f64 / n.max(1.0)
        );
    }
}
