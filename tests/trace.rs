//! Traces of real runs: parsed by Python's `json` (an independent parser) and checked against
//! the rules Perfetto enforces by tests/common/trace_check.rs; then their content: the slices,
//! threads, counters, flows and metadata a user needs to see where a token's time goes.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Command;

use common::trace_check::check;
use common::*;
use serde_json::Value;

fn python_parses(path: &Path) {
    let code = "import json,sys; d=json.load(open(sys.argv[1])); assert isinstance(d['traceEvents'], list); print(len(d['traceEvents']))";
    let o = Command::new("python3")
        .args(["-c", code, path.to_str().unwrap()])
        .output()
        .expect("python3 is needed (an independent JSON parser)");
    assert!(o.status.success(), "python's json rejects {}: {}", path.display(), String::from_utf8_lossy(&o.stderr));
}

fn load(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap();
    if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut s).expect("gzip");
        serde_json::from_str(&s).expect("json")
    } else {
        serde_json::from_slice(&bytes).expect("json")
    }
}

#[test]
fn run_trace_is_valid_and_shows_the_token_pipeline() {
    let (d, p) = convert("odd", "q4");
    let r = Reference::load("odd");
    let ids: Vec<String> = r.ids("input_ids").iter().map(|i| i.to_string()).collect();
    let t = d.path().join("run.json");
    let o = moescope(
        &[
            "run",
            "-m",
            p.to_str().unwrap(),
            "--prompt-ids",
            &ids.join(","),
            "-n",
            "6",
            "--ignore-eos",
            "--temperature",
            "0",
            "-t",
            "2",
            // a pool smaller than the experts (by default a model whose experts fit is loaded
            // whole, and there would be no reads to show)
            "--cache-mb",
            "0.1",
            "--trace",
            t.to_str().unwrap(),
        ],
        d.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    python_parses(&t);
    let doc = load(&t);
    let s = check(&doc);
    // one prefill, a decode slice per generated token after the first, a forward per eval
    assert_eq!(s.slices["prefill"], 1);
    assert_eq!(s.slices["decode"], 5);
    assert_eq!(s.slices["sample"], 6);
    assert_eq!(s.slices["forward"], 6);
    // 4 layers per forward; 2 of them MoE (decoder_sparse_step 2), 2 dense
    assert_eq!(s.slices["layer"], 24);
    assert_eq!(s.slices["moe"], 12);
    assert_eq!(s.slices["mlp"], 12);
    assert_eq!(s.slices["attention"], 24);
    assert!(s.slices["lm_head"] >= 6);
    // expert slices carry their layer and expert; decode routers carry experts and weights
    let experts: Vec<&Value> = s.x_events.iter().filter(|e| e.1 == "expert").map(|e| &e.2).collect();
    assert!(!experts.is_empty());
    for a in &experts {
        let l = a["layer"].as_i64().unwrap();
        assert!(l == 1 || l == 3, "experts only in MoE layers: {a}");
        assert!(a["expert"].as_i64().unwrap() < 24 && a["bytes"].as_i64().unwrap() > 0);
    }
    // one token's streamed experts are computed in groups, each as ready together: every
    // decode step's MoE layer has at least one, and together they hold every expert it chose
    let groups: Vec<&Value> = s.x_events.iter().filter(|e| e.1 == "experts").map(|e| &e.2).collect();
    assert!(groups.len() >= 10, "2 MoE layers x 5 decode steps: {} groups", groups.len());
    let ids: usize = groups.iter().map(|a| a["experts"].as_array().unwrap().len()).sum();
    assert_eq!(ids, 10 * 6, "each decode step's layer computes its 6 experts once");
    for a in &groups {
        let l = a["layer"].as_i64().unwrap();
        assert!(l == 1 || l == 3, "expert groups only in MoE layers: {a}");
        let n = a["experts"].as_array().unwrap().len() as i64;
        assert!(n >= 1 && a["bytes"].as_i64().unwrap() > 0, "{a}");
        assert!(a["experts"].as_array().unwrap().iter().all(|e| e.as_i64().unwrap() < 24));
    }
    let decode_routers = s.x_events.iter().filter(|e| e.1 == "router" && e.2.get("experts").is_some()).count();
    assert_eq!(decode_routers, 10, "2 MoE layers x 5 decode steps");
    for e in s.x_events.iter().filter(|e| e.1 == "router" && e.2.get("experts").is_some()) {
        assert_eq!(e.2["experts"].as_array().unwrap().len(), 6);
        let w: f64 = e.2["weights"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).sum();
        assert!(w > 0.0 && w <= 1.0 + 1e-5);
    }
    // the engine thread is named and dispatches products to the participants of the compute
    // pool. The engine thread is one of them, and on a model this small it may run every
    // chunk before a sleeping worker wakes, so a worker's track is not required here; where a
    // worker did run chunks, its track is named like the pool's threads.
    let names: Vec<&String> = s.thread_names.values().collect();
    assert!(names.iter().any(|n| *n == "engine"), "{names:?}");
    assert!(
        names.iter().all(|n| *n == "engine"
            || n.starts_with("moescope-compute")
            || n.starts_with("moescope-io")
            || *n == "moescope-predict"),
        "{names:?}"
    );
    assert!(s.flows > 0, "dispatch flows from the engine to the pool's participants");
    assert_eq!(s.counter_names["decode"], 5, "a tok/s counter per decode step");
    for c in ["expert hit %", "expert pool MB", "read queue", "read MB/s", "prefetch MB"] {
        assert_eq!(s.counter_names.get(c), Some(&5), "counter {c}: {:?}", s.counter_names);
    }
    // expert reads on the I/O threads, predictions on their own thread
    assert!(names.iter().any(|n| n.starts_with("moescope-io")), "{names:?}");
    assert!(names.iter().any(|n| *n == "moescope-predict"), "{names:?}");
    let reads: Vec<&Value> = s.x_events.iter().filter(|e| e.1 == "read").map(|e| &e.2).collect();
    assert!(!reads.is_empty(), "a pool of 0.1 MiB must read experts");
    for r in &reads {
        assert!(["demand", "prefetch"].contains(&r["origin"].as_str().unwrap()), "{r}");
        assert!(r["bytes"].as_i64().unwrap() > 0 && r["queue_wait_us"].is_i64());
    }
    assert!(s.slices.get("predict").copied().unwrap_or(0) > 0);
    let meta = &doc["otherData"];
    assert_eq!(meta["quant"], "q4");
    assert_eq!(meta["threads"], 2);
    assert!(meta["build"]["version"].is_string() && meta["machine"]["cpu"].is_string());
    assert_eq!(meta["trace"]["truncated"], false);
}

#[test]
fn capped_trace_says_so_and_stays_valid() {
    let (d, p) = convert("single", "q8");
    let t = d.path().join("capped.json.gz");
    let o = moescope(
        &[
            "run",
            "-m",
            p.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3,4,5,6,7,8",
            "-n",
            "8",
            "--ignore-eos",
            "--trace",
            t.to_str().unwrap(),
            "--trace-max-events",
            "60",
        ],
        d.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("dropped"), "the cap is reported: {}", stderr(&o));
    let doc = load(&t);
    check(&doc);
    let tr = &doc["otherData"]["trace"];
    assert_eq!(tr["truncated"], true);
    assert_eq!(tr["event_cap"], 60);
    assert!(tr["dropped_events"].as_u64().unwrap() > 0);
}

/// The checker itself rejects each broken rule (so a passing trace means something).
#[test]
fn checker_rejects_broken_traces() {
    let meta = r#"{"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"p"}},
                  {"ph":"M","name":"thread_name","pid":1,"tid":7,"args":{"name":"t"}}"#;
    let good = r#"{"ph":"X","name":"a","pid":1,"tid":7,"ts":1.0,"dur":10.0,"args":{}},
                  {"ph":"X","name":"b","pid":1,"tid":7,"ts":2.0,"dur":3.0,"args":{}},
                  {"ph":"s","name":"f","id":5,"pid":1,"tid":7,"ts":2.5},
                  {"ph":"f","name":"f","id":5,"bp":"e","pid":1,"tid":7,"ts":4.0},
                  {"ph":"C","name":"c","pid":1,"tid":7,"ts":3.0,"args":{"v":1.5}}"#;
    let doc = |body: &str| -> Value { serde_json::from_str(&format!("{{\"traceEvents\":[{meta},{body}]}}")).unwrap() };
    check(&doc(good));
    let bad = [
        ("X without dur", r#"{"ph":"X","name":"a","pid":1,"tid":7,"ts":1.0}"#),
        (
            "overlap",
            r#"{"ph":"X","name":"a","pid":1,"tid":7,"ts":1.0,"dur":10.0},{"ph":"X","name":"b","pid":1,"tid":7,"ts":5.0,"dur":10.0}"#,
        ),
        ("string counter", r#"{"ph":"C","name":"c","pid":1,"tid":7,"ts":3.0,"args":{"v":"x"}}"#),
        (
            "unmatched flow",
            r#"{"ph":"X","name":"a","pid":1,"tid":7,"ts":1.0,"dur":10.0},{"ph":"s","name":"f","id":5,"pid":1,"tid":7,"ts":2.5}"#,
        ),
        (
            "flow outside a slice",
            r#"{"ph":"X","name":"a","pid":1,"tid":7,"ts":1.0,"dur":1.0},{"ph":"s","name":"f","id":5,"pid":1,"tid":7,"ts":2.5},{"ph":"f","name":"f","id":5,"bp":"e","pid":1,"tid":7,"ts":1.5}"#,
        ),
        ("unnamed thread", r#"{"ph":"X","name":"a","pid":1,"tid":8,"ts":1.0,"dur":1.0}"#),
    ];
    for (what, body) in bad {
        let d = doc(body);
        let r = std::panic::catch_unwind(|| check(&d));
        assert!(r.is_err(), "the checker accepted a trace with: {what}");
    }
}
