//! `--trace FILE` on any command: start the recorder, and write the Chrome Trace JSON at the end.

use std::path::PathBuf;

use anyhow::{Context, Result};
use moescope::sysinfo;
use moescope::trace::{chrome, recorder};
use serde_json::{Value, json};

use crate::cli::TraceArgs;

pub struct TraceOut {
    path: PathBuf,
}

/// Start recording if a trace file was asked for; this thread's track is "engine".
pub fn begin(args: &TraceArgs) -> Option<TraceOut> {
    let path = args.trace.as_deref()?;
    recorder::start(args.trace_max_events);
    recorder::set_thread_name("engine");
    Some(TraceOut { path: path.to_path_buf() })
}

impl TraceOut {
    /// A trace to `path` of a recording someone else started.
    pub fn to(path: PathBuf) -> TraceOut {
        TraceOut { path }
    }

    /// Stop recording and write the file with `meta` (model, settings) plus machine facts.
    pub fn finish(self, meta: Value) -> Result<()> {
        let rec = recorder::stop();
        let mut other = json!({"build": sysinfo::build(), "machine": sysinfo::machine()});
        if let (Value::Object(o), Value::Object(m)) = (&mut other, meta) {
            o.extend(m);
        }
        chrome::write(&self.path, &rec, other).with_context(|| format!("writing {}", self.path.display()))?;
        let n: usize = rec.threads.iter().map(|t| t.events.len()).sum();
        if rec.dropped > 0 {
            eprintln!(
                "moescope: trace {}: {n} events; the cap ({}) dropped {} more (raise --trace-max-events)",
                self.path.display(),
                rec.cap,
                rec.dropped
            );
        } else {
            eprintln!("moescope: trace {}: {n} events", self.path.display());
        }
        Ok(())
    }
}
