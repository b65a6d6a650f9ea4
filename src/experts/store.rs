//! Reading expert blobs from the package: one `pread` per blob into a 4096-byte aligned buffer,
//! through O_DIRECT (so the page cache does not silently hold what the budget does not count)
//! or buffered. Short reads and EINTR are retried; a read that hits the end of the file means
//! the package shrank; the blob's checksum is verified unless switched off.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::package::layout::{EXPERT_ALIGN, TensorEntry, parse_hex64};
use crate::package::{Package, PackageError};

pub use crate::aligned_buf::AlignedBuf;

/// How expert blobs are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: straight from the device into the buffer, bypassing the page cache.
    Direct,
    /// Ordinary reads through the page cache.
    Buffered,
}

impl IoMode {
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Direct => "direct",
            IoMode::Buffered => "buffered",
        }
    }
}

/// Where each blob is and what it must hash to.
pub struct ExpertStore {
    path: PathBuf,
    file: File,
    mode: IoMode,
    /// the longest blob (a pool slot's buffer)
    blob_len: usize,
    /// each MoE layer's blob length (what a read of one of its experts reads)
    layer_lens: Vec<usize>,
    num_experts: usize,
    layers: Vec<usize>,
    table: Vec<(u64, u64)>,
    /// each MoE layer's three parts (offsets within the blob), for the finiteness check
    parts: Vec<Vec<TensorEntry>>,
    pub verify: bool,
    /// a test's injected faults (`faults::inject`); None in production
    faults: Option<std::sync::Arc<super::faults::Faults>>,
}

/// Why a read failed, with the file, expert and offset.
pub type ReadError = PackageError;

impl ExpertStore {
    /// Open the package's file for expert reads. Asking for O_DIRECT where the filesystem
    /// refuses it falls back to buffered reads; the returned warning says so.
    pub fn open(pkg: &Package, mode: IoMode, verify: bool) -> Result<(ExpertStore, Option<String>), PackageError> {
        let path = pkg.path().to_path_buf();
        let io = |error| PackageError::Io { path: path.clone(), error };
        let ex = pkg
            .meta
            .experts
            .as_ref()
            .ok_or_else(|| PackageError::Meta { path: path.clone(), msg: "no expert table".into() })?;
        let table = ex
            .table
            .iter()
            .map(|(off, sum)| {
                parse_hex64(sum)
                    .map(|s| (*off, s))
                    .ok_or_else(|| PackageError::Meta { path: path.clone(), msg: "malformed expert checksum".into() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (file, mode, warning) = match mode {
            IoMode::Buffered => (File::open(&path).map_err(io)?, IoMode::Buffered, None),
            IoMode::Direct => match open_direct(&path) {
                Ok(f) => (f, IoMode::Direct, None),
                Err(e) => (
                    File::open(&path).map_err(io)?,
                    IoMode::Buffered,
                    Some(format!("{}: O_DIRECT refused ({e}); reading experts through the page cache", path.display())),
                ),
            },
        };
        let faults = super::faults::plan_for(&path);
        let store = ExpertStore {
            path,
            file,
            mode,
            blob_len: ex.blob_len as usize,
            layer_lens: (0..ex.layers.len()).map(|i| ex.len_of(i) as usize).collect(),
            num_experts: ex.num_experts,
            layers: ex.layers.clone(),
            table,
            parts: (0..ex.layers.len()).map(|i| ex.parts_of(i).to_vec()).collect(),
            verify,
            faults,
        };
        Ok((store, warning))
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Bytes of the longest blob: a buffer that holds any expert.
    pub fn blob_len(&self) -> usize {
        self.blob_len
    }

    /// Bytes a read of blob `slot` reads (its layer's blob length).
    pub fn len_of(&self, slot: usize) -> usize {
        self.layer_lens.get(slot / self.num_experts.max(1)).copied().unwrap_or(self.blob_len)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Index of (MoE layer index `li`, expert `e`) in the table.
    pub fn slot_of(&self, li: usize, e: usize) -> usize {
        li * self.num_experts + e
    }

    /// Read blob `slot` into `buf` (at least `len_of(slot)` bytes), retrying short reads and
    /// EINTR; verify its checksum if asked.
    pub fn read(&self, slot: usize, buf: &mut AlignedBuf) -> Result<(), ReadError> {
        self.read_part(slot, buf, 0, self.len_of(slot))?;
        self.check(slot, buf)
    }

    /// Read bytes `from..to` of blob `slot` into the same range of `buf` (a read in pieces,
    /// so a speculative read can stand aside between them); `from` a multiple of 4096 (as
    /// O_DIRECT needs), `to` one too or the blob's end.
    pub fn read_part(&self, slot: usize, buf: &mut AlignedBuf, from: usize, to: usize) -> Result<(), ReadError> {
        let (off, _) = self.table[slot];
        let to = to.min(self.len_of(slot));
        let dst = &mut buf.as_mut_slice()[from..to];
        let mut done = 0;
        while done < dst.len() {
            let at = off + (from + done) as u64;
            let got = match &self.faults {
                None => self.file.read_at(&mut dst[done..], at),
                Some(f) => f.read(&mut dst[done..], at, |b, o| self.file.read_at(b, o)),
            };
            match got {
                Ok(0) => {
                    return Err(PackageError::Truncated {
                        path: self.path.clone(),
                        what: format!("{} (the file shrank while in use)", self.blob_name(slot)),
                        need: off + self.len_of(slot) as u64,
                        have: at,
                    });
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(PackageError::Io {
                        path: self.path.clone(),
                        error: std::io::Error::new(
                            e.kind(),
                            format!("reading {} at offset {at}: {e}", self.blob_name(slot)),
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Verify a wholly read blob against its checksum, if verification is on.
    pub fn check(&self, slot: usize, buf: &AlignedBuf) -> Result<(), ReadError> {
        let (off, sum) = self.table[slot];
        if !self.verify {
            return Ok(());
        }
        let blob = &buf.as_slice()[..self.len_of(slot)];
        if xxhash_rust::xxh3::xxh3_64(blob) != sum {
            return Err(PackageError::Checksum {
                path: self.path.clone(),
                what: self.blob_name(slot),
                offset: off,
                len: blob.len() as u64,
            });
        }
        for p in self.parts.get(slot / self.num_experts.max(1)).into_iter().flatten() {
            let what = || format!("{} {}", self.blob_name(slot), p.name);
            crate::package::finite::require_finite(&self.path, what, p, blob, off)?;
        }
        Ok(())
    }

    fn blob_name(&self, slot: usize) -> String {
        let li = slot / self.num_experts;
        format!("expert blob (layer {}, expert {})", self.layers[li], slot % self.num_experts)
    }

    /// Drop the package's pages from the page cache (for cold-start measurements); pages a
    /// process has mapped (the dense weights) stay.
    pub fn evict_page_cache(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: advisory call on an open descriptor.
        unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        if let Ok(f) = File::open(&self.path) {
            // SAFETY: as above, on a second descriptor for buffered-mode pages.
            unsafe {
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

fn open_direct(path: &Path) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)?;
    // some filesystems accept the flag at open and refuse the first read: probe one block
    let mut probe = AlignedBuf::new(EXPERT_ALIGN as usize);
    f.read_at(probe.as_mut_slice(), 0)?;
    Ok(f)
}

/// Read bandwidth of random expert blobs: `threads` threads, one blob read after another each
/// (as the I/O workers read them; open the store without verification to time the disk alone),
/// for `secs` seconds; bytes per second.
/// The disk roofline of streamed decode is this over the bytes read per token.
pub fn probe_read_bandwidth(store: &ExpertStore, threads: usize, secs: f64) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let n_blobs = store.table.len().max(1) as u64;
    let bytes = AtomicU64::new(0);
    let stop = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for i in 0..threads.max(1) {
            let bytes = &bytes;
            s.spawn(move || {
                let mut buf = AlignedBuf::new(store.blob_len);
                // a fixed LCG per thread: reproducible, and spread over the whole expert region
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
                while std::time::Instant::now() < stop {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let slot = ((x >> 33) % n_blobs) as usize;
                    if store.read(slot, &mut buf).is_ok() {
                        bytes.fetch_add(store.len_of(slot) as u64, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}
