//! `convert --quant q4_k | q2_k | iq4_xs` of a HuggingFace checkpoint: the demo's (hidden 256,
//! so its attention and its experts' gate and up rows are whole 256-value super-blocks; the
//! experts' down rows of 64 take q4 group 32). Every block-quantized tensor holds exactly the
//! blocks the kernels' quantizer makes of the checkpoint's rows (a quantizer held to ggml's own
//! in kernels/tests/ggml_quant.rs), at the GGUF type's bytes a weight, the requantization report
//! is printed, and the model's logits stay within the q4 bounds of transformers' on the
//! checkpoint (tests/reference_logits.rs's; Q2_K within bounds measured for it, below).

mod common;

use common::*;
use moescope::convert::safetensors::HfCheckpoint;
use moescope::convert::source::TensorSource;
use moescope::engine::{Engine, EngineOptions};
use moescope::model::{Logits, NoObserver};
use moescope::package::Package;
use moescope::package::layout::ScaleForm;
use moescope_kernels::ggml::{BlockType, dequantize};
use moescope_kernels::ggml_quant::quantize_row;

/// Logits bounds as tests/reference_logits.rs states them: (max |dlogit| in sigma, mean KL in
/// sigma^2, least top-1 agreement). Q4_K and IQ4_XS take its q4 bounds (measured 1.00 and 1.28
/// sigma, 7.3e-3 and 7.6e-3 sigma^2, 0.85 and 0.81); Q2_K, 2.6 bits a weight, measured 1.96
/// sigma, 6.3e-2 sigma^2, 0.44 (perplexity 26.5 on the held-out text against bf16's 22.1;
/// llama.cpp's own Q2_K of the same checkpoint 26.6): 1.6x headroom on the error and KL, as there.
fn bounds(t: BlockType) -> (f64, f64, f64) {
    match t {
        BlockType::Q2K => (3.2, 0.1, 0.3),
        _ => (2.5, 7e-2, 0.35),
    }
}

#[test]
fn a_checkpoint_quantized_into_ggml_blocks_holds_the_quantizers_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck_dir = fixture("demo");
    let ck = HfCheckpoint::open(&ck_dir).expect("checkpoint");
    let r = Reference::load("demo");
    let ids = r.ids("input_ids");
    let want = r.f32("logits");
    for (mode, t, bits) in
        [("q4_k", BlockType::Q4K, 4.5), ("q2_k", BlockType::Q2K, 2.625), ("iq4_xs", BlockType::Iq4Xs, 4.25)]
    {
        let pkg = dir.path().join(format!("{mode}.moe"));
        let o =
            moescope(&["convert", ck_dir.to_str().unwrap(), "-o", pkg.to_str().unwrap(), "--quant", mode], dir.path());
        assert!(o.status.success(), "{mode}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("quantized from the checkpoint's values: relative RMS weight error"),
            "{}",
            stderr(&o)
        );

        let p = Package::open(&pkg).expect("open");
        let mut checked = 0;
        let (mut x, mut blocks) = (vec![], vec![]);
        let mut check = |name: &str, m: moescope_kernels::Mat<'_>| {
            let (mut got, mut back) = (vec![0f32; m.cols], vec![0f32; m.cols]);
            for row in 0..m.rows {
                ck.read_rows(name, row, 1, &mut x).expect("rows");
                blocks.clear();
                quantize_row(t, &x, &mut blocks);
                dequantize(t, &blocks, &mut back);
                m.dequant_row(row, &mut got);
                assert!(got.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()), "{mode}: {name} row {row}");
            }
            checked += 1;
        };
        for e in &p.meta.tensors {
            let blocks_form = matches!(e.scale_form(), ScaleForm::Blocks(_));
            // the attention's rows (256 values) are blocks; the embedding stays q8
            assert_eq!(
                blocks_form,
                e.name.contains("self_attn.") && e.name.ends_with("proj.weight"),
                "{mode}: {}",
                e.name
            );
            if blocks_form {
                check(&e.name, p.mat_by_index(p.require(&e.name, &e.shape, false).expect("tensor")));
            }
        }
        let cfg = p.meta.model.clone();
        for l in cfg.moe_layers() {
            let m = p.expert(l, 3).expect("expert");
            check(&format!("model.layers.{l}.mlp.experts.3.gate_proj.weight"), m.gate);
            check(&format!("model.layers.{l}.mlp.experts.3.up_proj.weight"), m.up);
        }
        assert_eq!(checked, 4 * cfg.num_hidden_layers + 2 * cfg.moe_layers().len(), "{mode}");

        // the bits a weight the type's blocks take
        let j: serde_json::Value =
            serde_json::from_str(&stdout(&moescope(&["inspect", pkg.to_str().unwrap(), "--json"], dir.path())))
                .expect("inspect json");
        assert_eq!(
            j["dense_by_type"][t.name()]["bits_per_weight"].as_f64(),
            Some(bits),
            "{mode}: {}",
            j["dense_by_type"]
        );

        let opts = EngineOptions {
            threads: 2,
            ctx_size: Some(64),
            isa: moescope_kernels::Isa::detect(),
            stream: None,
            panels: true,
            kv: moescope::model::KvTypes::F32,
        };
        let mut eng = Engine::load(&pkg, opts).expect("load");
        let got = eng.eval(&ids, Logits::All, &mut NoObserver).expect("prefill").to_vec();
        check_logits(mode, &got, &want, want.len() / ids.len(), Some(bounds(t)));
    }
}

/// `synth` draws its weights in moescope's own formats: a GGUF block mode is refused by name
/// before anything is written (it had written a q4g32 package labelled with the mode).
#[test]
fn synth_refuses_the_block_modes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("x.moe");
    for mode in ["q4_k", "q2_k", "iq4_xs"] {
        let args = [
            "synth",
            "--shape",
            "qwen3-30b-a3b",
            "--layers",
            "1",
            "--experts",
            "8",
            "--vocab",
            "64",
            "-o",
            out.to_str().unwrap(),
        ];
        let o = moescope(&[&args[..], &["--quant", mode]].concat(), dir.path());
        assert_clean_failure(&o, &[mode, "convert a checkpoint or GGUF file"]);
        assert!(!out.exists(), "{mode}: nothing written");
    }
}
