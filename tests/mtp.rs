//! Multi-token-prediction layers kept in the package and not run (DeepSeek-V3's and GLM-4.5's
//! `num_nextn_predict_layers`): each fixture with its MTP layer added (`common::with_mtp_layer`)
//! converts into a package whose MTP section holds each of the layer's tensors with the
//! checkpoint's values (bf16: exactly), DeepSeek's `kv_b_proj` split as the main layers' is, and
//! whose model (dense tensors, expert blobs, logits) is the plain fixture's bit for bit.

mod common;

use std::collections::BTreeMap;

use common::{convert, with_mtp_layer};
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{Logits, NoObserver};
use moescope::package::Package;
use safetensors::SafeTensors;

/// The checkpoint's bf16 tensors as f32, by name.
fn checkpoint(dir: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(std::path::Path::new(dir).join("model.safetensors")).expect("model.safetensors");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let v =
                t.data().chunks(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)).collect();
            (name, (t.shape().to_vec(), v))
        })
        .collect()
}

/// Every value of MTP tensor `name`, row-major, as the package holds it.
fn values(pkg: &Package, name: &str) -> Vec<f32> {
    let m = pkg.mtp_tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (rows, cols) = pkg.meta.mtp.as_ref().unwrap().tensors.iter().find(|t| t.name == name).unwrap().rows_cols();
    let mut out = vec![0.0; rows * cols];
    for (r, row) in out.chunks_mut(cols).enumerate() {
        m.dequant_row(r, row);
    }
    out
}

fn logits(pkg: &std::path::Path, ids: &[u32]) -> Vec<f32> {
    let isa = moescope_kernels::Isa::detect();
    let opts = EngineOptions {
        threads: 2,
        ctx_size: Some(ids.len().next_multiple_of(64)),
        isa,
        stream: None,
        panels: true,
        kv: moescope::model::KvTypes::F32,
    };
    let mut eng = Engine::load(pkg, opts).expect("load");
    eng.eval(ids, Logits::All, &mut NoObserver).expect("prefill").to_vec()
}

#[test]
fn deepseeks_mtp_layer_is_kept_with_the_checkpoints_values_and_not_run() {
    kept_and_not_run("deepseek");
}

#[test]
fn glms_mtp_layer_is_kept_with_the_checkpoints_values_and_not_run() {
    kept_and_not_run("glm");
}

fn kept_and_not_run(fixture: &str) {
    let dir = with_mtp_layer(fixture);
    let src = checkpoint(&dir);
    let (_t1, with) = convert(&dir, "bf16");
    let (_t2, plain) = convert(fixture, "bf16");
    let (pkg, base) = (Package::open(&with).expect("open"), Package::open(&plain).expect("open"));
    let mtp = pkg.meta.mtp.as_ref().expect("an MTP section");
    assert_eq!(mtp.layers, [3]);
    assert!(base.meta.mtp.is_none());

    // the section's names: the checkpoint's layer-3 tensors but the two copies of the model's
    // embedding and output layer, DeepSeek's kv_b_proj as its two absorbed halves
    let mla = fixture == "deepseek";
    let mut want: Vec<String> = src
        .keys()
        .filter_map(|n| n.strip_prefix("model.layers.3."))
        .filter(|r| !matches!(*r, "embed_tokens.weight" | "shared_head.head.weight" | "self_attn.kv_b_proj.weight"))
        .map(|r| format!("model.layers.3.{r}"))
        .chain(
            ["k_b_proj", "v_b_proj"]
                .map(|h| format!("model.layers.3.self_attn.{h}.weight"))
                .into_iter()
                .filter(|_| mla),
        )
        .collect();
    let mut have: Vec<String> = mtp.tensors.iter().map(|t| t.name.clone()).collect();
    want.sort();
    have.sort();
    assert_eq!(have, want);
    assert!(have.len() > 40, "{} tensors", have.len());
    for copy in ["embed_tokens", "shared_head.head"] {
        assert!(pkg.meta.ignored.iter().any(|i| i.contains(&format!("model.layers.3.{copy}.weight"))), "{copy}");
    }

    // values: the checkpoint's exactly
    for name in &have {
        if let Some((_, v)) = src.get(name) {
            assert_eq!(&values(&pkg, name), v, "{name}");
        }
    }
    if mla {
        absorbed_halves_are_kv_b_projs(&pkg, &src["model.layers.3.self_attn.kv_b_proj.weight"].1);
    }

    // the model itself is the plain fixture's: dense tensors, expert blobs, logits
    let sums = |p: &Package| -> Vec<(String, Option<String>)> {
        p.meta.tensors.iter().map(|t| (t.name.clone(), t.xxh3.clone())).collect()
    };
    assert_eq!(sums(&pkg), sums(&base));
    let blobs =
        |p: &Package| p.meta.experts.as_ref().map(|e| e.table.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>());
    assert_eq!(blobs(&pkg), blobs(&base));
    let ids = common::Reference::load(&dir).ids("input_ids");
    assert_eq!(logits(&with, &ids), logits(&plain, &ids));
}

/// `k_b_proj` row `h r + c` is column c of head h's key rows of `kv_b_proj`, `v_b_proj` head
/// h's value rows (the fixture's shape: 4 heads, kv_lora 32, nope 16, v 24).
fn absorbed_halves_are_kv_b_projs(pkg: &Package, kv_b: &[f32]) {
    let (nh, r, nope, vd) = (4, 32, 16, 24);
    let (k_b, v_b) = (
        values(pkg, "model.layers.3.self_attn.k_b_proj.weight"),
        values(pkg, "model.layers.3.self_attn.v_b_proj.weight"),
    );
    for h in 0..nh {
        for c in 0..r {
            for d in 0..nope {
                assert_eq!(k_b[(h * r + c) * nope + d], kv_b[(h * (nope + vd) + d) * r + c], "k_b head {h} ({c}, {d})");
            }
        }
        for j in 0..vd {
            let row = &kv_b[(h * (nope + vd) + nope + j) * r..][..r];
            assert_eq!(&v_b[(h * vd + j) * r..][..r], row, "v_b head {h} row {j}");
        }
    }
}

#[test]
fn a_damaged_mtp_tensor_is_named_when_read() {
    let (_t, with) = convert(&with_mtp_layer("deepseek"), "q8");
    let name = "model.layers.3.eh_proj.weight";
    let at = {
        let pkg = Package::open(&with).expect("open");
        assert!(pkg.mtp_tensor(name).is_ok());
        pkg.meta.mtp.as_ref().unwrap().tensors.iter().find(|t| t.name == name).unwrap().offset
    };
    let mut bytes = std::fs::read(&with).unwrap();
    bytes[at as usize] ^= 0x55;
    std::fs::write(&with, bytes).unwrap();
    // the package still opens (the section is not read to run) and the tensor's read fails
    let pkg = Package::open(&with).expect("open");
    let Err(e) = pkg.mtp_tensor(name) else { panic!("a damaged tensor read") };
    let e = e.to_string();
    assert!(e.contains(name) && e.contains("checksum"), "{e}");
}

/// GLM's Q8_0 GGUF (tests/fixtures/gguf/glm: llama.cpp's converter on the GLM fixture with its
/// MTP layer, `blk.3.*` with `nextn.*`) keeps the same MTP tensors as the checkpoint's package,
/// the file's Q8_0 values within their rounding (a 32-value block's scale d is its largest value
/// / 127, stored as f16: half a step, plus 127 times the f16 rounding of d, 2^-11 d; bounded here
/// with the row's largest value), the norms exact.
#[test]
fn the_ggufs_mtp_layer_is_the_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let from_gguf = dir.path().join("g.moe");
    let opts = moescope::convert::ConvertOptions::new(moescope::convert::QuantMode::File);
    moescope::convert::convert_gguf(&common::fixture("gguf/glm/glm-q8_0.gguf"), &from_gguf, opts).expect("convert");
    let (_t, from_hf) = convert(&with_mtp_layer("glm"), "bf16");
    let (g, h) = (Package::open(&from_gguf).expect("open"), Package::open(&from_hf).expect("open"));
    let names = |p: &Package| {
        let mut v: Vec<String> =
            p.meta.mtp.as_ref().expect("MTP section").tensors.iter().map(|t| t.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&g), names(&h));
    for copy in ["embed_tokens", "shared_head_head"] {
        assert!(g.meta.ignored.iter().any(|i| i.contains(&format!("blk.3.nextn.{copy}.weight"))), "{copy}");
    }
    for name in names(&h) {
        let cols = h.meta.mtp.as_ref().unwrap().tensors.iter().find(|t| t.name == name).unwrap().rows_cols().1;
        let (a, b) = (values(&g, &name), values(&h, &name));
        for (r, (ra, rb)) in a.chunks(cols).zip(b.chunks(cols)).enumerate() {
            let d = rb.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            let bound = d * (0.5 + 127.0 / 2048.0);
            let worst = ra.iter().zip(rb).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst <= bound, "{name} row {r}: {worst} > {bound}");
        }
    }
}
