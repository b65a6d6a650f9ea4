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
        None => moescope::convert::default_hf_quant(m),
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
/// and modification time of every file of the directory (of a GGUF file: the file and, when it
/// is part 1 of a split model, the other parts beside it; not the unrelated files a folder of
/// downloads holds, which changed the name with every file written there), the quantization,
/// the package version and the converter's revision, so any change to the checkpoint (or to the
/// format) converts again.
fn cache_name(model: &Path, mode: QuantMode) -> Result<String> {
    let canon = model.canonicalize().with_context(|| format!("{}", model.display()))?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(canon.as_os_str().as_encoded_bytes());
    h.update(mode.name().as_bytes());
    h.update(&VERSION.to_le_bytes());
    h.update(&WRITER_REVISION.to_le_bytes());
    let dir = if canon.is_file() { canon.parent().unwrap_or(Path::new("/")).to_path_buf() } else { canon.clone() };
    let split = split_prefix(&canon);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("{}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| !canon.is_file() || e.path() == canon || split.as_ref().is_some_and(|s| s.holds(&e.file_name())))
        .collect();
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

/// The names of a split GGUF's parts, from its first part `NAME-00001-of-0000N.gguf`.
struct SplitParts {
    stem: String,
    suffix: String,
}

impl SplitParts {
    /// Whether `name` is `NAME-0000k-of-0000N.gguf`.
    fn holds(&self, name: &std::ffi::OsStr) -> bool {
        name.to_str()
            .and_then(|n| n.strip_prefix(&self.stem)?.strip_suffix(&self.suffix))
            .is_some_and(|no| no.len() == 6 && no.starts_with('-') && no[1..].bytes().all(|b| b.is_ascii_digit()))
    }
}

fn split_prefix(file: &Path) -> Option<SplitParts> {
    let name = file.file_name()?.to_str()?;
    let (stem, rest) = name.rsplit_once("-00001-of-")?;
    (rest.len() == 10 && rest.ends_with(".gguf") && rest[..5].bytes().all(|b| b.is_ascii_digit()))
        .then(|| SplitParts { stem: stem.into(), suffix: format!("-of-{rest}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gguf_is_named_by_its_own_parts_only() {
        let d = tempfile::tempdir().expect("tempdir");
        let write = |n: &str| std::fs::write(d.path().join(n), n).expect("write");
        for n in ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "other.gguf", "one.gguf"] {
            write(n);
        }
        let first = d.path().join("m-00001-of-00002.gguf");
        let one = d.path().join("one.gguf");
        let (a, b) = (cache_name(&first, QuantMode::File).unwrap(), cache_name(&one, QuantMode::File).unwrap());
        // unrelated files come and go: the names stay
        write("notes.txt");
        std::fs::create_dir(d.path().join("runs")).expect("mkdir");
        assert_eq!(cache_name(&first, QuantMode::File).unwrap(), a);
        assert_eq!(cache_name(&one, QuantMode::File).unwrap(), b);
        // a part changes: the split model's name changes
        std::fs::write(d.path().join("m-00002-of-00002.gguf"), "changed!").expect("write");
        assert_ne!(cache_name(&first, QuantMode::File).unwrap(), a);
        assert_eq!(cache_name(&one, QuantMode::File).unwrap(), b);
    }
}
