//! Chrome Trace Event JSON (`{"traceEvents": [...]}`), the format Perfetto and chrome://tracing
//! open. Written through a temporary file renamed into place; `*.gz` is gzip-compressed.
//!
//! What Perfetto needs and this guarantees: every `X` has a `dur`; slices on one thread nest
//! (they are recorded by scoped guards); counters carry numeric args only; `M` events name the
//! process and every thread, with sort indices; each flow has exactly one `s` and one `f`, each
//! inside a slice of its thread (flows that lost a side to the event cap are left out).
//! Timestamps are microseconds with nanosecond decimals.

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::recorder::{Arg, Event, Recording};

const PID: u32 = 1;

fn us(ns: u64) -> Value {
    // exact decimal microseconds: 1234567 ns -> 1234.567
    let v = format!("{}.{:03}", ns / 1000, ns % 1000);
    serde_json::from_str(&v).unwrap_or(Value::from(ns as f64 / 1000.0))
}

fn arg_json(a: &Arg) -> Value {
    match a {
        Arg::I(v) => json!(v),
        Arg::F(v) if v.is_finite() => json!(v),
        Arg::F(v) => json!(v.to_string()),
        Arg::S(s) => json!(s),
        Arg::Ints(v) => json!(v),
        Arg::Floats(v) => Value::Array(v.iter().map(|x| if x.is_finite() { json!(x) } else { json!(null) }).collect()),
    }
}

fn args_json(args: &[(&'static str, Arg)]) -> Value {
    let mut m = Map::new();
    for (k, v) in args {
        m.insert((*k).to_string(), arg_json(v));
    }
    Value::Object(m)
}

/// Sort order of a thread's track: the engine first, then compute workers, then the rest.
fn sort_index(name: &str) -> (u32, String) {
    let rank = if name == "engine" {
        0
    } else if name.starts_with("moescope-compute") {
        1
    } else if name.starts_with("moescope-io") {
        2
    } else {
        3
    };
    (rank, name.to_string())
}

/// All events of `rec` as JSON values, metadata first.
pub fn events(rec: &Recording) -> Vec<Value> {
    let mut out = Vec::new();
    let _ = each_event(rec, &mut |v| {
        out.push(v);
        Ok(())
    });
    out
}

/// Hand the events of `rec` to `sink` one at a time, metadata first: a million-event trace is
/// written without holding its JSON in memory (that took ~2 GB).
pub fn each_event(rec: &Recording, sink: &mut dyn FnMut(Value) -> std::io::Result<()>) -> std::io::Result<()> {
    let mut out = |v: Value| sink(v);
    out(json!({"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "moescope"}}))?;
    out(json!({"ph": "M", "name": "process_sort_index", "pid": PID, "tid": 0, "args": {"sort_index": 0}}))?;
    let mut threads: Vec<_> = rec.threads.iter().filter(|t| !t.events.is_empty()).collect();
    threads.sort_by_key(|t| sort_index(&t.name));
    for (i, t) in threads.iter().enumerate() {
        out(json!({"ph": "M", "name": "thread_name", "pid": PID, "tid": t.tid, "args": {"name": t.name}}))?;
        out(json!({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": t.tid, "args": {"sort_index": i}}))?;
    }
    // flows: keep those with one start and one end, each inside a slice of its own thread
    let mut ends: HashMap<u64, (u32, u32)> = HashMap::new();
    for t in &threads {
        let mut slices: Vec<(u64, u64)> = t
            .events
            .iter()
            .filter_map(|e| if let Event::Slice { ts, dur, .. } = e { Some((*ts, ts + dur)) } else { None })
            .collect();
        slices.sort_unstable();
        // some slice with start <= x ends at or after x: the running maximum of the ends
        // over the slices sorted by start answers it with one binary search
        let mut max_end = Vec::with_capacity(slices.len());
        let mut m = 0;
        for &(_, b) in &slices {
            m = m.max(b);
            max_end.push(m);
        }
        let inside = |x: u64| {
            let n = slices.partition_point(|&(a, _)| a <= x);
            n > 0 && max_end[n - 1] >= x
        };
        for e in &t.events {
            if let Event::Flow { id, ts, start } = e
                && inside(*ts)
            {
                let c = ends.entry(*id).or_default();
                if *start { c.0 += 1 } else { c.1 += 1 }
            }
        }
    }
    let good: HashSet<u64> = ends.into_iter().filter(|(_, c)| *c == (1, 1)).map(|(id, _)| id).collect();

    for t in &threads {
        let mut evs: Vec<&Event> = t.events.iter().collect();
        evs.sort_by_key(|e| match e {
            Event::Slice { ts, .. }
            | Event::Counter { ts, .. }
            | Event::Instant { ts, .. }
            | Event::Flow { ts, .. } => *ts,
        });
        for e in evs {
            let v = match e {
                Event::Slice { name, ts, dur, args } => json!({
                    "ph": "X", "name": name, "cat": "moescope", "pid": PID, "tid": t.tid,
                    "ts": us(*ts), "dur": us(*dur), "args": args_json(args)
                }),
                Event::Counter { name, ts, values } => {
                    let mut m = Map::new();
                    for (k, v) in values {
                        if v.is_finite() {
                            m.insert((*k).to_string(), json!(v));
                        }
                    }
                    if m.is_empty() {
                        continue;
                    }
                    json!({"ph": "C", "name": name, "pid": PID, "tid": t.tid, "ts": us(*ts), "args": m})
                }
                Event::Instant { name, ts, args } => json!({
                    "ph": "i", "s": "t", "name": name, "cat": "moescope", "pid": PID, "tid": t.tid,
                    "ts": us(*ts), "args": args_json(args)
                }),
                Event::Flow { id, ts, start } => {
                    if !good.contains(id) {
                        continue;
                    }
                    let mut v = json!({"ph": if *start { "s" } else { "f" }, "name": "dispatch", "cat": "flow",
                                       "id": id, "pid": PID, "tid": t.tid, "ts": us(*ts)});
                    if !*start {
                        v["bp"] = json!("e");
                    }
                    v
                }
            };
            out(v)?;
        }
    }
    Ok(())
}

/// Write `rec` with the metadata block `other` (model, settings, machine) to `path`.
pub fn write(path: &Path, rec: &Recording, mut other: Value) -> std::io::Result<()> {
    crate::out_file::check_destination(path)?;
    let tmp = path.with_extension(format!(
        "{}.partial",
        path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    let res = write_to(&tmp, path, rec, &mut other);
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res?;
    std::fs::rename(&tmp, path)
}

fn write_to(tmp: &Path, path: &Path, rec: &Recording, other: &mut Value) -> std::io::Result<()> {
    let f = std::fs::File::create(tmp)?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    let mut w: Box<dyn Write> = if gz {
        Box::new(flate2::write::GzEncoder::new(BufWriter::new(f), flate2::Compression::fast()))
    } else {
        Box::new(BufWriter::new(f))
    };
    w.write_all(b"{\"traceEvents\":[\n")?;
    let mut n = 0usize;
    each_event(rec, &mut |e| {
        if n > 0 {
            w.write_all(b",\n")?;
        }
        n += 1;
        serde_json::to_writer(&mut w, &e).map_err(std::io::Error::from)
    })?;
    if let Value::Object(m) = other {
        m.insert(
            "trace".into(),
            json!({
                "events": n,
                "event_cap": rec.cap,
                "dropped_events": rec.dropped,
                "truncated": rec.dropped > 0,
                "kept": if rec.ring { "newest events (ring)" } else { "oldest events" },
                "clock": format!("{}: ticks mapped onto the OS monotonic clock; ts = time since recording started", rec.clock),
            }),
        );
    }
    w.write_all(b"\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":")?;
    serde_json::to_writer(&mut w, other)?;
    w.write_all(b"}\n")?;
    w.flush()
}
