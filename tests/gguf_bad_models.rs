//! GGUF files that read as GGUF but do not make a model moescope runs: each gives one clear
//! error naming the key, tensor or file, exits 1, and leaves no package behind (the file-level
//! damage, truncation, magic, version, counts, offsets, is tests/gguf_reader.rs's).

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A copy of the tiny Q8_0 fixture with the bytes `from` (which must occur once) replaced by
/// `to` (of the same length).
fn patched(dir: &Path, from: &[u8], to: &[u8]) -> PathBuf {
    patched_file(dir, "gguf/tiny/tiny-q8_0.gguf", from, to)
}

/// A copy of the GGUF fixture `file` with the bytes `from` (which must occur once) replaced by
/// `to` (of the same length).
fn patched_file(dir: &Path, file: &str, from: &[u8], to: &[u8]) -> PathBuf {
    assert_eq!(from.len(), to.len());
    let mut b = std::fs::read(fixture(file)).expect("fixture");
    let hits: Vec<usize> = b.windows(from.len()).enumerate().filter(|(_, w)| *w == from).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "{:?} occurs {} times", String::from_utf8_lossy(from), hits.len());
    b[hits[0]..hits[0] + to.len()].copy_from_slice(to);
    let p = dir.join("bad.gguf");
    std::fs::write(&p, b).expect("write");
    p
}

fn convert_fails(gguf: &Path, needles: &[&str]) {
    let d = gguf.parent().expect("dir");
    let out = d.join("out.moe");
    let o = moescope(&["convert", gguf.to_str().unwrap(), "-o", out.to_str().unwrap()], d);
    assert_clean_failure(&o, needles);
    assert_eq!(o.status.code(), Some(1));
    assert!(!out.exists() && !d.join("out.moe.partial").exists(), "a package was left behind");
    // and through -m, which converts into the cache
    let o = moescope(&["run", "-m", gguf.to_str().unwrap(), "--prompt-ids", "1,2", "-n", "1"], d);
    assert_clean_failure(&o, needles);
}

#[test]
fn missing_metadata_key_is_named() {
    let d = tempfile::tempdir().unwrap();
    let p = patched(d.path(), b"qwen3moe.expert_used_count", b"qwen3moe.expert_used_couNT");
    convert_fails(&p, &["bad.gguf", "qwen3moe.expert_used_count", "missing"]);
}

#[test]
fn missing_tensor_is_named() {
    let d = tempfile::tempdir().unwrap();
    let p = patched(d.path(), b"blk.1.ffn_down_exps.weight", b"blk.1.ffn_down_exps.weighX");
    convert_fails(&p, &["missing tensor", "blk.1.ffn_down_exps.weight"]);
}

#[test]
fn unknown_architecture() {
    let d = tempfile::tempdir().unwrap();
    // the value of general.architecture: a u64 length 8, then the string
    let p = patched(d.path(), b"\x08\0\0\0\0\0\0\0qwen3moe", b"\x08\0\0\0\0\0\0\0llama3xx");
    convert_fails(&p, &["bad.gguf", "unsupported architecture", "llama3xx"]);
}

/// qwen3next's beta and alpha come from its fused `ssm_ba`, which is named when missing.
#[test]
fn qwen3next_without_ssm_ba_names_it() {
    let d = tempfile::tempdir().unwrap();
    let p = patched_file(d.path(), "gguf/next/next-moe-q8_0.gguf", b"blk.2.ssm_ba.weight", b"blk.2.ssm_bX.weight");
    convert_fails(&p, &["bad.gguf", "missing tensor", "blk.2.ssm_ba.weight"]);
}

/// An `ssm_ba` that disagrees with the value heads the metadata states is named, with both shapes.
#[test]
fn qwen3next_ssm_ba_of_the_wrong_size_is_named() {
    let d = tempfile::tempdir().unwrap();
    // time_step_rank 6 -> 4: 2 key heads of r = 2, so beta would be 4 rows, but ssm_ba holds 12
    let key = b"qwen3next.ssm.time_step_rank";
    let mut from = key.to_vec();
    from.extend_from_slice(&[4, 0, 0, 0, 6, 0, 0, 0]);
    let mut to = key.to_vec();
    to.extend_from_slice(&[4, 0, 0, 0, 4, 0, 0, 0]);
    let p = patched_file(d.path(), "gguf/next/next-moe-q8_0.gguf", &from, &to);
    convert_fails(&p, &["bad.gguf", "blk.0.ssm_ba.weight", "[6, 128], expected [4, 128]"]);
}

#[test]
fn unsupported_tensor_type_lists_the_supported_ones() {
    let d = tempfile::tempdir().unwrap();
    // attn_q of layer 0: its type (u32 after the name and dims) from Q8_0 (8) to TQ1_0 (34, a
    // ternary type moescope does not read), whose blocks of 256 take less room than the Q8_0
    // data there, so the file still reads
    let name = b"blk.0.attn_q.weight";
    let mut b = std::fs::read(fixture("gguf/tiny/tiny-q8_0.gguf")).unwrap();
    let at = b.windows(name.len()).position(|w| w == name).expect("tensor") + name.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    assert_eq!(u32::from_le_bytes(b[ty..ty + 4].try_into().unwrap()), 8, "Q8_0");
    b[ty..ty + 4].copy_from_slice(&34u32.to_le_bytes());
    let p = d.path().join("bad.gguf");
    std::fs::write(&p, b).unwrap();
    convert_fails(&p, &["blk.0.attn_q.weight", "TQ1_0 is not supported", "Q2_K", "IQ2_XXS", "IQ1_M", "Q8_0", "BF16"]);
}

#[test]
fn split_model_with_a_part_missing() {
    let d = tempfile::tempdir().unwrap();
    for i in [1, 3] {
        let n = format!("tiny-bf16-0000{i}-of-00003.gguf");
        std::fs::copy(fixture("gguf/tiny/split").join(&n), d.path().join(&n)).unwrap();
    }
    let first = d.path().join("tiny-bf16-00001-of-00003.gguf");
    convert_fails(&first, &["tiny-bf16-00002-of-00003.gguf"]);
}

/// A block count far past the file's layers is refused at once, before anything is sized by it.
#[test]
fn block_count_past_the_layers_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // qwen3moe.block_count: a u32 (type 4) of 2 after the key
    let key = b"qwen3moe.block_count";
    let mut b = std::fs::read(fixture("gguf/tiny/tiny-q8_0.gguf")).expect("fixture");
    let at = b.windows(key.len()).position(|w| w == key).expect("key") + key.len();
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 4, "a u32");
    assert_eq!(u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()), 2, "2 blocks");
    b[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let p = d.path().join("bad.gguf");
    std::fs::write(&p, b).unwrap();
    convert_fails(&p, &["qwen3moe.block_count", "4294967295 blocks", "blk.4294967294.attn_norm.weight"]);
}
