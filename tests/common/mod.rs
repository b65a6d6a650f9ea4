//! Helpers shared by the integration tests: fixtures, their transformers references, packages
//! converted into temporary folders, and the real binary.
#![allow(dead_code)]

pub mod pty;
pub mod server;
pub mod trace_check;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use moescope::convert::{ConvertOptions, QuantMode, convert_hf};
use safetensors::SafeTensors;

/// A committed fixture by name (a path under tests/fixtures, its packed files unpacked), or any
/// fixture directory by absolute path.
pub fn fixture(name: &str) -> PathBuf {
    if Path::new(name).is_absolute() {
        return PathBuf::from(name);
    }
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| unpacked("tests/fixtures")).join(name)
}

/// A file of assets/tokenizers (the real tokenizers `moescope synth` embeds), unpacked.
pub fn asset(name: &str) -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| unpacked("assets/tokenizers")).join(name)
}

/// The repository's folder `rel` as its readers see it: its packed files unpacked
/// (`moescope::packed`) into the target folder, once per state of the folder's files.
fn unpacked(rel: &str) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let key = moescope::packed::tree_key(&from).unwrap_or_else(|e| panic!("{e}"));
    let to = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{key:08x}", rel.replace('/', "-")));
    moescope::packed::unpack_tree(&from, &to).unwrap_or_else(|e| panic!("unpacking {rel}: {e}"));
    to
}

/// gpt-oss's bf16 release layout, derived from the MXFP4 fixture (`moescope::derived_fixture`;
/// the same weights, so the MXFP4 fixture's references are its own), written once per test
/// binary; its absolute path, for [fixture] and [convert].
pub fn gpt_oss_bf16() -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    derived(&DIR, "gpt-oss-mxfp4", "gpt-oss-bf16", &moescope::derived_fixture::gpt_oss_bf16_release)
}

/// The "single" fixture split into 4 shards with the hub's index (`moescope::derived_fixture::
/// sharded`: the same weights, so its references are single's), written once per test binary;
/// its absolute path, for [fixture] and [convert].
pub fn sharded() -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    derived(&DIR, "single", "sharded", &|src, to| moescope::derived_fixture::sharded(src, to, 4))
}

/// Fixture `from` (deepseek or glm) with the multi-token-prediction layer its config states
/// (`moescope::derived_fixture::with_mtp_layer`: the main model's weights the same, so its
/// references are `from`'s), written once per test binary; its absolute path.
pub fn with_mtp_layer(from: &str) -> String {
    static DIRS: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    let i = ["deepseek", "glm"].iter().position(|f| *f == from).expect("deepseek or glm");
    derived(&DIRS[i], from, &format!("{from}-mtp"), &moescope::derived_fixture::with_mtp_layer)
}

/// A checkpoint `make` derives from fixture `from` into a folder named `name` of this test
/// binary (made once, in `dir`), with `from`'s references beside it: the same weights.
fn derived(
    dir: &OnceLock<PathBuf>,
    from: &str,
    name: &str,
    make: &dyn Fn(&Path, &Path) -> Result<(), String>,
) -> String {
    let dir = dir.get_or_init(|| {
        let src = fixture(from);
        let to = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&to).unwrap_or_else(|e| panic!("{name} folder: {e}"));
        make(&src, &to).unwrap_or_else(|e| panic!("{name}: {e}"));
        for f in ["reference.json", "reference.safetensors"] {
            std::fs::copy(src.join(f), to.join(f)).expect("reference");
        }
        to
    });
    dir.to_string_lossy().into_owned()
}

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
        Reference::load_file(name, "reference.safetensors")
    }

    /// Another safetensors file of fixture folder `name`.
    pub fn load_file(name: &str, file: &str) -> Reference {
        let p = fixture(name).join(file);
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

    /// An F16 tensor widened to f32 (exactly).
    pub fn f16(&self, key: &str) -> Vec<f32> {
        let v = self.view();
        let t = v.tensor(key).unwrap_or_else(|_| panic!("reference has no {key}"));
        assert_eq!(t.dtype(), safetensors::Dtype::F16, "{key}");
        t.data().chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
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
    let opts = EngineOptions {
        threads: 1,
        ctx_size: Some(64),
        isa: moescope_kernels::Isa::detect(),
        stream: Some(probe),
        panels: true,
        kv: moescope::model::KvTypes::F32,
    };
    Engine::load(pkg, opts).expect("load").pool().expect("streamed").blob_len() as u64
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

/// The standard deviation of a reference's logits: the scale quantization errors grow with.
pub fn logits_sigma(want: &[f32]) -> f64 {
    let n = want.len() as f64;
    let mean = want.iter().map(|&x| x as f64).sum::<f64>() / n;
    (want.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
}

/// Rows of logits (`[n, v]`) against a reference's: with `bounds` = (max |Δ| and mean KL in
/// units of σ and σ², least top-1 agreement; tests/reference_logits.rs's), held to them; without,
/// exact weights: max |Δ| 1e-3. Top-1 must agree wherever the reference's margin exceeds twice the
/// error bound (1e-3 for exact weights). Prints what it measured.
pub fn check_logits(tag: &str, got: &[f32], want: &[f32], v: usize, bounds: Option<(f64, f64, f64)>) {
    assert_eq!(got.len(), want.len(), "{tag}: logits");
    let sigma = logits_sigma(want);
    let (mut max_abs, mut kl_sum, mut agree) = (0f32, 0f64, 0usize);
    for (i, (a, b)) in got.chunks_exact(v).zip(want.chunks_exact(v)).enumerate() {
        max_abs = max_abs.max(max_abs_diff(a, b));
        kl_sum += kl(b, a);
        agree += usize::from(argmax(a) == argmax(b));
        let flip = bounds.map_or(1e-3, |(b, _, _)| (2.0 * b * sigma) as f32);
        if margin(b) >= flip {
            assert_eq!(argmax(a), argmax(b), "{tag}: row {i}: top-1 differs where the margin is {}", margin(b));
        }
    }
    let rows = (got.len() / v) as f64;
    let mean_kl = kl_sum / rows;
    eprintln!(
        "{tag}: sigma {sigma:.3} max|dlogit| {max_abs:.3e} ({:.3} sigma) mean KL {mean_kl:.3e} top1 agree {:.3}",
        max_abs as f64 / sigma,
        agree as f64 / rows
    );
    match bounds {
        None => assert!(max_abs <= 1e-3, "{tag}: max |dlogit| {max_abs} > 1e-3"),
        Some((b, kl_max, agree_min)) => {
            assert!(max_abs as f64 <= b * sigma, "{tag}: max |dlogit| {max_abs} > {}", b * sigma);
            assert!(mean_kl <= kl_max * sigma * sigma, "{tag}: mean KL {mean_kl}");
            assert!(agree as f64 / rows >= agree_min, "{tag}: top-1 agreement {}", agree as f64 / rows);
        }
    }
}

/// The GGUF file `gguf` converted with its own values, at every tier this CPU has: the prompt
/// `ids`' logits against `want` ([`check_logits`] with `bounds`), and its last token decoded
/// after the rest through the cache equal to the prompt's last row.
pub fn check_gguf_logits(gguf: &Path, ids: &[u32], want: &[f32], bounds: Option<(f64, f64, f64)>) {
    use moescope::engine::{Engine, EngineOptions};
    use moescope::model::{Logits, NoObserver};
    let v = want.len() / ids.len();
    let dir = tempfile::tempdir().expect("tempdir");
    let pkg = dir.path().join("gguf.moe");
    moescope::convert::convert_gguf(gguf, &pkg, ConvertOptions::new(QuantMode::File))
        .unwrap_or_else(|e| panic!("converting {}: {e}", gguf.display()));
    let name = gguf.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    // latent attention with quantized up-projections: a decode step runs the absorbed form,
    // whose k_b / v_b products take the query and latent output quantized to int8 (every
    // quantized product's input), a prompt's batch the expanded form, which expands keys and
    // values in f32 (src/model/mla_expanded.rs): the step is held to transformers' row within
    // the bounds rather than to the prompt's row (0.0102 apart on tests/deepseek.rs's file)
    let quantized_mla = {
        let p = moescope::package::Package::open(&pkg).expect("package");
        let up = |n: &str| n.ends_with("self_attn.k_b_proj.weight") || n.ends_with("self_attn.v_b_proj.weight");
        p.meta
            .tensors
            .iter()
            .filter(|t| up(&t.name))
            .any(|t| p.mat_by_index(p.require(&t.name, &t.shape, false).expect("tensor")).quant_group().is_some())
    };
    for isa in moescope_kernels::Isa::available() {
        let tag = format!("{name} {isa}");
        let ctx = Some(ids.len().next_multiple_of(64));
        let mut eng = Engine::load(
            &pkg,
            EngineOptions {
                threads: 2,
                ctx_size: ctx,
                isa,
                stream: None,
                panels: true,
                kv: moescope::model::KvTypes::F32,
            },
        )
        .expect("load");
        let got = eng.eval(ids, Logits::All, &mut NoObserver).expect("prefill").to_vec();
        eng.reset();
        eng.eval(&ids[..ids.len() - 1], Logits::Last, &mut NoObserver).expect("prefill");
        let inc = eng.eval(&ids[ids.len() - 1..], Logits::Last, &mut NoObserver).expect("decode").to_vec();
        let last = (ids.len() - 1) * v;
        if quantized_mla {
            check_logits(&format!("{tag} decode"), &inc, &want[last..], v, bounds);
        } else {
            let d_inc = max_abs_diff(&inc, &got[last..]);
            assert!(d_inc <= 1e-4, "{tag}: decode differs from the prompt's last row by {d_inc}");
        }
        check_logits(&tag, &got, want, v, bounds);
    }
}

/// Every weight of the package `pkg` (converted from `gguf` with the file's types kept) equals
/// the file's value bit for bit, as the GGUF source dequantizes it: dense tensors and every
/// expert.
pub fn assert_package_holds_gguf_values(gguf: &Path, pkg: &Path) {
    use moescope::convert::gguf::source::GgufSource;
    use moescope::convert::source::TensorSource;
    use moescope::package::Package;
    let file = gguf.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let (src, p) = (GgufSource::open(gguf).expect("open"), Package::open(pkg).expect("package"));
    let (mut want, mut got, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    let mut check = |name: &str, m: moescope_kernels::Mat<'_>| {
        // a tensor kept as the file's blocks holds the file's bytes
        if let moescope_kernels::MatData::Blocks { q, .. } = m.data {
            assert!(src.file_bytes(name, 0, m.rows, &mut raw).expect("blocks"), "{file}: {name} has blocks");
            assert!(q == &raw[..], "{file}: {name}'s blocks are not the file's bytes");
        }
        for r in 0..m.rows {
            src.read_rows(name, r, 1, &mut want).expect("rows");
            got.resize(m.cols, 0.0);
            m.dequant_row(r, &mut got);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{file}: {name} row {r} value {j}: {g} != {w}");
            }
        }
    };
    for t in p.meta.tensors.iter().filter(|t| t.shape.len() == 2) {
        check(&t.name, p.mat_by_index(p.require(&t.name, &t.shape, false).expect("tensor")));
    }
    let cfg = p.meta.model.clone();
    for l in cfg.moe_layers() {
        for e in 0..cfg.num_experts {
            let x = p.expert(l, e).expect("expert");
            let names = moescope::convert::plan::expert_tensors(&cfg, l, e);
            for (m, (name, _)) in [x.gate, x.up, x.down].into_iter().zip(names.iter()) {
                check(name, m);
            }
        }
    }
}

/// The options the streaming tests load with: 2 threads at the best tier, 320 positions of f32
/// KV (what the references compute), experts as `stream` says.
pub fn options(stream: Option<moescope::experts::StreamConfig>) -> moescope::engine::EngineOptions {
    moescope::engine::EngineOptions {
        threads: 2,
        ctx_size: Some(320),
        isa: moescope_kernels::Isa::detect(),
        stream,
        panels: true,
        kv: moescope::model::KvTypes::F32,
    }
}
