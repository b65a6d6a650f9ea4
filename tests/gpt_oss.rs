//! gpt-oss's checkpoint layout: the experts transposed and their gate and up interleaved by
//! column. The package's expert matrices, read back, are the ones transformers holds after
//! loading the checkpoint (its `dequant_*` tensors of layer 0), value for value. (Its logits
//! against transformers' are in reference_logits.rs, its streaming in streaming.rs.)

mod common;

use common::*;
use moescope::package::Package;

#[test]
fn expert_matrices_are_transformers_own_values() {
    let r = Reference::load("gpt-oss");
    let (gu, down) = (r.f32("dequant_gate_up"), r.f32("dequant_down"));
    // [E, H, 2I] and [E, I, H]
    let [e_n, h, two_i] = r.shape("dequant_gate_up")[..] else { panic!("gate_up shape") };
    let i = two_i / 2;
    let (_d, path) = convert("gpt-oss", "bf16");
    let pkg = Package::open(&path).expect("package");
    let (mut row_h, mut row_i) = (vec![0f32; h], vec![0f32; i]);
    for e in 0..e_n {
        let m = pkg.expert(0, e).expect("expert");
        for j in 0..i {
            m.gate.dequant_row(j, &mut row_h);
            let want: Vec<f32> = (0..h).map(|c| gu[(e * h + c) * two_i + 2 * j]).collect();
            assert_eq!(row_h, want, "expert {e} gate row {j}");
            m.up.dequant_row(j, &mut row_h);
            let want: Vec<f32> = (0..h).map(|c| gu[(e * h + c) * two_i + 2 * j + 1]).collect();
            assert_eq!(row_h, want, "expert {e} up row {j}");
        }
        for o in 0..h {
            m.down.dequant_row(o, &mut row_i);
            let want: Vec<f32> = (0..i).map(|j| down[(e * i + j) * h + o]).collect();
            assert_eq!(row_i, want, "expert {e} down row {o}");
        }
    }
}
