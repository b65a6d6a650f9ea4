//! GGUF files (llama.cpp's format, version 3, little-endian): the header, the metadata and the
//! tensor index, read without trusting any of it. Every count, length, shape, type and offset
//! is checked against what the file holds before it is used, so a damaged or hostile file
//! gives one error naming the key, tensor or byte offset, and nothing is allocated beyond the
//! file's size. Tensor data is not read here: each tensor's byte range is checked and kept.
//!
//! ```text
//! "GGUF" u32 version | u64 n_tensors | u64 n_kv
//! n_kv x (string key, u32 type, value)                 string = u64 length + UTF-8
//! n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//! padding to general.alignment (32); tensor data, each offset relative to its start
//! ```

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's most dimensions a tensor has.
const MAX_DIMS: usize = 4;
/// Arrays of arrays nest at most this deep.
const MAX_DEPTH: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: not a GGUF file (no GGUF magic at offset 0)")]
    Magic { path: PathBuf },
    #[error("{path}: a big-endian GGUF file; only little-endian files are supported")]
    BigEndian { path: PathBuf },
    #[error("{path}: GGUF version {version} is not supported (only version 3)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: at offset {offset}: {what}")]
    At { path: PathBuf, offset: u64, what: String },
    #[error("{path}: key '{key}': {what}")]
    Key { path: PathBuf, key: String, what: String },
    #[error("{path}: tensor {name}: {what}")]
    Tensor { path: PathBuf, name: String, what: String },
}

/// A ggml tensor type: its id in the file, name, and block (values per block, bytes per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    pub block: u64,
    pub block_bytes: u64,
}

/// Every type gguf-py 0.19 knows (`GGML_QUANT_SIZES`); which of them moescope can run is the
/// converter's business.
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|t| t.0 == id).map(|&(id, name, block, block_bytes)| GgmlType {
            id,
            name,
            block,
            block_bytes,
        })
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type's name, and the elements.
    Array(&'static str, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The value type's name, as gguf-py spells it (lower case).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "uint8",
            Value::I8(_) => "int8",
            Value::U16(_) => "uint16",
            Value::I16(_) => "int16",
            Value::U32(_) => "uint32",
            Value::I32(_) => "int32",
            Value::F32(_) => "float32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(..) => "array",
            Value::U64(_) => "uint64",
            Value::I64(_) => "int64",
            Value::F64(_) => "float64",
        }
    }

    /// A whole number of any integer type that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(x) => Some(x as u64),
            Value::U16(x) => Some(x as u64),
            Value::U32(x) => Some(x as u64),
            Value::U64(x) => Some(x),
            Value::I8(x) => u64::try_from(x).ok(),
            Value::I16(x) => u64::try_from(x).ok(),
            Value::I32(x) => u64::try_from(x).ok(),
            Value::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x as f64),
            Value::F64(x) => Some(x),
            _ => self.as_u64().map(|x| x as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        if let Value::Str(s) = self { Some(s) } else { None }
    }

    /// As JSON (for `inspect --json` and the tests).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::Str(s) => json!(s),
            Value::Bool(b) => json!(b),
            Value::F32(x) => json!(x),
            Value::F64(x) => json!(x),
            Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => json!(self.as_i64()),
            Value::Array(_, v) => serde_json::Value::Array(v.iter().map(Value::to_json).collect()),
            _ => json!(self.as_u64()),
        }
    }

    fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(x) => Some(x as i64),
            Value::I16(x) => Some(x as i64),
            Value::I32(x) => Some(x as i64),
            Value::I64(x) => Some(x),
            _ => self.as_u64().and_then(|x| i64::try_from(x).ok()),
        }
    }
}

/// One tensor's entry: its dimensions in ggml order (`ne[0]` innermost), type, and where its
/// data lies in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute offset in the file.
    pub offset: u64,
    pub bytes: u64,
}

/// A GGUF file's header, metadata and tensor index.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub file_size: u64,
    /// In file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where tensor data begins.
    pub data_start: u64,
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }
}

/// Whether `path` starts with the GGUF magic (either byte order: a big-endian file is refused
/// by [`open`] with its own error).
pub fn is_gguf(path: &Path) -> bool {
    let mut m = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut m)).is_ok() && (&m == MAGIC || &m == b"FUGG")
}

/// Read and check `path`'s header, metadata and tensor index.
pub fn open(path: &Path) -> Result<Gguf, GgufError> {
    let io = |error| GgufError::Io { path: path.to_path_buf(), error };
    let f = File::open(path).map_err(io)?;
    let file_size = f.metadata().map_err(io)?.len();
    let mut r = Reader { r: BufReader::with_capacity(1 << 16, f), pos: 0, size: file_size, path };
    let magic: [u8; 4] = r.array("the magic")?;
    if &magic == b"FUGG" {
        return Err(GgufError::BigEndian { path: path.into() });
    }
    if &magic != MAGIC {
        return Err(GgufError::Magic { path: path.into() });
    }
    let version = r.u32("the version")?;
    if version != 3 {
        return Err(GgufError::Version { path: path.into(), version });
    }
    let n_tensors = r.u64("the tensor count")?;
    let n_kv = r.u64("the metadata count")?;
    // the smallest entry of each: a key of one byte, a type and a u8 value (13 bytes); a name of
    // one byte, one dimension, a type and an offset (29 bytes)
    r.fits(n_kv, 13, "metadata entries")?;
    r.fits(n_tensors, 29, "tensors")?;
    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let at = r.pos;
        let key = r.string("a metadata key")?;
        if metadata.iter().any(|(k, _)| *k == key) {
            return Err(r.err_at(at, format!("key '{key}' appears twice")));
        }
        let ty = r.u32("a value type").map_err(|e| key_err(path, &key, e))?;
        let v = r.value(ty, 0).map_err(|e| key_err(path, &key, e))?;
        metadata.push((key, v));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            let what = format!("must be a u32 power of two, got {v:?}");
            return Err(GgufError::Key { path: path.into(), key: "general.alignment".into(), what });
        }
    };
    let mut raw = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = r.string("a tensor name")?;
        let t = r.tensor_entry().map_err(|e| tensor_err(path, &name, e))?;
        raw.push((name, t));
    }
    let data_start = r.pos.next_multiple_of(alignment);
    let tensors = place(path, raw, data_start, alignment, file_size)?;
    Ok(Gguf { path: path.into(), version, file_size, metadata, tensors, alignment, data_start })
}

/// A tensor's index entry as read: dimensions, ggml type id, data offset from the data start.
type RawEntry = (Vec<u64>, u32, u64);

/// Each tensor's byte range: aligned, inside the file, not overlapping another; its size from
/// its shape and type.
fn place(
    path: &Path,
    raw: Vec<(String, RawEntry)>,
    data_start: u64,
    alignment: u64,
    file_size: u64,
) -> Result<Vec<TensorInfo>, GgufError> {
    let mut out: Vec<TensorInfo> = Vec::with_capacity(raw.len());
    for (name, (ne, type_id, rel)) in raw {
        let bad = |what: String| GgufError::Tensor { path: path.into(), name: name.clone(), what };
        if out.iter().any(|t| t.name == name) {
            return Err(bad("appears twice in the index".into()));
        }
        let ty = GgmlType::from_id(type_id).ok_or_else(|| bad(format!("unknown ggml type {type_id}")))?;
        if ne[0] % ty.block != 0 {
            return Err(bad(format!(
                "{} values per row is not a whole number of {} blocks of {}",
                ne[0], ty.name, ty.block
            )));
        }
        let values = ne.iter().try_fold(1u64, |a, &n| a.checked_mul(n));
        let bytes = values.and_then(|v| (v / ty.block).checked_mul(ty.block_bytes));
        let bytes = bytes.ok_or_else(|| bad(format!("shape {ne:?} is too large")))?;
        if rel % alignment != 0 {
            return Err(bad(format!("data offset {rel} is not a multiple of the alignment {alignment}")));
        }
        let offset = data_start.checked_add(rel).ok_or_else(|| bad(format!("data offset {rel} is too large")))?;
        match offset.checked_add(bytes) {
            Some(end) if end <= file_size => {}
            _ => {
                let what = format!(
                    "its {bytes} bytes at offset {offset} ({} {ne:?}) go past the end of the file ({file_size} bytes)",
                    ty.name
                );
                return Err(bad(what));
            }
        }
        out.push(TensorInfo { name, ne, ty, offset, bytes });
    }
    let mut by_offset: Vec<&TensorInfo> = out.iter().filter(|t| t.bytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for w in by_offset.windows(2) {
        if w[0].offset + w[0].bytes > w[1].offset {
            let what = format!("its data overlaps tensor {}'s (offset {})", w[0].name, w[0].offset);
            return Err(GgufError::Tensor { path: path.into(), name: w[1].name.clone(), what });
        }
    }
    Ok(out)
}

fn key_err(path: &Path, key: &str, e: GgufError) -> GgufError {
    match e {
        GgufError::At { offset, what, .. } => {
            GgufError::Key { path: path.into(), key: key.into(), what: format!("at offset {offset}: {what}") }
        }
        e => e,
    }
}

fn tensor_err(path: &Path, name: &str, e: GgufError) -> GgufError {
    match e {
        GgufError::At { offset, what, .. } => {
            GgufError::Tensor { path: path.into(), name: name.into(), what: format!("at offset {offset}: {what}") }
        }
        e => e,
    }
}

/// The file read forward, every read checked against its size.
struct Reader<'a> {
    r: BufReader<File>,
    pos: u64,
    size: u64,
    path: &'a Path,
}

impl Reader<'_> {
    fn err_at(&self, offset: u64, what: String) -> GgufError {
        GgufError::At { path: self.path.into(), offset, what }
    }

    fn left(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    /// `n` items of at least `each` bytes must fit in what is left.
    fn fits(&self, n: u64, each: u64, what: &str) -> Result<(), GgufError> {
        if n.checked_mul(each).is_none_or(|b| b > self.left()) {
            let most = self.left() / each;
            return Err(self.err_at(
                self.pos,
                format!("the file claims {n} {what}; its {} bytes left hold at most {most}", self.left()),
            ));
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, GgufError> {
        if n > self.left() {
            return Err(self
                .err_at(self.pos, format!("{what} of {n} bytes runs past the end of the file ({} bytes)", self.size)));
        }
        let mut b = vec![0u8; n as usize];
        self.r.read_exact(&mut b).map_err(|error| GgufError::Io { path: self.path.into(), error })?;
        self.pos += n;
        Ok(b)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.bytes(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&b);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > self.left() {
            return Err(
                self.err_at(at, format!("{what} of {n} bytes runs past the end of the file ({} bytes)", self.size))
            );
        }
        let b = self.bytes(n, what)?;
        String::from_utf8(b).map_err(|_| self.err_at(at, format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, GgufError> {
        let at = self.pos;
        Ok(match ty {
            0 => Value::U8(self.array::<1>("a u8")?[0]),
            1 => Value::I8(self.array::<1>("an i8")?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array("a u16")?)),
            3 => Value::I16(i16::from_le_bytes(self.array("an i16")?)),
            4 => Value::U32(self.u32("a u32")?),
            5 => Value::I32(i32::from_le_bytes(self.array("an i32")?)),
            6 => Value::F32(f32::from_le_bytes(self.array("an f32")?)),
            7 => match self.array::<1>("a bool")?[0] {
                b @ (0 | 1) => Value::Bool(b == 1),
                b => return Err(self.err_at(at, format!("a bool of {b} (0 or 1)"))),
            },
            8 => Value::Str(self.string("a string")?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.err_at(at, format!("arrays nested more than {MAX_DEPTH} deep")));
                }
                let elem = self.u32("an array's element type")?;
                let n = self.u64("an array's length")?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    t => return Err(self.err_at(at, format!("an array of unknown value type {t}"))),
                };
                self.fits(n, min, "array elements")?;
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, depth + 1)?);
                }
                Value::Array(type_name(elem), v)
            }
            10 => Value::U64(self.u64("a u64")?),
            11 => Value::I64(i64::from_le_bytes(self.array("an i64")?)),
            12 => Value::F64(f64::from_le_bytes(self.array("an f64")?)),
            t => return Err(self.err_at(at, format!("unknown value type {t}"))),
        })
    }

    /// A tensor's dimensions, type id and relative data offset.
    fn tensor_entry(&mut self) -> Result<RawEntry, GgufError> {
        let at = self.pos;
        let n_dims = self.u32("the number of dimensions")? as usize;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(self.err_at(at, format!("{n_dims} dimensions (1 to {MAX_DIMS})")));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let at = self.pos;
            match self.u64("a dimension")? {
                0 => return Err(self.err_at(at, "a dimension of 0".into())),
                n => ne.push(n),
            }
        }
        let ty = self.u32("the tensor type")?;
        let offset = self.u64("the data offset")?;
        Ok((ne, ty, offset))
    }
}

fn type_name(t: u32) -> &'static str {
    match t {
        0 => "uint8",
        1 => "int8",
        2 => "uint16",
        3 => "int16",
        4 => "uint32",
        5 => "int32",
        6 => "float32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "uint64",
        11 => "int64",
        _ => "float64",
    }
}
