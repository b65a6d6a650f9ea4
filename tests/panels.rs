//! A resident copy reordered for the AVX-512 kernels (`Package::make_resident` with `panels`, what
//! the engine does where they run: q4 matrices and experts in lane order, other long rows
//! panel-major) gives the x4 order's logits bit for bit: a prompt's every
//! position and decode steps after it, at every tier (below AVX-512 the rows are gathered one
//! at a time), at 1 to 3 threads with pieces of any size (a thread's piece may start inside a
//! 16-row superblock).
//!
//! The model: GLM-4.5-Air's shape cut to one layer, 8 experts and 256 tokens (~150 MB, made at
//! test time): its o_proj `[4096, 12288]` has rows long enough to be reordered.

use std::sync::Arc;

use moescope::convert::QuantMode;
use moescope::exec::Exec;
use moescope::model::{Decoder, KvCache, Logits, NoObserver, Resident, RunState, Runtime};
use moescope::package::Package;
use moescope::synth::{SynthSpec, shapes, synthesize};
use moescope_kernels::Isa;

/// The logits of the prompt (every position) and of two decode steps after it, as bits.
fn logits(model: &Decoder, exec: &Exec, prompt: &[u32]) -> Vec<u32> {
    let experts = Resident(model.package());
    let mut st = RunState::new(&model.cfg, prompt.len());
    let mut kv = KvCache::new(&model.cfg, prompt.len() + 2);
    let rt = Runtime { exec, experts: &experts };
    let mut out = model.forward(rt, &mut st, &mut kv, prompt, Logits::All, &mut NoObserver).expect("prompt").to_vec();
    for id in [3u32, 5] {
        out.extend_from_slice(model.forward(rt, &mut st, &mut kv, &[id], Logits::Last, &mut NoObserver).expect("step"));
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn panel_major_long_rows_give_the_x4_logits_bit_for_bit() {
    reordered_copy_gives_the_x4_logits("glm-4.5-air");
}

/// Qwen3-30B-A3B's shape cut to one layer of 8 experts: its experts (a MoE first layer, which
/// GLM-4.5-Air's is not) in lane order.
#[test]
fn experts_in_lane_order_give_the_x4_logits_bit_for_bit() {
    reordered_copy_gives_the_x4_logits("qwen3-30b-a3b");
}

fn reordered_copy_gives_the_x4_logits(shape: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("one-layer.moe");
    let spec = SynthSpec {
        shape: shapes::find(shape).expect("shape"),
        layers: Some(1),
        experts: Some(8),
        vocab: Some(256),
        quant: QuantMode::Q4 { max_group: 32 },
        seed: 5,
    };
    synthesize(&spec, &path, false, None).expect("synthesize");
    let load = |panels: bool| {
        let mut p = Package::open(&path).expect("open");
        p.make_resident(true, false, panels).expect("resident");
        p.verify_dense().expect("checksums of the reordered copy's tensors");
        p
    };
    let (x4, pm) = (load(false), load(true));
    assert_eq!(x4.panelled_tensors(), 0);
    // every q4 matrix (groups of 32, rows a multiple of 16) goes to lane order, the experts' too
    assert!(pm.panelled_tensors() > 1, "the attention projections reordered");
    let (x4, pm) = (Decoder::load(Arc::new(x4)).expect("x4"), Decoder::load(Arc::new(pm)).expect("panels"));
    let mut rng = moescope::rng::Rng::new(9);
    let prompt: Vec<u32> = (0..11).map(|_| (rng.next_u64() % 256) as u32).collect();
    for isa in Isa::available() {
        let want = logits(&x4, &Exec::new(1, isa).expect("exec"), &prompt);
        for threads in [1, 2, 3] {
            for least in [64 << 10, 0] {
                let exec = Exec::new(threads, isa).expect("exec").with_min_piece_bytes(least);
                let got = logits(&pm, &exec, &prompt);
                let first = want.iter().zip(&got).position(|(a, b)| a != b);
                assert!(
                    first.is_none() && want.len() == got.len(),
                    "{isa}, {threads} threads, pieces of {least} B: logits differ first at {first:?}"
                );
            }
        }
    }
}
