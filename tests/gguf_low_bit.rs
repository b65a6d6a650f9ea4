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
        let opts = EngineOptions { threads: 2, ctx_size: Some(64), isa, stream, panels: true };
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
