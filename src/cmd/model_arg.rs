//! `-m MODEL`: a package, a HuggingFace directory or a GGUF file (converted once into the
//! cache), or nothing (the built-in demo).

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result, bail};

use moescope::cache_dir::cache_dir;
use moescope::convert::WRITER_REVISION;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf, convert_hf, gguf};
use moescope::demo;
use moescope::package::layout::VERSION;

pub fn resolve(model: Option<&Path>, quant: Option<&str>) -> Result<PathBuf> {
    let Some(m) = model else {
        if !demo::EMBEDDED {
            bail!("this moescope was built without the demo model (--no-default-features): pass -m MODEL");
        }
        let dir = cache_dir().map_err(anyhow::Error::msg)?;
        let (path, fresh) = demo::ensure_package(&dir).context("writing the built-in demo model")?;
        eprintln!(
            "moescope: built-in demo model (7M-parameter MoE trained on the Rust docs){}",
            if fresh { format!("; written to {}", path.display()) } else { String::new() }
        );
        return Ok(path);
    };
    let is_gguf = m.is_file() && gguf::is_gguf(m);
    if m.is_file() && !is_gguf {
        return Ok(m.to_path_buf());
    }
    if !m.exists() {
        bail!("{}: no such file or directory", m.display());
    }
    if !is_gguf && !m.join("config.json").exists() {
        bail!("{}: neither a .moe package nor a HuggingFace model directory (no config.json)", m.display());
    }
    let mode = match quant {
        Some(q) => QuantMode::parse(q).map_err(anyhow::Error::msg)?,
        None if is_gguf => QuantMode::File,
        None => QuantMode::Q4 { max_group: 128 },
    };
    let out = cache_dir().map_err(anyhow::Error::msg)?.join("converted").join(cache_name(m, mode)?);
    if out.exists() {
        eprintln!("moescope: using {} (converted earlier from {})", out.display(), m.display());
        return Ok(out);
    }
    std::fs::create_dir_all(out.parent().unwrap_or(Path::new(".")))
        .with_context(|| format!("creating {}", out.display()))?;
    eprintln!("moescope: converting {} ({}) into {}", m.display(), mode.name(), out.display());
    super::interrupt::install();
    let _busy = super::interrupt::Interruptible::start();
    let opts = ConvertOptions {
        quant: mode,
        progress: true,
        cancel: Some(&super::interrupt::STOP),
        ..ConvertOptions::new(mode)
    };
    let rep = if is_gguf { convert_gguf(m, &out, opts)? } else { convert_hf(m, &out, opts)? };
    for w in &rep.warnings {
        eprintln!("warning: {w}");
    }
    eprintln!("moescope: wrote {} ({:.1} MB) in {:.1} s", out.display(), rep.bytes as f64 / 1e6, rep.seconds);
    Ok(out)
}

/// `<name>-<quant>-<fingerprint>.moe`: the fingerprint covers the model's path, the name, size
/// and modification time of every file of the directory (of a GGUF file: every file beside it,
/// which takes in a split model's other parts), the quantization, the package version and the
/// converter's revision, so any change to the checkpoint (or to the format) converts again.
fn cache_name(model: &Path, mode: QuantMode) -> Result<String> {
    let canon = model.canonicalize().with_context(|| format!("{}", model.display()))?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(canon.as_os_str().as_encoded_bytes());
    h.update(mode.name().as_bytes());
    h.update(&VERSION.to_le_bytes());
    h.update(&WRITER_REVISION.to_le_bytes());
    let dir = if canon.is_file() { canon.parent().unwrap_or(Path::new("/")).to_path_buf() } else { canon.clone() };
    let mut entries: Vec<_> =
        std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))?.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let md = e.metadata().with_context(|| format!("{}", e.path().display()))?;
        let mtime = md.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
        h.update(e.file_name().as_encoded_bytes());
        h.update(&md.len().to_le_bytes());
        h.update(&mtime.to_le_bytes());
    }
    let name = match canon.file_stem() {
        Some(n) if canon.is_file() => n.to_string_lossy().into_owned(),
        _ => canon.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()),
    };
    Ok(format!("{name}-{}-{:016x}.moe", mode.name(), h.digest()))
}
