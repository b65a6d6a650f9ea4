//! Helpers shared by the integration tests: fixtures, their transformers references, packages
//! converted into temporary folders, and the real binary.
#![allow(dead_code)]

pub mod server;
pub mod trace_check;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moescope::convert::{ConvertOptions, QuantMode, convert_hf};
use safetensors::SafeTensors;

/// A committed fixture by name, or any fixture directory by absolute path.
pub fn fixture(name: &str) -> PathBuf {
    if Path::new(name).is_absolute() {
        return PathBuf::from(name);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures").join(name)
}

pub const MODEL_FIXTURES: [&str; 8] =
    ["single", "sharded", "dense-layer", "tied-demo-tok", "fused", "t5-config", "odd", "wide"];

/// Convert fixture `name` with `quant` into a fresh temporary folder.
pub fn convert(name: &str, quant: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let stem = Path::new(name).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let out = dir.path().join(format!("{stem}-{quant}.moe"));
    let q = QuantMode::parse(quant).expect("quant");
    convert_hf(&fixture(name), &out, ConvertOptions::new(q))
        .unwrap_or_else(|e| panic!("converting {name} ({quant}): {e}"));
    (dir, out)
}

/// What transformers computed (tests/reference/make_fixtures.py), read with the `safetensors`
/// crate, not with the engine's own reader.
pub struct Reference {
    bytes: Vec<u8>,
}

impl Reference {
    pub fn load(name: &str) -> Reference {
        let p = fixture(name).join("reference.safetensors");
        Reference { bytes: std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())) }
    }

    fn view(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("reference.safetensors")
    }

    pub fn shape(&self, key: &str) -> Vec<usize> {
        self.view().tensor(key).expect(key).shape().to_vec()
    }

    pub fn f32(&self, key: &str) -> Vec<f32> {
        let v = self.view();
        let t = v.tensor(key).unwrap_or_else(|_| panic!("reference has no {key}"));
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{key}");
        t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    pub fn i64(&self, key: &str) -> Vec<i64> {
        let v = self.view();
        let t = v.tensor(key).unwrap_or_else(|_| panic!("reference has no {key}"));
        assert_eq!(t.dtype(), safetensors::Dtype::I64, "{key}");
        t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    pub fn ids(&self, key: &str) -> Vec<u32> {
        self.i64(key).into_iter().map(|x| x as u32).collect()
    }
}

/// One expert slot's bytes in the pool of package `pkg`: a budget of n of them holds n experts.
pub fn slot_bytes(pkg: &Path) -> u64 {
    use moescope::engine::{Engine, EngineOptions};
    use moescope::experts::StreamConfig;
    let probe = StreamConfig { budget_bytes: Some(1), ..StreamConfig::default() };
    let opts =
        EngineOptions { threads: 1, ctx_size: Some(64), isa: moescope_kernels::Isa::detect(), stream: Some(probe) };
    Engine::load(pkg, opts).expect("load").experts.as_ref().expect("streamed").cache.blob_len() as u64
}

/// The moescope binary, run with a private cache folder.
pub fn moescope(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moescope"))
        .args(args)
        .env("MOESCOPE_CACHE_DIR", cache)
        .output()
        .expect("running moescope")
}

/// The moescope binary with `input` on its stdin (the REPL reads it line by line).
pub fn moescope_stdin(args: &[&str], cache: &Path, input: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_moescope"))
        .args(args)
        .env("MOESCOPE_CACHE_DIR", cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running moescope");
    child.stdin.take().expect("stdin").write_all(input).expect("writing stdin");
    child.wait_with_output().expect("waiting for moescope")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A failed run with a one-line error that contains every `needle`, and no panic.
pub fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let last = err.lines().rfind(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line in: {err}"));
    for n in needles {
        assert!(last.contains(n), "error line '{last}' does not mention '{n}'");
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn argmax(x: &[f32]) -> usize {
    let mut b = 0;
    for i in 1..x.len() {
        if x[i] > x[b] {
            b = i;
        }
    }
    b
}

/// KL(p || q) of the softmaxes of two logit rows, in nats.
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lse = |x: &[f32]| {
        let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p_logits), lse(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let la = a as f64 - lp;
            la.exp() * (la - (b as f64 - lq))
        })
        .sum()
}

/// Top-1 minus top-2 of a logit row.
pub fn margin(x: &[f32]) -> f32 {
    let mut v = x.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    v[0] - v[1]
}
