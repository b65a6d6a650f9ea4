//! An independent checker of Chrome Trace Event JSON, for the rules Perfetto's importer
//! enforces (see the module doc of src/trace/chrome.rs and traces/README.md): written from the
//! format's description, sharing no code with the exporter.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

/// Microseconds with up to 3 decimals -> integer nanoseconds.
fn ns(v: &Value) -> Option<i64> {
    v.as_f64().map(|us| (us * 1000.0).round() as i64)
}

/// What the checker saw, for further assertions.
#[derive(Debug, Default)]
pub struct Summary {
    pub slices: BTreeMap<String, usize>,
    pub thread_names: HashMap<i64, String>,
    pub counters: usize,
    /// Counter events by name.
    pub counter_names: BTreeMap<String, usize>,
    pub flows: usize,
    /// (tid, name, args) of every X event.
    pub x_events: Vec<(i64, String, Value)>,
}

/// Check `doc` (a parsed trace); panics with the first rule broken.
/// (thread id, timestamp) of an event.
type TidTs = (i64, i64);

pub fn check(doc: &Value) -> Summary {
    let evs = doc["traceEvents"].as_array().expect("traceEvents must be an array");
    assert!(!evs.is_empty(), "empty trace");
    let mut s = Summary::default();
    let mut have_process_name = false;
    let mut used_tids: HashSet<i64> = HashSet::new();
    let mut slices: HashMap<i64, Vec<(i64, i64, String)>> = HashMap::new();
    // flow id -> its starts and its ends, each (tid, ts)
    let mut flows: HashMap<i64, (Vec<TidTs>, Vec<TidTs>)> = HashMap::new();
    for e in evs {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("event without ph: {e}"));
        let name = e["name"].as_str().unwrap_or_else(|| panic!("event without name: {e}"));
        let pid = e["pid"].as_i64().unwrap_or_else(|| panic!("event without numeric pid: {e}"));
        assert_eq!(pid, 1, "one process: {e}");
        let tid = e["tid"].as_i64().unwrap_or_else(|| panic!("event without numeric tid: {e}"));
        if ph != "M" {
            used_tids.insert(tid);
            let ts = ns(&e["ts"]).unwrap_or_else(|| panic!("event without numeric ts: {e}"));
            assert!(ts >= 0, "negative ts: {e}");
        }
        match ph {
            "M" => match name {
                "process_name" => {
                    have_process_name = e["args"]["name"].is_string();
                }
                "thread_name" => {
                    let n = e["args"]["name"].as_str().unwrap_or_else(|| panic!("thread_name without args.name: {e}"));
                    s.thread_names.insert(tid, n.to_string());
                }
                "process_sort_index" | "thread_sort_index" => {
                    assert!(e["args"]["sort_index"].is_i64(), "sort index must be an integer: {e}");
                }
                other => panic!("unexpected metadata event {other}"),
            },
            "X" => {
                let dur = ns(&e["dur"]).unwrap_or_else(|| panic!("X without dur: {e}"));
                assert!(dur >= 0, "negative dur: {e}");
                assert!(e["args"].is_object() || e.get("args").is_none(), "args must be an object: {e}");
                let ts = ns(&e["ts"]).unwrap_or(0);
                slices.entry(tid).or_default().push((ts, ts + dur, name.to_string()));
                *s.slices.entry(name.to_string()).or_default() += 1;
                s.x_events.push((tid, name.to_string(), e["args"].clone()));
            }
            "C" => {
                let args = e["args"].as_object().unwrap_or_else(|| panic!("counter args must be an object: {e}"));
                assert!(!args.is_empty(), "counter without values: {e}");
                for (k, v) in args {
                    assert!(v.is_number(), "counter {name}.{k} is not a number: {e}");
                }
                s.counters += 1;
                *s.counter_names.entry(name.to_string()).or_default() += 1;
            }
            "i" | "I" => {
                let scope = e["s"].as_str().unwrap_or("t");
                assert!(["t", "p", "g"].contains(&scope), "bad instant scope: {e}");
            }
            "s" | "f" => {
                let id = e["id"].as_i64().unwrap_or_else(|| panic!("flow without numeric id: {e}"));
                if ph == "f" {
                    assert_eq!(e["bp"], "e", "flow end bound to its enclosing slice: {e}");
                }
                let ts = ns(&e["ts"]).unwrap_or(0);
                let f = flows.entry(id).or_default();
                if ph == "s" { f.0.push((tid, ts)) } else { f.1.push((tid, ts)) }
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert!(have_process_name, "no process_name metadata");
    for tid in &used_tids {
        assert!(s.thread_names.contains_key(tid), "thread {tid} has events but no thread_name");
    }
    // slices on one thread nest: sorted by start (longest first at equal starts), each one
    // lies inside every open slice that has not ended before it starts
    for (tid, v) in &mut slices {
        v.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut stack: Vec<(i64, i64, String)> = vec![];
        for sl in v.iter() {
            while stack.last().is_some_and(|top| top.1 <= sl.0) {
                stack.pop();
            }
            if let Some(top) = stack.last() {
                assert!(
                    sl.1 <= top.1,
                    "thread {tid}: slice {} [{}, {}] overlaps {} [{}, {}] without nesting",
                    sl.2,
                    sl.0,
                    sl.1,
                    top.2,
                    top.0,
                    top.1
                );
            }
            stack.push(sl.clone());
        }
    }
    // flows: one start and one end, each inside a slice of its thread
    let within = |tid: i64, ts: i64| slices.get(&tid).is_some_and(|v| v.iter().any(|sl| sl.0 <= ts && ts <= sl.1));
    for (id, (starts, ends)) in &flows {
        assert_eq!((starts.len(), ends.len()), (1, 1), "flow {id}: {} starts and {} ends", starts.len(), ends.len());
        assert!(within(starts[0].0, starts[0].1), "flow {id} starts outside any slice");
        assert!(within(ends[0].0, ends[0].1), "flow {id} ends outside any slice");
        assert!(starts[0].1 <= ends[0].1, "flow {id} ends before it starts");
    }
    s.flows = flows.len();
    s
}
