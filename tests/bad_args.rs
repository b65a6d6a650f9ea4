//! Command-line values that the args fuzz target (moescope-replay's `args`) found crashing or
//! hanging the binary: each now gets one clear error line naming the flag, and no panic.

mod common;

use common::*;

#[test]
fn thread_counts_past_the_limit_are_refused() {
    let cache = tempfile::tempdir().unwrap();
    let text = fixture("demo").join("heldout.txt");
    let text = text.to_str().unwrap();
    // a million compute threads aborted the process while it started them (no guard page left)
    for (args, flag) in [
        (vec!["run", "-p", "hi", "-n", "2", "-t", "100000"], "--threads"),
        (vec!["bench", "-p", "4", "-n", "2", "-r", "1", "-t", "1,600"], "-t"),
        (vec!["perplexity", text, "-t", "513"], "--threads"),
        (vec!["plan", "--shape", "qwen3-30b-a3b", "-t", "100000"], "--threads"),
    ] {
        let o = moescope(&args, cache.path());
        assert_clean_failure(&o, &[flag, "at most 512"]);
    }
}

#[test]
fn a_context_past_the_models_positions_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    let text = fixture("demo").join("heldout.txt");
    // 2^32 tokens sized a 2 TiB KV cache and the allocation aborted
    for args in [
        vec!["run", "-p", "hi", "-n", "2", "-c", "4294967296"],
        vec!["perplexity", text.to_str().unwrap(), "--window", "4294967296"],
    ] {
        let o = moescope(&args, cache.path());
        assert_clean_failure(&o, &["4294967296", "max_position_embeddings"]);
    }
    let o = moescope(&["run", "-p", "hi", "-n", "2", "-c", "4096"], cache.path());
    assert!(o.status.success(), "the model's own length is allowed: {}", stderr(&o));
}

#[test]
fn synthetic_traces_past_memory_or_with_a_nan_zipf_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("t.jsonl");
    let out = out.to_str().unwrap();
    let base = ["sim", "--synthetic", out, "--layers", "4", "--experts", "16", "--top-k", "2"];
    for (extra, needle) in [
        (["--tokens", "100000000000"], "--tokens"),
        (["--zipf", "nan"], "--zipf"),
        (["--experts", "100000000"], "--experts"),
    ] {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let o = moescope(&args, d.path());
        assert_clean_failure(&o, &[needle]);
        assert!(!std::path::Path::new(out).exists(), "a refused trace leaves no file");
    }
    // the zipf that hung (every weight past the first underflowed): k distinct experts each step
    let args: Vec<&str> = base.iter().copied().chain(["--tokens", "16", "--zipf", "191"]).collect();
    let o = moescope(&args, d.path());
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_device_without_end_as_an_input_file_is_refused() {
    let cache = tempfile::tempdir().unwrap();
    // each read /dev/zero until the allocation aborted the process
    for (args, needle) in [
        (vec!["run", "-p", "x", "-n", "2", "--route-from", "/dev/zero"], "a line longer than"),
        (vec!["sim", "/dev/zero"], "a line longer than"),
        (vec!["perplexity", "/dev/zero"], "larger than 64 MiB"),
    ] {
        let o = moescope(&args, cache.path());
        assert_clean_failure(&o, &["/dev/zero", needle]);
    }
}

#[test]
fn an_output_path_in_no_folder_fails_before_anything_is_written() {
    let d = tempfile::tempdir().unwrap();
    let logits = d.path().join("logits.npy");
    let missing = d.path().join("no/such/trace.json");
    let args = ["run", "-p", "x", "-n", "2", "--logits-out", logits.to_str().unwrap()];
    for (flag, path) in [("--trace", &missing), ("--routing-out", &missing), ("--trace", &d.path().to_path_buf())] {
        let mut a = args.to_vec();
        a.extend([flag, path.to_str().unwrap()]);
        let o = moescope(&a, d.path());
        assert_clean_failure(&o, &[flag]);
        // the run wrote its logits, then failed at the end on the trace's path
        assert!(!logits.exists(), "{flag} {}: the logits were written before the failure", path.display());
    }
}

#[test]
fn an_output_path_that_is_not_a_regular_file_is_never_replaced() {
    let d = tempfile::tempdir().unwrap();
    // a FIFO stands for /dev/null (which a convert run as root replaced with a regular file): a
    // test that failed on the device itself would break the machine it runs on
    let fifo = d.path().join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let f = fifo.to_str().unwrap();
    let ckpt = fixture("single");
    for args in [
        vec!["convert", ckpt.to_str().unwrap(), "-o", f],
        vec!["synth", "--shape", "qwen3-30b-a3b", "--layers", "1", "--experts", "8", "--vocab", "64", "-o", f],
        vec!["sim", "--synthetic", f, "--layers", "2", "--experts", "8", "--top-k", "2", "--tokens", "4"],
        vec!["run", "-p", "x", "-n", "2", "--trace", f],
        vec!["run", "-p", "x", "-n", "2", "--logits-out", f],
    ] {
        let o = moescope(&args, d.path());
        assert_clean_failure(&o, &[f, "not a regular file"]);
        let kind = std::fs::symlink_metadata(&fifo).expect("still there").file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind), "{args:?} replaced the FIFO");
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.iter().all(|n| n == "fifo" || n == "cache"), "{args:?} left {left:?}");
    }
}
