//! The hidden `compute-peak` command: the tiers' multiply-adds a second at each thread count,
//! every thread running its probe at once (`moescope_kernels::peak`), so a prefill's rate reads
//! as a share of what these cores retire, and a machine's vCPUs show whether they are cores
//! (the rate doubles from 8 threads to 16) or hyperthreads of fewer (it does not).

use std::sync::Barrier;
use std::time::Instant;

use anyhow::{Result, bail};
use moescope_kernels::peak::{self, Work};

use super::parse_list;

/// One probe kind: its name, unit and function.
type Probe = (&'static str, &'static str, fn(u64) -> Option<Work>);

const PROBES: [Probe; 3] =
    [("int8 VNNI", "GMAC/s", peak::vnni), ("int8 AMX", "GMAC/s", peak::amx), ("f32 FMA", "GMAC/s", peak::fma)];

pub fn run(threads: &str, ms: u64) -> Result<()> {
    for t in parse_list("-t", threads)? {
        if t == 0 {
            bail!("-t: 0 threads");
        }
        let mut parts = vec![];
        for (name, unit, probe) in PROBES {
            // steps one thread runs in about `ms` milliseconds, from a short calibration
            let Some(w) = probe(1 << 12) else { continue };
            let t0 = Instant::now();
            probe(1 << 16);
            let per_step = t0.elapsed().as_secs_f64() / (1 << 16) as f64;
            let steps = ((ms as f64 / 1e3 / per_step.max(1e-12)) as u64).max(1 << 12);
            let barrier = Barrier::new(t);
            let (secs, works) = std::thread::scope(|s| {
                let hs: Vec<_> = (0..t)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            let t0 = Instant::now();
                            let w = probe(steps);
                            (t0.elapsed().as_secs_f64(), w)
                        })
                    })
                    .collect();
                let out: Vec<_> = hs.into_iter().filter_map(|h| h.join().ok()).collect();
                (out.iter().map(|o| o.0).fold(0.0, f64::max), out.into_iter().filter_map(|o| o.1).collect::<Vec<_>>())
            });
            if works.len() != t || works.iter().any(|w| w.total != w.expected) || w.total != w.expected {
                bail!("compute-peak: the {name} probe's sums are not the ones its instructions make");
            }
            let rate = works.iter().map(|w| w.macs as f64).sum::<f64>() / secs / 1e9;
            parts.push(format!("{name} {rate:.1} {unit} ({:.1} a thread)", rate / t as f64));
        }
        if parts.is_empty() {
            bail!("compute-peak: this CPU has none of the probed tiers (AVX-512 VNNI, AMX)");
        }
        println!("threads {t}: {}", parts.join(", "));
    }
    Ok(())
}
