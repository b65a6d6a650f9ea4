//! Faults injected into the expert store's reads (`experts::faults`): EIO, reads that stop at
//! an end of file, and blobs that arrive damaged fail the request that needed them with a clear
//! error, leave no half-read entry in the pool, and the next request works, exactly; short and
//! slow reads give the same bits. Every case streams through a small pool, so reads continue
//! all through a request.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use moescope::engine::{Engine, EngineError};
use moescope::experts::faults::{Fault, Faults, inject};
use moescope::experts::pool::{Cell, QueueDepth};
use moescope::experts::{IoMode, PolicyKind, StreamConfig};
use moescope::model::{Logits, NoObserver};

/// The "single" fixture at q4 streamed through a pool a third of its experts' size (prefetch
/// off: every read is a demand read), reading through an injected fault plan; and the logits
/// of the run with every expert resident.
fn setup(io: IoMode) -> (tempfile::TempDir, Engine, Arc<Faults>, Vec<f32>) {
    setup_with(io, false)
}

/// [`setup`], with prefetch on or off.
fn setup_with(io: IoMode, prefetch: bool) -> (tempfile::TempDir, Engine, Arc<Faults>, Vec<f32>) {
    let (d, pkg) = convert("single", "q4");
    let want = run(&mut load(&pkg, None)).expect("the resident run");
    let faults = inject(&pkg);
    let probe = load(&pkg, Some(stream(1, io)));
    let cache = probe.pool().expect("streamed");
    let res = cache.residency();
    let all = cache.blob_len() as u64 * (res.n_layers * res.num_experts) as u64;
    drop(probe);
    let mut cfg = stream(all / 3, io);
    cfg.prefetch = prefetch;
    (d, load(&pkg, Some(cfg)), faults, want)
}

fn load(pkg: &Path, stream: Option<StreamConfig>) -> Engine {
    Engine::load(pkg, common::options(stream)).expect("load")
}

fn stream(budget: u64, io: IoMode) -> StreamConfig {
    StreamConfig {
        budget_bytes: Some(budget),
        policy: PolicyKind::Lru,
        prefetch: false,
        io_workers: 2,
        io: Some(io),
        verify: true,
        auto: false,
        force: false,
    }
}

/// The reference prompt's logits (all positions) and 8 cached decode steps.
fn run(eng: &mut Engine) -> Result<Vec<f32>, EngineError> {
    let r = Reference::load("single");
    let (prompt, forced) = (r.ids("input_ids"), r.ids("forced_ids"));
    eng.reset();
    let mut out = eng.eval(&prompt, Logits::All, &mut NoObserver)?.to_vec();
    for &id in &forced[..8] {
        out.extend_from_slice(eng.eval(&[id], Logits::Last, &mut NoObserver)?);
    }
    Ok(out)
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The (layer, expert) an error names, as "expert blob (layer L, expert E)".
fn named_blob(err: &str) -> (usize, usize) {
    let at = err.find("(layer ").unwrap_or_else(|| panic!("no blob named: {err}"));
    let nums: Vec<usize> = err[at..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|s| s.parse().unwrap())
        .collect();
    (nums[0], nums[1])
}

/// A request failed by `fault` on its `nth` read: the error names the blob and says `says`; once
/// the reads in flight drain, that blob is not in the pool; the next request gives the resident
/// run's logits.
fn fails_then_recovers(io: IoMode, nth: u64, fault: Fault, says: &str) {
    let (_d, mut eng, faults, want) = setup(io);
    faults.arm(nth, fault);
    let err = match run(&mut eng) {
        Ok(_) => panic!("{fault:?}: the faulty read did not fail its request"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(says) && err.contains("expert blob (layer"), "{fault:?}: {err}");
    assert_eq!(faults.counts().1, 1, "the fault fired once");
    let cache = eng.streamed().unwrap().cache.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cache.queue_depth() != QueueDepth::default() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (layer, expert) = named_blob(&err);
    let res = cache.residency();
    assert_ne!(
        res.cells[layer * res.num_experts + expert],
        Cell::Resident,
        "{fault:?}: the failed blob is in the pool"
    );
    let got = run(&mut eng).expect("the next request works");
    assert!(same_bits(&got, &want), "{fault:?}: the next request's logits differ from the resident run's");
}

#[test]
fn an_eio_fails_the_request_and_the_next_one_works() {
    fails_then_recovers(IoMode::Direct, 3, Fault::Eio, "os error 5");
    fails_then_recovers(IoMode::Buffered, 1, Fault::Eio, "os error 5");
}

#[test]
fn a_read_that_meets_an_end_of_file_fails_the_request_and_the_next_one_works() {
    fails_then_recovers(IoMode::Buffered, 2, Fault::Eof, "shrank");
}

#[test]
fn a_damaged_read_fails_its_checksum_and_the_next_request_works() {
    fails_then_recovers(IoMode::Direct, 5, Fault::Corrupt, "checksum mismatch");
    fails_then_recovers(IoMode::Buffered, 1, Fault::Corrupt, "checksum mismatch");
}

/// Short reads are asked again for the rest: the same bits (O_DIRECT in whole 4096-byte
/// pieces, as a device returns them; buffered at any length).
#[test]
fn short_reads_give_the_same_bits() {
    for (io, piece) in [(IoMode::Direct, 4096), (IoMode::Buffered, 1000)] {
        let (_d, mut eng, faults, want) = setup(io);
        faults.arm_next(40, Fault::Short(piece));
        let got = run(&mut eng).expect("short reads are retried");
        assert!(same_bits(&got, &want), "{io:?}: short reads changed the logits");
        assert_eq!(faults.counts().1, 40, "{io:?}: every armed short read fired");
    }
}

/// With prefetch on, faults land on speculative reads too (read in pieces, standing aside for
/// demand reads): a failed prefetch nobody asked for yet is dropped and read again on demand, one
/// that was asked for fails the request. Either way never other bits: every request gives the
/// resident run's logits or a clear error, and the next one after the faults stop is exact.
#[test]
fn faults_under_prefetch_give_the_right_bits_or_a_clear_error() {
    for (io, fault, says) in
        [(IoMode::Direct, Fault::Eio, "os error 5"), (IoMode::Buffered, Fault::Corrupt, "checksum mismatch")]
    {
        let (_d, mut eng, faults, want) = setup_with(io, true);
        for k in 1..=10 {
            faults.arm(37 * k, fault);
        }
        let (mut ok, mut failed, mut survived) = (0, 0, 0);
        for _ in 0..8 {
            let before = faults.counts().1;
            match run(&mut eng) {
                Ok(got) => {
                    assert!(same_bits(&got, &want), "{fault:?}: a request that succeeded has other logits");
                    ok += 1;
                    // a fault fired during it and it still succeeded: a dropped prefetch
                    survived += usize::from(faults.counts().1 > before);
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.contains(says) && e.contains("expert blob (layer"), "{fault:?}: {e}");
                    failed += 1;
                }
            }
        }
        let (_, fired) = faults.counts();
        assert!(fired > 0, "{fault:?}: no fault fired ({ok} ok, {failed} failed)");
        // faults still armed past the reads made: disarm by reading past them
        let mut done = false;
        for _ in 0..20 {
            if let Ok(got) = run(&mut eng) {
                assert!(same_bits(&got, &want), "{fault:?}: logits after the faults");
                done = true;
                break;
            }
        }
        assert!(done, "{fault:?}: no request worked after the faults");
        eprintln!(
            "{io:?} {fault:?}: {fired} faults fired, {ok} requests exact ({survived} through a fault), {failed} failed cleanly"
        );
    }
}

/// Reads that take 100 ms: the same bits, only later.
#[test]
fn slow_reads_give_the_same_bits() {
    let (_d, mut eng, faults, want) = setup(IoMode::Direct);
    faults.arm_next(6, Fault::Slow(Duration::from_millis(100)));
    let got = run(&mut eng).expect("slow reads complete");
    assert!(same_bits(&got, &want), "slow reads changed the logits");
    assert_eq!(faults.counts().1, 6);
}

/// A package truncated while `moescope run` has it mapped: the next touch of a lost page raises
/// SIGBUS, and the process ends with one line naming the file and exit status 1 (no bare "Bus
/// error", no core). The dense weights are always read through the mapping, so streaming or not,
/// this is how such a run ends; streamed expert reads fail as errors (the tests above). The chat
/// REPL answers one line, the file is cut to its header, then the next line is sent.
#[test]
fn a_package_truncated_while_mapped_ends_the_run_with_one_line() {
    use std::io::{BufRead, Read, Write};
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("demo.moe");
    moescope::demo::write_demo_package(&pkg, moescope::convert::QuantMode::Q4 { max_group: 128 }).expect("demo");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_moescope"))
        .args(["run", "-m", pkg.to_str().unwrap(), "-n", "4", "--no-stream", "-t", "1"])
        .env("MOESCOPE_CACHE_DIR", d.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(b"hello\n").unwrap();
    let mut reply = String::new();
    out.read_line(&mut reply).expect("the first reply");
    std::fs::OpenOptions::new().write(true).open(&pkg).unwrap().set_len(4096).unwrap();
    let _ = stdin.write_all(b"again\n");
    drop(stdin);
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the run went on after its package was truncated");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{status:?}: {err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains(pkg.to_str().unwrap()) && last.contains("SIGBUS"), "{err}");
}
