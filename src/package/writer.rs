//! Writing a package: offsets are planned up front, tensors and expert blobs are streamed in
//! plan order into a temporary file beside the target, and only a finished, fsynced file is
//! renamed into place. The magic is the last thing written, so even a partial file copied by
//! hand is never taken for a package.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use super::error::PackageError;
use super::layout::*;
use super::sink::Sink;

/// Fill in every offset of `meta` (dense tensors in the order given, the expert blobs, then
/// the multi-token-prediction tensors)
/// and return the header they imply. Checksums are left as placeholders of final width.
pub fn plan(meta: &mut Meta) -> Header {
    let zero = hex64(0);
    for t in meta.tensors.iter_mut().chain(meta.mtp.iter_mut().flat_map(|m| m.tensors.iter_mut())) {
        t.xxh3 = Some(zero.clone());
    }
    meta.version = FIRST_VERSION;
    if let Some(ex) = &mut meta.experts {
        // parts inside a blob, 64-byte aligned (each layer's from 0 when they differ by
        // layer), each blob padded to 4096: one length for all, or one per layer where the
        // layers' parts differ in size (a pool slot holds the longest)
        let blob = |end: u64| align_up(end.max(1), EXPERT_ALIGN);
        let lens: Vec<u64> = if ex.per_layer() {
            ex.parts.chunks_mut(3).map(|p| blob(place(p, 0))).collect()
        } else {
            vec![blob(place(&mut ex.parts, 0))]
        };
        ex.blob_len = lens.iter().copied().max().unwrap_or(EXPERT_ALIGN);
        ex.layer_lens = if lens.iter().all(|&l| l == ex.blob_len) { vec![] } else { lens };
        if !ex.layer_lens.is_empty() {
            meta.version = VERSION;
        }
        ex.table = vec![(0, zero.clone()); ex.layers.len() * ex.num_experts];
    }
    // the metadata length depends on the offsets' digits and they on it: iterate to a fixpoint
    let mut meta_reserved = 0u64;
    loop {
        let dense_offset = align_up(HEADER_SIZE + meta_reserved, EXPERT_ALIGN);
        let off = place(&mut meta.tensors, dense_offset);
        let dense_len = off - dense_offset;
        let expert_offset = align_up(off, EXPERT_ALIGN);
        let mut expert_len = 0;
        if let Some(ex) = &mut meta.experts {
            let n = ex.num_experts.max(1);
            for i in 0..ex.table.len() {
                ex.table[i].0 = expert_offset + expert_len;
                expert_len += ex.len_of(i / n);
            }
        }
        let mut file_size = expert_offset + expert_len;
        if let Some(mtp) = &mut meta.mtp {
            file_size = place(&mut mtp.tensors, align_up(file_size, EXPERT_ALIGN));
        }
        let need = serde_json::to_vec(meta).map(|v| v.len() as u64).unwrap_or(0);
        if need <= meta_reserved {
            return Header {
                version: meta.version,
                file_size,
                meta_offset: HEADER_SIZE,
                meta_len: meta_reserved,
                meta_xxh3: 0,
                dense_offset,
                dense_len,
                expert_offset,
                expert_len,
            };
        }
        // room for the JSON plus slack, so one more round normally settles it
        meta_reserved = need + 256;
    }
}

/// Lay `entries` out one after another from `start`, each 64-byte aligned, setting offset,
/// length and scales offset; returns the end.
fn place(entries: &mut [TensorEntry], start: u64) -> u64 {
    let mut off = start;
    for t in entries {
        let f = t.format().unwrap_or(moescope_kernels::Format::F32);
        let (r, c) = t.rows_cols();
        let (len, so) = span(f, r, c, t.scale_form());
        off = align_up(off, DENSE_ALIGN);
        t.offset = off;
        t.length = len;
        t.scales_offset = so.map(|s| off + s);
        off += len;
    }
    off
}

struct Current {
    /// Index of the dense tensor being written.
    index: usize,
    start: u64,
    end: u64,
    hasher: Xxh3,
    scales: Vec<u8>,
    mins: Vec<u8>,
    scales_at: Option<u64>,
}

pub struct PackageWriter {
    final_path: PathBuf,
    tmp_path: PathBuf,
    file: Option<Sink>,
    pos: u64,
    meta: Meta,
    header: Header,
    cur: Option<Current>,
    next_dense: usize,
    next_expert: usize,
}

impl PackageWriter {
    /// Start writing `meta` (already planned with [`plan`]) to `path`.
    pub fn create(path: &Path, meta: Meta, header: Header) -> Result<PackageWriter, PackageError> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "package".into());
        let tmp_path = path.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        // name the target in the message: the temporary name means nothing to the user
        let io = |source| PackageError::Io { path: path.to_path_buf(), error: source };
        crate::out_file::check_destination(path).map_err(io)?;
        let file = Sink::create(&tmp_path).map_err(io)?;
        let mut w = PackageWriter {
            final_path: path.to_path_buf(),
            tmp_path: tmp_path.clone(),
            file: Some(file),
            pos: 0,
            meta,
            header,
            cur: None,
            next_dense: 0,
            next_expert: 0,
        };
        // a zero header for now: the real one (with the magic) goes in last
        w.raw_write(&vec![0u8; (header.dense_offset) as usize])?;
        Ok(w)
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    fn io_err(&self, source: std::io::Error) -> PackageError {
        PackageError::Io { path: self.tmp_path.clone(), error: source }
    }

    fn raw_write(&mut self, b: &[u8]) -> Result<(), PackageError> {
        let r = match self.file.as_mut() {
            Some(f) => f.write_all(b),
            None => Err(std::io::Error::other("package writer already finished")),
        };
        r.map_err(|e| self.io_err(e))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, off: u64) -> Result<(), PackageError> {
        if off < self.pos {
            return Err(PackageError::Corrupt {
                path: self.tmp_path.clone(),
                what: format!("write order (at {} but next item starts at {off})", self.pos),
            });
        }
        let zeros = vec![0u8; (off - self.pos) as usize];
        self.raw_write(&zeros)
    }

    /// Dense tensor `i` of the write order: the dense region's, then the MTP section's.
    fn tensor_mut(&mut self, i: usize) -> Option<&mut TensorEntry> {
        let n = self.meta.tensors.len();
        match self.meta.mtp.as_mut() {
            Some(m) if i >= n => m.tensors.get_mut(i - n),
            _ => self.meta.tensors.get_mut(i),
        }
    }

    /// Tensors [`begin_dense`](Self::begin_dense) takes: the dense region's, then (after the
    /// experts) the MTP section's.
    fn planned_tensors(&self) -> usize {
        self.meta.tensors.len() + self.meta.mtp.as_ref().map_or(0, |m| m.tensors.len())
    }

    /// Begin the next dense tensor (in plan order: the MTP section's after the experts);
    /// returns its index entry.
    pub fn begin_dense(&mut self) -> Result<TensorEntry, PackageError> {
        let i = self.next_dense;
        let t = self.tensor_mut(i).map(|t| t.clone()).ok_or_else(|| PackageError::Corrupt {
            path: self.tmp_path.clone(),
            what: "more dense tensors written than planned".into(),
        })?;
        self.pad_to(t.offset)?;
        self.cur = Some(Current {
            index: i,
            start: t.offset,
            end: t.offset + t.length,
            hasher: Xxh3::new(),
            scales: Vec::new(),
            mins: Vec::new(),
            scales_at: t.scales_offset,
        });
        self.next_dense += 1;
        Ok(t)
    }

    /// Values of the current tensor, in row order.
    pub fn write_values(&mut self, b: &[u8]) -> Result<(), PackageError> {
        if let Some(c) = self.cur.as_mut() {
            c.hasher.update(b);
        }
        self.raw_write(b)
    }

    /// Scales of the current tensor, in row order (kept until the values are done).
    pub fn push_scales(&mut self, s: &[f32]) {
        if let Some(c) = self.cur.as_mut() {
            c.scales.extend_from_slice(bytemuck::cast_slice(s));
        }
    }

    /// Scales of the current tensor as the bytes the package stores (k4 records), in row order.
    pub fn push_scale_bytes(&mut self, b: &[u8]) {
        if let Some(c) = self.cur.as_mut() {
            c.scales.extend_from_slice(b);
        }
    }

    /// Mins of the current tensor (one with asymmetric groups), in row order: written after
    /// all its scales.
    pub fn push_mins(&mut self, m: &[f32]) {
        if let Some(c) = self.cur.as_mut() {
            c.mins.extend_from_slice(bytemuck::cast_slice(m));
        }
    }

    /// Finish the current dense tensor: scales, length check, checksum.
    pub fn end_dense(&mut self) -> Result<(), PackageError> {
        let Some(mut c) = self.cur.take() else {
            return Ok(());
        };
        if let Some(at) = c.scales_at {
            // padding between values and scales is part of the checksummed range
            let pad = vec![0u8; at.saturating_sub(self.pos) as usize];
            c.hasher.update(&pad);
            self.raw_write(&pad)?;
            let scales = std::mem::take(&mut c.scales);
            c.hasher.update(&scales);
            self.raw_write(&scales)?;
            let mins = std::mem::take(&mut c.mins);
            c.hasher.update(&mins);
            self.raw_write(&mins)?;
        }
        let (pos, tmp) = (self.pos, self.tmp_path.clone());
        let Some(t) = self.tensor_mut(c.index) else { return Ok(()) };
        if pos != c.end {
            return Err(PackageError::Tensor {
                path: tmp,
                name: t.name.clone(),
                msg: format!("wrote {} bytes, planned {}", pos - c.start, c.end - c.start),
            });
        }
        t.xxh3 = Some(hex64(c.hasher.digest()));
        Ok(())
    }

    /// Write the next expert blob (layer-major, expert-minor), its layer's length (`len_of`).
    pub fn write_expert(&mut self, blob: &[u8]) -> Result<(), PackageError> {
        let i = self.next_expert;
        let (off, len) = match &self.meta.experts {
            Some(ex) if i < ex.table.len() && blob.len() as u64 == ex.len_of(i / ex.num_experts.max(1)) => {
                (ex.table[i].0, blob.len() as u64)
            }
            _ => {
                return Err(PackageError::Corrupt {
                    path: self.tmp_path.clone(),
                    what: format!("expert blob {i} does not match the plan"),
                });
            }
        };
        self.pad_to(off)?;
        self.raw_write(blob)?;
        debug_assert_eq!(self.pos, off + len);
        let sum = hex64(xxhash_rust::xxh3::xxh3_64(blob));
        if let Some(ex) = self.meta.experts.as_mut() {
            ex.table[i].1 = sum;
        }
        self.next_expert += 1;
        Ok(())
    }

    /// Write metadata and header, fsync and rename into place.
    pub fn finish(mut self) -> Result<(), PackageError> {
        let planned_experts = self.meta.experts.as_ref().map_or(0, |e| e.table.len());
        if self.next_dense != self.planned_tensors() || self.next_expert != planned_experts {
            return Err(PackageError::Corrupt {
                path: self.tmp_path.clone(),
                what: format!(
                    "incomplete: {}/{} tensors and {}/{} experts written",
                    self.next_dense,
                    self.planned_tensors(),
                    self.next_expert,
                    planned_experts
                ),
            });
        }
        self.pad_to(self.header.file_size)?;
        let mut json = serde_json::to_vec(&self.meta)
            .map_err(|e| PackageError::Meta { path: self.tmp_path.clone(), msg: e.to_string() })?;
        if json.len() as u64 > self.header.meta_len {
            return Err(PackageError::Meta {
                path: self.tmp_path.clone(),
                msg: format!("metadata grew to {} bytes, {} reserved", json.len(), self.header.meta_len),
            });
        }
        json.resize(self.header.meta_len as usize, b' ');
        self.header.meta_xxh3 = xxhash_rust::xxh3::xxh3_64(&json);
        let header = self.header.encode();
        let mut f = match self.file.take() {
            Some(w) => w.finish().map_err(|e| PackageError::Io { path: self.tmp_path.clone(), error: e })?,
            None => return Ok(()),
        };
        let io = |source| PackageError::Io { path: self.tmp_path.clone(), error: source };
        f.seek(SeekFrom::Start(HEADER_SIZE)).map_err(io)?;
        f.write_all(&json).map_err(io)?;
        f.sync_all().map_err(io)?;
        f.seek(SeekFrom::Start(0)).map_err(io)?;
        f.write_all(&header).map_err(io)?;
        f.sync_all().map_err(io)?;
        // Out of the page cache: the pages `write` cached are small folios, which an mmap maps
        // 4 KiB at a time; read back afresh, readahead caches 2 MiB folios that map with PMDs
        // (fewer TLB misses for a decode that reads the experts through the mapping).
        // SAFETY: advisory, on the open file; its data is synced above
        #[cfg(target_os = "linux")]
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        drop(f);
        fs::rename(&self.tmp_path, &self.final_path)
            .map_err(|source| PackageError::Io { path: self.final_path.clone(), error: source })?;
        self.tmp_path = PathBuf::new();
        Ok(())
    }
}

impl Drop for PackageWriter {
    fn drop(&mut self) {
        // a failed or abandoned write leaves nothing behind
        if !self.tmp_path.as_os_str().is_empty() {
            self.file.take();
            let _ = fs::remove_file(&self.tmp_path);
        }
    }
}

/// Builds one expert blob: parts placed at their planned offsets, zero padded.
pub struct BlobBuilder<'a> {
    parts: &'a [TensorEntry],
    pub buf: Vec<u8>,
}

impl<'a> BlobBuilder<'a> {
    /// A blob of `region.layers[i]`.
    pub fn new(region: &'a ExpertRegion, i: usize) -> BlobBuilder<'a> {
        BlobBuilder { parts: region.parts_of(i), buf: vec![0u8; region.len_of(i) as usize] }
    }

    pub fn clear(&mut self) {
        self.buf.fill(0);
    }

    /// Values and scales of part `p` with its scales as the bytes the package stores (k4 or k6
    /// records; f32 scales through [`put`](Self::put)).
    pub fn put_bytes(&mut self, p: usize, values: &[u8], scales: &[u8]) {
        let part = &self.parts[p];
        let o = part.offset as usize;
        self.buf[o..o + values.len()].copy_from_slice(values);
        if let Some(so) = part.scales_offset {
            self.buf[so as usize..so as usize + scales.len()].copy_from_slice(scales);
        }
    }

    /// Values and scales of part `p` (`values` = row-major bytes, `scales` f32 row-major), and
    /// its mins when it has them (after the scales).
    pub fn put(&mut self, p: usize, values: &[u8], scales: &[f32], mins: &[f32]) {
        self.put_bytes(p, values, bytemuck::cast_slice(scales));
        let part = &self.parts[p];
        if let Some(so) = part.scales_offset.filter(|_| part.has_mins()) {
            let (rows, cols) = part.rows_cols();
            let at = so as usize + part.format().map_or(0, |f| f.scale_bytes(rows, cols));
            let mb: &[u8] = bytemuck::cast_slice(mins);
            self.buf[at..at + mb.len()].copy_from_slice(mb);
        }
    }
}
