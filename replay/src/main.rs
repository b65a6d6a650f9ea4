//! moescope-replay: the fuzz targets of `moescope::fuzzing` run on the saved corpus and on
//! seeded mutations of it, the same cases on every machine for the same seed. Cases run in a
//! child process (a batch per child, fed over a pipe) under `RLIMIT_AS` and a per-case
//! wall-clock timeout: a panic anywhere in the child aborts it, an allocation past the limit
//! aborts it, a case that does not answer in time is killed. The parent saves each input that
//! killed or hung its child into fuzz/corpus/TARGET/ (so it is replayed from then on), prints
//! the counts, and exits 1 if there was any.
//!
//! Each target answers how far an input got (0: refused at once ... 3: converted or parsed and
//! run); the counts per depth are printed, so a run that only ever reaches depth 0 shows.
//!
//! usage: moescope-replay [--cases N] [--seed S] [--targets a,b] [--timeout-s T] [--mem-mib M]
//!        [--root DIR] [--write-seeds OUT] [--moescope BIN]   (N cases in all, shared by the targets by
//!        weight; DIR: the repository; BIN: the binary the args target runs, default beside this one)
//!        moescope-replay --write-typed-ggufs OUT [--root DIR]   (the tiny Q8_0 GGUF re-typed to each
//!        of `moescope::derived_gguf::ONE_TYPE_FILES`, OUT/tiny-TYPE.gguf, as the tests derive them:
//!        the files tests/reference/llama_logits.py gives llama.cpp)

mod args;
mod mutate;
mod seeds;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use mutate::{Rng, Shape};

/// Each target's share of the cases (its inputs cost more or less to run) and its inputs' shape.
const PLAN: [(&str, usize, Shape); 8] = [
    ("gguf", 3, Shape::Whole),
    ("routing_trace", 1, Shape::Whole),
    ("package", 3, Shape::Package),
    ("checkpoint", 2, Shape::Bundle),
    ("chat_template", 3, Shape::Bundle),
    ("request", 1, Shape::Tagged),
    ("tool_calls", 1, Shape::Tagged),
    // a process per case (~30 ms each): its share is small
    ("args", 1, Shape::Args),
];

struct Opts {
    cases: usize,
    seed: u64,
    targets: Vec<String>,
    timeout: Duration,
    mem_bytes: u64,
    root: PathBuf,
    /// write each target's seeds into DIR/TARGET/ and stop (libFuzzer's starting corpus)
    write_seeds: Option<PathBuf>,
    /// write the single-type GGUFs into DIR and stop
    write_typed: Option<PathBuf>,
    /// the binary the args target runs (default: beside this one)
    moescope: Option<PathBuf>,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        cases: 10_000,
        seed: 1,
        targets: PLAN.iter().map(|p| p.0.to_string()).collect(),
        timeout: Duration::from_secs(20),
        mem_bytes: 3 << 30,
        root: PathBuf::from("."),
        write_seeds: None,
        write_typed: None,
        moescope: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("{a}: '{v}' is not a number"));
        match a.as_str() {
            "--cases" => o.cases = num(val()?)? as usize,
            "--seed" => o.seed = num(val()?)?,
            "--timeout-s" => o.timeout = Duration::from_secs(num(val()?)?),
            "--mem-mib" => o.mem_bytes = num(val()?)? << 20,
            "--root" => o.root = PathBuf::from(val()?),
            "--targets" => o.targets = val()?.split(',').map(str::to_string).collect(),
            "--write-seeds" => o.write_seeds = Some(PathBuf::from(val()?)),
            "--write-typed-ggufs" => o.write_typed = Some(PathBuf::from(val()?)),
            "--moescope" => o.moescope = Some(PathBuf::from(val()?)),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    for t in &o.targets {
        if moescope::fuzzing::target(t).is_none() && t != "args" {
            return Err(format!("no target '{t}'"));
        }
    }
    Ok(o)
}

/// Child mode: cases from stdin (u32 LE length, bytes), one byte written back per case done.
/// stdout is moved aside first, so nothing the target prints can pass for an answer.
fn child(target: &str) -> ! {
    let Some(run) = moescope::fuzzing::target(target) else { std::process::exit(2) };
    std::panic::set_hook(Box::new(|info| {
        eprintln!("replay child: {info}");
        std::process::abort();
    }));
    // SAFETY: plain descriptor calls on this process's own descriptors
    let ack_fd = unsafe {
        let fd = libc::dup(1);
        libc::dup2(2, 1);
        fd
    };
    // SAFETY: ack_fd was just made by dup and is owned here alone
    let mut acks = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(ack_fd) };
    let mut input = std::io::stdin().lock();
    loop {
        let mut len = [0u8; 4];
        if input.read_exact(&mut len).is_err() {
            std::process::exit(0);
        }
        let mut case = vec![0u8; u32::from_le_bytes(len) as usize];
        if input.read_exact(&mut case).is_err() {
            std::process::exit(0);
        }
        let depth = run(&case);
        if acks.write_all(&[depth]).and_then(|_| acks.flush()).is_err() {
            std::process::exit(0);
        }
    }
}

/// A running child and the answers it sends back.
struct Runner {
    child: Child,
    stdin: ChildStdin,
    acks: Receiver<u8>,
    stderr: PathBuf,
    /// cases this child has taken (its first may start a server: more time)
    done: usize,
}

fn spawn(target: &str, o: &Opts, scratch: &Path) -> Result<Runner, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let stderr = scratch.join(format!("{target}.stderr"));
    let err = std::fs::File::create(&stderr).map_err(|e| format!("{}: {e}", stderr.display()))?;
    let mem = o.mem_bytes;
    let mut cmd = Command::new(exe);
    cmd.args(["--child", target]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(err);
    // a failure's report is the panic's message, not a backtrace
    cmd.env("RUST_BACKTRACE", "0");
    // the targets' scratch files (cases, converted packages, the server's demo package) under
    // the parent's scratch folder, removed with it at the end (each child left ~1 MB in /tmp)
    cmd.env("TMPDIR", scratch);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: mem, rlim_max: mem };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting a child: {e}"))?;
    let stdin = child.stdin.take().ok_or("no child stdin")?;
    let mut out = child.stdout.take().ok_or("no child stdout")?;
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        while out.read_exact(&mut b).is_ok() {
            if tx.send(b[0]).is_err() {
                break;
            }
        }
    });
    Ok(Runner { child, stdin, acks: rx, stderr, done: 0 })
}

/// How a target's cases run: in a replay child fed over a pipe, or as the moescope binary itself.
enum Exec {
    Child(Runner),
    Args(args::Files),
}

impl Exec {
    fn start(target: &str, o: &Opts, scratch: &Path) -> Result<Exec, String> {
        if target != "args" {
            return spawn(target, o, scratch).map(Exec::Child);
        }
        let exe = match &o.moescope {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|e| format!("own path: {e}"))?.with_file_name("moescope"),
        };
        args::Files::new(&exe, &o.root, &scratch.join("args")).map(Exec::Args)
    }
}

enum Outcome {
    /// how far the input got (the target's answer)
    Ok(u8),
    /// the child died: its exit status and the tail of what it printed
    Crash(String),
    Hang,
}

fn run_case(r: &mut Runner, case: &[u8], timeout: Duration) -> Outcome {
    let sent = r.stdin.write_all(&(case.len() as u32).to_le_bytes()).and_then(|_| r.stdin.write_all(case));
    let wait = if r.done == 0 { timeout.max(Duration::from_secs(120)) } else { timeout };
    let got = if sent.is_ok() { r.acks.recv_timeout(wait) } else { Err(RecvTimeoutError::Disconnected) };
    r.done += 1;
    match got {
        Ok(depth) => Outcome::Ok(depth),
        Err(RecvTimeoutError::Timeout) => {
            let _ = r.child.kill();
            let _ = r.child.wait();
            Outcome::Hang
        }
        Err(RecvTimeoutError::Disconnected) => {
            let status = r.child.wait().map_or_else(|e| e.to_string(), |s| s.to_string());
            let err = std::fs::read_to_string(&r.stderr).unwrap_or_default();
            let tail: Vec<&str> = err.lines().rev().take(6).collect();
            Outcome::Crash(format!("{status}: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | ")))
        }
    }
}

/// Failing inputs a run saves per target, at most.
const MAX_SAVED: usize = 8;

/// Keep an input that killed or hung a child in the corpus, named by its hash.
fn save(root: &Path, target: &str, kind: &str, case: &[u8]) -> PathBuf {
    let dir = root.join("fuzz/corpus").join(target);
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!("{kind}-{:016x}", xxhash(case)));
    let _ = std::fs::write(&p, case);
    p
}

/// FNV-1a, 64 bits: a stable name for a saved input.
fn xxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(args.get(2).map_or("", String::as_str));
    }
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("moescope-replay: {e}");
            std::process::exit(2);
        }
    };
    let scratch = std::env::temp_dir().join(format!("moescope-replay-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        eprintln!("moescope-replay: {}: {e}", scratch.display());
        std::process::exit(2);
    }
    if let Some(dir) = &o.write_typed {
        if let Err(e) = seeds::write_typed_ggufs(&o.root, dir) {
            eprintln!("moescope-replay: {e}");
            std::process::exit(2);
        }
        return;
    }
    let plan: Vec<_> = PLAN.iter().filter(|p| o.targets.iter().any(|t| t == p.0)).collect();
    if let Some(dir) = &o.write_seeds {
        for &&(target, _, _) in &plan {
            let d = dir.join(target);
            for (i, (_, b)) in seeds::seeds(target, &o.root).iter().enumerate() {
                if let Err(e) = std::fs::create_dir_all(&d).and_then(|_| std::fs::write(d.join(format!("seed-{i}")), b))
                {
                    eprintln!("moescope-replay: {}: {e}", d.display());
                    std::process::exit(2);
                }
            }
        }
        return;
    }
    let weight: usize = plan.iter().map(|p| p.1).sum::<usize>().max(1);
    let mut failures = 0;
    println!(
        "moescope-replay: {} cases, seed {}, {} s per case, {} MiB address space",
        o.cases,
        o.seed,
        o.timeout.as_secs(),
        o.mem_bytes >> 20
    );
    for &&(target, share, shape) in &plan {
        let t0 = Instant::now();
        let mut seeds = seeds::seeds(target, &o.root);
        let mut exec = match Exec::start(target, &o, &scratch) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("moescope-replay: {target}: {e}");
                std::process::exit(2);
            }
        };
        if let Exec::Args(files) = &exec {
            seeds.splice(0..0, files.seeds());
        }
        if seeds.is_empty() {
            eprintln!("moescope-replay: no seeds for {target}");
            std::process::exit(2);
        }
        let n = (o.cases * share).div_ceil(weight).max(seeds.len());
        let mut rng = Rng::new(o.seed ^ xxhash(target.as_bytes()));
        let (mut crashes, mut hangs, mut depths) = (0, 0, [0usize; 4]);
        for i in 0..n {
            // the seeds as they are first, then mutations of them
            let (name, case) = if i < seeds.len() {
                (seeds[i].0.clone(), seeds[i].1.clone())
            } else {
                let s = rng.below(seeds.len());
                let case = match &exec {
                    Exec::Args(files) => files.mutate(&mut rng, &seeds[s].1),
                    Exec::Child(_) => mutate::mutate(&mut rng, &seeds[s].1, shape),
                };
                (format!("mutation {i} of {}", seeds[s].0), case)
            };
            let outcome = match &mut exec {
                Exec::Child(runner) => run_case(runner, &case, o.timeout),
                Exec::Args(files) => files.run(&case, o.timeout, o.mem_bytes),
            };
            let (kind, what) = match outcome {
                Outcome::Ok(d) => {
                    depths[(d as usize).min(3)] += 1;
                    continue;
                }
                Outcome::Crash(why) => {
                    crashes += 1;
                    ("crash", why)
                }
                Outcome::Hang => {
                    hangs += 1;
                    ("hang", format!("no answer in {} s", o.timeout.as_secs()))
                }
            };
            // the first few of a run are kept (a planted bug can kill hundreds of cases)
            let kept = if crashes + hangs <= MAX_SAVED {
                save(&o.root, target, kind, &case).display().to_string()
            } else {
                "not saved: past the first few".into()
            };
            println!("  {target}: {kind} on {name} ({} bytes, {kept}): {what}", case.len());
            if let Exec::Child(_) = exec {
                exec = match Exec::start(target, &o, &scratch) {
                    Ok(e) => e,
                    Err(e) => {
                        eprintln!("moescope-replay: {target}: {e}");
                        std::process::exit(2);
                    }
                };
            }
        }
        if let Exec::Child(runner) = exec {
            drop(runner.stdin);
            let mut child = runner.child;
            let _ = child.wait();
        }
        failures += crashes + hangs;
        println!(
            "{target:>14}: {n} cases ({} seeds), {crashes} crashes, {hangs} hangs, {:.1} s; reached {depths:?}",
            seeds.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if failures > 0 {
        println!("moescope-replay: {failures} inputs killed or hung a child; they are saved in fuzz/corpus/");
        std::process::exit(1);
    }
}
