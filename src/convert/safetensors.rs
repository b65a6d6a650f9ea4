//! Reading HuggingFace safetensors checkpoints (one file, or shards with
//! `model.safetensors.index.json`) without loading them: headers are parsed up front and each
//! request reads just the rows it needs with `pread`, so memory stays bounded by one chunk.
//!
//! Fused experts (`mlp.experts.gate_up_proj [E, 2I, H]`, rows gate then up, and
//! `mlp.experts.down_proj [E, H, I]`, as in the official Qwen3.5 checkpoints) are exposed
//! under the per-expert names, so the rest of the converter sees one layout.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::ConvertError;
use super::source::TensorSource;
use moescope_kernels::quant::bf16_to_f32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StDtype {
    F32,
    F16,
    Bf16,
    /// Packed bytes (MXFP4's blocks and exponents): read with [`HfCheckpoint::read_bytes`].
    U8,
}

impl StDtype {
    fn size(self) -> usize {
        match self {
            StDtype::F32 => 4,
            StDtype::F16 | StDtype::Bf16 => 2,
            StDtype::U8 => 1,
        }
    }
}

/// One tensor as seen by the converter: a run of equally long rows in one file.
#[derive(Debug, Clone)]
struct Loc {
    file: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    /// Absolute file offset of row 0.
    start: u64,
}

impl Loc {
    fn row_len(&self) -> usize {
        if self.shape.len() == 1 { self.shape[0] } else { self.shape[1..].iter().product() }
    }
    fn rows(&self) -> usize {
        if self.shape.len() == 1 { 1 } else { self.shape[0] }
    }
}

pub struct HfCheckpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, File)>,
    tensors: HashMap<String, Loc>,
}

impl HfCheckpoint {
    /// Open every shard of `dir` and index its tensors.
    pub fn open(dir: &Path) -> Result<HfCheckpoint, ConvertError> {
        let index = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if index.exists() {
            let v = super::hf_config::read_json(&index)?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ConvertError::File { path: index.clone(), msg: "no weight_map object".into() })?;
            let mut names: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
            names.sort();
            names.dedup();
            names
        } else {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .map_err(|source| ConvertError::Io { path: dir.to_path_buf(), error: source })?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors") && n != "reference.safetensors")
                .collect();
            names.sort();
            names
        };
        if shard_names.is_empty() {
            return Err(ConvertError::File {
                path: dir.to_path_buf(),
                msg: "no *.safetensors weights found (is this a HuggingFace model directory?)".into(),
            });
        }
        let mut ck = HfCheckpoint { dir: dir.to_path_buf(), files: vec![], tensors: HashMap::new() };
        for name in shard_names {
            let path = dir.join(&name);
            if name.contains('/') || name.contains("..") {
                return Err(ConvertError::File {
                    path: index.clone(),
                    msg: format!("shard name '{name}' leaves the directory"),
                });
            }
            let file = File::open(&path).map_err(|source| ConvertError::Io { path: path.clone(), error: source })?;
            let fi = ck.files.len();
            for (tname, loc) in parse_header(&path, &file, fi)? {
                ck.add(tname, loc, &path)?;
            }
            ck.files.push((path, file));
        }
        Ok(ck)
    }

    fn add(&mut self, name: String, loc: Loc, path: &Path) -> Result<(), ConvertError> {
        // fused experts -> per-expert views, beside the fused tensor itself (gpt-oss's
        // transposed `[E, H, 2I]` is read whole, by `convert::gpt_oss`)
        let fused = name.strip_suffix(".weight").unwrap_or(&name);
        if let Some(prefix) = fused.strip_suffix(".experts.gate_up_proj") {
            let [e, two_i, h] = three(&loc, &name, path)?;
            let prefix = prefix.to_string();
            self.tensors.insert(name.clone(), loc.clone());
            if two_i % 2 != 0 {
                return Ok(()); // not Qwen3.5's layout; a reader of per-expert names finds none
            }
            let i = two_i / 2;
            let es = loc.dtype.size() as u64;
            for x in 0..e {
                let base = loc.start + (x * two_i * h) as u64 * es;
                let mk = |start| Loc { file: loc.file, dtype: loc.dtype, shape: vec![i, h], start };
                self.tensors.insert(format!("{prefix}.experts.{x}.gate_proj.weight"), mk(base));
                self.tensors.insert(format!("{prefix}.experts.{x}.up_proj.weight"), mk(base + (i * h) as u64 * es));
            }
            return Ok(());
        }
        if let Some(prefix) = fused.strip_suffix(".experts.down_proj") {
            let [e, h, i] = three(&loc, &name, path)?;
            let prefix = prefix.to_string();
            self.tensors.insert(name.clone(), loc.clone());
            let es = loc.dtype.size() as u64;
            for x in 0..e {
                let start = loc.start + (x * h * i) as u64 * es;
                self.tensors.insert(
                    format!("{prefix}.experts.{x}.down_proj.weight"),
                    Loc { file: loc.file, dtype: loc.dtype, shape: vec![h, i], start },
                );
            }
            return Ok(());
        }
        self.tensors.insert(name, loc);
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Total bytes of the weight files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().filter_map(|(_, f)| f.metadata().ok()).map(|m| m.len()).sum()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// Rows `[r0, r0 + n)` of a U8 tensor (rows along its first dimension), as bytes.
    pub fn read_bytes(&self, name: &str, r0: usize, n: usize, out: &mut Vec<u8>) -> Result<(), ConvertError> {
        let (loc, path, file) = self.locate(name, r0, n)?;
        if loc.dtype != StDtype::U8 {
            return Err(ConvertError::Tensor {
                file: path.clone(),
                name: name.into(),
                msg: "expected U8 bytes".into(),
            });
        }
        out.resize(n * loc.row_len(), 0);
        file.read_exact_at(out, loc.start + (r0 * loc.row_len()) as u64)
            .map_err(|source| ConvertError::Io { path: path.clone(), error: source })
    }

    /// The tensor `name` whose rows `[r0, r0 + n)` are asked for, and its file.
    fn locate(&self, name: &str, r0: usize, n: usize) -> Result<(&Loc, &PathBuf, &File), ConvertError> {
        let loc = self
            .tensors
            .get(name)
            .ok_or_else(|| ConvertError::MissingTensor { dir: self.dir.clone(), name: name.into() })?;
        let (path, file) = &self.files[loc.file];
        if r0 + n > loc.rows() {
            return Err(ConvertError::Tensor {
                file: path.clone(),
                name: name.into(),
                msg: format!("rows {r0}..{} out of range", r0 + n),
            });
        }
        Ok((loc, path, file))
    }
}

fn three(loc: &Loc, name: &str, path: &Path) -> Result<[usize; 3], ConvertError> {
    match loc.shape.as_slice() {
        [a, b, c] => Ok([*a, *b, *c]),
        s => Err(ConvertError::Tensor {
            file: path.into(),
            name: name.into(),
            msg: format!("fused experts must be 3-D, found shape {s:?}"),
        }),
    }
}

/// The safetensors header: 8-byte little-endian length, then JSON
/// `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`.
fn parse_header(path: &Path, file: &File, fi: usize) -> Result<Vec<(String, Loc)>, ConvertError> {
    let bad = |msg: String| ConvertError::File { path: path.to_path_buf(), msg };
    let io = |source| ConvertError::Io { path: path.to_path_buf(), error: source };
    let file_len = file.metadata().map_err(io)?.len();
    let mut n = [0u8; 8];
    file.read_exact_at(&mut n, 0).map_err(|_| bad("too short for a safetensors header".into()))?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 || 8 + n > file_len {
        return Err(bad(format!("safetensors header length {n} does not fit the file ({file_len} bytes)")));
    }
    let mut h = vec![0u8; n as usize];
    file.read_exact_at(&mut h, 8).map_err(io)?;
    let v: BTreeMap<String, Value> =
        serde_json::from_slice(&h).map_err(|e| bad(format!("invalid safetensors header: {e}")))?;
    let data_start = 8 + n;
    let mut out = vec![];
    for (name, t) in v {
        if name == "__metadata__" {
            continue;
        }
        let tbad = |msg: String| ConvertError::Tensor { file: path.to_path_buf(), name: name.clone(), msg };
        let dtype = match t.get("dtype").and_then(|d| d.as_str()) {
            Some("BF16") => StDtype::Bf16,
            Some("F16") => StDtype::F16,
            Some("F32") => StDtype::F32,
            Some("U8") => StDtype::U8,
            other => return Err(tbad(format!("dtype {other:?} is not supported (BF16, F16, F32, U8)"))),
        };
        let shape: Vec<usize> = t
            .get("shape")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64().map(|n| n as usize)).collect())
            .ok_or_else(|| tbad("no shape".into()))?;
        let offs: Vec<u64> = t
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        let [b, e] = offs[..] else {
            return Err(tbad("no data_offsets".into()));
        };
        let numel: usize = shape.iter().product();
        if e < b || e - b != (numel * dtype.size()) as u64 || data_start + e > file_len {
            return Err(tbad(format!("data_offsets [{b}, {e}] do not match shape {shape:?} or the file size")));
        }
        out.push((name, Loc { file: fi, dtype, shape, start: data_start + b }));
    }
    Ok(out)
}

impl TensorSource for HfCheckpoint {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|l| l.shape.clone())
    }

    fn read_rows(&self, name: &str, r0: usize, n: usize, out: &mut Vec<f32>) -> Result<(), ConvertError> {
        let (loc, path, file) = self.locate(name, r0, n)?;
        let cols = loc.row_len();
        if loc.dtype == StDtype::U8 {
            let msg = "holds packed bytes (U8), not weights to read as numbers".into();
            return Err(ConvertError::Tensor { file: path.clone(), name: name.into(), msg });
        }
        let es = loc.dtype.size();
        let mut raw = vec![0u8; n * cols * es];
        file.read_exact_at(&mut raw, loc.start + (r0 * cols * es) as u64)
            .map_err(|source| ConvertError::Io { path: path.clone(), error: source })?;
        out.clear();
        out.reserve(n * cols);
        match loc.dtype {
            StDtype::Bf16 => out.extend(raw.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))),
            StDtype::F16 => out.extend(raw.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())),
            StDtype::F32 => out.extend(raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            StDtype::U8 => {}
        }
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(ConvertError::NonFinite {
                file: path.clone(),
                name: name.into(),
                row: r0 + i / cols,
                col: i % cols,
                value: out[i],
            });
        }
        Ok(())
    }

    fn origin(&self, name: &str) -> String {
        match self.tensors.get(name) {
            Some(l) => self.files[l.file].0.display().to_string(),
            None => self.dir.display().to_string(),
        }
    }
}
