//! The metadata's entries checked before anything is read through them: each tensor entry's
//! shape, format, size, alignment and layout within its region, and the expert table against the
//! model (layers, parts, blob lengths, every blob inside the expert region).

use std::path::Path;

use super::error::PackageError;
use super::layout::*;

/// Shape, format, size and alignment of one entry, within `[lo, hi)`.
pub(super) fn check_entry(path: &Path, t: &TensorEntry, lo: u64, hi: u64) -> Result<(), PackageError> {
    let bad = |msg: String| PackageError::Tensor { path: path.to_path_buf(), name: t.name.clone(), msg };
    let Some((len, so)) = t.expected_len() else {
        return Err(bad(format!("inconsistent type {:?} / group {:?} / shape {:?}", t.dtype, t.group, t.shape)));
    };
    if t.shape.is_empty() || t.shape.len() > 2 {
        return Err(bad(format!("shape {:?} is not a vector or a matrix", t.shape)));
    }
    if t.length != len {
        return Err(bad(format!("length {} at offset {}, expected {len} for its type and shape", t.length, t.offset)));
    }
    if !t.offset.is_multiple_of(DENSE_ALIGN) {
        return Err(bad(format!("offset {} is not {DENSE_ALIGN}-byte aligned", t.offset)));
    }
    let end = t.offset.saturating_add(t.length);
    if t.offset < lo || end > hi {
        return Err(bad(format!("bytes {}..{end} lie outside their region {lo}..{hi}", t.offset)));
    }
    if t.scales_offset != so.map(|s| t.offset + s) {
        return Err(bad(format!("scales offset {:?} does not follow the values", t.scales_offset)));
    }
    // the layout this version writes, or rows one after another (as earlier versions wrote)
    let (rows, cols) = t.rows_cols();
    let (want, plain) = t.format().map(|f| (f.layout(rows, cols), f.row_major_layout())).unwrap_or(("", ""));
    if t.base_layout() != want && t.base_layout() != plain {
        return Err(bad(format!("layout '{}' is not supported (expected '{want}')", t.layout)));
    }
    Ok(())
}

pub(super) fn check_experts(path: &Path, ex: &ExpertRegion, meta: &Meta, h: &Header) -> Result<usize, PackageError> {
    let m = &meta.model;
    let bad = |msg: String| PackageError::Meta { path: path.to_path_buf(), msg: format!("expert table: {msg}") };
    if ex.layers != m.moe_layers() || ex.num_experts != m.num_experts {
        return Err(bad(format!(
            "covers layers {:?} x {} experts, the model has MoE layers {:?} x {}",
            ex.layers,
            ex.num_experts,
            m.moe_layers(),
            m.num_experts
        )));
    }
    let (hd, inter) = (m.hidden_size, m.moe_intermediate_size);
    let want = [("gate_proj", [inter, hd]), ("up_proj", [inter, hd]), ("down_proj", [hd, inter])];
    if ex.parts.len() != 3 && !ex.per_layer() {
        return Err(bad(format!("{} parts, expected 3 (or 3 per layer)", ex.parts.len())));
    }
    if ex.blob_len == 0 || !ex.blob_len.is_multiple_of(EXPERT_ALIGN) {
        return Err(bad(format!("blob length {} is not a multiple of {EXPERT_ALIGN}", ex.blob_len)));
    }
    if !ex.layer_lens.is_empty() {
        // one length per layer (version 2): each a whole number of pages, the longest blob_len
        if h.version < 2 || ex.layer_lens.len() != ex.layers.len() || !ex.per_layer() {
            return Err(bad(format!(
                "{} layer lengths for {} layers with {} parts in a version {} package",
                ex.layer_lens.len(),
                ex.layers.len(),
                ex.parts.len(),
                h.version
            )));
        }
        let max = ex.layer_lens.iter().copied().max().unwrap_or(0);
        if let Some(l) = ex.layer_lens.iter().find(|&&l| l == 0 || !l.is_multiple_of(EXPERT_ALIGN)) {
            return Err(bad(format!("layer blob length {l} is not a positive multiple of {EXPERT_ALIGN}")));
        }
        if max != ex.blob_len {
            return Err(bad(format!("longest layer blob {max} is not the blob length {}", ex.blob_len)));
        }
    }
    for (i, (p, (name, shape))) in ex.parts.iter().zip(want.iter().cycle()).enumerate() {
        if p.name != *name || p.shape != *shape {
            return Err(bad(format!("part {} {:?}, expected {name} {:?}", p.name, p.shape, shape)));
        }
        let len = if ex.per_layer() { ex.len_of(i / 3) } else { ex.blob_len };
        check_entry(path, p, 0, len)?;
    }
    let n = ex.layers.len() * ex.num_experts;
    if ex.table.len() != n {
        return Err(bad(format!("{} entries, expected {n}", ex.table.len())));
    }
    let (lo, hi) = (h.expert_offset, h.expert_offset + h.expert_len);
    for (i, (off, sum)) in ex.table.iter().enumerate() {
        let end = off.checked_add(ex.len_of(i / ex.num_experts)).unwrap_or(u64::MAX);
        if off % EXPERT_ALIGN != 0 || *off < lo || end > hi {
            return Err(bad(format!(
                "blob {i} (layer {}, expert {}) at offset {off} is misaligned or outside the expert region",
                ex.layers[i / ex.num_experts],
                i % ex.num_experts
            )));
        }
        if parse_hex64(sum).is_none() {
            return Err(bad(format!("blob {i} has a malformed checksum")));
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::package::reader::interleaved;
    use moescope_kernels::Format;

    fn q4_entry(shape: &[usize], layout: &str) -> TensorEntry {
        let f = Format::Q4 { group: 128 };
        let (rows, cols) = (shape[0], shape[1]);
        let (length, so) = span(f, rows, cols, ScaleForm::Plain);
        TensorEntry {
            name: "w".into(),
            dtype: DType::Q4,
            shape: shape.to_vec(),
            group: Some(128),
            layout: layout.into(),
            offset: 0,
            length,
            scales_offset: so,
            xxh3: None,
        }
    }

    #[test]
    fn layouts_this_version_writes_and_row_major_ones_are_taken_others_refused() {
        let p = Path::new("m.moe");
        // 8 rows of whole chunks: written interleaved, and row-major (older packages) still read
        for layout in ["q4_lohi32_x4", "q4_lohi32"] {
            let t = q4_entry(&[8, 256], layout);
            assert!(check_entry(p, &t, 0, 1 << 20).is_ok(), "{layout}");
            assert_eq!(interleaved(&t), layout.ends_with("_x4"), "{layout}");
        }
        // 6 rows are not whole blocks of 4: an x4 claim is refused, naming the tensor and layout
        let t = q4_entry(&[6, 256], "q4_lohi32_x4");
        let e = check_entry(p, &t, 0, 1 << 20).unwrap_err().to_string();
        assert!(
            e.contains("'q4_lohi32_x4' is not supported") && e.contains("expected 'q4_lohi32'") && e.contains('w'),
            "{e}"
        );
        assert!(check_entry(p, &q4_entry(&[6, 256], "q4_lohi32"), 0, 1 << 20).is_ok());
        // and another format's layout name
        let e = check_entry(p, &q4_entry(&[8, 256], "q6_lo4hi2_x4"), 0, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("not supported"), "{e}");
    }
}
