//! Bad input gets one clear error line naming the file, key, tensor or offset, a non-zero exit,
//! no panic, and never a file that looks complete.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// A copy of fixture `single` in a temporary folder, to damage.
fn copy_single() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let dst = d.path().join("ckpt");
    std::fs::create_dir(&dst).unwrap();
    for e in std::fs::read_dir(fixture("single")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    (d, dst)
}

/// Rewrite `dir/model.safetensors` through `edit(name, dtype, shape, bytes)`; returning None
/// drops the tensor.
fn rewrite_weights(
    dir: &Path,
    edit: impl Fn(&str, Dtype, Vec<usize>, Vec<u8>) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let p = dir.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for (name, t) in st.tensors() {
        if let Some((dt, shape, data)) = edit(&name, t.dtype(), t.shape().to_vec(), t.data().to_vec()) {
            kept.push((name, dt, shape, data));
        }
    }
    let views: Vec<(String, TensorView<'_>)> =
        kept.iter().map(|(n, dt, s, d)| (n.clone(), TensorView::new(*dt, s.clone(), d).unwrap())).collect();
    let out = safetensors::serialize(views, None::<HashMap<String, String>>).unwrap();
    std::fs::write(&p, out).unwrap();
}

fn convert_cmd(src: &Path, out: &Path, cache: &Path) -> std::process::Output {
    moescope(&["convert", src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quant", "q4"], cache)
}

/// Nothing but the untouched inputs in `dir` after a failed conversion.
fn assert_no_output(dir: &Path, out: &Path) {
    assert!(!out.exists(), "{} was left behind", out.display());
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".moe"))
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
}

#[test]
fn unknown_architecture() {
    let (d, ck) = copy_single();
    let cfg = ck.join("config.json");
    let txt = std::fs::read_to_string(&cfg).unwrap().replace("Qwen3MoeForCausalLM", "LlamaForCausalLM");
    std::fs::write(&cfg, txt).unwrap();
    let out = d.path().join("x.moe");
    let o = convert_cmd(&ck, &out, d.path());
    assert_clean_failure(&o, &["config.json", "unsupported architecture", "LlamaForCausalLM"]);
    assert_no_output(d.path(), &out);
}

#[test]
fn missing_config_key_is_named() {
    let (d, ck) = copy_single();
    let cfg = ck.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("num_experts_per_tok");
    std::fs::write(&cfg, v.to_string()).unwrap();
    let out = d.path().join("x.moe");
    assert_clean_failure(&convert_cmd(&ck, &out, d.path()), &["config.json", "num_experts_per_tok"]);
    assert_no_output(d.path(), &out);
}

/// Counts a config states are checked before anything loops over them: past any model's (10^9,
/// 2^40 layers, 10^9 experts: `convert` ran for minutes on the first), and within reason but
/// more than the checkpoint holds (the missing last layer is named). Each fails at once.
#[test]
fn huge_counts_in_config_fail_at_once() {
    for (key, value, needles) in [
        ("num_hidden_layers", 1_000_000_000u64, &["num_hidden_layers", "beyond", "at most 1024"][..]),
        ("num_hidden_layers", 1 << 40, &["num_hidden_layers", "beyond"][..]),
        ("num_experts", 1_000_000_000, &["num_experts", "beyond"][..]),
        ("vocab_size", 1 << 40, &["vocab_size", "beyond"][..]),
        ("num_hidden_layers", 1000, &["missing tensor", "model.layers.999.input_layernorm.weight"][..]),
    ] {
        let (d, ck) = copy_single();
        let cfg = ck.join("config.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v[key] = value.into();
        std::fs::write(&cfg, v.to_string()).unwrap();
        let out = d.path().join("x.moe");
        let t0 = std::time::Instant::now();
        assert_clean_failure(&convert_cmd(&ck, &out, d.path()), needles);
        // a hang shows as minutes; this is not a timing test, the bound only has to catch that
        assert!(t0.elapsed().as_secs() < 60, "{key} = {value}: {:?}", t0.elapsed());
        assert_no_output(d.path(), &out);
    }
}

/// A tokenizer.json cut inside its decoder makes the `tokenizers` crate panic in its own
/// deserializer (found by moescope-replay); the conversion fails with one line naming the file.
#[test]
fn truncated_tokenizer_json_is_a_clean_error() {
    let (d, ck) = copy_single();
    let tok = std::fs::read_to_string(fixture("demo").join("tokenizer.json")).expect("demo tokenizer");
    let tok = serde_json::from_str::<serde_json::Value>(&tok).expect("json").to_string();
    let cut = tok.find("\"decoder\":{").expect("a decoder") + "\"decoder\":{\"type\":\"ByteLevel\",".len();
    std::fs::write(ck.join("tokenizer.json"), &tok[..cut]).unwrap();
    let out = d.path().join("x.moe");
    let o = convert_cmd(&ck, &out, d.path());
    assert_clean_failure(&o, &["tokenizer.json", "cannot load"]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"), "the panic was printed");
    assert_no_output(d.path(), &out);
}

#[test]
fn missing_tensor() {
    let (d, ck) = copy_single();
    let victim = "model.layers.1.self_attn.k_proj.weight";
    rewrite_weights(&ck, |n, dt, s, b| (n != victim).then_some((dt, s, b)));
    let out = d.path().join("x.moe");
    assert_clean_failure(&convert_cmd(&ck, &out, d.path()), &["missing tensor", victim]);
    assert_no_output(d.path(), &out);
}

#[test]
fn missing_expert_tensor() {
    let (d, ck) = copy_single();
    let victim = "model.layers.2.mlp.experts.5.down_proj.weight";
    rewrite_weights(&ck, |n, dt, s, b| (n != victim).then_some((dt, s, b)));
    let out = d.path().join("x.moe");
    assert_clean_failure(&convert_cmd(&ck, &out, d.path()), &["missing tensor", victim]);
    assert_no_output(d.path(), &out);
}

#[test]
fn wrong_shape() {
    let (d, ck) = copy_single();
    let victim = "model.layers.0.self_attn.q_norm.weight";
    rewrite_weights(
        &ck,
        |n, dt, s, b| {
            if n == victim { Some((dt, vec![16], b[..32].to_vec())) } else { Some((dt, s, b)) }
        },
    );
    let out = d.path().join("x.moe");
    assert_clean_failure(&convert_cmd(&ck, &out, d.path()), &[victim, "[16]", "[32]"]);
    assert_no_output(d.path(), &out);
}

#[test]
fn non_finite_weight() {
    let (d, ck) = copy_single();
    // an expert (read late, after the dense tensors were written): the partial file must go
    let victim = "model.layers.2.mlp.experts.7.up_proj.weight";
    rewrite_weights(&ck, |n, dt, s, mut b| {
        if n == victim {
            // row 3, column 5 of a [64, 128] bf16 matrix <- NaN
            let i = (3 * 128 + 5) * 2;
            b[i..i + 2].copy_from_slice(&0x7FC0u16.to_le_bytes());
        }
        Some((dt, s, b))
    });
    let out = d.path().join("x.moe");
    assert_clean_failure(&convert_cmd(&ck, &out, d.path()), &[victim, "non-finite", "row 3", "column 5"]);
    assert_no_output(d.path(), &out);
}

#[test]
fn not_a_model_directory() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("x.moe");
    assert_clean_failure(&convert_cmd(d.path(), &out, d.path()), &["config.json"]);
    let o = moescope(&["run", "-m", d.path().to_str().unwrap(), "--prompt-ids", "1,2"], d.path());
    assert_clean_failure(&o, &["no config.json"]);
}

/// A good q4 package of `single` to damage.
fn package() -> (tempfile::TempDir, PathBuf) {
    convert("single", "q4")
}

fn inspect(p: &Path, cache: &Path) -> std::process::Output {
    moescope(&["inspect", p.to_str().unwrap()], cache)
}

#[test]
fn truncated_package() {
    let (d, p) = package();
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len / 2).unwrap();
    assert_clean_failure(&inspect(&p, d.path()), &["truncated", &len.to_string()]);
    // and cut inside the header
    f.set_len(100).unwrap();
    assert_clean_failure(&inspect(&p, d.path()), &["truncated", "header"]);
}

#[test]
fn wrong_magic() {
    let (d, p) = package();
    let mut b = std::fs::read(&p).unwrap();
    b[..8].copy_from_slice(b"MOEZxxxx");
    std::fs::write(&p, b).unwrap();
    assert_clean_failure(&inspect(&p, d.path()), &["not a moescope package"]);
    // a package whose first bytes say GGUF: inspect and run (which takes GGUF files too) read
    // it as a GGUF file, and say what is wrong with it as one
    let mut b = std::fs::read(&p).unwrap();
    b[..8].copy_from_slice(b"GGUFxxxx");
    std::fs::write(&p, b).unwrap();
    assert_clean_failure(&inspect(&p, d.path()), &["GGUF version", "not supported"]);
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1,2"], d.path());
    assert_clean_failure(&o, &["GGUF version", "not supported"]);
    let junk = d.path().join("junk.moe");
    std::fs::write(&junk, b"hello").unwrap();
    assert_clean_failure(&inspect(&junk, d.path()), &["not a moescope package"]);
}

#[test]
fn future_version() {
    let (d, p) = package();
    let mut b = std::fs::read(&p).unwrap();
    b[8..12].copy_from_slice(&3u32.to_le_bytes());
    std::fs::write(&p, b).unwrap();
    assert_clean_failure(&inspect(&p, d.path()), &["version 3", "not supported"]);
}

fn meta(p: &Path) -> serde_json::Value {
    let o = moescope(&["inspect", "--json", p.to_str().unwrap()], p.parent().unwrap());
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn flipped_byte_in_an_expert_blob() {
    let (d, p) = package();
    let r = Reference::load("single");
    // the expert the first prompt token picks first in layer 0
    let e = r.i64("router_topk_idx")[0] as u64;
    let m = meta(&p);
    let start = m["regions"]["experts"]["offset"].as_u64().unwrap();
    let blob = m["regions"]["experts"]["bytes_per_expert"].as_u64().unwrap();
    let at = start + e * blob + 100;
    let mut b = std::fs::read(&p).unwrap();
    b[at as usize] ^= 0x10;
    std::fs::write(&p, b).unwrap();
    let ids: Vec<String> = r.ids("input_ids").iter().map(|i| i.to_string()).collect();
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", &ids.join(","), "-n", "2"], d.path());
    let off = (start + e * blob).to_string();
    assert_clean_failure(&o, &["checksum mismatch", &format!("layer 0, expert {e}"), &off]);
}

#[test]
fn flipped_byte_in_a_dense_tensor() {
    let (d, p) = package();
    let m = meta(&p);
    let dense = m["regions"]["dense"]["offset"].as_u64().unwrap();
    let mut b = std::fs::read(&p).unwrap();
    b[dense as usize + 10] ^= 1;
    std::fs::write(&p, b).unwrap();
    assert_clean_failure(
        &inspect(&p, d.path()),
        &["checksum mismatch", "model.embed_tokens.weight", &dense.to_string()],
    );
}

#[test]
fn prompt_longer_than_the_context() {
    let (d, p) = package();
    let o = moescope(
        &["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3,4,5,6,7,8,9,10", "--ctx-size", "8"],
        d.path(),
    );
    assert_clean_failure(&o, &["prompt has 10 tokens", "8", "--ctx-size"]);
}

#[test]
fn text_prompt_without_a_tokenizer() {
    let (d, p) = package();
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt", "hello"], d.path());
    assert_clean_failure(&o, &["no tokenizer", "--prompt-ids"]);
}

#[test]
fn token_id_out_of_range() {
    let (d, p) = package();
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1,5000"], d.path());
    assert_clean_failure(&o, &["5000", "out of range", "1024"]);
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1,x"], d.path());
    assert_clean_failure(&o, &["--prompt-ids", "'x'"]);
}

#[test]
fn bad_sampling_arguments() {
    let (d, p) = package();
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1", "--top-p", "0"], d.path());
    assert_clean_failure(&o, &["--top-p"]);
    let o = moescope(&["convert", "x", "-o", "y.moe", "--quant", "q3"], d.path());
    assert_clean_failure(&o, &["q3"]);
}

/// Rewrites a checksummed range of package `p` with `change(bytes)` (the file's bytes) and its
/// checksum to match, the metadata's and the header's, as a tool that rewrites weights would:
/// every checksum passes. `pick(meta)` gives the range's offset, length and checksum.
fn rewrite_range(
    p: &Path,
    pick: impl FnOnce(&serde_json::Value) -> (usize, usize, String),
    change: impl FnOnce(&mut [u8]),
) {
    use moescope::package::layout::{HEADER_SIZE, Header, hex64};
    let mut b = std::fs::read(p).unwrap();
    let (h, meta) = header_and_meta(&b);
    let (mo, ml) = (h.meta_offset as usize, h.meta_len as usize);
    let (off, len, old) = pick(&meta);
    change(&mut b);
    let new = hex64(xxhash_rust::xxh3::xxh3_64(&b[off..off + len]));
    let at = mo + b[mo..mo + ml].windows(16).position(|w| w == old.as_bytes()).unwrap();
    b[at..at + 16].copy_from_slice(new.as_bytes());
    let h2 = Header { meta_xxh3: xxhash_rust::xxh3::xxh3_64(&b[mo..mo + ml]), ..h };
    b[..HEADER_SIZE as usize].copy_from_slice(&h2.encode());
    std::fs::write(p, b).unwrap();
}

/// A package file's header and metadata JSON.
fn header_and_meta(b: &[u8]) -> (moescope::package::layout::Header, serde_json::Value) {
    use moescope::package::layout::{HEADER_SIZE, Header};
    let h = Header::decode(&b[..HEADER_SIZE as usize]).unwrap();
    let meta = serde_json::from_slice(&b[h.meta_offset as usize..(h.meta_offset + h.meta_len) as usize]).unwrap();
    (h, meta)
}

/// Dense tensor `name`'s entry in the package's metadata.
fn tensor(p: &Path, name: &str) -> serde_json::Value {
    let (_, meta) = header_and_meta(&std::fs::read(p).unwrap());
    meta["tensors"].as_array().unwrap().iter().find(|t| t["name"] == name).unwrap().clone()
}

fn rewrite_tensor(p: &Path, name: &str, change: impl FnOnce(&mut [u8])) -> serde_json::Value {
    let t = tensor(p, name);
    let (off, len) = (t["offset"].as_u64().unwrap() as usize, t["length"].as_u64().unwrap() as usize);
    rewrite_range(p, |_| (off, len, t["xxh3"].as_str().unwrap().to_string()), change);
    t
}

/// A package whose checksums all match but whose final norm holds a NaN: refused at load,
/// naming the tensor and offset. Before, the NaN vanished where activations are quantized and
/// the run printed tokens (exit 0). Found by the replay's mutations that rewrite a tensor with
/// its checksum.
#[test]
fn a_nan_weight_behind_matching_checksums_is_refused_at_load() {
    let (d, p) = package();
    let at = tensor(&p, "model.norm.weight")["offset"].as_u64().unwrap();
    // all ones: NaN as bf16 (0xFFFF) and as f32
    rewrite_tensor(&p, "model.norm.weight", |b| b[at as usize..at as usize + 4].fill(0xFF));
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3", "-n", "2"], d.path());
    assert_clean_failure(&o, &["model.norm.weight", "non-finite", &at.to_string()]);
}

/// Finite scales so large that the logits overflow (3e38 for every row of the lm_head): the
/// run fails naming the position, rather than sampling from infinities.
#[test]
fn logits_that_overflow_are_an_error_not_output() {
    let (d, p) = package();
    let t = tensor(&p, "lm_head.weight");
    let s = t["scales_offset"].as_u64().unwrap() as usize;
    let end = (t["offset"].as_u64().unwrap() + t["length"].as_u64().unwrap()) as usize;
    rewrite_tensor(&p, "lm_head.weight", |b| {
        for c in b[s..end].chunks_exact_mut(4) {
            c.copy_from_slice(&3e38f32.to_le_bytes());
        }
    });
    let o = moescope(&["run", "-m", p.to_str().unwrap(), "--prompt-ids", "1,2,3", "-n", "2"], d.path());
    assert_clean_failure(&o, &["logits at position 2", "not finite"]);
}

/// An expert blob whose first scale is NaN behind matching checksums: the request that reads it
/// fails naming the blob, streamed through the pool and read through the mapping alike.
#[test]
fn a_nan_scale_in_an_expert_blob_fails_its_first_read() {
    let r = Reference::load("single");
    let e = r.i64("router_topk_idx")[0] as usize;
    let ids: Vec<String> = r.ids("input_ids").iter().map(|i| i.to_string()).collect();
    for stream in [true, false] {
        let (d, p) = package();
        let at = std::cell::Cell::new(0);
        rewrite_range(
            &p,
            |m| {
                let ex = &m["experts"];
                let (off, sum) = (ex["table"][e][0].as_u64().unwrap(), ex["table"][e][1].as_str().unwrap());
                at.set((off + ex["parts"][0]["scales_offset"].as_u64().unwrap()) as usize);
                (off as usize, ex["blob_len"].as_u64().unwrap() as usize, sum.to_string())
            },
            |b| b[at.get()..at.get() + 4].copy_from_slice(&f32::NAN.to_le_bytes()),
        );
        let at = at.get();
        let ids = ids.join(",");
        let mut args = vec!["run", "-m", p.to_str().unwrap(), "--prompt-ids", &ids, "-n", "2"];
        args.extend(if stream { ["--cache-mb", "0.5"] } else { ["--no-stream", "--prefetch"] });
        if !stream {
            args.push("off");
        }
        let o = moescope(&args, d.path());
        assert_clean_failure(&o, &[&format!("expert blob (layer 0, expert {e})"), "non-finite", &at.to_string()]);
    }
}
