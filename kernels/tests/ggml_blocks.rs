//! The dequantizers against gguf-py 0.19's reference (`gguf.quants.dequantize`) on random
//! blocks of every supported type (fixture: tests/reference/make_ggml_blocks_fixture.py, kept
//! packed with xz as the project's other fixtures are).

mod common;

use moescope_kernels::ggml::{BlockType, dequantize};

#[test]
fn every_type_dequantizes_bit_for_bit_as_gguf_py() {
    let mut seen = vec![];
    for common::FixtureBlocks { t, blocks, want } in common::fixture_blocks() {
        let mut got = vec![0f32; want.len()];
        dequantize(t, &blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), *w, "{}: value {i}: {g} != {}", t.name(), f32::from_bits(*w));
        }
        seen.push(t);
    }
    seen.sort_by_key(|t| t.ggml_id());
    assert_eq!(seen, BlockType::ALL.to_vec(), "the fixture covers every supported type");
}
