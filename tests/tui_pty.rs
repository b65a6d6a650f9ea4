//! The real binary in a pseudo-terminal, driven like a person: the workbench opens on the demo
//! model, a prompt streams tokens, Esc stops the reply mid-way, `p` turns prefetch off, `t`
//! exports a trace that is checked as a Chrome trace, a bracketed paste lands in the input as
//! two lines, and `q` quits with the terminal handed back.

mod common;

use common::pty::{decoded, spawn};

#[test]
fn a_person_chats_stops_toggles_prefetch_and_exports_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    // long replies, so there is time to stop one
    // a small recorder cap, so the session overflows it and the ring keeps the newest events
    let args = ["chat", "-n", "3500", "--ignore-eos", "--temperature", "0", "-t", "1", "--trace-max-events", "4000"];
    let mut p = spawn(&args, dir.path());

    // drawn at once (the model loads behind it), then ready
    p.wait_for("the workbench", 5, |s| s.contains("Chat") && s.contains("INPUT"));
    p.wait_for("the model", 60, |s| s.contains("idle") && s.contains("moescope demo"));

    p.send("Explain the borrow checker\r");
    let s = p.wait_for("tokens streaming", 30, |s| decoded(s).is_some_and(|n| n > 5));
    let first = decoded(&s).unwrap();
    let s = p.wait_for("more tokens", 30, |s| decoded(s).is_some_and(|n| n > first + 20));
    assert!(s.contains("› Explain the borrow checker"));

    // Esc stops the reply at the next token
    p.send("\x1b");
    let s = p.wait_for("the reply to stop", 10, |s| s.contains("stop: cancelled"));
    let n: usize = s
        .lines()
        .find_map(|l| {
            l.split(" tokens · TTFT").next().filter(|x| x.len() < l.len()).map(|x| x.trim_start_matches('│').trim())
        })
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("a stats line:\n{s}"));
    assert!(n < 3500, "stopped early: {n} tokens");
    p.wait_for("idle again", 5, |s| s.contains("idle") && s.contains(" CMD "));

    // Esc left the input: `p` is a command
    assert!(p.text().contains("prefetch on"), "prefetch starts on:\n{}", p.text());
    p.send("p");
    p.wait_for("prefetch off", 5, |s| s.contains("prefetch off"));

    // `t` exports the session's trace under ./traces/
    p.send("t");
    let s = p.wait_for("the trace path", 20, |s| s.contains("trace written: traces/moescope-"));
    let traces: Vec<_> = std::fs::read_dir(dir.path().join("traces")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(traces.len(), 1, "{traces:?}\n{s}");
    let name = traces[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("moescope-") && name.ends_with(".json"), "{name}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&traces[0]).unwrap()).expect("the trace is JSON");
    let sum = common::trace_check::check(&doc);
    let meta = &doc["otherData"]["trace"];
    assert_eq!(meta["kept"], "newest events (ring)", "{meta}");
    assert!(meta["dropped_events"].as_u64().unwrap() > 0, "the session overflowed the cap: {meta}");
    assert!(sum.slices.keys().any(|k| k == "decode" || k == "forward"), "engine slices: {:?}", sum.slices.keys());

    // a bracketed paste is one insertion, newlines included
    p.send("i");
    p.send("\x1b[200~first line\nsecond line\x1b[201~");
    p.wait_for("the pasted lines", 5, |s| s.contains("│first line") && s.contains("│second line"));

    // quit: Esc, q; the process ends cleanly
    p.send("\x1b");
    p.wait_for("command mode", 5, |s| s.contains(" CMD "));
    p.send("q");
    let status = p.exit();
    assert!(status.success(), "exit status {status:?}");
}

/// `serve --workbench`: while a client streams and another waits, the requests pane shows the
/// running request with its tokens and tok/s and the queue's depth; `t` writes a trace with the
/// requests on a track of their own; `q` stops the server.
#[test]
fn serve_workbench_shows_requests_and_exports_them() {
    use common::server::Client;
    let dir = tempfile::tempdir().unwrap();
    // one slot: the second request waits in the queue while the first replies
    let mut p =
        spawn(&["serve", "--workbench", "--port", "0", "-t", "1", "--queue", "4", "--parallel", "1"], dir.path());
    let s = p.wait_for("the requests pane", 60, |s| s.contains("Requests") && s.contains("idle"));
    let port: u16 = s
        .split("listening on 127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no port on the screen:\n{s}"));
    let c = Client { port };
    let short = serde_json::json!({"prompt": "fn main", "max_tokens": 4});
    assert_eq!(c.post("/v1/completions", &short).status, 200);
    p.wait_for("a request served", 10, |s| s.contains("1 served") && s.contains("cmpl-"));
    let long = serde_json::json!({"prompt": "fn main", "max_tokens": 3000, "ignore_eos": true, "stream": true});
    let mut sse = c.stream("/v1/completions", &long);
    sse.next_data().expect("a first chunk");
    let waiting = std::thread::spawn(move || Client { port }.post("/v1/completions", &short).status);
    let s = p.wait_for("the running request and the queue", 30, |s| {
        s.contains("queue 1 waiting")
            && s.contains("slot 0 cmpl-")
            && s.contains("step: 1 seq · 1 tok · experts read")
            && s.contains("tok/s")
            && decoded(s).is_some_and(|n| n > 20)
    });
    let rate: f64 = s
        .split("slot 0 cmpl-")
        .nth(1)
        .and_then(|r| r.split(" tok · ").nth(1))
        .and_then(|r| r.split(" tok/s").next())
        .and_then(|x| x.trim().parse().ok())
        .unwrap_or_else(|| panic!("no tok/s on the screen:\n{s}"));
    assert!(rate > 0.0, "{s}");
    p.send("t");
    p.wait_for("the trace path", 20, |s| s.contains("trace written: traces/moescope-"));
    sse.hang_up();
    assert_eq!(waiting.join().unwrap(), 200);
    p.wait_for("all done", 20, |s| {
        s.contains("2 served") && s.contains("1 cancelled") && s.contains("queue 0 waiting")
    });
    let traces: Vec<_> = std::fs::read_dir(dir.path().join("traces")).unwrap().map(|e| e.unwrap().path()).collect();
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&traces[0]).unwrap()).expect("the trace is JSON");
    let sum = common::trace_check::check(&doc);
    let track = sum.thread_names.iter().find(|(_, n)| n.as_str() == "requests").map(|(t, _)| *t);
    let track = track.unwrap_or_else(|| panic!("no requests track: {:?}", sum.thread_names));
    let on_track: Vec<_> = sum.x_events.iter().filter(|(tid, name, _)| *tid == track && name == "request").collect();
    assert_eq!(on_track.len(), 1, "the finished request (the running one ends later): {on_track:?}");
    assert_eq!(on_track[0].2["outcome"], "length");
    // the engine's steps (a forward pass over the running requests), with the layers inside
    assert!(
        sum.slices.keys().any(|k| k == "step") && sum.slices.keys().any(|k| k == "moe"),
        "engine slices: {:?}",
        sum.slices.keys()
    );
    p.send("q");
    let status = p.exit();
    assert!(status.success(), "exit status {status:?}");
}
