//! GGUF files, llama.cpp's format: the reader (`file.rs`: header, metadata, tensor index, all
//! checked against the file; what `inspect` reads), a model's metadata as a `ModelConfig` with
//! a split file's parts joined (`model.rs`; what GLM-4.5's and DeepSeek-V3's add in `families.rs`), its tensors as the converter's `TensorSource`
//! (`source.rs`, with the block codes relaid in `codes.rs` and the format that keeps each type's
//! values exactly in `exact.rs`), and its tokenizer rebuilt from
//! `tokenizer.ggml.*` (`vocab.rs`).

pub(crate) mod codes;
pub mod exact;
mod families;
mod file;
pub mod model;
pub mod source;
pub mod vocab;

pub use file::{GgmlType, Gguf, GgufError, MAGIC, TensorInfo, Value, is_gguf, open};
