//! Errors of the converter: each names the file and the key or tensor at fault.

use std::path::PathBuf;

use crate::package::PackageError;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("{path}: key '{key}': {msg}")]
    Config { path: PathBuf, key: String, msg: String },
    #[error("{path}: unsupported architecture '{found}' (moescope runs: {supported})")]
    Architecture { path: PathBuf, found: String, supported: String },
    #[error("{dir}: missing tensor {name}")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("{file}: tensor {name} has shape {found:?}, expected {expected:?}")]
    Shape { file: PathBuf, name: String, found: Vec<usize>, expected: Vec<usize> },
    #[error("{file}: tensor {name} has a non-finite value ({value}) at row {row}, column {col}")]
    NonFinite { file: PathBuf, name: String, row: usize, col: usize, value: f32 },
    #[error("{file}: tensor {name}: {msg}")]
    Tensor { file: PathBuf, name: String, msg: String },
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Gguf(#[from] super::gguf::GgufError),
    #[error("interrupted: nothing was written")]
    Interrupted,
}
