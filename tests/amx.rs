//! The AMX tier (int8 tiles for prompts' q4 products, where the kernel grants the tile state)
//! gives the AVX-512 VNNI tier's logits bit for bit: each group's integer sums are exact either
//! way and the float steps after them are the same, in the same order.
//!
//! The model: Qwen3-30B-A3B's shape cut to one layer of 8 experts, every token routed to all 8
//! (top-8), so each expert's products take the whole 40-token prompt: tiles of 16 tokens, two a
//! pass, and a short one. Groups of 32 (`q4g32`, GGUF Q4_0's) and the default q4 (groups of 128).

use std::sync::Arc;

use moescope::convert::QuantMode;
use moescope::exec::Exec;
use moescope::model::{Decoder, KvCache, Logits, NoObserver, Resident, RunState, Runtime};
use moescope::package::Package;
use moescope::synth::{SynthSpec, shapes, synthesize};
use moescope_kernels::Isa;

/// The logits of every position of `prompt` in one pass, as bits.
fn prompt_logits(model: &Decoder, exec: &Exec, prompt: &[u32]) -> Vec<u32> {
    let experts = Resident(model.package());
    let mut st = RunState::new(&model.cfg, prompt.len());
    let mut kv = KvCache::new(&model.cfg, prompt.len());
    let rt = Runtime { exec, experts: &experts };
    let out = model.forward(rt, &mut st, &mut kv, prompt, Logits::All, &mut NoObserver).expect("prompt");
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_amx_tier_gives_the_vnni_tiers_logits_bit_for_bit() {
    if !Isa::available().contains(&Isa::Amx) {
        eprintln!("not run: AMX tiles are not granted on this machine (moescope_kernels::amx::granted)");
        return;
    }
    for max_group in [32, 128] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("one-layer.moe");
        let spec = SynthSpec {
            shape: shapes::find("qwen3-30b-a3b").expect("shape"),
            layers: Some(1),
            experts: Some(8),
            vocab: Some(256),
            quant: QuantMode::Q4 { max_group },
            seed: 11,
        };
        synthesize(&spec, &path, false, None).expect("synthesize");
        let mut p = Package::open(&path).expect("open");
        // lane order (resident, reordered) as the engine runs it where AVX-512 is
        p.make_resident(true, false, true).expect("resident");
        let model = Decoder::load(Arc::new(p)).expect("load");
        let mut rng = moescope::rng::Rng::new(3);
        let prompt: Vec<u32> = (0..40).map(|_| (rng.next_u64() % 256) as u32).collect();
        let want = prompt_logits(&model, &Exec::new(1, Isa::Avx512).expect("exec"), &prompt);
        for threads in [1, 2, 3] {
            let got = prompt_logits(&model, &Exec::new(threads, Isa::Amx).expect("exec"), &prompt);
            let first = want.iter().zip(&got).position(|(a, b)| a != b);
            assert!(
                first.is_none() && want.len() == got.len(),
                "groups of {max_group}, {threads} threads: AMX logits differ from VNNI's first at {first:?}"
            );
        }
    }
}
