//! One module per subcommand.

pub mod bench;
pub mod chat;
pub mod convert;
pub mod experts_report;
pub mod inspect;
pub mod interrupt;
pub mod model_arg;
pub mod perplexity;
pub mod plan;
pub mod prefill_progress;
pub mod repl;
pub mod run;
pub mod run_config;
pub mod serve;
pub mod sim;
pub mod synth;
pub mod trace_out;

use std::path::Path;

use anyhow::{Result, bail};
use moescope::exec::MAX_THREADS;

/// An output file's folder exists and the path is not a folder, checked before any work: a run
/// wrote its --logits-out, then failed at the end on a --trace path in no folder.
pub fn output_path(flag: &str, path: Option<&Path>) -> Result<()> {
    let Some(p) = path else { return Ok(()) };
    moescope::out_file::check_destination(p).map_err(|e| anyhow::anyhow!("{flag} {e}"))?;
    let folder = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !folder.is_dir() {
        bail!("{flag} {}: no folder {}", p.display(), folder.display());
    }
    Ok(())
}

/// A compute thread count as given (`None`: `default`), checked: at least 1, at most
/// [`MAX_THREADS`] (a million threads aborted the process while it started them).
pub fn thread_count(flag: &str, given: Option<usize>, default: usize) -> Result<usize> {
    match given.unwrap_or(default) {
        0 => bail!("{flag} must be at least 1"),
        t if t > MAX_THREADS => bail!("{flag}: {t} threads, at most {MAX_THREADS}"),
        t => Ok(t),
    }
}
