//! The demo model built into the binary, used when no model is given.
//!
//! A small Qwen3-MoE trained on the Rust documentation (`README.md` here is its model card;
//! `tests/reference/train_demo.py` made it): 6 layers, hidden 256, 16 experts of 64, top-4,
//! tied embeddings, 7.0 M parameters, with a byte-level BPE of 4096 tokens trained on the same
//! text (Qwen's special tokens and the Qwen3 chat template). The binary carries its HuggingFace
//! checkpoint (bf16 safetensors); on first use it is converted, by the same code as `moescope
//! convert`, into a q4 package in the user's cache directory, so its experts live on disk and
//! stream like a real model's.

use std::path::{Path, PathBuf};

use crate::convert::{
    ConvertError, ConvertOptions, QuantMode, add_tokenizer_eos, hf_config, safetensors::HfCheckpoint, tokenizer_files,
    write_package,
};
use crate::package::layout::VERSION;

/// The weights packed (`crate::packed`: 14 MB of bf16 in ~10 MB), in two shards (no tracked
/// file of the repository passes 8 MB), and what the packed files unpack to.
#[cfg(feature = "embedded-demo")]
const WEIGHTS: [&[u8]; 2] = [
    include_bytes!("model/model-00001-of-00002.safetensors.xz"),
    include_bytes!("model/model-00002-of-00002.safetensors.xz"),
];
/// Built without the `embedded-demo` feature: no weights (see [`EMBEDDED`]).
#[cfg(not(feature = "embedded-demo"))]
const WEIGHTS: [&[u8]; 2] = [&[], &[]];
const MANIFEST: &str = include_str!("MANIFEST");

/// Whether this binary carries the demo model.
pub const EMBEDDED: bool = cfg!(feature = "embedded-demo");

/// The checkpoint's files, as `train_demo.py` saved them (plus src/demo's tokenizer), but for
/// the packed ones (`PACKED`).
const FILES: [(&str, &[u8]); 2] = [
    ("config.json", include_bytes!("model/config.json")),
    ("tokenizer_config.json", include_bytes!("tokenizer_config.json")),
];

/// The packed files: the weights' shards and index, and the tokenizer, each with its path in
/// `MANIFEST`.
const PACKED: [(&str, &str, &[u8]); 4] = [
    ("model-00001-of-00002.safetensors", "model/model-00001-of-00002.safetensors", WEIGHTS[0]),
    ("model-00002-of-00002.safetensors", "model/model-00002-of-00002.safetensors", WEIGHTS[1]),
    (
        "model.safetensors.index.json",
        "model/model.safetensors.index.json",
        include_bytes!("model/model.safetensors.index.json.xz"),
    ),
    ("tokenizer.json", "tokenizer.json", include_bytes!("tokenizer.json.xz")),
];

/// Bumped whenever the demo's weights or shape change, so a stale cached package is replaced.
const DEMO_REVISION: u32 = 3;

/// The demo streams its experts through a pool of half their size by default, so even this
/// small model shows real hits, misses, prefetches and reads.
pub const DEFAULT_POOL_FRACTION: f64 = 0.5;

/// The name the package carries (the status line shows it).
pub const NAME: &str = "moescope demo (Rust docs)";

/// Removes the unpacked checkpoint however the conversion ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Write the embedded checkpoint into `dir` (created), as a HuggingFace model directory.
pub fn unpack_checkpoint(dir: &Path) -> Result<(), ConvertError> {
    std::fs::create_dir_all(dir).map_err(|error| ConvertError::Io { path: dir.to_path_buf(), error })?;
    for (name, bytes) in FILES {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(|error| ConvertError::Io { path: p, error })?;
    }
    // the packed ones one at a time (the weights are 14 MB unpacked), each checked against its
    // MANIFEST line
    let bad =
        |msg: String| ConvertError::File { path: PathBuf::from("src/demo"), msg: format!("embedded demo: {msg}") };
    let manifest = crate::packed::parse_manifest(MANIFEST, "src/demo/MANIFEST").map_err(bad)?;
    for (name, path, packed) in PACKED.into_iter().filter(|p| !p.2.is_empty()) {
        let b = crate::packed::unpack_checked(Path::new(path), packed, &manifest).map_err(bad)?;
        let p = dir.join(name);
        std::fs::write(&p, b).map_err(|error| ConvertError::Io { path: p, error })?;
    }
    Ok(())
}

/// Convert the embedded checkpoint into the package `out` with `quant`, through a temporary
/// HuggingFace directory beside `out` (removed afterwards).
pub fn write_demo_package(out: &Path, quant: QuantMode) -> Result<u64, ConvertError> {
    let parent = out.parent().unwrap_or(Path::new("."));
    // unique per process and call: threads of one process may write packages at once
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = TempDir(parent.join(format!(".demo-checkpoint-{}-{n}", std::process::id())));
    unpack_checkpoint(&tmp.0)?;
    let mut cfg = hf_config::read_config(&tmp.0)?;
    let ck = HfCheckpoint::open(&tmp.0)?;
    let tok = tokenizer_files::read_tokenizer(&tmp.0)?.unwrap_or_default();
    add_tokenizer_eos(&mut cfg, &tok);
    let opts = ConvertOptions { default_pool_fraction: Some(DEFAULT_POOL_FRACTION), ..ConvertOptions::new(quant) };
    write_package(&ck, &cfg, tok, crate::convert::Origin { name: NAME, ignored: vec![], synthetic: None }, opts, out)
}

/// Path of the demo package in `cache_dir`, written there first if missing.
/// Returns (path, whether it was just written).
pub fn ensure_package(cache_dir: &Path) -> Result<(PathBuf, bool), ConvertError> {
    let path = cache_dir.join(format!("demo-r{DEMO_REVISION}-v{VERSION}-q4.moe"));
    if path.exists() {
        return Ok((path, false));
    }
    std::fs::create_dir_all(cache_dir)
        .map_err(|source| ConvertError::Io { path: cache_dir.to_path_buf(), error: source })?;
    write_demo_package(&path, QuantMode::Q4 { max_group: 128 })?;
    Ok((path, true))
}
