//! The resident copy of a package's dense weights (and of its experts when they fit): copied
//! into huge pages at load, and there reordered for the AVX-512 kernels: q4 matrices with
//! symmetric groups in lane order ([`moescope_kernels::quant::lanes_offset`], and their scales,
//! [`moescope_kernels::quant::lane_scale_index`]: the q4 kernel reads each 16-row block and its
//! scales as they are, where it transposed them at every product, which cost decode 4-6% and
//! prefill about as much for the values, 2-5% for the scales), the other long rows panel-major
//! ([`moescope_kernels::quant::panel_offset`]: the decode kernel then reuses each panel of the
//! activations while it is in L1). The bytes are the same, reordered in memory only (the file
//! keeps the x4 order, so streaming, checksums and other readers are untouched; each tensor and
//! expert blob is checked before it is reordered); every product is the same, bit for bit. Only
//! where the AVX-512 kernels run: the other tiers gather such rows one at a time.

use moescope_kernels::quant::{lane_rows, lane_scales, lanes_pay, panel_rows, panels_pay};

use super::PackageError;
use super::layout::{ScaleForm, TensorEntry};
use super::reader::Package;

impl Package {
    /// Copy the dense region (`with_experts`: and the expert region after it) into anonymous
    /// memory backed by transparent huge pages. Decode streams every dense weight once per token
    /// (the lm_head alone is nearly half of a Qwen3-30B-A3B q4 token): with 2 MiB pages the reads
    /// cross no 4 KiB page boundaries and miss no TLB entries. The page cache's copy is 4 KiB
    /// pages the kernel does not map huge. The experts too when they are served from memory
    /// rather than streamed (the package fits): through 4 KiB pages they ran slower than the
    /// copy (both measured in the commits that added them). The cost is a start that reads the
    /// whole file.
    /// `drop_cached`: drop the file's copy of those pages from the page cache (when experts
    /// stream, memory is what the pool is sized against; else the next start reads them from
    /// memory rather than the disk). `panels`: put the dense matrices with long rows in the
    /// panel-major order the AVX-512 decode kernel reads fastest (below), each
    /// verified against its checksum first.
    pub fn make_resident(&mut self, with_experts: bool, drop_cached: bool, panels: bool) -> Result<(), PackageError> {
        use std::os::unix::fs::FileExt;
        let start = self.header.dense_offset;
        let end = if with_experts && self.header.expert_len > 0 {
            self.header.expert_offset + self.header.expert_len
        } else {
            start + self.header.dense_len
        };
        let len = end - start;
        let io = |e: std::io::Error| PackageError::Io { path: self.path.clone(), error: e };
        let _s = crate::trace::span("make_resident")
            .arg("bytes", len)
            .arg("with_experts", if with_experts { "yes" } else { "no" });
        let mut anon = memmap2::MmapMut::map_anon(len as usize).map_err(io)?;
        // advisory: without THP the copy still works, as 4 KiB pages
        let _ = anon.advise(memmap2::Advice::HugePage);
        let file = std::fs::File::open(&self.path).map_err(io)?;
        // in as many parts as there are cores: each part's page faults (zeroing huge pages) and
        // copy out of the page cache run beside the others' (3.2 GB: 0.8-2.6 s in one part here)
        let parts = crate::sysinfo::logical_cores().clamp(1, 8);
        let step = (len as usize).div_ceil(parts).next_multiple_of(2 << 20);
        std::thread::scope(|sc| {
            let jobs: Vec<_> = anon
                .chunks_mut(step)
                .enumerate()
                .map(|(i, part)| {
                    let file = &file;
                    sc.spawn(move || file.read_exact_at(part, start + (i * step) as u64))
                })
                .collect();
            jobs.into_iter()
                .try_for_each(|j| j.join().unwrap_or_else(|_| Err(std::io::Error::other("a copy thread panicked"))))
        })
        .map_err(io)?;
        if drop_cached {
            // SAFETY: advisory call on an open descriptor
            unsafe {
                use std::os::fd::AsRawFd;
                libc::posix_fadvise(file.as_raw_fd(), start as i64, len as i64, libc::POSIX_FADV_DONTNEED);
            }
        }
        if panels {
            let mut panelled = vec![false; self.meta.tensors.len()];
            for (i, t) in self.meta.tensors.iter().enumerate() {
                let at = t.offset.checked_sub(start).map(|a| a as usize);
                if let Some(at) = at.filter(|&a| a + t.length as usize <= anon.len())
                    && (wants_panels(t) || to_lanes(t))
                {
                    super::reader::verify_bytes(
                        &self.path,
                        &t.name,
                        &anon[at..at + t.length as usize],
                        t.offset,
                        t.xxh3.as_deref(),
                    )?;
                    reorder(&mut anon, at, t);
                    panelled[i] = true;
                }
            }
            // the experts before the flags: a blob that fails its check leaves no copy, and no
            // tensor marked as reordered in the mapping's bytes
            let laned = with_experts && self.header.expert_len > 0;
            if laned {
                self.experts_in_lanes(&mut anon, start)?;
            }
            self.resident = Some((start, anon.make_read_only().map_err(io)?));
            (self.panelled, self.experts_laned) = (panelled, laned);
            return Ok(());
        }
        self.resident = Some((start, anon.make_read_only().map_err(io)?));
        Ok(())
    }

    /// Dense tensors whose resident copy is reordered, panel-major or in lane order
    /// ([`make_resident`](Self::make_resident)).
    pub fn panelled_tensors(&self) -> usize {
        self.panelled.iter().filter(|&&p| p).count()
    }
}

/// Whether `t` (a dense tensor) is reordered when made resident: a row-interleaved q4 or q6
/// matrix with rows as long as [`panels_pay`] asks.
fn wants_panels(t: &TensorEntry) -> bool {
    let (rows, cols) = t.rows_cols();
    super::reader::interleaved(t) && t.format().is_some_and(|f| panels_pay(f, rows, cols))
}

/// Whether `t` (dense, or an expert's part) is put in lane order when made resident: a
/// row-interleaved q4 matrix with symmetric groups (f32 or f16 scales) that [`lanes_pay`]
/// takes, for the AVX-512 q4 kernel (`mat/avx512_q4_rows.rs`), which then reads each 16-row
/// block as it is rather than transposing it at every product.
pub(super) fn to_lanes(t: &TensorEntry) -> bool {
    let (rows, cols) = t.rows_cols();
    super::reader::interleaved(t)
        && matches!(t.scale_form(), ScaleForm::Plain | ScaleForm::F16)
        && t.format().is_some_and(|f| lanes_pay(f, rows, cols))
}

/// Reorder the value bytes of `t`, which start at `at` in `bytes`: into lane order where
/// [`to_lanes`] (its scales too, wherever they lie past `at`), else panel-major.
fn reorder(bytes: &mut [u8], at: usize, t: &TensorEntry) {
    let (rows, cols) = t.rows_cols();
    let Some(f) = t.format() else { return };
    let (rb, cb) = (f.data_bytes(1, cols), f.chunk_bytes().unwrap_or(0));
    let vals = &mut bytes[at..at + rows * rb];
    let x4 = vals.to_vec();
    if !to_lanes(t) {
        panel_rows(&x4, rb, cb, vals);
        return;
    }
    lane_rows(&x4, rb, vals);
    // f32 or f16 scales (`to_lanes` takes no mins), `[rows, groups]`
    let (Some(group), Some(past)) = (f.group(), t.scales_offset.and_then(|so| so.checked_sub(t.offset))) else {
        return;
    };
    let width = if t.scale_form() == ScaleForm::F16 { 2 } else { 4 };
    let (ng, s) = (cols / group, at + past as usize);
    let scales = &mut bytes[s..s + rows * ng * width];
    let rm = scales.to_vec();
    if width == 2 {
        lane_scales(rm.as_chunks::<2>().0, ng, scales.as_chunks_mut::<2>().0);
    } else {
        lane_scales(rm.as_chunks::<4>().0, ng, scales.as_chunks_mut::<4>().0);
    }
}

impl Package {
    /// Every expert blob of the resident copy `anon` (file offset `start` at its first byte)
    /// checked (checksum, finite values) and its parts that [`to_lanes`] put in lane order;
    /// then marked checked, so no later check reads the reordered bytes.
    fn experts_in_lanes(&self, anon: &mut [u8], start: u64) -> Result<(), PackageError> {
        let Some(ex) = self.meta.experts.clone() else { return Ok(()) };
        let _s = crate::trace::span("experts_in_lanes");
        for (slot, (off, sum)) in ex.table.iter().enumerate() {
            let li = slot / ex.num_experts.max(1);
            let what = format!("expert blob (layer {}, expert {})", ex.layers[li], slot % ex.num_experts.max(1));
            let at = (off - start) as usize;
            let blob = &anon[at..at + ex.len_of(li) as usize];
            super::reader::verify_bytes(&self.path, &what, blob, *off, Some(sum))?;
            for p in ex.parts_of(li) {
                self.finite_in(|| format!("{what} {}", p.name), p, *off, (&anon[..], start))?;
            }
            for p in ex.parts_of(li) {
                if to_lanes(p) {
                    reorder(anon, at + p.offset as usize, p);
                }
            }
            self.mark_checked(slot);
        }
        Ok(())
    }
}
