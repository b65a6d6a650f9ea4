//! The GGUF reader against what gguf-py wrote and read back (tests/fixtures/gguf/tiny.gguf and
//! tiny.json, made by tests/reference/make_gguf_reader_fixture.py), and against damaged copies
//! of that file: each damage gives one error naming what is wrong, never a panic.

mod common;

use std::path::{Path, PathBuf};

use moescope::convert::gguf::{self, GgufError};
use serde_json::Value;

fn fixture() -> (Vec<u8>, Value) {
    let dir = common::fixture("gguf");
    let bytes = std::fs::read(dir.join("tiny.gguf")).unwrap();
    let want: Value = serde_json::from_slice(&std::fs::read(dir.join("tiny.json")).unwrap()).unwrap();
    (bytes, want)
}

#[test]
fn reads_what_gguf_py_wrote() {
    let path = common::fixture("gguf").join("tiny.gguf");
    let g = gguf::open(&path).unwrap();
    let (_, want) = fixture();
    assert_eq!(g.version, 3);
    let meta: Vec<Value> = g
        .metadata
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "type": v.type_name(), "value": v.to_json()}))
        .collect();
    assert_eq!(Value::Array(meta), want["metadata"]);
    let tensors: Vec<Value> = g
        .tensors
        .iter()
        .map(|t| serde_json::json!({"name": t.name, "type": t.ty.name, "ne": t.ne, "offset": t.offset, "bytes": t.bytes}))
        .collect();
    assert_eq!(Value::Array(tensors), want["tensors"]);
    assert_eq!(g.architecture(), Some("qwen3moe"));
    assert_eq!(g.get("qwen3moe.expert_count").and_then(|v| v.as_u64()), Some(3));
}

/// Where tensor `name`'s index entry is: (its n_dims, its first ne, its type, its offset).
fn entry(b: &[u8], name: &str) -> (usize, usize, usize, usize) {
    let at = b.windows(name.len()).position(|w| w == name.as_bytes()).unwrap() + name.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    (at, at + 4, ty, ty + 4)
}

/// Where metadata key `key`'s value type is.
fn key_at(b: &[u8], key: &str) -> usize {
    b.windows(key.len()).position(|w| w == key.as_bytes()).unwrap() + key.len()
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn open_damaged(dir: &Path, b: &[u8]) -> (PathBuf, Result<gguf::Gguf, GgufError>) {
    let p = dir.join("damaged.gguf");
    std::fs::write(&p, b).unwrap();
    let r = gguf::open(&p);
    (p, r)
}

#[test]
fn every_damage_is_one_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let (good, _) = fixture();
    type Damage = (&'static str, Box<dyn Fn(&mut Vec<u8>)>, &'static [&'static str]);
    let cases: Vec<Damage> = vec![
        ("wrong magic", Box::new(|b| b[..4].copy_from_slice(b"GGUX")), &["not a GGUF file"]),
        ("big-endian", Box::new(|b| b[..4].copy_from_slice(b"FUGG")), &["big-endian"]),
        ("version 1", Box::new(|b| put_u32(b, 4, 1)), &["version 1", "only version 3"]),
        ("version 2", Box::new(|b| put_u32(b, 4, 2)), &["version 2"]),
        ("huge tensor count", Box::new(|b| put_u64(b, 8, 1 << 60)), &["claims 1152921504606846976 tensors"]),
        ("huge metadata count", Box::new(|b| put_u64(b, 16, u64::MAX)), &["metadata entries", "hold at most"]),
        ("huge key length", Box::new(|b| put_u64(b, 24, 1 << 40)), &["offset 24", "past the end"]),
        ("key not UTF-8", Box::new(|b| b[32] = 0xff), &["offset 24", "not UTF-8"]),
        (
            "huge array",
            Box::new(|b| {
                let at = key_at(b, "test.ints");
                put_u64(b, at + 8, 1 << 50)
            }),
            &["key 'test.ints'", "array elements"],
        ),
        (
            "bool of 2",
            Box::new(|b| {
                let at = key_at(b, "test.bool");
                b[at + 4] = 2
            }),
            &["key 'test.bool'", "a bool of 2"],
        ),
        (
            "unknown value type",
            Box::new(|b| {
                let at = key_at(b, "test.u8");
                put_u32(b, at, 77)
            }),
            &["key 'test.u8'", "unknown value type 77"],
        ),
        (
            "unknown tensor type",
            Box::new(|b| {
                let (_, _, ty, _) = entry(b, "blk.0.attn_v.weight");
                put_u32(b, ty, 99)
            }),
            &["tensor blk.0.attn_v.weight", "unknown ggml type 99"],
        ),
        (
            "offset past the end",
            Box::new(|b| {
                let (_, _, _, off) = entry(b, "blk.0.attn_norm.weight");
                put_u64(b, off, 1 << 40)
            }),
            &["tensor blk.0.attn_norm.weight", "past the end of the file"],
        ),
        (
            "misaligned offset",
            Box::new(|b| {
                let (_, _, _, off) = entry(b, "blk.0.attn_norm.weight");
                let v = u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
                put_u64(b, off, v + 4)
            }),
            &["tensor blk.0.attn_norm.weight", "not a multiple of the alignment 32"],
        ),
        (
            "shape larger than the data",
            Box::new(|b| {
                let (_, ne0, _, _) = entry(b, "token_embd.weight");
                put_u64(b, ne0 + 8, 8000)
            }),
            &["tensor token_embd.weight", "go past the end"],
        ),
        (
            "rows not whole blocks",
            Box::new(|b| {
                let (_, ne0, _, _) = entry(b, "blk.0.attn_k.weight");
                put_u64(b, ne0, 33)
            }),
            &["tensor blk.0.attn_k.weight", "not a whole number of Q8_0 blocks of 32"],
        ),
        (
            "five dimensions",
            Box::new(|b| {
                let (nd, _, _, _) = entry(b, "blk.0.attn_q.weight");
                put_u32(b, nd, 5)
            }),
            &["tensor blk.0.attn_q.weight", "5 dimensions"],
        ),
        (
            "a zero dimension",
            Box::new(|b| {
                let (_, ne0, _, _) = entry(b, "blk.0.attn_q.weight");
                put_u64(b, ne0, 0)
            }),
            &["tensor blk.0.attn_q.weight", "a dimension of 0"],
        ),
        (
            "a name twice",
            Box::new(|b| {
                let (nd, _, _, _) = entry(b, "blk.0.attn_k.weight");
                b[nd - "k.weight".len()] = b'q'
            }),
            &["tensor blk.0.attn_q.weight", "appears twice"],
        ),
        (
            "overlapping data",
            Box::new(|b| {
                let (_, _, _, off) = entry(b, "blk.0.attn_q.weight");
                put_u64(b, off, 0)
            }),
            &["overlaps tensor token_embd.weight"],
        ),
    ];
    for (what, damage, needles) in &cases {
        let mut b = good.clone();
        damage(&mut b);
        let (p, r) = open_damaged(d.path(), &b);
        let msg = match r {
            Ok(_) => panic!("{what}: read without an error"),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(&p.display().to_string()), "{what}: {msg}");
        for n in *needles {
            assert!(msg.contains(n), "{what}: {msg:?} lacks {n:?}");
        }
        assert!(!msg.contains('\n'), "{what}: one line: {msg}");
    }
    // the command line: exit 1, one line, no panic
    let mut b = good.clone();
    put_u32(&mut b, 4, 2);
    let (p, _) = open_damaged(d.path(), &b);
    common::assert_clean_failure(&common::moescope(&["inspect", p.to_str().unwrap()], d.path()), &["GGUF version 2"]);
}

#[test]
fn every_truncation_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let (good, want) = fixture();
    // every cut inside the header and index, and inside each tensor's data
    let last = want["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["offset"].as_u64().unwrap() + t["bytes"].as_u64().unwrap())
        .max()
        .unwrap() as usize;
    assert_eq!(last, good.len());
    for n in (0..good.len()).step_by(3) {
        let (_, r) = open_damaged(d.path(), &good[..n]);
        assert!(r.is_err(), "cut at {n} of {} read without an error", good.len());
    }
}
