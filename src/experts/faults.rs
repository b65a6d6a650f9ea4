//! Injected I/O faults for the expert store's tests: a fault plan registered for a package path
//! before the engine opens it, then armed at any time. Every `pread` of an expert blob counts as
//! one read; an armed fault fires on the read it names. Production code never registers one:
//! [`ExpertStore`](super::store::ExpertStore) finds no plan and reads the file directly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a faulty read does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The read fails with EIO.
    Eio,
    /// The read returns only this many bytes (the store asks again for the rest).
    Short(usize),
    /// The read returns end of file, as if the file had shrunk.
    Eof,
    /// The read waits this long first, then reads.
    Slow(Duration),
    /// The read returns its bytes with one of them flipped.
    Corrupt,
}

/// The faults of one package's reads.
#[derive(Debug, Default)]
pub struct Faults {
    reads: AtomicU64,
    /// (the read count it fires at, the fault); each fires once
    armed: Mutex<Vec<(u64, Fault)>>,
    fired: AtomicU64,
    /// bytes the reads returned
    bytes: AtomicU64,
}

impl Faults {
    /// `fault` on the `n`-th read from now (1: the next one).
    pub fn arm(&self, n: u64, fault: Fault) {
        let at = self.reads.load(Ordering::SeqCst) + n.max(1);
        self.lock().push((at, fault));
    }

    /// `fault` on each of the next `count` reads.
    pub fn arm_next(&self, count: u64, fault: Fault) {
        for n in 1..=count {
            self.arm(n, fault);
        }
    }

    /// Reads so far, and faults fired so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.reads.load(Ordering::SeqCst), self.fired.load(Ordering::SeqCst))
    }

    /// Bytes the reads returned so far (what was read of the file).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Fault)>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One read of `buf.len()` bytes at `at` through `read`, with the fault armed for it.
    pub fn read(
        &self,
        buf: &mut [u8],
        at: u64,
        read: impl FnOnce(&mut [u8], u64) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let got = self.faulty_read(buf, at, read);
        if let Ok(n) = &got {
            self.bytes.fetch_add(*n as u64, Ordering::SeqCst);
        }
        got
    }

    fn faulty_read(
        &self,
        buf: &mut [u8],
        at: u64,
        read: impl FnOnce(&mut [u8], u64) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        let fault = {
            let mut armed = self.lock();
            armed.iter().position(|(k, _)| *k == n).map(|i| armed.remove(i).1)
        };
        let Some(fault) = fault else { return read(buf, at) };
        self.fired.fetch_add(1, Ordering::SeqCst);
        match fault {
            Fault::Eio => Err(std::io::Error::from_raw_os_error(libc::EIO)),
            Fault::Eof => Ok(0),
            Fault::Short(k) => {
                let k = k.clamp(1, buf.len().max(1)).min(buf.len());
                read(&mut buf[..k], at)
            }
            Fault::Slow(d) => {
                std::thread::sleep(d);
                read(buf, at)
            }
            Fault::Corrupt => {
                let got = read(buf, at)?;
                if got > 0 {
                    buf[got / 2] ^= 0x10;
                }
                Ok(got)
            }
        }
    }
}

/// Plans by package path.
fn registry() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Arc<Faults>)>> {
    static PLANS: Mutex<Vec<(PathBuf, Arc<Faults>)>> = Mutex::new(Vec::new());
    PLANS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fault plan for the package at `path`: the stores opened on it from now on read through it.
pub fn inject(path: &Path) -> Arc<Faults> {
    let f = Arc::new(Faults::default());
    let mut r = registry();
    r.retain(|(p, _)| p != path);
    r.push((path.to_path_buf(), f.clone()));
    f
}

/// The plan registered for `path`, if a test registered one.
pub(super) fn plan_for(path: &Path) -> Option<Arc<Faults>> {
    let r = registry();
    if r.is_empty() {
        return None;
    }
    r.iter().find(|(p, _)| p == path).map(|(_, f)| f.clone())
}
