//! Errors of a forward pass.

use crate::package::PackageError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("context full: {need} tokens needed, the KV cache holds {ctx} (raise --ctx-size)")]
    ContextFull { need: usize, ctx: usize },
    #[error("{tokens} tokens in one pass; the run state holds {chunk}")]
    BatchTooLarge { tokens: usize, chunk: usize },
    #[error("{0}")]
    Unsupported(String),
    #[error("token id {id} is out of range (the vocabulary has {vocab} tokens)")]
    TokenOutOfRange { id: u32, vocab: usize },
}
