//! `t`: the trace of the session so far, as Chrome Trace JSON under `./traces/`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::sysinfo;
use crate::trace::{chrome, recorder};

/// A file name that does not exist yet: `moescope-<UTC stamp>.json`, `-2`, `-3`... when two
/// exports fall in one second.
pub fn fresh_path(dir: &Path, stamp: &str) -> PathBuf {
    let mut p = dir.join(format!("moescope-{stamp}.json"));
    let mut n = 2;
    while p.exists() {
        p = dir.join(format!("moescope-{stamp}-{n}.json"));
        n += 1;
    }
    p
}

/// Write what the recorder holds now (recording goes on); returns a line for the user.
pub fn trace(dir: &Path, meta: Value) -> std::io::Result<String> {
    if !recorder::enabled() {
        return Err(std::io::Error::other("the recorder is off (--trace-max-events 0)"));
    }
    std::fs::create_dir_all(dir).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let path = fresh_path(dir, &sysinfo::utc_now().stamp());
    let rec = recorder::snapshot();
    let mut other = json!({"build": sysinfo::build(), "machine": sysinfo::machine()});
    if let (Value::Object(o), Value::Object(m)) = (&mut other, meta) {
        o.extend(m);
    }
    chrome::write(&path, &rec, other).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let n: usize = rec.threads.iter().map(|t| t.events.len()).sum();
    let dropped = if rec.dropped > 0 { format!(" (the cap dropped {} more)", rec.dropped) } else { String::new() };
    Ok(format!("trace written: {} ({n} events{dropped}; open in ui.perfetto.dev)", path.display()))
}
