//! A package's multi-token-prediction section ([`MtpSection`]): checked when the package opens,
//! read a tensor at a time (checksum first), never made resident.

use std::collections::HashMap;
use std::path::Path;

use moescope_kernels::Mat;

use super::error::PackageError;
use super::layout::*;
use super::reader::{Package, mat_at};
use super::validate::check_entry;

/// The MTP section's tensors by name (none without one), after checking that its layers follow
/// the model's (`num_hidden_layers ..` + `num_nextn_predict_layers`) and that each tensor lies
/// between the end of the regions before it and the end of the file.
pub(super) fn check(path: &Path, meta: &Meta, h: &Header) -> Result<HashMap<String, usize>, PackageError> {
    let Some(mtp) = &meta.mtp else { return Ok(HashMap::new()) };
    let m = &meta.model;
    let want: Vec<usize> = (m.num_hidden_layers..m.num_hidden_layers + m.features.nextn_layers).collect();
    if mtp.layers != want || mtp.tensors.is_empty() {
        return Err(PackageError::Meta {
            path: path.to_path_buf(),
            msg: format!(
                "multi-token-prediction section: layers {:?} with {} tensors, the model states layers {want:?}",
                mtp.layers,
                mtp.tensors.len()
            ),
        });
    }
    let lo = (h.dense_offset + h.dense_len).max(h.expert_offset + h.expert_len);
    let mut index = HashMap::new();
    for (i, t) in mtp.tensors.iter().enumerate() {
        check_entry(path, t, lo, h.file_size)?;
        if index.insert(t.name.clone(), i).is_some() {
            return Err(PackageError::Tensor {
                path: path.to_path_buf(),
                name: t.name.clone(),
                msg: "listed twice".into(),
            });
        }
    }
    Ok(index)
}

impl Package {
    /// Every multi-token-prediction tensor against its checksum (`inspect` does; a run does not
    /// read them).
    pub fn verify_mtp(&self) -> Result<(), PackageError> {
        self.meta.mtp.iter().flat_map(|m| &m.tensors).try_for_each(|t| self.verify_entry(t))
    }

    /// Multi-token-prediction tensor `name` (from the file's mapping), its checksum and values
    /// checked on each call.
    pub fn mtp_tensor(&self, name: &str) -> Result<Mat<'_>, PackageError> {
        let entry = self.mtp_index.get(name).and_then(|&i| Some(&self.meta.mtp.as_ref()?.tensors[i]));
        let t =
            entry.ok_or_else(|| PackageError::Missing { path: self.path().to_path_buf(), name: name.to_string() })?;
        self.verify_entry(t)?;
        Ok(mat_at(&self.mmap, 0, t, 0))
    }
}
