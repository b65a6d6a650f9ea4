//! `bench --roofline`'s probes: the memory's read bandwidth in a child process (so its buffer
//! stays out of the bench's peak RSS) and the disk's O_DIRECT read bandwidth of expert blobs.

use std::io::Write;

use anyhow::{Context, Result, bail};
use moescope::engine::Engine;
use moescope::experts::IoMode;
use moescope::experts::store::{ExpertStore, probe_read_bandwidth};
use moescope::sysinfo::ReadProbe;

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
pub(super) fn probe_disk(engine: &Engine, workers: usize, when: &str) -> Result<f64> {
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
