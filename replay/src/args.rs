//! The `args` target: the moescope binary itself, run once per case with an argument vector
//! mutated from the commands' valid ones (every command but `chat` and `serve`, which wait for a
//! terminal or the network). A case is the vector's arguments joined by NUL bytes; a word that
//! starts with `@` names a file this target makes (a package, a checkpoint, a GGUF, a routing
//! trace, junk, a folder, an output path), so a saved case replays on any machine.
//!
//! A case passes when the binary exits 0, or 1 with a line `error: ...`, or 2 (clap's usage
//! error). It fails when the binary panics (exit 101), dies by a signal, exits otherwise, ends in
//! 1 without an `error:` line, leaves its output file behind after failing (a half-written
//! file), or runs past the timeout. The flags a mutation adds come from each command's `--help`,
//! so a new flag is fuzzed without a change here.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Outcome;
use crate::mutate::Rng;

/// The commands a case may name (hidden `read-bandwidth` fills 2 GiB; `chat` and `serve` wait).
const COMMANDS: [&str; 8] = ["run", "convert", "synth", "plan", "inspect", "bench", "sim", "perplexity"];

/// Valid command lines, the starting points (`@NAME`: a file of [`Files`]).
const SEEDS: [&str; 25] = [
    "run -p hello -n 4",
    "run -m @PKG --prompt-ids 1,2,3 -n 3 --json --seed 7 --temperature 0.8 --top-k 5",
    "run -m @CKPT -p fn -n 2 --quant q8 --cache-mb 1 --prefetch off --io buffered",
    "run -m @GGUF -p a -n 2 --no-stream",
    "run -p x -n 3 --chat --system be brief --no-think --trace @OUTGZ --trace-max-events 50",
    "run -p x -n 3 --logits-out @OUT --routing-out @OUT2 -c 64 -t 1",
    "run -p x -n 3 --route-from @TRACE --cache-aware-routing 0.02 --policy lru --io-workers 1",
    "run --prompt-ids 5 -n 2 --top-p 0.5 --min-p 0.1 --repeat-penalty 1.1 --repeat-last-n 8 --ignore-eos",
    "run -m @PKG --prompt-ids 1,2,1,2,1 -n 6 --spec ngram --draft 3 --json --temperature 0.9 --seed 4",
    "convert @CKPT -o @OUT --quant q4g32",
    "convert @GGUF -o @OUT",
    "convert @CKPT -o @OUT --quant q2_k",
    "convert @GGUF -o @OUT --quant iq4_xs",
    "synth --shape qwen3-30b-a3b -o @OUT --layers 1 --experts 4 --vocab 512",
    "synth --shape qwen3.5-35b-a3b -o @OUT --layers 4 --experts 2 --vocab 256 --quant q8 --seed 3",
    "plan --shape qwen3-30b-a3b --mem 8G -t 2 --json --reuse-probes",
    "plan -m @PKG --mem 512M -c 128 --trace @TRACE --reuse-probes",
    "plan --config @CONFIG --quant q8 --reuse-probes",
    "inspect @PKG",
    "inspect @PKG --json",
    "bench -p 8 -n 4 -r 1 --warmup 0",
    "bench -m @PKG -p 4,8 -n 2 -d 0,4 -r 1 --warmup 0 -o json --cache-mb 1,auto --prefetch on,off",
    "sim @TRACE --cache-mb 1,2 --policy lru --json",
    "sim --synthetic @OUT --layers 4 --experts 16 --top-k 2 --tokens 64 --zipf 1.1 --seed 2",
    "perplexity @TEXT --window 32 --tokens 96 --json",
];

/// Flags whose value multiplies the work a valid run does (repetitions, lengths, counts): a
/// mutation gives them small values only, so a case that runs long is a hang rather than a run
/// asked to be long. Limits that are part of validation (context, layers) get every edge value.
const WORK_FLAGS: [&str; 10] =
    ["--repetitions", "--warmup", "--n-gen", "--n-prompt", "--n-depth", "--tokens", "--repeat", "--layers", "-r", "-n"];

/// Values that sit on the edges of a parser or a check. Devices are named through links in the
/// scratch folder (`@NULL`, `@ZERO`), never by their own paths: a writer that replaced its
/// destination once turned this machine's /dev/null into a regular file.
const EDGES: [&str; 43] = [
    "0",
    "1",
    "2",
    "-1",
    "-0",
    "255",
    "65535",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-1e308",
    "1e-45",
    "nan",
    "inf",
    "-inf",
    "0.5",
    "",
    " ",
    ",",
    "1,",
    ",,",
    "0,0",
    "1,2,3,4,5,6,7,8",
    "auto",
    "on",
    "off",
    "q4",
    "bf16",
    "xyz",
    "8G",
    "0G",
    "99999999999G",
    "1T",
    "-",
    "--",
    "@NULL",
    "@ZERO",
    "@JUNK",
    "@EMPTY",
    "@DIR",
];

/// Small values for [`WORK_FLAGS`].
const SMALL: [&str; 8] = ["0", "1", "2", "3", "", "0,0", "1,2", "-1"];

/// The files a case's `@NAME` words stand for, made once per run.
pub struct Files {
    exe: PathBuf,
    /// the repository (its fixtures are copied, never named)
    root: PathBuf,
    dir: PathBuf,
    named: BTreeMap<&'static str, PathBuf>,
    /// each command's long and short flags, read from its `--help`
    flags: BTreeMap<&'static str, Vec<String>>,
    /// the input files as made: a case that changed one has them made again
    inputs: Vec<(PathBuf, u64, i64, i64)>,
}

/// Every path under `dir` with its length and modification time, in name order.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                if m.is_dir() {
                    todo.push(p.clone());
                }
                out.push((p, m.len(), m.mtime(), m.mtime_nsec()));
            }
        }
    }
    out.sort();
    out
}

fn check(out: std::io::Result<std::process::Output>, what: &str) -> Result<std::process::Output, String> {
    let out = out.map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(out)
}

/// The flags a command's `--help` lists (`-m, --model <MODEL>` gives both).
fn help_flags(help: &str) -> Vec<String> {
    let mut out = vec![];
    for line in help.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') {
            continue;
        }
        for w in t.split([' ', ',']).take_while(|w| w.starts_with('-') || w.is_empty()) {
            if w.len() > 1 && w != "-h" && w != "--help" {
                out.push(w.to_string());
            }
        }
    }
    out
}

impl Files {
    /// Makes the files under `dir` with the binary `exe`: a package of the demo checkpoint, a
    /// routing trace of a short run, junk and an empty file; learns each command's flags.
    pub fn new(exe: &Path, root: &Path, dir: &Path) -> Result<Files, String> {
        if !exe.is_file() {
            return Err(format!(
                "{}: no moescope binary (the args target runs it: `cargo build --release` first, or --moescope PATH)",
                exe.display()
            ));
        }
        let named: BTreeMap<&'static str, PathBuf> = [
            ("CKPT", "demo"),
            ("CONFIG", "demo/config.json"),
            ("TEXT", "demo/heldout.txt"),
            ("GGUF", "tiny.gguf"),
            ("DIR", "dir"),
            ("PKG", "demo.moe"),
            ("TRACE", "routing.jsonl"),
            ("JUNK", "junk"),
            ("EMPTY", "empty"),
            ("NULL", "null"),
            ("ZERO", "zero"),
        ]
        .into_iter()
        .map(|(k, v)| (k, dir.join("in").join(v)))
        .collect();
        let root = root.to_path_buf();
        let mut files = Files {
            exe: exe.to_path_buf(),
            root,
            dir: dir.to_path_buf(),
            named,
            flags: BTreeMap::new(),
            inputs: vec![],
        };
        files.make_inputs()?;
        for c in COMMANDS {
            let out = check(files.command(&[c, "--help"]).output(), &format!("{c} --help"))?;
            files.flags.insert(c, help_flags(&String::from_utf8_lossy(&out.stdout)));
        }
        Ok(files)
    }

    /// (Re)makes the input files under `dir/in`: copies of the demo checkpoint and the tiny GGUF,
    /// the demo's package and a routing trace of it, junk, an empty file and an empty folder.
    /// Every file a case names is a copy, and cases run in `dir/cwd`: a mutated command line may
    /// write its output over any path it is given (a run once wrote over the demo checkpoint's
    /// config.json, and files named `nan` and `q4` into the repository).
    fn make_inputs(&mut self) -> Result<(), String> {
        let at = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        let _ = std::fs::remove_dir_all(self.dir.join("in"));
        for d in [self.dir.join("cwd"), self.named["CKPT"].clone(), self.named["DIR"].clone()] {
            std::fs::create_dir_all(&d).map_err(|e| at(&d, e))?;
        }
        let demo = crate::seeds::fixtures(&self.root).join("demo");
        let shards =
            ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"];
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "heldout.txt"].into_iter().chain(shards) {
            std::fs::copy(demo.join(f), self.named["CKPT"].join(f)).map_err(|e| at(&demo.join(f), e))?;
        }
        let gguf = crate::seeds::fixtures(&self.root).join("gguf/tiny.gguf");
        std::fs::copy(&gguf, &self.named["GGUF"]).map_err(|e| at(&gguf, e))?;
        let mut junk = Rng::new(5);
        let bytes: Vec<u8> = (0..4096).map(|_| junk.next() as u8).collect();
        std::fs::write(&self.named["JUNK"], bytes).map_err(|e| at(&self.named["JUNK"], e))?;
        std::fs::write(&self.named["EMPTY"], b"").map_err(|e| at(&self.named["EMPTY"], e))?;
        for (name, device) in [("NULL", "/dev/null"), ("ZERO", "/dev/zero")] {
            std::os::unix::fs::symlink(device, &self.named[name]).map_err(|e| at(&self.named[name], e))?;
        }
        check(self.command(&["convert", "@CKPT", "-o", "@PKG"]).output(), "converting the demo checkpoint")?;
        let trace = ["run", "-m", "@PKG", "-p", "fn main", "-n", "6", "--routing-out", "@TRACE"];
        check(self.command(&trace).output(), "recording a routing trace")?;
        self.inputs = snapshot(&self.dir.join("in"));
        Ok(())
    }

    /// The path an `@NAME` word stands for; output names are per case, removed after it.
    fn path(&self, word: &[u8]) -> Option<PathBuf> {
        let name = std::str::from_utf8(word.strip_prefix(b"@")?).ok()?;
        match name {
            "OUT" => Some(self.dir.join("out/a.moe")),
            "OUT2" => Some(self.dir.join("out/b.jsonl")),
            "OUTGZ" => Some(self.dir.join("out/trace.json.gz")),
            "MISSING" => Some(self.dir.join("no/such/file")),
            _ => self.named.get(name).cloned(),
        }
    }

    fn command<S: AsRef<[u8]>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(&self.exe);
        for a in args {
            let a = a.as_ref();
            match self.path(a) {
                Some(p) => cmd.arg(p),
                None => cmd.arg(OsStr::from_bytes(a)),
            };
        }
        let home = self.dir.join("home");
        cmd.env("HOME", &home).env("MOESCOPE_CACHE_DIR", home.join("cache")).env("TMPDIR", &self.dir);
        cmd.env("RUST_BACKTRACE", "0")
            .env_remove("MOESCOPE_ISA")
            .stdin(Stdio::null())
            .current_dir(self.dir.join("cwd"));
        cmd
    }

    pub fn seeds(&self) -> Vec<(String, Vec<u8>)> {
        SEEDS.iter().map(|s| (format!("args: {s}"), s.replace(' ', "\0").into_bytes())).collect()
    }

    /// One to three argument-level mutations: a value replaced by an edge value or a file, a
    /// flag of the command added, an argument dropped, repeated or damaged, the command changed.
    pub fn mutate(&self, rng: &mut Rng, case: &[u8]) -> Vec<u8> {
        let mut args: Vec<Vec<u8>> = case.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
        for _ in 0..1 + rng.below(3) {
            self.mutate_once(rng, &mut args);
        }
        args.join(&0u8)
    }

    fn value(rng: &mut Rng, flag: Option<&[u8]>) -> Vec<u8> {
        let work = flag.is_some_and(|f| WORK_FLAGS.iter().any(|w| w.as_bytes() == f));
        if work {
            return SMALL[rng.below(SMALL.len())].as_bytes().to_vec();
        }
        match rng.below(12) {
            0 => vec![b'7'; 1 + rng.below(5000)],
            1 => vec![0xff, 0xfe, b'1'],
            2 => b"@MISSING".to_vec(),
            3 => [b"@PKG".as_slice(), b"@CKPT", b"@GGUF", b"@TRACE", b"@TEXT", b"@CONFIG", b"@OUT"][rng.below(7)]
                .to_vec(),
            _ => EDGES[rng.below(EDGES.len())].as_bytes().to_vec(),
        }
    }

    fn mutate_once(&self, rng: &mut Rng, args: &mut Vec<Vec<u8>>) {
        let command = args.first().and_then(|c| COMMANDS.iter().find(|&&k| k.as_bytes() == c.as_slice()));
        let n = args.len();
        match rng.below(8) {
            // a value (a word after the command that is not a flag) replaced
            0..=2 if n > 1 => {
                let i = 1 + rng.below(n - 1);
                if args[i].first() != Some(&b'-') || args[i].len() < 2 {
                    let flag = args[i - 1].clone();
                    args[i] = Self::value(rng, Some(&flag));
                }
            }
            // a flag of this command added, with a value
            3 | 4 => {
                let Some(flags) = command.and_then(|c| self.flags.get(c)) else { return };
                if flags.is_empty() {
                    return;
                }
                let flag = flags[rng.below(flags.len())].clone().into_bytes();
                let at = 1 + rng.below(n.max(1));
                let v = Self::value(rng, Some(&flag));
                let at = at.min(args.len());
                args.insert(at, flag);
                if rng.below(4) != 0 {
                    args.insert(at + 1, v);
                }
            }
            5 if n > 1 => {
                args.remove(1 + rng.below(n - 1));
            }
            6 if n > 0 => {
                let i = rng.below(n);
                let a = args[i].clone();
                args.insert(i, a);
            }
            7 if n > 0 => {
                // the command swapped, or one byte of a word changed
                if rng.below(2) == 0 {
                    args[0] = COMMANDS[rng.below(COMMANDS.len())].as_bytes().to_vec();
                } else {
                    let i = rng.below(n);
                    if !args[i].is_empty() {
                        let j = rng.below(args[i].len());
                        args[i][j] = [b'0', b'9', b'-', b',', b'.', 0x80, b'@'][rng.below(7)];
                    }
                }
            }
            _ => {}
        }
        // NUL separates the words of a case: none inside one
        for a in args.iter_mut() {
            a.retain(|&b| b != 0);
        }
    }

    /// Runs one case under the address-space and file-size limits; see the module's rules.
    pub fn run(&mut self, case: &[u8], timeout: Duration, mem: u64) -> Outcome {
        let mut outcome = self.run_once(case, timeout, mem);
        // belt and braces: no case may reach the machine's own devices (see EDGES)
        if std::fs::metadata("/dev/null")
            .map_or(true, |m| !std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()))
        {
            outcome = Outcome::Crash("/dev/null is no longer a device".into());
        }
        // what the case wrote in its working folder goes; inputs it changed are made again
        let cwd = self.dir.join("cwd");
        let _ = std::fs::remove_dir_all(&cwd);
        let _ = std::fs::create_dir_all(&cwd);
        if snapshot(&self.dir.join("in")) != self.inputs
            && let Err(e) = self.make_inputs()
        {
            return Outcome::Crash(format!("the case changed its input files, and making them again failed: {e}"));
        }
        outcome
    }

    fn run_once(&self, case: &[u8], timeout: Duration, mem: u64) -> Outcome {
        let args: Vec<&[u8]> = case.split(|&b| b == 0).collect();
        let out_dir = self.dir.join("out");
        let _ = std::fs::remove_dir_all(&out_dir);
        let _ = std::fs::create_dir_all(&out_dir);
        let outputs: Vec<PathBuf> =
            args.iter().filter_map(|a| self.path(a)).filter(|p| p.starts_with(&out_dir)).collect();
        let err_path = self.dir.join("stderr");
        let Ok(err) = std::fs::File::create(&err_path) else {
            return Outcome::Crash("cannot create stderr file".into());
        };
        let mut cmd = self.command(&args);
        cmd.stdout(Stdio::null()).stderr(err);
        // SAFETY: setrlimit and signal are async-signal-safe; nothing else runs between fork and exec
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit { rlim_cur: mem, rlim_max: mem };
                // a file past 256 MiB fails its write (EFBIG) instead of filling the disk
                let fsize = libc::rlimit { rlim_cur: 256 << 20, rlim_max: 256 << 20 };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 || libc::setrlimit(libc::RLIMIT_FSIZE, &fsize) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Outcome::Crash(format!("cannot start the binary: {e}")),
        };
        let t0 = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if t0.elapsed() < timeout => std::thread::sleep(Duration::from_millis(2)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Outcome::Hang;
                }
            }
        };
        let mut stderr = String::new();
        let _ = std::fs::File::open(&err_path).and_then(|mut f| f.read_to_string(&mut stderr));
        let tail =
            || stderr.lines().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
        let said_error = stderr.lines().any(|l| l.starts_with("error: "));
        match (status.code(), status.signal()) {
            (Some(0), _) => Outcome::Ok(3),
            (Some(2), _) if !stderr.contains("panicked at") => Outcome::Ok(0),
            (Some(1), _) if said_error && !stderr.contains("panicked at") => {
                let left = std::fs::read_dir(self.dir.join("cwd")).ok().and_then(|mut d| d.next()).and_then(|e| e.ok());
                match outputs.iter().find(|p| p.exists()).cloned().or(left.map(|e| e.path())) {
                    Some(p) => Outcome::Crash(format!("failed but left {} behind: {}", p.display(), tail())),
                    None => Outcome::Ok(1),
                }
            }
            (Some(1), _) => Outcome::Crash(format!("exit 1 without an `error:` line: {}", tail())),
            (code, sig) => Outcome::Crash(format!("exit {code:?}, signal {sig:?}: {}", tail())),
        }
    }
}
