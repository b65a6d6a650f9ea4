//! The memory plan against what the process may use, with a fake memory cgroup
//! (`MOESCOPE_CGROUP_DIR`: a folder holding `memory.limit_in_bytes`, as a v1 cgroup has):
//! an explicit `--cache-mb` whose plan exceeds the limit is refused before loading with a
//! one-line error naming the largest pool that fits; that pool then runs, one MiB more does
//! not; `--force` runs the oversized pool with a warning; `--cache-mb auto` sizes a pool that
//! fits. `.ci/run` repeats the refusal inside a real memory cgroup.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn run_limited(limit: u64, pkg: &Path, extra: &[&str]) -> Output {
    let cg = tempfile::tempdir().expect("tempdir");
    std::fs::write(cg.path().join("memory.limit_in_bytes"), format!("{limit}\n")).expect("limit file");
    let cache = tempfile::tempdir().expect("tempdir");
    let p = pkg.to_string_lossy().into_owned();
    let mut args = vec!["run", "-m", p.as_str(), "--prompt-ids", "1,2,3", "-n", "2", "-c", "64"];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_moescope"))
        .args(&args)
        .env("MOESCOPE_CACHE_DIR", cache.path())
        .env("MOESCOPE_CGROUP_DIR", cg.path())
        .output()
        .expect("running moescope")
}

#[test]
fn oversized_pools_are_refused_before_loading_and_the_named_largest_fits() {
    let (_d, pkg) = convert("single", "q8");
    // 384 MiB: the 256 MiB headroom and the ~70 MiB runtime estimate leave a few tens of MiB
    let limit = 384u64 << 20;
    let o = run_limited(limit, &pkg, &["--cache-mb", "200"]);
    assert_clean_failure(&o, &["--cache-mb 200", "exceeds", "384 MiB", "largest pool that fits is", "--force"]);
    // the largest pool the message names
    let err = stderr(&o);
    let at = err.find("largest pool that fits is ").expect("named") + "largest pool that fits is ".len();
    let largest: u64 = err[at..].split(' ').next().and_then(|n| n.parse().ok()).expect("a number of MiB");
    assert!(largest > 0 && largest < 200, "largest {largest}");
    let fits = run_limited(limit, &pkg, &["--cache-mb", &largest.to_string()]);
    assert!(fits.status.success(), "the named largest pool was refused: {}", stderr(&fits));
    // a pool past the room the message's own parts leave (each rounded down to the MiB) is
    // refused: the named largest is in whole expert blobs, so one MiB past it may still fit
    let part = |label: &str| -> u64 {
        let end = err.find(label).expect("the plan's parts");
        err[..end].trim_end().rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a number of MiB")
    };
    let room = (limit >> 20) - part("MiB dense+KV+buffers+runtime") - part("MiB headroom");
    assert!(largest <= room, "largest {largest} past the room {room}");
    let over = run_limited(limit, &pkg, &["--cache-mb", &(room + 1).to_string()]);
    assert_clean_failure(&over, &["exceeds"]);
    // --force runs it, saying so
    let forced = run_limited(limit, &pkg, &["--cache-mb", "200", "--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert!(stderr(&forced).contains("running anyway (--force)"), "{}", stderr(&forced));
    // auto sizes a pool within the limit and says how
    let auto = run_limited(limit, &pkg, &["--cache-mb", "auto"]);
    assert!(auto.status.success(), "{}", stderr(&auto));
    let e = stderr(&auto);
    assert!(e.contains("memory: pool") && e.contains("from the memory cgroup's limit"), "{e}");
    // no limit at all: nothing to refuse
    let o = moescope(
        &["run", "-m", pkg.to_str().unwrap(), "--prompt-ids", "1,2", "-n", "1", "--cache-mb", "200"],
        _d.path(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The pool's buffer peak is counted from the engine's load: on first use the demo's package is
/// written just before (with 8 MiB of write buffers), and `run` reported 8 MiB for a 1.3 MiB pool.
#[test]
fn the_pool_peak_excludes_a_package_written_before_the_load() {
    let cache = tempfile::tempdir().expect("tempdir");
    let o = moescope(&["run", "-p", "fn main", "-n", "8", "--json"], cache.path());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("written to"), "the demo package was not written by this run: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    let ex = &v["experts"];
    let num = |k: &str| ex[k].as_f64().unwrap_or_else(|| panic!("experts.{k} in {ex}"));
    let allowed = num("budget_mib") + num("io_workers") * num("blob_mib");
    assert!(num("buffers_peak_mib") <= allowed + 1e-3, "peak {} MiB, allowed {allowed}", num("buffers_peak_mib"));
}
