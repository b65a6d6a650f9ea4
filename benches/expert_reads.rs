//! O_DIRECT read bandwidth of expert blobs: random blobs of a package read by 1, 2 and 4
//! threads for a few seconds each, one `pread` per blob, as the expert store reads them.
//! The disk roofline of streamed decode is (this bandwidth / bytes read per token).
//!
//! `cargo bench --bench expert_reads -- PACKAGE.moe [SECONDS]`

use moescope::experts::store::{ExpertStore, IoMode, probe_read_bandwidth};
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

    let blob = store.blob_len();
    println!("{path}: {n_blobs} expert blobs of {:.2} MB, O_DIRECT ({})", blob as f64 / 1e6, store.mode().name());
    for threads in [1usize, 2, 4] {
        let secs_each = secs;
        let bw = probe_read_bandwidth(&store, threads, secs_each);
        let per_read_ms = blob as f64 * threads as f64 / bw * 1e3;
        println!(
            "{threads} thread(s): {:.0} MB/s, {:.0} reads/s, {per_read_ms:.2} ms per read",
            bw / 1e6,
            bw / blob as f64
        );
    }
}
