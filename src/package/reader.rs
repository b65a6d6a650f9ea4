//! Opening a package: mmap, then validate header, version, bounds, sizes and checksums before
//! anything is used. Expert blobs are checked the first time they are read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use memmap2::Mmap;
use moescope_kernels::kscales::{k4_bytes, k6_bytes};
use moescope_kernels::{Format, Mat, MatData};

use super::error::PackageError;
use super::layout::*;
use super::validate::{check_entry, check_experts};

/// An open, validated package.
pub struct Package {
    pub(super) path: PathBuf,
    pub(super) mmap: Mmap,
    /// The dense region, and the experts' when they fit, copied into anonymous memory backed by
    /// huge pages (see [`Package::make_resident`]): `(file offset of its first byte, the bytes)`.
    pub(super) resident: Option<(u64, Mmap)>,
    pub header: Header,
    pub meta: Meta,
    index: HashMap<String, usize>,
    /// The multi-token-prediction section's tensors by name (see `package::mtp`).
    pub(super) mtp_index: HashMap<String, usize>,
    /// Per expert blob: 0 = not checked yet, 1 = checksum good.
    expert_checked: Vec<AtomicU8>,
    /// Per dense tensor: its resident copy is reordered (`package::resident`: lane order where
    /// `to_lanes` says, else panel-major), its checksum verified before the reordering.
    pub(super) panelled: Vec<bool>,
    /// The resident copy's expert parts that `to_lanes` takes are in lane order (every blob
    /// checked before).
    pub(super) experts_laned: bool,
}

/// What to check when opening.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// Hash every dense tensor now (they are all read at the first token anyway).
    pub verify_dense: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { verify_dense: true }
    }
}

impl Package {
    pub fn open(path: &Path) -> Result<Package, PackageError> {
        Package::open_with(path, OpenOptions::default())
    }

    pub fn open_with(path: &Path, opts: OpenOptions) -> Result<Package, PackageError> {
        let p = path.to_path_buf();
        let io = |source| PackageError::Io { path: p.clone(), error: source };
        let file = File::open(path).map_err(io)?;
        let actual = file.metadata().map_err(io)?.len();
        if actual < HEADER_SIZE {
            // a short file that starts with something else is simply not a package
            let mut head = [0u8; 8];
            let n = std::io::Read::read(&mut &file, &mut head).unwrap_or(0);
            if n < 8 || head != MAGIC {
                return Err(PackageError::Magic { path: p });
            }
            return Err(PackageError::Truncated {
                path: p,
                what: "the header".into(),
                need: HEADER_SIZE,
                have: actual,
            });
        }
        // SAFETY: the file is opened read-only; a package is not modified while in use (the
        // converter writes a new file and renames it into place).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        super::sigbus::note_mapped(path);
        let header = match Header::decode(&mmap[..HEADER_SIZE as usize]) {
            Ok(h) => h,
            Err(HeaderError::Magic) | Err(HeaderError::Short(_)) => return Err(PackageError::Magic { path: p }),
            Err(HeaderError::Version(found)) => {
                return Err(PackageError::Version { path: p, found, supported: VERSION });
            }
            Err(HeaderError::Corrupt(what)) => return Err(PackageError::Corrupt { path: p, what: what.into() }),
        };
        if header.file_size > actual {
            return Err(PackageError::Truncated {
                path: p,
                what: "the package".into(),
                need: header.file_size,
                have: actual,
            });
        }
        if header.file_size < actual {
            return Err(PackageError::Corrupt {
                path: p,
                what: format!("size: the file has {actual} bytes, its header says {}", header.file_size),
            });
        }
        let regions = [
            ("metadata", header.meta_offset, header.meta_len),
            ("dense region", header.dense_offset, header.dense_len),
            ("expert region", header.expert_offset, header.expert_len),
        ];
        for (what, off, len) in regions {
            let end = off.saturating_add(len);
            if off < HEADER_SIZE || end > actual {
                return Err(PackageError::Corrupt { path: p, what: format!("{what} bounds ({off}+{len})") });
            }
        }
        let meta_bytes = &mmap[header.meta_offset as usize..(header.meta_offset + header.meta_len) as usize];
        if xxhash_rust::xxh3::xxh3_64(meta_bytes) != header.meta_xxh3 {
            return Err(PackageError::Checksum {
                path: p,
                what: "metadata".into(),
                offset: header.meta_offset,
                len: header.meta_len,
            });
        }
        let meta: Meta = serde_json::from_slice(meta_bytes)
            .map_err(|e| PackageError::Meta { path: p.clone(), msg: e.to_string() })?;
        if meta.format != FORMAT_NAME || meta.version != header.version {
            return Err(PackageError::Meta {
                path: p,
                msg: format!(
                    "format '{}' version {} (expected '{FORMAT_NAME}' {}, the header's)",
                    meta.format, meta.version, header.version
                ),
            });
        }
        meta.model
            .validate()
            .map_err(|msg| PackageError::Meta { path: p.clone(), msg: format!("model config: {msg}") })?;

        let mut index = HashMap::new();
        for (i, t) in meta.tensors.iter().enumerate() {
            check_entry(&p, t, header.dense_offset, header.dense_offset + header.dense_len)?;
            if index.insert(t.name.clone(), i).is_some() {
                return Err(PackageError::Tensor { path: p, name: t.name.clone(), msg: "listed twice".into() });
            }
        }
        let n_blobs = match &meta.experts {
            Some(ex) => check_experts(&p, ex, &meta, &header)?,
            None => {
                if !meta.model.moe_layers().is_empty() {
                    return Err(PackageError::Meta {
                        path: p,
                        msg: "the model has MoE layers but no expert table".into(),
                    });
                }
                0
            }
        };
        let mtp_index = super::mtp::check(&p, &meta, &header)?;
        let pkg = Package {
            path: p,
            mmap,
            resident: None,
            panelled: vec![false; meta.tensors.len()],
            experts_laned: false,
            header,
            meta,
            index,
            mtp_index,
            expert_checked: (0..n_blobs).map(|_| AtomicU8::new(0)).collect(),
        };
        if opts.verify_dense {
            pkg.verify_dense()?;
        }
        Ok(pkg)
    }

    /// Check every dense tensor against its checksum (in the resident copy once there is one).
    pub fn verify_dense(&self) -> Result<(), PackageError> {
        self.meta.tensors.iter().zip(&self.panelled).try_for_each(|(t, &p)| {
            // a reordered copy was verified before it was reordered
            if p { self.finite_in(|| t.name.clone(), t, 0, (&self.mmap[..], 0)) } else { self.verify_entry(t) }
        })
    }

    /// One dense-layout tensor's checksum and values.
    pub(super) fn verify_entry(&self, t: &TensorEntry) -> Result<(), PackageError> {
        self.verify(&t.name, t.offset, t.length, t.xxh3.as_deref())?;
        self.check_finite(|| t.name.clone(), t, 0)
    }

    /// A non-finite weight or scale of `t` (its offsets count from `start`: 0 for a dense
    /// tensor, the blob's offset for an expert's part) is an error naming it and where.
    /// Read from the resident copy where it holds the tensor (reading the mapping instead would
    /// bring the file's pages in beside the copy: a blocks tensor has a scale in every block).
    fn check_finite(&self, what: impl FnOnce() -> String, t: &TensorEntry, start: u64) -> Result<(), PackageError> {
        let at = self.bytes_for(start.saturating_add(t.offset), t.length);
        self.finite_in(what, t, start, at)
    }

    /// [`check_finite`](Self::check_finite) in `bytes`, which begin at file offset `origin`
    /// (the mapping's: a panelled tensor's copy is reordered, so it is checked in the file).
    pub(super) fn finite_in(
        &self,
        what: impl FnOnce() -> String,
        t: &TensorEntry,
        start: u64,
        (bytes, origin): (&[u8], u64),
    ) -> Result<(), PackageError> {
        if origin <= start {
            let rel = bytes.get(usize::try_from(start - origin).unwrap_or(usize::MAX)..).unwrap_or(&[]);
            return super::finite::require_finite(&self.path, what, t, rel, start);
        }
        // the copy begins after `start` (a dense tensor's offsets are the file's): the entry's
        // offsets moved to count from the copy
        let shift = origin - start;
        let moved = TensorEntry {
            offset: t.offset.saturating_sub(shift),
            scales_offset: t.scales_offset.map(|s| s.saturating_sub(shift)),
            ..t.clone()
        };
        super::finite::require_finite(&self.path, what, &moved, bytes, origin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_size(&self) -> u64 {
        self.header.file_size
    }

    fn verify(&self, what: &str, offset: u64, len: u64, sum: Option<&str>) -> Result<(), PackageError> {
        let (bytes, origin) = self.bytes_for(offset, len);
        verify_bytes(
            &self.path,
            what,
            &bytes[(offset - origin) as usize..(offset - origin + len) as usize],
            offset,
            sum,
        )
    }

    pub fn entry(&self, name: &str) -> Result<&TensorEntry, PackageError> {
        self.index
            .get(name)
            .map(|&i| &self.meta.tensors[i])
            .ok_or_else(|| PackageError::Missing { path: self.path.clone(), name: name.to_string() })
    }

    /// Dense tensor `name`, checked to have `shape` (and to be f32 if `f32_only`).
    pub fn require(&self, name: &str, shape: &[usize], f32_only: bool) -> Result<TensorId, PackageError> {
        let i = *self
            .index
            .get(name)
            .ok_or_else(|| PackageError::Missing { path: self.path.clone(), name: name.to_string() })?;
        let t = &self.meta.tensors[i];
        if t.shape != shape || (f32_only && t.dtype != DType::F32) {
            return Err(PackageError::Tensor {
                path: self.path.clone(),
                name: name.into(),
                msg: format!("{:?} {:?}, expected {}{shape:?}", t.dtype, t.shape, if f32_only { "f32 " } else { "" }),
            });
        }
        Ok(TensorId(i))
    }

    /// Dense tensor `i` (from [`Package::require`]) as a matrix; a vector is one row.
    pub fn mat_by_index(&self, i: TensorId) -> Mat<'_> {
        let t = &self.meta.tensors[i.0];
        let (bytes, origin) = self.bytes_for(t.offset, t.length);
        let mut m = mat_at(bytes, origin, t, 0);
        if self.panelled[i.0] {
            if super::resident::to_lanes(t) {
                in_lanes(&mut m);
            } else if let MatData::Q4 { panels, .. }
            | MatData::Q4K { panels, .. }
            | MatData::Q4F16 { panels, .. }
            | MatData::Q6 { panels, .. }
            | MatData::Q6K { panels, .. } = &mut m.data
            {
                *panels = true;
            }
        }
        m
    }

    /// Mark expert blob `slot` checked (its checksum and values were, by the caller).
    pub(super) fn mark_checked(&self, slot: usize) {
        self.expert_checked[slot].store(1, Ordering::Release);
    }

    /// Dense f32 tensor `i` (from [`Package::require`] with `f32_only`).
    pub fn f32_by_index(&self, i: TensorId) -> &[f32] {
        let t = &self.meta.tensors[i.0];
        let (bytes, origin) = self.bytes_for(t.offset, t.length);
        bytemuck::cast_slice(&bytes[(t.offset - origin) as usize..(t.offset - origin + t.length) as usize])
    }

    /// The bytes holding file range `offset..offset + len`, and the file offset of their first
    /// byte: the resident copy when it covers the range, else the file's mapping.
    fn bytes_for(&self, offset: u64, len: u64) -> (&[u8], u64) {
        match &self.resident {
            Some((start, r)) if offset >= *start && offset + len <= start + r.len() as u64 => (&r[..], *start),
            _ => (&self.mmap[..], 0),
        }
    }

    /// Bytes of the resident copy ([`make_resident`](Self::make_resident)); 0 without one.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.as_ref().map_or(0, |(_, r)| r.len() as u64)
    }

    /// Whether the experts are served from the resident copy ([`make_resident`](Self::make_resident)).
    pub fn experts_resident(&self) -> bool {
        let h = &self.header;
        h.expert_len > 0
            && matches!(&self.resident, Some((s, r)) if *s <= h.expert_offset && h.expert_offset + h.expert_len <= s + r.len() as u64)
    }

    /// The three matrices of expert `e` of MoE layer `layer`, checksum verified on first use.
    pub fn expert(&self, layer: usize, e: usize) -> Result<ExpertMats<'_>, PackageError> {
        let ex = self
            .meta
            .experts
            .as_ref()
            .ok_or_else(|| PackageError::Meta { path: self.path.clone(), msg: "no expert table".into() })?;
        let li = ex.index_of(layer).ok_or_else(|| PackageError::Meta {
            path: self.path.clone(),
            msg: format!("layer {layer} has no experts"),
        })?;
        if e >= ex.num_experts {
            return Err(PackageError::Meta { path: self.path.clone(), msg: format!("expert {e} out of range") });
        }
        let slot = li * ex.num_experts + e;
        let (off, sum) = &ex.table[slot];
        if self.expert_checked[slot].load(Ordering::Acquire) == 0 {
            self.check_blob(&format!("expert blob (layer {layer}, expert {e})"), li, *off, sum)?;
            self.expert_checked[slot].store(1, Ordering::Release);
        }
        let (bytes, origin) = self.bytes_for(*off, ex.len_of(li));
        let parts = ex.parts_of(li);
        // the resident copy's parts in lane order, where `experts_in_lanes` put them
        let laned = self.experts_laned && origin > 0;
        let mat = |k: usize| {
            let mut m = mat_at(bytes, origin, &parts[k], *off);
            if laned && super::resident::to_lanes(&parts[k]) {
                in_lanes(&mut m);
            }
            m
        };
        Ok(ExpertMats { gate: mat(0), up: mat(1), down: mat(2) })
    }

    /// Check every expert blob not checked yet, in table order, until `stop` is set; meant for a
    /// thread of its own, so that decode does not stop to hash each expert at its first use
    /// (tokens that meet experts for the first time would otherwise run measurably slower). A
    /// blob that fails is left unchecked: its first use verifies it again and reports the error.
    /// An expert blob of the `li`-th MoE layer at `off`: its checksum, then its parts' weights
    /// and scales finite (a blob marked checked passed both, whichever thread checked it).
    fn check_blob(&self, what: &str, li: usize, off: u64, sum: &str) -> Result<(), PackageError> {
        let Some(ex) = &self.meta.experts else { return Ok(()) };
        self.verify(what, off, ex.len_of(li), Some(sum))?;
        for p in ex.parts_of(li) {
            self.check_finite(|| format!("{what} {}", p.name), p, off)?;
        }
        Ok(())
    }

    pub fn verify_experts(&self, stop: &AtomicBool) {
        let Some(ex) = &self.meta.experts else { return };
        for (slot, (off, sum)) in ex.table.iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if self.expert_checked[slot].load(Ordering::Acquire) == 0
                && self.check_blob("expert blob", slot / ex.num_experts.max(1), *off, sum).is_ok()
            {
                self.expert_checked[slot].store(1, Ordering::Release);
            }
        }
    }

    /// The three matrices of an expert blob of MoE layer `moe_layer` (its place among the MoE
    /// layers) already in memory (read by the expert store).
    pub fn expert_view<'a>(&self, moe_layer: usize, blob: &'a [u8]) -> Result<ExpertMats<'a>, PackageError> {
        let ex = self
            .meta
            .experts
            .as_ref()
            .ok_or_else(|| PackageError::Meta { path: self.path.clone(), msg: "no expert table".into() })?;
        if moe_layer >= ex.layers.len() {
            return Err(PackageError::Meta {
                path: self.path.clone(),
                msg: format!("MoE layer {moe_layer} out of range"),
            });
        }
        if (blob.len() as u64) < ex.len_of(moe_layer) || !(blob.as_ptr() as usize).is_multiple_of(64) {
            return Err(PackageError::Meta {
                path: self.path.clone(),
                msg: "expert buffer too short or misaligned".into(),
            });
        }
        let parts = ex.parts_of(moe_layer);
        Ok(ExpertMats {
            gate: mat_at(blob, 0, &parts[0], 0),
            up: mat_at(blob, 0, &parts[1], 0),
            down: mat_at(blob, 0, &parts[2], 0),
        })
    }

    /// Bytes of its regions and of one expert blob.
    pub fn sizes(&self) -> PackageSizes {
        let blob = self.meta.experts.as_ref().map_or(0, |e| e.blob_len);
        PackageSizes { dense: self.header.dense_len, experts: self.header.expert_len, blob }
    }
}

/// Bytes of a package's regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackageSizes {
    /// The dense tensors.
    pub dense: u64,
    /// Every expert blob.
    pub experts: u64,
    /// One expert blob (gate, up and down with padding; 0 without experts).
    pub blob: u64,
}

/// A dense tensor of a package, checked by [`Package::require`]: its place in the tensor index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorId(usize);

impl TensorId {
    /// Its place in the package's tensor index (`meta.tensors`).
    pub fn index(self) -> usize {
        self.0
    }
}

/// gate `[I, H]`, up `[I, H]`, down `[H, I]` of one expert.
pub struct ExpertMats<'a> {
    pub gate: Mat<'a>,
    pub up: Mat<'a>,
    pub down: Mat<'a>,
}

/// `bytes` (file offset `offset`) against the hex xxh3 `sum`: an error naming `what` if it is
/// missing, malformed or different.
pub(super) fn verify_bytes(
    path: &Path,
    what: &str,
    bytes: &[u8],
    offset: u64,
    sum: Option<&str>,
) -> Result<(), PackageError> {
    let want = sum.and_then(parse_hex64).ok_or_else(|| PackageError::Meta {
        path: path.to_path_buf(),
        msg: format!("{what}: missing or malformed checksum"),
    })?;
    if xxhash_rust::xxh3::xxh3_64(bytes) != want {
        let len = bytes.len() as u64;
        return Err(PackageError::Checksum { path: path.to_path_buf(), what: what.to_string(), offset, len });
    }
    Ok(())
}

/// The matrix an (already validated) entry describes, its offsets taken from `base`.
/// `bytes` start at file (or blob) offset `origin`.
pub(super) fn mat_at<'a>(bytes: &'a [u8], origin: u64, t: &TensorEntry, base: u64) -> Mat<'a> {
    let (rows, cols) = t.rows_cols();
    let f = t.format().unwrap_or(Format::F32);
    let start = (base + t.offset - origin) as usize;
    if let ScaleForm::Blocks(bt) = t.scale_form() {
        let q = &bytes[start..start + bt.bytes_of(rows * cols)];
        return Mat { rows, cols, data: MatData::Blocks { t: bt, q } };
    }
    let data = &bytes[start..start + f.data_bytes(rows, cols)];
    let sb = f.scale_bytes(rows, cols);
    let s = (base + t.scales_offset.unwrap_or(t.offset) - origin) as usize;
    let scales = || bytemuck::cast_slice::<u8, f32>(&bytes[s..s + sb]);
    // f16 scales (and mins): as many bytes as the entry's form takes
    let halves = || bytemuck::cast_slice::<u8, u16>(&bytes[s..s + t.scale_form().bytes(f, rows, cols)]);
    let mins = t.has_mins().then(|| bytemuck::cast_slice::<u8, f32>(&bytes[s + sb..s + 2 * sb]));
    let data = match f {
        Format::F32 => MatData::F32(bytemuck::cast_slice(data)),
        Format::Bf16 => MatData::Bf16(bytemuck::cast_slice(data)),
        Format::Q8 { group } if t.scale_form() == ScaleForm::F16 => {
            MatData::Q8F16 { q: bytemuck::cast_slice(data), scales: halves(), group }
        }
        Format::Q8 { group } => MatData::Q8 { q: bytemuck::cast_slice(data), scales: scales(), group, mins },
        Format::Q4 { .. } if t.scale_form() == ScaleForm::K4 => {
            let k = &bytes[s..s + k4_bytes(rows, cols)];
            MatData::Q4K { q: data, k, x4: interleaved(t), panels: false }
        }
        Format::Q4 { group } if matches!(t.scale_form(), ScaleForm::F16 | ScaleForm::F16Mins) => {
            let mins = t.scale_form() == ScaleForm::F16Mins;
            MatData::Q4F16 { q: data, scales: halves(), group, x4: interleaved(t), panels: false, lanes: false, mins }
        }
        Format::Q4 { group } => {
            MatData::Q4 { q: data, scales: scales(), group, x4: interleaved(t), panels: false, lanes: false, mins }
        }
        Format::Q6 { .. } if t.scale_form() == ScaleForm::K6 => {
            let k = &bytes[s..s + k6_bytes(rows, cols)];
            MatData::Q6K { q: data, k, x4: interleaved(t), panels: false }
        }
        Format::Q6 { group } => MatData::Q6 { q: data, scales: scales(), group, x4: interleaved(t), panels: false },
        Format::Mxfp4 => MatData::Mxfp4 { q: data },
    };
    Mat { rows, cols, data }
}

/// Mark a q4 matrix with symmetric groups as being in lane order (its bytes reordered so by
/// `package::resident`).
fn in_lanes(m: &mut Mat<'_>) {
    if let MatData::Q4 { lanes, .. } | MatData::Q4F16 { lanes, .. } = &mut m.data {
        *lanes = true;
    }
}

/// Whether a (validated) entry's rows are stored interleaved.
pub(super) fn interleaved(t: &TensorEntry) -> bool {
    let (rows, cols) = t.rows_cols();
    t.format().is_some_and(|f| f.interleaves(rows, cols) && t.base_layout() == f.layout(rows, cols))
}
