//! What several kernel tests share.

use moescope_kernels::ggml::BlockType;

const PACKED: &[u8] = include_bytes!("../fixtures/ggml_blocks.bin.xz");

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// One type's random blocks from the gguf-py fixture (tests/reference/make_ggml_blocks_fixture.py)
/// with gguf-py's dequantized values as f32 bits.
pub struct FixtureBlocks {
    pub t: BlockType,
    pub blocks: Vec<u8>,
    pub want: Vec<u32>,
}

/// Every type's blocks of the fixture, in its order.
pub fn fixture_blocks() -> Vec<FixtureBlocks> {
    let mut f = vec![];
    lzma_rs::xz_decompress(&mut &PACKED[..], &mut f).expect("the packed fixture unpacks");
    let (mut at, mut out) = (0, vec![]);
    while at < f.len() {
        let (id, n) = (u32_at(&f, at), u32_at(&f, at + 4) as usize);
        at += 8;
        let t = BlockType::from_ggml_id(id).unwrap_or_else(|| panic!("fixture type {id} unknown"));
        let nb = t.bytes_of(n);
        let blocks = f[at..at + nb].to_vec();
        at += nb;
        let want = f[at..at + 4 * n].chunks_exact(4).map(|c| u32_at(c, 0)).collect();
        at += 4 * n;
        out.push(FixtureBlocks { t, blocks, want });
    }
    out
}
