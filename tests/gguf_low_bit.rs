//! GGUF's low-bit types read with their exact values: Q2_K, Q3_K, IQ4_NL and IQ4_XS, and the
//! codebook types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (the dequantizers
//! themselves are held to gguf-py bit for bit by kernels/tests/ggml_blocks.rs). The tiny
//! Qwen3-MoE's Q8_0 file is written back (test time, `moescope::derived_gguf`) with each
//! quantized tensor as random blocks of one of a mix's types in turn, so types mix per tensor
//! and per layer as the "dynamic" quants people download do (an expert's gate, up and down each
//! in its own type). Converted with the file's types kept, every weight equals the file's value,
//! and the model runs: the prompt's last row equals that token decoded through the cache, and
//! experts streamed through a pool of three equal the resident run bit for bit.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use moescope::convert::{ConvertOptions, QuantMode, convert_gguf};
use moescope::derived_gguf::{CODEBOOK_TYPES, LOW_BIT_TYPES};
use moescope::engine::{Engine, EngineOptions};
use moescope::experts::{IoMode, StreamConfig};
use moescope::model::{Logits, NoObserver};
use moescope_kernels::Isa;
use moescope_kernels::ggml::BlockType;

/// The low-bit mix's file converted with its types kept: (the GGUF, the package), in `dir`.
fn mixed_package(dir: &Path) -> (PathBuf, PathBuf) {
    let gguf = mixed_file(dir, &LOW_BIT_TYPES);
    let pkg = dir.join("mixed.moe");
    convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
    (gguf, pkg)
}

/// The Q8_0 fixture with its quantized tensors re-typed in turn by `types`, in `dir`.
fn mixed_file(dir: &Path, types: &[BlockType]) -> PathBuf {
    let path = dir.join("tiny-mixed.gguf");
    let k = moescope::derived_gguf::low_bit_mix(&fixture("gguf/tiny/tiny-q8_0.gguf"), &path, types).expect("derive");
    assert!(k >= 2 * types.len(), "every type on at least two tensors ({k} re-typed)");
    path
}

#[test]
fn a_file_mixing_the_low_bit_types_converts_exactly_and_runs_streamed_as_resident() {
    // what inspect says each type runs as (the file's blocks, computed as the q8 matrix of
    // their codes: groups of the sub-blocks; "" for Q2_K's, Q3_K's and IQ4_XS's integer block
    // sums)
    let q2 = [("Q2_K", ""), ("Q3_K", ""), ("IQ4_NL", "q8, group 32")];
    let iq = [("IQ2_XXS", "q8, group 32"), ("IQ2_XS", "q8, group 16"), ("IQ2_S", "q8, group 16")];
    let iq3 = [("IQ3_XXS", "q8, group 32"), ("IQ3_S", "q8, group 32"), ("IQ1_S", "q8, group 32")];
    let runs_as: Vec<(&str, &str)> = q2.into_iter().chain([("IQ4_XS", "")]).collect();
    let codebook: Vec<(&str, &str)> = iq.into_iter().chain(iq3).chain([("IQ1_M", "q8, group 16")]).collect();
    mix_converts_exactly_and_runs(&LOW_BIT_TYPES, &runs_as);
    mix_converts_exactly_and_runs(&CODEBOOK_TYPES, &codebook);
}

fn mix_converts_exactly_and_runs(types: &[BlockType], runs_as: &[(&str, &str)]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = mixed_file(dir.path(), types);
    let o = moescope(&["inspect", gguf.to_str().unwrap(), "--json"], dir.path());
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("json");
    let runs = |t: &str| j["by_type"][t]["runs_as"].as_str().map(String::from);
    assert_eq!(runs_as.len(), types.len());
    for (t, want) in runs_as {
        // Q2_K, Q3_K and IQ4_XS: integer sums per block, as ggml computes them
        let want = match *want {
            "" => "its own blocks (integer sums a block, activations quantized per 256)".to_string(),
            _ => format!("its own blocks (computed as {want})"),
        };
        assert_eq!(runs(t).as_deref(), Some(&want[..]), "{t}");
        // the package holds each type at the file's own bytes
        let ty = &j["by_type"][t];
        assert!(ty["bytes"].as_u64().is_some() && ty["package_bytes"] == ty["bytes"], "{t}: {ty}");
    }

    let pkg = dir.path().join("mixed.moe");
    convert_gguf(&gguf, &pkg, ConvertOptions::new(QuantMode::File)).expect("convert");
    assert_package_holds_gguf_values(&gguf, &pkg);

    let ids: Vec<u32> = Reference::load("gguf/tiny").ids("ids");
    let run = |stream: Option<StreamConfig>, isa: Isa| {
        let opts = EngineOptions {
            threads: 2,
            ctx_size: Some(64),
            isa,
            stream,
            panels: true,
            kv: moescope::model::KvTypes::F32,
        };
        let mut eng = Engine::load(&pkg, opts).expect("load");
        let all = eng.eval(&ids, Logits::All, &mut NoObserver).expect("prefill").to_vec();
        eng.reset();
        eng.eval(&ids[..ids.len() - 1], Logits::Last, &mut NoObserver).expect("prefill");
        let last = eng.eval(&ids[ids.len() - 1..], Logits::Last, &mut NoObserver).expect("decode").to_vec();
        (all, last)
    };
    let mut resident = None;
    for isa in Isa::available() {
        let (all, last) = run(None, isa);
        assert!(all.iter().all(|x| x.is_finite()), "{isa}: logits not finite");
        let v = last.len();
        let d = max_abs_diff(&last, &all[all.len() - v..]);
        assert!(d <= 1e-4, "{isa}: decode differs from the prompt's last row by {d}");
        if isa == Isa::detect() {
            resident = Some(all);
        }
    }
    let resident = resident.expect("the detected tier is among the available ones");
    let blob = moescope::package::Package::open(&pkg).expect("open").sizes().blob;
    let small = StreamConfig { budget_bytes: Some(3 * blob), io: Some(IoMode::Direct), ..StreamConfig::default() };
    let streamed = run(Some(small), Isa::detect()).0;
    assert!(resident.iter().zip(&streamed).all(|(a, b)| a.to_bits() == b.to_bits()), "streamed logits differ");
}

#[test]
fn a_block_with_an_infinite_scale_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = mixed_file(dir.path(), &LOW_BIT_TYPES);
    // the first Q2_K tensor's third block gets d = +inf (f16 0x7C00 at byte 80 of 84)
    let g = moescope::convert::gguf::open(&gguf).expect("open");
    let t = g.tensors.iter().find(|t| t.ty.name == "Q2_K").expect("a Q2_K tensor");
    let mut bytes = std::fs::read(&gguf).expect("read");
    let at = (t.offset + 2 * 84 + 80) as usize;
    bytes[at..at + 2].copy_from_slice(&0x7C00u16.to_le_bytes());
    std::fs::write(&gguf, &bytes).expect("write");
    let e = convert_gguf(&gguf, &dir.path().join("x.moe"), ConvertOptions::new(QuantMode::File)).expect_err("refused");
    let msg = e.to_string();
    let per_row = t.ne[0] as usize / 256;
    let want = format!("non-finite scale in block {} of row {}", 2 % per_row, 2 / per_row);
    assert!(msg.contains(&t.name) && msg.contains(&want), "{msg}");
    assert!(!dir.path().join("x.moe").exists(), "no half-written package");
}

#[test]
fn each_layers_experts_are_read_at_their_own_length() {
    // the mix gives each expert tensor the next type in turn, so the two layers' experts differ
    // in bytes: each layer's blobs get a length of their own, a miss reads the file's bytes of
    // that expert (its three tensors' share) plus padding to a page, never the longest layer's
    let dir = tempfile::tempdir().expect("tempdir");
    let (gguf, pkg) = mixed_package(dir.path());
    let g = moescope::convert::gguf::open(&gguf).expect("open");
    let p = moescope::package::Package::open(&pkg).expect("open");
    let ex = p.meta.experts.as_ref().expect("experts");
    let mut lens = vec![];
    for (i, &l) in ex.layers.iter().enumerate() {
        let file: u64 = ["gate", "up", "down"]
            .iter()
            .map(|w| g.tensors.iter().find(|t| t.name == format!("blk.{l}.ffn_{w}_exps.weight")).expect("tensor").bytes)
            .sum::<u64>()
            / ex.num_experts as u64;
        let len = ex.len_of(i);
        // three parts, each 64-byte aligned, then the page
        assert!(len >= file && len < (file + 3 * 64).next_multiple_of(4096) + 1, "layer {l}: {len} bytes for {file}");
        lens.push(len);
    }
    assert!(lens.iter().any(|&l| l < ex.blob_len), "the layers' lengths differ: {lens:?}");
    assert_eq!(p.sizes().experts, lens.iter().sum::<u64>() * ex.num_experts as u64, "the region is their sum");

    // streamed through a pool of three of the longest, prefetch off: each layer's demand reads
    // are its misses times its own length
    let ids: Vec<u32> = Reference::load("gguf/tiny").ids("ids");
    let stream = StreamConfig {
        budget_bytes: Some(3 * ex.blob_len),
        io: Some(IoMode::Direct),
        prefetch: false,
        ..StreamConfig::default()
    };
    let opts = EngineOptions {
        threads: 2,
        ctx_size: Some(64),
        isa: Isa::detect(),
        stream: Some(stream),
        panels: true,
        kv: moescope::model::KvTypes::F32,
    };
    // counts what the store's reads return from the file
    let reads = moescope::experts::faults::inject(&pkg);
    let mut eng = Engine::load(&pkg, opts).expect("load");
    eng.eval(&ids, Logits::Last, &mut NoObserver).expect("prefill");
    let stats = eng.pool().expect("streamed").stats();
    for (i, s) in stats.iter().enumerate() {
        assert!(s.misses > 0, "layer {i} read nothing");
        assert_eq!(s.bytes_demand, s.misses * lens[i], "layer {i}: {} misses", s.misses);
    }
    assert_eq!(reads.bytes(), stats.iter().map(|s| s.bytes_demand).sum::<u64>(), "bytes read from the file");
}

/// The package at `p` with its metadata JSON changed by `change` and its header's version set to
/// `version`, every checksum made to match.
fn rewrite_meta(p: &Path, version: u32, change: impl FnOnce(&mut serde_json::Value)) {
    use moescope::package::layout::{HEADER_SIZE, Header};
    let mut b = std::fs::read(p).expect("read");
    let h = Header::decode(&b[..HEADER_SIZE as usize]).expect("header");
    let (mo, ml) = (h.meta_offset as usize, h.meta_len as usize);
    let mut meta: serde_json::Value = serde_json::from_slice(&b[mo..mo + ml]).expect("meta");
    change(&mut meta);
    meta["version"] = version.into();
    let mut json = serde_json::to_vec(&meta).expect("json");
    assert!(json.len() <= ml, "the changed metadata fits its room");
    json.resize(ml, b' ');
    b[mo..mo + ml].copy_from_slice(&json);
    let h2 = Header { version, meta_xxh3: xxhash_rust::xxh3::xxh3_64(&json), ..h };
    b[..HEADER_SIZE as usize].copy_from_slice(&h2.encode());
    std::fs::write(p, b).expect("write");
}

#[test]
fn layer_lengths_that_do_not_fit_the_table_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, pkg) = mixed_package(dir.path());
    let bad = |version: u32, change: &dyn Fn(&mut serde_json::Value), want: &str| {
        let p = dir.path().join("bad.moe");
        std::fs::copy(&pkg, &p).expect("copy");
        rewrite_meta(&p, version, |m| change(&mut m["experts"]));
        let e = moescope::package::Package::open(&p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("expert table") && e.contains(want), "{want}: {e}");
    };
    let first = |m: &serde_json::Value| m["layer_lens"][0].as_u64().expect("layer lengths");
    // a length not a whole page, none the longest, lengths in a version 1 package, a count
    // that is not the layers'
    bad(2, &|m| m["layer_lens"][0] = (first(m) - 1).into(), "not a positive multiple of 4096");
    bad(2, &|m| m["blob_len"] = (m["blob_len"].as_u64().unwrap_or(0) + 4096).into(), "is not the blob length");
    bad(1, &|_| {}, "in a version 1 package");
    bad(2, &|m| m["layer_lens"] = serde_json::json!([first(m)]), "1 layer lengths for 2 layers");
    // and the package itself opens
    moescope::package::Package::open(&pkg).expect("the package as written opens");
}

/// The load-time check of the dense weights' scales reads the resident copy the engine computes
/// with, not the file's pages through the mapping (which it brought into memory beside the copy:
/// a blocks tensor has an f16 scale in every block, so every page of it; 0.5 GB of a Q2_K
/// Qwen3-30B-A3B's 0.76 GB dense region, counted in the process's resident size). Shown by
/// writing a NaN scale into the file after the copy was made: the copy's check passes.
#[test]
fn the_dense_check_reads_the_resident_copy() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, pkg) = mixed_package(dir.path());
    let mut p = moescope::package::Package::open(&pkg).expect("open");
    let t = p.meta.tensors.iter().find(|t| t.layout.ends_with("+ggml_q2_k")).expect("a dense Q2_K tensor").clone();
    p.make_resident(false, false, false).expect("resident copy");
    // the first block's d (bytes 80..82 of 84) as f16 NaN, in the file under the mapping
    let f = std::fs::OpenOptions::new().write(true).open(&pkg).expect("open for writing");
    f.write_all_at(&0x7E00u16.to_le_bytes(), t.offset + 80).expect("write");
    p.verify_dense().expect("the copy holds the converted, finite scales");
    // and a fresh open, which checks the file, refuses it by name
    drop(p);
    let e = moescope::package::Package::open(&pkg).and_then(|mut p| {
        p.make_resident(false, false, false)?;
        p.verify_dense()
    });
    assert!(e.err().map(|e| e.to_string()).unwrap_or_default().contains(&t.name), "the NaN is found in a fresh copy");
}
