//! Errors of reading and writing packages: each names the file, and the tensor, expert or
//! offset concerned.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}: not a moescope package (bad magic; expected a .moe file written by `moescope convert`)")]
    Magic { path: PathBuf },
    #[error(
        "{path}: package format version {found} is not supported by this moescope (it reads version {supported}); convert the model again with this version"
    )]
    Version { path: PathBuf, found: u32, supported: u32 },
    #[error("{path}: truncated: {what} needs bytes up to offset {need}, the file has {have}")]
    Truncated { path: PathBuf, what: String, need: u64, have: u64 },
    #[error("{path}: corrupt {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("{path}: checksum mismatch in {what} at offset {offset} (length {len}): the file is damaged")]
    Checksum { path: PathBuf, what: String, offset: u64, len: u64 },
    #[error("{path}: bad metadata: {msg}")]
    Meta { path: PathBuf, msg: String },
    #[error("{path}: tensor {name}: {msg}")]
    Tensor { path: PathBuf, name: String, msg: String },
    #[error("{path}: missing tensor {name}")]
    Missing { path: PathBuf, name: String },
    /// A streamed expert read failed (the message names the file, expert and offset).
    #[error("{0}")]
    ExpertRead(String),
}
