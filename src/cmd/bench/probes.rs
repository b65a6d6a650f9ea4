//! `bench --roofline`'s probes: the memory's read bandwidth in a child process (so its buffer
//! stays out of the bench's peak RSS) and the disk's O_DIRECT read bandwidth of expert blobs.

use std::io::Write;

use anyhow::{Context, Result, bail};
use moescope::engine::{Engine, sizing};
use moescope::experts::IoMode;
use moescope::experts::store::{ExpertStore, probe_read_bandwidth};
use moescope::sysinfo::{self, ReadProbe};
use serde_json::json;

use super::report::Row;

/// The memory probe's buffer: 2 GiB (past any cache), less where memory is short; beside the
/// memory plan's largest pool (the pool's buffers are still being allocated now, so what is
/// free now overstates it: a probe sized from that was OOM-killed with the pool under a cgroup
/// limit). None when that leaves less than 256 MiB (said when the probe was asked for).
pub(super) fn memory_probe_bytes(engine: &Engine, largest_pool: u64, asked: bool) -> Option<usize> {
    let allowance = sizing::allowance();
    let plan = engine.memory_plan();
    let room = allowance.bytes.saturating_sub(plan.total - plan.experts + largest_pool + sizing::headroom(&allowance));
    let bytes = (2usize << 30).min(sysinfo::available_memory_bytes() as usize / 4).min(room as usize);
    if bytes >= (256 << 20) {
        return Some(bytes);
    }
    if asked {
        // a tight cap leaves no room beside the pool: the disk's side is still worth having
        eprintln!(
            "moescope bench: --roofline: no memory probe: it needs 256 MiB beside the largest pool ({} MiB) under {}, which leaves {} MiB (a pool {} MiB smaller would leave room); the disk is still probed",
            largest_pool >> 20,
            allowance.source,
            room >> 20,
            ((256u64 << 20).saturating_sub(room) >> 20) + 1
        );
    }
    None
}

/// The disk's side of the roofline at one thread count: its read bandwidth before and after the
/// tests, and while as many threads stream memory as decode's do (bytes/s).
pub(super) struct DiskProbe {
    pub threads: usize,
    pub before: f64,
    pub after: f64,
    pub loaded: f64,
}

impl DiskProbe {
    /// The O_DIRECT read bandwidth of random expert blobs now (see [`probe_disk`]).
    pub(super) fn read(engine: &Engine, workers: usize, when: &str) -> Result<f64> {
        probe_disk(engine, workers, when)
    }

    /// Probed again after `threads` threads' tests (`before` was probed ahead of them), and under
    /// their memory load.
    pub(super) fn around(engine: &Engine, workers: usize, threads: usize, before: f64) -> Result<DiskProbe> {
        let after = probe_disk(engine, workers, " after the tests")?;
        // and as decode's reads meet it: beside t threads streaming memory
        let when = format!(" while {threads} thread(s) stream memory");
        let loaded = sysinfo::under_memory_load(threads, || probe_disk(engine, workers, &when))?;
        Ok(DiskProbe { threads, before, after, loaded })
    }

    /// The mean of the probes before and after.
    pub(super) fn bps(&self) -> f64 {
        (self.before + self.after) / 2.0
    }

    /// A decode row's share of the disk's bandwidth its reads kept busy: t/s over (read
    /// bandwidth / bytes read per token).
    pub(super) fn fill(&self, row: &mut Row) {
        let (bps, dl) = (self.bps(), self.loaded);
        if let (Some(e), true) = (row.experts.as_mut(), row.decode_latency.is_some()) {
            let mbt = e["read_mb_per_token"].as_f64().unwrap_or(0.0);
            e["disk_read_mbps"] = json!(bps / 1e6);
            e["disk_read_mbps_probes"] = json!([self.before / 1e6, self.after / 1e6]);
            e["disk_roofline_pct"] = json!(100.0 * row.avg_ts * mbt * 1e6 / bps);
            e["disk_read_mbps_loaded"] = json!(dl / 1e6);
            e["disk_loaded_roofline_pct"] = json!(100.0 * row.avg_ts * mbt * 1e6 / dl);
        }
    }
}

/// One memory probe's line: the bandwidth that counts, then both ways it was read.
pub(super) fn print_probe(p: &ReadProbe, threads: usize, when: &str) {
    eprintln!(
        "moescope bench: read bandwidth {:.1} GB/s at {threads} thread(s) {when} (plain {:.1}, prefetching {:.1})",
        p.best(),
        p.plain,
        p.prefetched
    );
}

/// The O_DIRECT read bandwidth of random expert blobs, bytes/s: as many threads as the pool's
/// I/O workers, without checksums, for 2 s (the disk roofline's denominator).
fn probe_disk(engine: &Engine, workers: usize, when: &str) -> Result<f64> {
    let (store, _) = ExpertStore::open(engine.package(), IoMode::Direct, false)?;
    let bps = probe_read_bandwidth(&store, workers, 2.0);
    eprintln!(
        "moescope bench: expert reads {:.0} MB/s{when} ({workers} threads, {}, random blobs)",
        bps / 1e6,
        store.mode().name()
    );
    Ok(bps)
}

/// The memory probe: a child process (this binary's hidden `read-bandwidth --serve`) that fills
/// its buffer once and probes it whenever asked, so the buffer never counts in this process's
/// peak RSS and a probe between two repetitions costs only its passes.
pub(super) struct Prober {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Prober {
    pub(super) fn start(mib: usize) -> Result<Prober> {
        use std::process::Stdio;
        let exe = std::env::current_exe().context("--roofline: locating this executable")?;
        let mut child = std::process::Command::new(&exe)
            .args(["read-bandwidth", "--serve", "--mib", &mib.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("--roofline: running {}", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("--roofline: the bandwidth probe's pipes did not open");
        };
        Ok(Prober { child, stdin: Some(stdin), stdout: std::io::BufReader::new(stdout) })
    }

    /// The read bandwidth now at `threads` threads.
    pub(super) fn probe(&mut self, threads: usize) -> Result<ReadProbe> {
        use std::io::BufRead;
        let mut line = String::new();
        let sent = match self.stdin.as_mut() {
            Some(i) => writeln!(i, "{threads}").and_then(|_| i.flush()).is_ok(),
            None => false,
        };
        if sent {
            self.stdout.read_line(&mut line).context("--roofline: reading the bandwidth probe")?;
        }
        // "best plain prefetched", GB/s
        let v: Vec<f64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        match v[..] {
            [best, plain, prefetched] if best > 0.0 => Ok(ReadProbe { plain, prefetched }),
            _ => bail!("--roofline: the bandwidth probe failed: '{}'", line.trim()),
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        // end of input ends the child; it frees its buffer on the way out
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
