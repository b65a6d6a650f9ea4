//! The user's cache directory: converted models and the demo package live here.

use std::path::PathBuf;

/// `$MOESCOPE_CACHE_DIR`, else `$XDG_CACHE_HOME/moescope`, else `$HOME/.cache/moescope`.
pub fn cache_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("MOESCOPE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("moescope"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("moescope")),
        None => Err("no cache directory: set MOESCOPE_CACHE_DIR (or HOME)".into()),
    }
}
