//! The dequantizers against gguf-py 0.19's reference (`gguf.quants.dequantize`) on random
//! blocks of every supported type (fixture: tests/reference/make_ggml_blocks_fixture.py, kept
//! packed with xz as the project's other fixtures are).

use moescope_kernels::ggml::{BlockType, dequantize};

const PACKED: &[u8] = include_bytes!("fixtures/ggml_blocks.bin.xz");

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

#[test]
fn every_type_dequantizes_bit_for_bit_as_gguf_py() {
    let mut fixture = vec![];
    lzma_rs::xz_decompress(&mut &PACKED[..], &mut fixture).expect("the packed fixture unpacks");
    let fixture = &fixture[..];
    let mut at = 0;
    let mut seen = vec![];
    while at < fixture.len() {
        let (id, n) = (u32_at(fixture, at) as u32, u32_at(fixture, at + 4));
        at += 8;
        let t = BlockType::from_ggml_id(id).unwrap_or_else(|| panic!("fixture type {id} unknown"));
        let nb = t.bytes_of(n);
        let blocks = &fixture[at..at + nb];
        at += nb;
        let want: Vec<u32> = fixture[at..at + 4 * n].chunks_exact(4).map(|c| u32_at(c, 0) as u32).collect();
        at += 4 * n;
        let mut got = vec![0f32; n];
        dequantize(t, blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), *w, "{}: value {i}: {g} != {}", t.name(), f32::from_bits(*w));
        }
        seen.push(t);
    }
    seen.sort_by_key(|t| t.ggml_id());
    assert_eq!(seen, BlockType::ALL.to_vec(), "the fixture covers every supported type");
}
